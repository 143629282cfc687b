package blob_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/blob"
	"github.com/fleetd/fleet/blob/s3test"
	"github.com/minio/minio-go/v7"
)

func TestS3(t *testing.T) {
	srv := s3test.Start(t)
	testStore(t, srv.Store(t))
	// Nothing but committed objects remains: no object, and no multipart
	// upload of the aborted or failed puts.
	c := srv.Client(t)
	ctx := context.Background()
	for o := range c.ListObjects(ctx, srv.Bucket, minio.ListObjectsOptions{Recursive: true}) {
		t.Errorf("object left behind: %s %v", o.Key, o.Err)
	}
	for u := range c.ListIncompleteUploads(ctx, srv.Bucket, "", true) {
		t.Errorf("upload left behind: %s %v", u.Key, u.Err)
	}
}

// TestS3Parts puts an object of several parts and reads it back from
// offsets inside and across them, as ranged downloads do.
func TestS3Parts(t *testing.T) {
	srv := s3test.Start(t)
	s := srv.Store(t)
	ctx := context.Background()
	data := make([]byte, 12<<20+123) // three parts of 5 MiB, the last short
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	p, err := s.Put(ctx, "big/one", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if p.Size() != int64(len(data)) {
		t.Fatalf("Size = %d, want %d", p.Size(), len(data))
	}
	if err := p.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	o, err := s.Open(ctx, "big/one")
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if o.Size() != int64(len(data)) {
		t.Fatalf("object Size = %d", o.Size())
	}
	for _, r := range []struct{ off, n int64 }{
		{0, 100}, {5<<20 - 10, 20}, {7 << 20, 6 << 20}, {int64(len(data)) - 1, 1}, {3, 4},
	} {
		if _, err := o.Seek(r.off, io.SeekStart); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(io.LimitReader(o, r.n))
		end := min(r.off+r.n, int64(len(data)))
		if err != nil || !bytes.Equal(got, data[r.off:end]) {
			t.Fatalf("bytes %d+%d: %d bytes, err %v; not the object's", r.off, r.n, len(got), err)
		}
	}
	if n, err := o.Seek(0, io.SeekEnd); err != nil || n != int64(len(data)) {
		t.Fatalf("Seek(0, end) = %d, %v", n, err)
	}
	if n, err := o.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("Read at the end = %d, %v", n, err)
	}
	o.Seek(0, io.SeekStart)
	all, err := io.ReadAll(o)
	if err != nil || !bytes.Equal(all, data) {
		t.Fatalf("whole object: %d bytes, %v", len(all), err)
	}
}

// TestS3Reader cuts an upload after its first part went out: the upload is
// aborted, and its part with it.
func TestS3CutAfterAPart(t *testing.T) {
	srv := s3test.Start(t)
	s := srv.Store(t)
	ctx := context.Background()
	cut := errors.New("cut")
	_, err := s.Put(ctx, "big/cut", io.MultiReader(bytes.NewReader(make([]byte, 6<<20)), errReader{cut}))
	if !errors.Is(err, cut) {
		t.Fatalf("Put = %v, want the reader's error", err)
	}
	for u := range srv.Client(t).ListIncompleteUploads(ctx, srv.Bucket, "", true) {
		t.Errorf("upload left behind: %s %v", u.Key, u.Err)
	}
}

func TestParseS3URL(t *testing.T) {
	env := func(k string) string {
		return map[string]string{"AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK", "AWS_REGION": "eu-west-1"}[k]
	}
	c, err := blob.ParseS3URL("s3://firmware/fleetd/prod?endpoint=http://127.0.0.1:7070&path_style=true&part_size=16777216&presign=15m", env)
	if err != nil {
		t.Fatal(err)
	}
	want := blob.S3Config{Bucket: "firmware", Prefix: "fleetd/prod", Endpoint: "http://127.0.0.1:7070", Region: "eu-west-1",
		PathStyle: true, PartSize: 16 << 20, Presign: 15 * time.Minute, AccessKey: "AK", SecretKey: "SK"}
	if c != want {
		t.Fatalf("got %+v\nwant %+v", c, want)
	}
	for _, bad := range []string{
		"s3://", "http://bucket/x", "s3://b/../x", "s3://b/p?endpoint=ftp://h", "s3://b/p?endpoint=http://h/path",
		"s3://b/p?path_style=maybe", "s3://b/p?part_size=1024", "s3://b/p?colour=blue", "s3://b/p?presign=8d", "s3://b/p?presign=soon",
	} {
		if _, err := blob.ParseS3URL(bad, env); err == nil {
			t.Errorf("ParseS3URL(%q) succeeded", bad)
		} else if !strings.Contains(err.Error(), "s3://") && !strings.Contains(err.Error(), bad) {
			t.Errorf("ParseS3URL(%q) = %v, which does not name the value", bad, err)
		}
	}
}
