// Package firmware is fleetd's firmware logic beyond the store: bundle
// archives (package bundle) parsed and verified while they stream to the
// blob store, the two upload flows with their S5 verification, signed
// download URLs, and the preparation of update_firmware actions.
package firmware

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/blob"
	"github.com/fleetd/fleet/firmware/bundle"
	"github.com/google/uuid"
)

// Service implements fleet.FirmwareService over a store and a blob store.
// Fill in the fields, then use it; it keeps no goroutines running between
// calls (the caller runs RunOrphanRemoval on one of its own).
type Service struct {
	Store  fleet.FirmwareStore
	Blobs  blob.Store
	Logger *slog.Logger
	Now    func() time.Time
	Parse  bundle.ParseOptions
	// MaxParsing bounds the archives parsed at once: inflating and hashing
	// cost CPU, and a flood of uploads would take every core. Others wait
	// their turn (their bodies unread). Default 2.
	MaxParsing int
	// PublicURL is the scheme and host devices reach the API at, for
	// signed download URLs; empty uses the dispatching request's.
	PublicURL string

	mu      sync.Mutex
	secret  []byte        // the URL signing key, once loaded
	parsing chan struct{} // a token per archive being parsed
}

// parseSlot waits for a turn to parse an archive, or for ctx's end.
func (s *Service) parseSlot(ctx context.Context) (release func(), err error) {
	s.mu.Lock()
	if s.parsing == nil {
		n := s.MaxParsing
		if n <= 0 {
			n = 2
		}
		s.parsing = make(chan struct{}, n)
	}
	slots := s.parsing
	s.mu.Unlock()
	select {
	case slots <- struct{}{}:
		return func() { <-slots }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

var _ fleet.FirmwareService = (*Service)(nil)

func (s *Service) now() time.Time {
	if s.Now == nil {
		return time.Now()
	}
	return s.Now()
}

func (s *Service) log() *slog.Logger {
	if s.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Logger
}

// parseFailure carries Parse's verdict through the pipe to the blob
// store's Put, so that Put's error says who stopped the upload.
type parseFailure struct{ err error }

func (p parseFailure) Error() string { return p.err.Error() }

type parsed struct {
	file *fleet.BundleFile
	err  error
}

// ingest streams an archive into a new, uncommitted blob while Parse reads
// the same bytes, and returns what Parse found with the blob to commit.
// Nothing is buffered beyond the pipe's single write: memory stays flat
// whatever the size. On any error the blob is gone.
func (s *Service) ingest(ctx context.Context, tenant string, id uuid.UUID, archive io.Reader) (*fleet.BundleFile, blob.Pending, error) {
	// Each upload gets a key of its own: two uploads racing for one
	// record never touch each other's file.
	release, err := s.parseSlot(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer release()
	key := path.Join(bundlesPrefix, tenant, id.String(), uuid.NewString())
	pr, pw := io.Pipe()
	done := make(chan parsed, 1)
	go func() {
		f, err := bundle.Parse(pr, s.Parse)
		if err != nil {
			pr.CloseWithError(parseFailure{err})
		}
		done <- parsed{f, err}
	}()
	pending, err := s.Blobs.Put(ctx, key, io.TeeReader(archive, pw))
	pw.CloseWithError(err) // nil: the parser sees the end of the archive
	res := <-done
	if err != nil {
		var pf parseFailure
		var fe *fleet.Error
		switch {
		case errors.As(err, &pf):
			return nil, nil, pf.err
		case errors.As(err, &fe) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
			return nil, nil, err // the upload itself: cut, too large, cancelled
		}
		return nil, nil, fmt.Errorf("store archive: %w", err)
	}
	if res.err != nil {
		s.abort(ctx, pending)
		return nil, nil, res.err
	}
	res.file.BlobKey = key
	return res.file, pending, nil
}

func (s *Service) abort(ctx context.Context, p blob.Pending) {
	if err := p.Abort(context.WithoutCancel(ctx)); err != nil {
		s.log().Error("abort firmware upload", "err", err)
	}
}

// deleteBlob removes an archive no record references; a failure leaves an
// orphan file, which is logged.
func (s *Service) deleteBlob(ctx context.Context, key string) {
	if key == "" {
		return
	}
	if err := s.Blobs.Delete(context.WithoutCancel(ctx), key); err != nil && !errors.Is(err, blob.ErrNotFound) {
		s.log().Error("delete firmware archive", "key", key, "err", err)
	}
}

// bundlesPrefix begins the blob key of every archive:
// bundles/{tenant}/{bundle id}/{upload id}.
const bundlesPrefix = "bundles"

// OrphanGrace is how old an archive no record references must be before
// RemoveOrphans deletes it: an upload commits its archive a moment before
// writing its record, perhaps on another replica, and must not lose it.
const OrphanGrace = time.Hour

// RemoveOrphans deletes the archives that no bundle record references and
// that are older than OrphanGrace, and returns how many it deleted. Only a
// crash between committing an archive and writing its record, or a
// deletion that failed, leaves one; both are rare, so a pass is a walk of
// the bundles' files and a primary-key read for each. Files outside the
// layout of bundle archives are not fleetd's to delete and are left alone.
// A deletion that fails does not stop the others; the failures are
// returned together.
func (s *Service) RemoveOrphans(ctx context.Context) (int, error) {
	var orphans []string
	err := s.Blobs.Walk(ctx, bundlesPrefix, func(key string, mod time.Time) error {
		if time.Since(mod) < OrphanGrace { // files keep the machine's time, not s.Now's
			return nil
		}
		used, err := s.referenced(ctx, key)
		if err == nil && !used {
			orphans = append(orphans, key)
		}
		return err
	})
	if err != nil {
		return 0, err
	}
	n := 0
	var failed []error
	for _, key := range orphans {
		switch err := s.Blobs.Delete(ctx, key); {
		case err == nil:
			n++
			s.log().Info("removed a firmware archive no bundle references", "key", key)
		case !errors.Is(err, blob.ErrNotFound): // not: another replica removed it first
			failed = append(failed, fmt.Errorf("delete %s: %w", key, err))
		}
	}
	return n, errors.Join(failed...)
}

// referenced reports whether a bundle record points to the archive key,
// which ingest made as bundles/{tenant}/{bundle id}/{upload id}.
func (s *Service) referenced(ctx context.Context, key string) (bool, error) {
	parts := strings.Split(key, "/")
	if len(parts) != 4 {
		return true, nil
	}
	id, err := uuid.Parse(parts[2])
	if err != nil {
		return true, nil
	}
	b, err := s.Store.FindBundle(ctx, parts[1], id)
	if fleet.ErrorCode(err) == fleet.ENOTFOUND {
		return false, nil
	} else if err != nil {
		return false, err
	}
	return b.BlobKey == key, nil
}

// RunOrphanRemoval runs RemoveOrphans at once and then every interval
// until ctx ends. Replicas sharing the blob store may all run it: deleting
// an orphan twice is harmless.
func (s *Service) RunOrphanRemoval(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if _, err := s.RemoveOrphans(ctx); err != nil && ctx.Err() == nil {
			s.log().Error("remove orphaned firmware archives", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// defaultFileName names an archive uploaded without a file name.
func defaultFileName(f *fleet.BundleFile) string {
	if f.Gzipped {
		return "bundle-" + f.Manifest.Version + ".tar.gz"
	}
	return "bundle-" + f.Manifest.Version + ".tar"
}

// UploadBundle stores, parses and records an archive in one go.
func (s *Service) UploadBundle(ctx context.Context, tenant, fileName string, archive io.Reader) (*fleet.Bundle, bool, error) {
	id := uuid.New()
	f, pending, err := s.ingest(ctx, tenant, id, archive)
	if err != nil {
		return nil, false, err
	}
	// The version is known only once the manifest is read: the archive
	// is in a blob by then, to be dropped if its version is taken, by it
	// or by another.
	if same, err := s.taken(ctx, tenant, f); err != nil || same != nil {
		s.abort(ctx, pending)
		return same, false, err
	}
	if !fleet.ValidFileName(fileName) {
		fileName = defaultFileName(f)
	}
	// The file is committed before the record that points to it: a crash
	// in between leaves an unreferenced file, never a record without one.
	if err := pending.Commit(ctx); err != nil {
		s.abort(ctx, pending)
		return nil, false, fmt.Errorf("commit archive: %w", err)
	}
	if err := s.storeComponents(ctx, tenant, f); err != nil {
		s.deleteBlob(ctx, f.BlobKey)
		return nil, false, err
	}
	b := &fleet.Bundle{ID: id, Version: f.Manifest.Version, FileName: fileName}
	if err := s.Store.CreateBundle(ctx, tenant, b, f); err != nil {
		s.deleteBlob(ctx, f.BlobKey)
		if fleet.ErrorCode(err) == fleet.ECONFLICT {
			// The same archive, uploaded at once by another request
			// that won the version.
			if same, _ := s.taken(ctx, tenant, f); same != nil {
				return same, false, nil
			}
		}
		return nil, false, err
	}
	return b, true, nil
}

// taken returns the completed bundle of f's version when its archive is
// f's byte for byte, ECONFLICT when a live bundle has the version with
// another archive (or none yet), and neither when the version is free.
func (s *Service) taken(ctx context.Context, tenant string, f *fleet.BundleFile) (*fleet.Bundle, error) {
	b, err := s.Store.FindBundleByVersion(ctx, tenant, f.Manifest.Version)
	switch {
	case fleet.ErrorCode(err) == fleet.ENOTFOUND:
		return nil, nil
	case err != nil:
		return nil, err
	case b.SameArchive(f.Checksum, f.ContentLength):
		return b, nil
	case b.UploadStatus == fleet.UploadCompleted:
		return nil, fleet.Errorf(fleet.ECONFLICT, "firmware bundle version %s exists already with another archive (sha256 %s; this one's is %s); give the new build a new version",
			b.Version, *b.Checksum, f.Checksum)
	case b.UploadStatus == fleet.UploadPending:
		return nil, fleet.Errorf(fleet.ECONFLICT, "firmware bundle version %s exists already, a pending record awaiting its upload (%s)", b.Version, b.ID)
	}
	return nil, nil // failed bundles do not hold their version
}

// CreatePendingBundle makes a record for an archive to come.
func (s *Service) CreatePendingBundle(ctx context.Context, tenant, version, fileName string) (*fleet.Bundle, error) {
	b := &fleet.Bundle{ID: uuid.New(), Version: version, FileName: fileName}
	if err := s.Store.CreatePendingBundle(ctx, tenant, b); err != nil {
		return nil, err
	}
	return b, nil
}

// UploadBundleFile stores the archive of a pending record.
func (s *Service) UploadBundleFile(ctx context.Context, tenant string, id uuid.UUID, archive io.Reader) (*fleet.Bundle, error) {
	b, err := s.Store.FindBundle(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	// Refuse before reading a possibly large body (but the archive of a
	// completed bundle, which may be sent again); the store checks again,
	// atomically, once it is in.
	if err := b.AwaitsArchive(); err != nil {
		if b.UploadStatus == fleet.UploadCompleted {
			return s.sentAgain(ctx, b, archive, err)
		}
		return nil, err
	}
	f, pending, err := s.ingest(ctx, tenant, id, archive)
	if err != nil {
		return nil, err
	}
	if f.Manifest.Version != b.Version {
		s.abort(ctx, pending)
		return nil, &fleet.Error{Code: fleet.EINVALID,
			Message: fmt.Sprintf("%s says version %s, but this record is for version %s", bundle.ManifestName, f.Manifest.Version, b.Version),
			Fields:  map[string]string{"manifest.version": "must be " + b.Version}}
	}
	if err := pending.Commit(ctx); err != nil {
		s.abort(ctx, pending)
		return nil, fmt.Errorf("commit archive: %w", err)
	}
	if err := s.storeComponents(ctx, tenant, f); err != nil {
		s.deleteBlob(ctx, f.BlobKey)
		return nil, err
	}
	nb, err := s.Store.AttachBundleFile(ctx, tenant, id, f)
	if err != nil {
		s.deleteBlob(ctx, f.BlobKey)
		return nil, err
	}
	if nb.UploadStatus == fleet.UploadFailed {
		s.deleteBlob(ctx, nb.BlobKey)
		nb.BlobKey = ""
		return nb, verificationFailed(nb)
	}
	return nb, nil
}

// sentAgain reads an archive sent to completed bundle b: the same bytes
// are b, others are refused as a change would be. A digest is all it
// needs of them, so nothing is stored.
func (s *Service) sentAgain(ctx context.Context, b *fleet.Bundle, archive io.Reader, refused error) (*fleet.Bundle, error) {
	release, err := s.parseSlot(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	h := sha256.New()
	n, err := io.Copy(h, archive)
	if err != nil {
		return nil, err
	}
	if !b.SameArchive(hex.EncodeToString(h.Sum(nil)), n) {
		return nil, refused
	}
	return b, nil
}

// verificationFailed is the ECONFLICT of a bundle that just failed.
func verificationFailed(b *fleet.Bundle) error {
	e := &fleet.Error{Code: fleet.ECONFLICT, Message: b.UploadError}
	if b.Declared != nil && b.Checksum != nil {
		if m := b.Declared.Mismatch(*b.ContentLength, *b.UncompressedSize, *b.Checksum); len(m) > 0 {
			e.Fields = m
		}
	}
	return e
}

// DeclareBundle is S5: it records the declaration and verifies the
// archive against it when both are in.
func (s *Service) DeclareBundle(ctx context.Context, tenant string, id uuid.UUID, d fleet.Declaration) (*fleet.Bundle, error) {
	if !fleet.ValidChecksum(d.Checksum) {
		return nil, fleet.FieldErrors(map[string]string{"checksum": fleet.ChecksumRule})
	}
	b, err := s.Store.DeclareBundle(ctx, tenant, id, d)
	if err != nil {
		return nil, err
	}
	switch b.UploadStatus {
	case fleet.UploadFailed:
		if b.BlobKey != "" { // failed just now
			s.deleteBlob(ctx, b.BlobKey)
			b.BlobKey = ""
			return b, verificationFailed(b)
		}
		return b, fleet.Errorf(fleet.ECONFLICT, "firmware bundle %s failed earlier (%s); create a new record to upload again", b.ID, b.UploadError)
	case fleet.UploadCompleted:
		// A completed bundle is what it is; a declaration may confirm it
		// but not change it.
		if m := d.Mismatch(*b.ContentLength, *b.UncompressedSize, *b.Checksum); len(m) > 0 {
			return b, &fleet.Error{Code: fleet.ECONFLICT, Message: fleet.MismatchMessage(m), Fields: m}
		}
	}
	return b, nil
}

// DeleteBundle removes a bundle and its archive.
func (s *Service) DeleteBundle(ctx context.Context, tenant string, id uuid.UUID) error {
	b, err := s.Store.DeleteBundle(ctx, tenant, id)
	if err != nil {
		return err
	}
	s.deleteBlob(ctx, b.BlobKey)
	return nil
}

// FindBundle returns a bundle.
func (s *Service) FindBundle(ctx context.Context, tenant string, id uuid.UUID) (*fleet.Bundle, error) {
	return s.Store.FindBundle(ctx, tenant, id)
}

// FindBundleByVersion returns the bundle of a version (S6).
func (s *Service) FindBundleByVersion(ctx context.Context, tenant, version string) (*fleet.Bundle, error) {
	return s.Store.FindBundleByVersion(ctx, tenant, version)
}

// FindBundles lists bundles.
func (s *Service) FindBundles(ctx context.Context, tenant string, f fleet.BundleFilter) ([]*fleet.Bundle, int, error) {
	return s.Store.FindBundles(ctx, tenant, f)
}

// FindFirmwares lists a component's versions.
func (s *Service) FindFirmwares(ctx context.Context, tenant, component string, p fleet.Page) ([]*fleet.Firmware, int, error) {
	return s.Store.FindFirmwares(ctx, tenant, component, p)
}

// UpdateFirmware is S8.
func (s *Service) UpdateFirmware(ctx context.Context, tenant, component, version string, u fleet.FirmwareUpdate) (*fleet.Firmware, error) {
	return s.Store.UpdateFirmware(ctx, tenant, component, version, u)
}

// OpenArtifact opens the archive of a completed bundle.
func (s *Service) OpenArtifact(ctx context.Context, tenant string, id uuid.UUID) (*fleet.Bundle, fleet.Artifact, error) {
	b, err := s.Store.FindBundle(ctx, tenant, id)
	if err != nil {
		return nil, nil, err
	}
	if b.UploadStatus != fleet.UploadCompleted {
		return nil, nil, fleet.Errorf(fleet.ECONFLICT, "firmware bundle %s is %s; only a completed bundle can be downloaded", id, b.UploadStatus)
	}
	obj, err := s.Blobs.Open(ctx, b.BlobKey)
	if err != nil {
		return nil, nil, fmt.Errorf("open archive of bundle %s (%s): %w", id, b.BlobKey, err)
	}
	art, err := s.redirectable(ctx, obj, b.BlobKey, b.FileName)
	return b, art, err
}

// redirectable is obj, or obj with the presigned URL downloads go to when
// the blob store gives one.
func (s *Service) redirectable(ctx context.Context, obj blob.Object, key, fileName string) (fleet.Artifact, error) {
	p, ok := s.Blobs.(blob.Presigner)
	if !ok {
		return obj, nil
	}
	u, err := p.PresignGet(ctx, key, fileName)
	if err != nil {
		obj.Close()
		return nil, err
	}
	if u == "" {
		return obj, nil
	}
	return redirect{obj, u}, nil
}

type redirect struct {
	blob.Object
	url string
}

func (r redirect) RedirectURL() string { return r.url }
