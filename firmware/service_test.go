package firmware_test

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/sha1"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/blob"
	"github.com/fleetd/fleet/blob/s3test"
	"github.com/fleetd/fleet/firmware"
	"github.com/fleetd/fleet/firmware/bundle"
	"github.com/fleetd/fleet/internal/testclock"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
	"github.com/google/uuid"
	"github.com/minio/minio-go/v7"
)

func newService(t testing.TB, store string) (*firmware.Service, *testBlobs, *testclock.Clock) {
	t.Helper()
	c := testclock.New(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC))
	db := sqlstoretest.MustOpen(t, sqlstoretest.Backends()[0], sqlstoretest.Options{Now: c.Now})
	for _, name := range []string{"acme", "beta"} {
		if _, _, err := db.CreateTenant(context.Background(), name); err != nil {
			t.Fatal(err)
		}
	}
	tb := &testBlobs{aged: aged{age: map[string]time.Duration{}}}
	switch store {
	case "file":
		dir := t.TempDir()
		d, err := blob.OpenDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		tb.Store = d
		tb.files = func() []string { return dirFiles(dir) }
	case "s3":
		srv := s3test.Start(t)
		tb.Store = srv.Store(t)
		tb.files = func() []string {
			var out []string
			c := srv.Client(t)
			for o := range c.ListObjects(context.Background(), srv.Bucket, minio.ListObjectsOptions{Recursive: true}) {
				out = append(out, o.Key)
			}
			for u := range c.ListIncompleteUploads(context.Background(), srv.Bucket, "", true) {
				out = append(out, "upload of "+u.Key)
			}
			return out
		}
	default:
		t.Fatalf("no blob store %q", store)
	}
	return &firmware.Service{Store: db, Blobs: tb.aged, Now: c.Now, PublicURL: "https://fleet.example.com"}, tb, c
}

// stores runs f with each blob store.
func stores(t *testing.T, f func(t *testing.T, store string)) {
	for _, store := range []string{"file", "s3"} {
		t.Run(store, func(t *testing.T) { f(t, store) })
	}
}

// testBlobs is a test service's blob store, with what the test sees of it
// from behind.
type testBlobs struct {
	aged
	files func() []string // every object, and every upload in progress
}

// aged is a blob store whose objects named in age look older by as much:
// an S3 object's time is its server's, which a test cannot set.
type aged struct {
	blob.Store
	age map[string]time.Duration
}

func (a aged) Walk(ctx context.Context, prefix string, fn func(string, time.Time) error) error {
	return a.Store.Walk(ctx, prefix, func(key string, mod time.Time) error { return fn(key, mod.Add(-a.age[key])) })
}

// put commits an object that looks age old.
func (b *testBlobs) put(t testing.TB, key string, age time.Duration) string {
	t.Helper()
	ctx := context.Background()
	p, err := b.Put(ctx, key, strings.NewReader(key))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	b.age[key] = age
	return key
}

func dirFiles(dir string) []string {
	var out []string
	filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		if err == nil && !e.IsDir() {
			out = append(out, path)
		}
		return nil
	})
	return out
}

