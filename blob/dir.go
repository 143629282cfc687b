package blob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"
)

// Dir is a Store in a local directory: objects are files under Dir's root,
// temporary objects live in root/.tmp on the same filesystem so that a
// commit is an atomic rename.
type Dir struct {
	root string
	tmp  string
}

var _ Store = (*Dir)(nil)

// staleTemp is how old a temporary file must be before OpenDir removes it:
// only a crash leaves one behind, and an upload in progress on another
// process sharing the directory is never this old.
const staleTemp = 24 * time.Hour

// OpenDir opens the store in root and removes temporary files that a
// crash left behind. Directories are made on the first Put, so a server
// that never stores a file makes none.
func OpenDir(root string) (*Dir, error) {
	d := &Dir{root: root, tmp: filepath.Join(root, ".tmp")}
	entries, err := os.ReadDir(d.tmp)
	if errors.Is(err, fs.ErrNotExist) {
		return d, nil
	} else if err != nil {
		return nil, fmt.Errorf("blob: read %s: %w", d.tmp, err)
	}
	for _, e := range entries {
		if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > staleTemp {
			os.Remove(filepath.Join(d.tmp, e.Name()))
		}
	}
	return d, nil
}

var keyElement = regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9._-]*$`)

// splitKey returns the elements of key, refusing keys that could leave a
// store's root (a directory's, or a bucket's prefix).
func splitKey(key string) ([]string, error) {
	parts := strings.Split(key, "/")
	for _, p := range parts {
		if !keyElement.MatchString(p) {
			return nil, fmt.Errorf("blob: invalid key %q", key)
		}
	}
	return parts, nil
}

// path returns the file of key.
func (d *Dir) path(key string) (string, error) {
	parts, err := splitKey(key)
	if err != nil {
		return "", err
	}
	return filepath.Join(append([]string{d.root}, parts...)...), nil
}

// Put copies r into a temporary file, synced to disk before it returns.
func (d *Dir) Put(ctx context.Context, key string, r io.Reader) (Pending, error) {
	final, err := d.path(key)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(d.tmp, 0o755); err != nil {
		return nil, fmt.Errorf("blob: %w", err)
	}
	f, err := os.CreateTemp(d.tmp, "put-*")
	if err != nil {
		return nil, fmt.Errorf("blob: %w", err)
	}
	n, err := io.Copy(f, ctxReader{ctx, r})
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return nil, err
	}
	return &dirPending{tmp: f.Name(), final: final, size: n}, nil
}

// ctxReader stops a copy when its context ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

type dirPending struct {
	tmp, final string
	size       int64
	done       bool
}

func (p *dirPending) Size() int64 { return p.size }

func (p *dirPending) Commit(ctx context.Context) error {
	if p.done {
		return errors.New("blob: commit after commit or abort")
	}
	dir := filepath.Dir(p.final)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("blob: %w", err)
	}
	if err := os.Rename(p.tmp, p.final); err != nil {
		return fmt.Errorf("blob: %w", err)
	}
	p.done = true
	return syncDir(dir)
}

func (p *dirPending) Abort(ctx context.Context) error {
	if p.done {
		return nil
	}
	p.done = true
	if err := os.Remove(p.tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("blob: %w", err)
	}
	return nil
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("blob: %w", err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("blob: sync %s: %w", dir, err)
	}
	return nil
}

// Open opens a committed object.
func (d *Dir) Open(ctx context.Context, key string) (Object, error) {
	path, err := d.path(key)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if notExist(err) {
		return nil, ErrNotFound
	} else if err != nil {
		return nil, fmt.Errorf("blob: %w", err)
	}
	info, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("blob: %w", err)
	}
	return &dirObject{File: f, size: info.Size(), mod: info.ModTime()}, nil
}

// notExist reports whether err says a key's file is not there: no such
// file, or a file where one of its folders would be (ENOTDIR), as a bucket
// answers NoSuchKey for a key below another.
func notExist(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)
}

type dirObject struct {
	*os.File
	size int64
	mod  time.Time
}

func (o *dirObject) Size() int64        { return o.size }
func (o *dirObject) ModTime() time.Time { return o.mod }

// Delete removes a committed object.
func (d *Dir) Delete(ctx context.Context, key string) error {
	path, err := d.path(key)
	if err != nil {
		return err
	}
	if err := os.Remove(path); notExist(err) {
		return ErrNotFound
	} else if err != nil {
		return fmt.Errorf("blob: %w", err)
	}
	return nil
}

// Walk visits the committed objects under prefix, in lexical order of their
// keys; temporary files are not objects.
func (d *Dir) Walk(ctx context.Context, prefix string, fn func(key string, mod time.Time) error) error {
	start, err := d.path(prefix)
	if err != nil {
		return err
	}
	err = filepath.WalkDir(start, func(path string, e fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil // not made yet, or deleted since its directory was read
		} else if err != nil {
			return err
		}
		if e.IsDir() || !e.Type().IsRegular() {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		info, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		} else if err != nil {
			return err
		}
		rel, err := filepath.Rel(d.root, path)
		if err != nil {
			return err
		}
		return fn(filepath.ToSlash(rel), info.ModTime())
	})
	if err != nil {
		return fmt.Errorf("blob: walk %s: %w", prefix, err)
	}
	return nil
}
