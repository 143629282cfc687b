// Package blob stores large files, such as firmware archives, out of the
// database. Store is fleetd's own interface so that handlers never see the
// backend: the local filesystem (Dir) or a bucket of an S3-compatible
// service (S3).
//
// Writes are two-phase: Put streams into a temporary object that nobody can
// Open, and only Commit makes it visible under its key. A failed or
// abandoned upload is aborted and leaves nothing behind.
package blob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// ErrNotFound is returned by Open and Delete for a key with no object.
var ErrNotFound = errors.New("blob: not found")

// Store keeps objects by key. Keys are slash-separated paths of
// [A-Za-z0-9._-] elements, such as "bundles/acme/3f1c…".
type Store interface {
	// Put streams r to its end into a temporary object for key. The object
	// is visible only after Pending.Commit; on any error nothing remains.
	Put(ctx context.Context, key string, r io.Reader) (Pending, error)
	// Open returns a committed object for reading, seekable so that ranges
	// are cheap.
	Open(ctx context.Context, key string) (Object, error)
	// Delete removes a committed object; a missing one is ErrNotFound.
	Delete(ctx context.Context, key string) error
	// Walk calls fn with the key and modification time of each committed
	// object whose key begins with the elements of prefix, until fn
	// returns an error. A prefix with no objects is no error.
	Walk(ctx context.Context, prefix string, fn func(key string, mod time.Time) error) error
}

// Presigner is a Store that can send a downloader to the object itself
// (S3 with presign set). PresignGet returns "" when it will not.
type Presigner interface {
	PresignGet(ctx context.Context, key, fileName string) (string, error)
}

// Pending is an object written but not yet visible.
type Pending interface {
	// Size is the number of bytes written.
	Size() int64
	// Commit makes the object visible under its key, durably, replacing
	// any object there.
	Commit(ctx context.Context) error
	// Abort discards the object; after Commit it does nothing.
	Abort(ctx context.Context) error
}

// Object is a committed object open for reading.
type Object interface {
	io.ReadSeeker
	io.Closer
	Size() int64
	ModTime() time.Time
}

// Open opens the store a location names: file://DIR (a directory, made
// when first written) or s3://bucket/prefix?… (see ParseS3URL), whose
// credentials come through getenv.
func Open(ctx context.Context, location string, getenv func(string) string) (Store, error) {
	scheme, rest, _ := strings.Cut(location, "://")
	switch scheme {
	case "file":
		if rest == "" {
			return nil, fmt.Errorf("blob: %q: want file://DIR", location)
		}
		return OpenDir(rest)
	case "s3":
		c, err := ParseS3URL(location, getenv)
		if err != nil {
			return nil, err
		}
		return OpenS3(ctx, c)
	}
	return nil, fmt.Errorf("blob: %q: want file://DIR or s3://bucket/prefix", location)
}