func bundleArchive(t testing.TB, version string, body string) []byte {
	t.Helper()
	var buf bytes.Buffer
	err := bundle.Build(&buf, version, []bundle.Source{{ComponentName: "app", VersionNumber: version, FileName: "app.bin", Size: int64(len(body)), Body: strings.NewReader(body)}}, true)
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestUploadLeavesNothingOnFailure(t *testing.T) {
	stores(t, func(t *testing.T, store string) {
		svc, blobs, _ := newService(t, store)
		ctx := context.Background()
		good := bundleArchive(t, "1.0.0", strings.Repeat("x", 100_000))
		cut := fleet.Errorf(fleet.EINVALID, "the upload did not arrive whole")
		for name, r := range map[string]io.Reader{
			"BadArchive": bytes.NewReader([]byte("not an archive at all, but long enough to be written somewhere")),
			"Cut":        io.MultiReader(bytes.NewReader(good[:len(good)/2]), errReader{cut}),
			"Cancelled":  &cancelReader{r: bytes.NewReader(good)},
		} {
			t.Run(name, func(t *testing.T) {
				ctx := ctx
				if cr, ok := r.(*cancelReader); ok {
					var cancel context.CancelFunc
					ctx, cancel = context.WithCancel(ctx)
					cr.cancel = cancel
				}
				if _, _, err := svc.UploadBundle(ctx, "acme", "b.tar.gz", r); err == nil {
					t.Fatal("the upload succeeded")
				}
				if fs := blobs.files(); len(fs) != 0 {
					t.Fatalf("files left: %v", fs)
				}
			})
		}
		if _, n, _ := svc.FindBundles(ctx, "acme", fleet.BundleFilter{Page: fleet.Page{Page: 1, Limit: 10}}); n != 0 {
			t.Fatalf("%d records left", n)
		}
		t.Run("RecordConflict", func(t *testing.T) {
			first, created, err := svc.UploadBundle(ctx, "acme", "", bytes.NewReader(good))
			if err != nil || !created {
				t.Fatalf("first upload: created %v, %v", created, err)
			}
			before := blobs.files()
			_, _, err = svc.UploadBundle(ctx, "acme", "", bytes.NewReader(bundleArchive(t, "1.0.0", "another build")))
			if fleet.ErrorCode(err) != fleet.ECONFLICT {
				t.Fatalf("another archive of the version: %v", err)
			}
			if after := blobs.files(); len(after) != len(before) {
				t.Fatalf("the refused upload left its file: %v", after)
			}
			// The same bytes again are the bundle there is: a re-run CI
			// job passes, and its copy of the archive is not kept.
			again, created, err := svc.UploadBundle(ctx, "acme", "other-name.tar.gz", bytes.NewReader(good))
			if err != nil || created || again.ID != first.ID || again.FileName != first.FileName {
				t.Fatalf("the same archive again: %+v, created %v, %v; want bundle %s", again, created, err, first.ID)
			}
			if after := blobs.files(); strings.Join(after, " ") != strings.Join(before, " ") {
				t.Fatalf("files %v, want %v", after, before)
			}
		})
	})
}

// cancelReader cancels its context halfway, as a client that goes away.
type cancelReader struct {
	r      io.Reader
	n      int
	cancel context.CancelFunc
}

func (c *cancelReader) Read(p []byte) (int, error) {
	c.n++
	if c.n == 2 {
		c.cancel()
	}
	return c.r.Read(p[:min(len(p), 1000)])
}

func TestConcurrentFileUploads(t *testing.T) {
	stores(t, func(t *testing.T, store string) {
		svc, blobs, _ := newService(t, store)
		ctx := context.Background()
		p, err := svc.CreatePendingBundle(ctx, "acme", "1.0.0", "b.tar.gz")
		if err != nil {
			t.Fatal(err)
		}
		data := bundleArchive(t, "1.0.0", strings.Repeat("y", 50_000))
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i := range errs {
			wg.Go(func() { _, errs[i] = svc.UploadBundleFile(ctx, "acme", p.ID, bytes.NewReader(data)) })
		}
		wg.Wait()
		ok := 0
		for _, err := range errs {
			switch fleet.ErrorCode(err) {
			case "":
				ok++
			case fleet.ECONFLICT:
			default:
				t.Fatalf("upload: %v", err)
			}
		}
		if ok != 1 {
			t.Fatalf("%d uploads won, want 1 (errors %v)", ok, errs)
		}
		// The winner's archive, and the component file all four carry.
		if fs := blobs.files(); len(fs) != 2 || !strings.Contains(strings.Join(fs, " "), "components/acme/") {
			t.Fatalf("files = %v, want the winner's archive and its component's file", fs)
		}
	})
}

// TestUploadSameArchiveAgain: an archive uploaded again, byte for byte,
// is the bundle of its version, on both upload paths and when the two
// uploads race; nothing is stored twice.
func TestUploadSameArchiveAgain(t *testing.T) {
	stores(t, func(t *testing.T, store string) {
		svc, blobs, _ := newService(t, store)
		ctx := context.Background()
		data := bundleArchive(t, "1.0.0", strings.Repeat("z", 50_000))

		t.Run("Racing", func(t *testing.T) {
			var wg sync.WaitGroup
			ids := make([]uuid.UUID, 4)
			created := make([]bool, 4)
			for i := range ids {
				wg.Go(func() {
					b, c, err := svc.UploadBundle(ctx, "acme", "", bytes.NewReader(data))
					if err != nil {
						t.Errorf("upload %d: %v", i, err)
						return
					}
					ids[i], created[i] = b.ID, c
				})
			}
			wg.Wait()
			n := 0
			for i := range ids {
				if ids[i] != ids[0] {
					t.Fatalf("bundles %v: want one", ids)
				}
				if created[i] {
					n++
				}
			}
			if n != 1 {
				t.Fatalf("%d uploads created the bundle, want 1", n)
			}
			if fs := blobs.files(); len(fs) != 2 {
				t.Fatalf("files = %v, want the bundle's archive and its component's file", fs)
			}
		})
		t.Run("FileOfACompletedRecord", func(t *testing.T) {
			other := bundleArchive(t, "2.0.0", "two")
			p, err := svc.CreatePendingBundle(ctx, "acme", "2.0.0", "b.tar.gz")
			if err != nil {
				t.Fatal(err)
			}
			b, err := svc.UploadBundleFile(ctx, "acme", p.ID, bytes.NewReader(other))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := svc.DeclareBundle(ctx, "acme", p.ID, fleet.Declaration{Checksum: *b.Checksum, ContentLength: *b.ContentLength, UncompressedSize: *b.UncompressedSize}); err != nil {
				t.Fatal(err)
			}
			before := blobs.files()
			again, err := svc.UploadBundleFile(ctx, "acme", p.ID, bytes.NewReader(other))
			if err != nil || again.ID != p.ID || again.UploadStatus != fleet.UploadCompleted {
				t.Fatalf("the same file again: %+v, %v", again, err)
			}
			if _, err := svc.UploadBundleFile(ctx, "acme", p.ID, bytes.NewReader(bundleArchive(t, "2.0.0", "changed"))); fleet.ErrorCode(err) != fleet.ECONFLICT {
				t.Fatalf("another file: %v", err)
			}
			if after := blobs.files(); strings.Join(after, " ") != strings.Join(before, " ") {
				t.Fatalf("files %v, want %v", after, before)
			}
		})
	})
}

func TestSignedURLs(t *testing.T) {
	svc, _, clk := newService(t, "file")
	ctx := context.Background()
	id := uuid.New()
	raw, err := svc.SignArtifactURL(ctx, "acme", id, clk.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	if u.Scheme != "https" || u.Host != "fleet.example.com" || u.Path != firmware.ArtifactPath(id) {
		t.Fatalf("URL = %s", raw)
	}
	q := u.Query()
	verify := func(tenant string, id uuid.UUID, expires, sig string) error {
		return svc.VerifyArtifactURL(ctx, tenant, id, expires, sig)
	}
	if err := verify("acme", id, q.Get("expires"), q.Get("signature")); err != nil {
		t.Fatalf("a fresh URL: %v", err)
	}
	tampered := []byte(q.Get("signature"))
	tampered[3] ^= 1
	for name, err := range map[string]error{
		"OtherTenant":     verify("beta", id, q.Get("expires"), q.Get("signature")),
		"OtherBundle":     verify("acme", uuid.New(), q.Get("expires"), q.Get("signature")),
		"LaterExpiry":     verify("acme", id, fmt.Sprint(clk.Now().Add(48*time.Hour).Unix()), q.Get("signature")),
		"TamperedSig":     verify("acme", id, q.Get("expires"), string(tampered)),
		"NotBase64":       verify("acme", id, q.Get("expires"), "***"),
		"NoSignature":     verify("acme", id, q.Get("expires"), ""),
		"ExpiresNotInt":   verify("acme", id, "soon", q.Get("signature")),
		"ShortSignature":  verify("acme", id, q.Get("expires"), q.Get("signature")[:10]),
		"SignatureSuffix": verify("acme", id, q.Get("expires"), q.Get("signature")+"AA"),
	} {
		if fleet.ErrorCode(err) != fleet.EUNAUTHENTICATED {
			t.Errorf("%s: %v, want %s", name, err, fleet.EUNAUTHENTICATED)
		}
	}
	clk.Add(time.Hour)
	err = verify("acme", id, q.Get("expires"), q.Get("signature"))
	if fleet.ErrorCode(err) != fleet.EUNAUTHENTICATED || !strings.Contains(fleet.ErrorMessage(err), "expired") {
		t.Fatalf("an expired URL: %v", err)
	}
	t.Run("SharedByReplicas", func(t *testing.T) {
		// Another Service on the same store (another replica) accepts it.
		other := &firmware.Service{Store: svc.Store, Blobs: svc.Blobs, Now: func() time.Time { return clk.Now().Add(-time.Minute) }}
		if err := other.VerifyArtifactURL(ctx, "acme", id, q.Get("expires"), q.Get("signature")); err != nil {
			t.Fatalf("another replica: %v", err)
		}
	})
	t.Run("BaseURLFromRequest", func(t *testing.T) {
		plain := &firmware.Service{Store: svc.Store, Blobs: svc.Blobs}
		raw, err := plain.SignArtifactURL(fleet.NewContextWithBaseURL(ctx, "http://10.0.0.5:8080"), "acme", id, clk.Now().Add(time.Hour))
		if err != nil || !strings.HasPrefix(raw, "http://10.0.0.5:8080/api/v1/firmware-bundles/id/") {
			t.Fatalf("URL = %s, %v", raw, err)
		}
	})
}

func TestOpenArtifact(t *testing.T) {
	stores(t, func(t *testing.T, store string) {
		svc, blobs, _ := newService(t, store)
		ctx := context.Background()
		data := bundleArchive(t, "1.0.0", "app")
		b, _, err := svc.UploadBundle(ctx, "acme", "", bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		if b.FileName != "bundle-1.0.0.tar.gz" {
			t.Fatalf("default file name = %q", b.FileName)
		}
		_, art, err := svc.OpenArtifact(ctx, "acme", b.ID)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(art)
		art.Close()
		if !bytes.Equal(got, data) {
			t.Fatal("the artifact is not the archive")
		}
		if _, _, err := svc.OpenArtifact(ctx, "beta", b.ID); fleet.ErrorCode(err) != fleet.ENOTFOUND {
			t.Fatalf("another tenant: %v", err)
		}

		// Each component's file is an object of its own, with the hashes
		// hawkBit clients check.
		b, _ = svc.FindBundle(ctx, "acme", b.ID)
		fw, comp, err := svc.OpenComponent(ctx, "acme", b.Firmwares[0].ID)
		if err != nil {
			t.Fatal(err)
		}
		got, _ = io.ReadAll(comp)
		comp.Close()
		if string(got) != "app" || fw.MD5 != fmt.Sprintf("%x", md5.Sum(got)) || fw.SHA1 != fmt.Sprintf("%x", sha1.Sum(got)) {
			t.Fatalf("component file %q, md5 %s, sha1 %s", got, fw.MD5, fw.SHA1)
		}
		if _, _, err := svc.OpenComponent(ctx, "beta", fw.ID); fleet.ErrorCode(err) != fleet.ENOTFOUND {
			t.Fatalf("another tenant's component: %v", err)
		}

		// The component versions stay when the bundle goes, and so do
		// their files.
		if err := svc.DeleteBundle(ctx, "acme", b.ID); err != nil {
			t.Fatal(err)
		}
		if fs := blobs.files(); len(fs) != 1 || !strings.Contains(fs[0], "components/acme/"+fw.Checksum) {
			t.Fatalf("files after delete: %v, want the component's only", fs)
		}
	})
}

func TestDeclareValidates(t *testing.T) {
	svc, _, _ := newService(t, "file")
	_, err := svc.DeclareBundle(context.Background(), "acme", uuid.New(), fleet.Declaration{Checksum: "nope"})
	if fleet.ErrorCode(err) != fleet.EINVALID {
		t.Fatalf("bad checksum: %v", err)
	}
}

// BenchmarkUpload streams 64 MiB archives through parsing, hashing, the
// blob store (with fsync) and the database, and reports the peak heap.
func BenchmarkUpload(b *testing.B) {
	svc, _, _ := newService(b, "file")
	ctx := context.Background()
	const size = 64 << 20
	b.SetBytes(size)
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapInuse
	var peak uint64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		pr, pw := io.Pipe()
		version := fmt.Sprintf("1.0.%d", i)
		go func() {
			src := []bundle.Source{{ComponentName: "rootfs", VersionNumber: version, FileName: "rootfs.img", Size: size, Body: io.LimitReader(zeros{}, size)}}
			pw.CloseWithError(bundle.Build(pw, version, src, false))
		}()
		if _, _, err := svc.UploadBundle(ctx, "acme", "", pr); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	close(stop)
	<-done
	b.ReportMetric(float64(peak-min(peak, base))/(1<<20), "peak-heap-MB")
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func TestCheckPublicURL(t *testing.T) {
	for _, ok := range []string{"", "https://fleet.example.com", "http://10.0.0.5:8080", "https://example.com/fleet"} {
		if err := firmware.CheckPublicURL(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"fleet.example.com", "ftp://x", "https://", "https://x/?a=b", "https://u:p@x"} {
		if err := firmware.CheckPublicURL(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestRemoveOrphans(t *testing.T) {
	stores(t, func(t *testing.T, store string) {
		svc, blobs, _ := newService(t, store)
		ctx := context.Background()
		kept, _, err := svc.UploadBundle(ctx, "acme", "", bytes.NewReader(bundleArchive(t, "1.0.0", "one")))
		if err != nil {
			t.Fatal(err)
		}
		kept, _ = svc.FindBundle(ctx, "acme", kept.ID)
		pending, err := svc.CreatePendingBundle(ctx, "acme", "2.0.0", "b.tar.gz")
		if err != nil {
			t.Fatal(err)
		}
		put := func(key string, age time.Duration) string { return blobs.put(t, key, age) }
		old := 2 * time.Hour
		orphans := []string{
			// a crash between committing the archive and writing its record
			put("bundles/acme/"+uuid.NewString()+"/"+uuid.NewString(), old),
			// between committing the archive of a pending record and attaching it
			put("bundles/acme/"+pending.ID.String()+"/"+uuid.NewString(), old),
			// a second archive of a bundle that has one
			put("bundles/acme/"+kept.ID.String()+"/"+uuid.NewString(), old),
			// another tenant's path with the bundle's id: not the bundle's
			put("bundles/beta/"+kept.ID.String()+"/"+uuid.NewString(), old),
		}
		young := put("bundles/acme/"+uuid.NewString()+"/"+uuid.NewString(), time.Minute)
		foreign := put("bundles/notes.txt", old)
		notAnID := put("bundles/acme/not-a-uuid/"+uuid.NewString(), old)
		blobs.age[kept.BlobKey] = old

		n, err := svc.RemoveOrphans(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n != len(orphans) {
			t.Errorf("removed %d archives, want %d", n, len(orphans))
		}
		for _, key := range orphans {
			if _, err := svc.Blobs.Open(ctx, key); err != blob.ErrNotFound {
				t.Errorf("orphan %s: Open = %v, want it gone", key, err)
			}
		}
		for _, key := range []string{kept.BlobKey, young, foreign, notAnID} {
			o, err := svc.Blobs.Open(ctx, key)
			if err != nil {
				t.Errorf("%s was removed: %v", key, err)
				continue
			}
			o.Close()
		}
		if n, err := svc.RemoveOrphans(ctx); err != nil || n != 0 {
			t.Errorf("second pass removed %d (%v), want 0", n, err)
		}
	})
}

// failingDelete is a blob store whose deletions of the keys in fail fail,
// as on a read-only file system.
type failingDelete struct {
	blob.Store
	fail map[string]bool
}

func (f failingDelete) Delete(ctx context.Context, key string) error {
	if f.fail[key] {
		return errors.New("read-only file system")
	}
	return f.Store.Delete(ctx, key)
}

// failingFind is a firmware store whose reads of bundles fail.
type failingFind struct{ fleet.FirmwareStore }

func (failingFind) FindBundle(context.Context, string, uuid.UUID) (*fleet.Bundle, error) {
	return nil, errors.New("database unreachable")
}

func TestRemoveOrphansReportsFailures(t *testing.T) {
	stores(t, func(t *testing.T, store string) {
		svc, blobs, _ := newService(t, store)
		ctx := context.Background()
		orphan := func() string {
			return blobs.put(t, "bundles/acme/"+uuid.NewString()+"/"+uuid.NewString(), 2*firmware.OrphanGrace)
		}
		stuck, removable := orphan(), orphan()

		svc.Blobs = failingDelete{blobs.aged, map[string]bool{stuck: true}}
		n, err := svc.RemoveOrphans(ctx)
		if err == nil || !strings.Contains(err.Error(), stuck) || n != 1 {
			t.Fatalf("RemoveOrphans = %d, %v; want the other removed and the failure named", n, err)
		}
		if _, err := blobs.Open(ctx, removable); err != blob.ErrNotFound {
			t.Fatalf("the orphan after a failed deletion: Open = %v, want it gone", err)
		}

		db := svc.Store
		svc.Store = failingFind{db}
		if n, err := svc.RemoveOrphans(ctx); err == nil || n != 0 {
			t.Fatalf("RemoveOrphans with the store down = %d, %v; want its error and nothing removed", n, err)
		}
		svc.Store = db

		cancelled, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := svc.RemoveOrphans(cancelled); !errors.Is(err, context.Canceled) {
			t.Fatalf("RemoveOrphans with a cancelled context = %v", err)
		}
	})
}

// TestRunOrphanRemoval checks that the loop removes an orphan and ends
// with its context.
func TestRunOrphanRemoval(t *testing.T) {
	stores(t, func(t *testing.T, store string) {
		svc, blobs, _ := newService(t, store)
		ctx, cancel := context.WithCancel(context.Background())
		key := blobs.put(t, "bundles/acme/"+uuid.NewString()+"/"+uuid.NewString(), 2*firmware.OrphanGrace)
		done := make(chan struct{})
		go func() { svc.RunOrphanRemoval(ctx, time.Millisecond); close(done) }()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			if _, err := svc.Blobs.Open(ctx, key); err == blob.ErrNotFound {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the orphan was not removed")
			}
		}
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("RunOrphanRemoval did not end with its context")
		}
	})
}

// errReader fails every read with err.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// TestParsingBounded: beyond MaxParsing, an upload waits for a turn before
// anything of it is parsed (docs/reliability.md#smaller-bounds; at 10129e9
// uploads were parsed all at once, each inflating as it pleased).
func TestParsingBounded(t *testing.T) {
	svc, _, _ := newService(t, "file")
	svc.MaxParsing = 1
	good := bundleArchive(t, "1.0.0", strings.Repeat("x", 100_000))
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { _, _, err := svc.UploadBundle(context.Background(), "acme", "a.tar.gz", pr); done <- err }()
	if _, err := pw.Write(good[:10]); err != nil { // read: the first upload holds the slot
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, _, err := svc.UploadBundle(ctx, "acme", "b.tar.gz", bytes.NewReader(bundleArchive(t, "2.0.0", "y"))); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second upload: %v; want it to wait for the first", err)
	}
	pw.Write(good[10:])
	pw.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, _, err := svc.UploadBundle(context.Background(), "acme", "b.tar.gz", bytes.NewReader(bundleArchive(t, "2.0.0", "y"))); err != nil {
		t.Fatalf("after the first: %v", err)
	}
}
