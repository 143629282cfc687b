package blob_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/blob"
)

// testStore is the behaviour every Store must have: TestDir and TestS3 run
// it.
func testStore(t *testing.T, s blob.Store) {
	ctx := context.Background()
	t.Run("InvisibleUntilCommit", func(t *testing.T) {
		p, err := s.Put(ctx, "a/one", strings.NewReader("hello"))
		if err != nil {
			t.Fatal(err)
		}
		if p.Size() != 5 {
			t.Fatalf("Size = %d", p.Size())
		}
		if _, err := s.Open(ctx, "a/one"); !errors.Is(err, blob.ErrNotFound) {
			t.Fatalf("Open before Commit: %v, want ErrNotFound", err)
		}
		if err := p.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		o, err := s.Open(ctx, "a/one")
		if err != nil {
			t.Fatal(err)
		}
		defer o.Close()
		if o.Size() != 5 {
			t.Fatalf("object Size = %d", o.Size())
		}
		o.Seek(1, io.SeekStart)
		b, _ := io.ReadAll(o)
		if string(b) != "ello" {
			t.Fatalf("read after seek = %q", b)
		}
	})
	t.Run("Abort", func(t *testing.T) {
		p, err := s.Put(ctx, "a/two", strings.NewReader("bye"))
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Abort(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Open(ctx, "a/two"); !errors.Is(err, blob.ErrNotFound) {
			t.Fatalf("Open after Abort: %v", err)
		}
	})
	t.Run("ReaderError", func(t *testing.T) {
		cut := errors.New("connection cut")
		_, err := s.Put(ctx, "a/three", io.MultiReader(strings.NewReader("part"), errReader{cut}))
		if !errors.Is(err, cut) {
			t.Fatalf("Put = %v, want the reader's error", err)
		}
	})
	t.Run("Walk", func(t *testing.T) {
		for _, k := range []string{"a/b/c", "other/x"} {
			p, err := s.Put(ctx, k, strings.NewReader(k))
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			defer s.Delete(ctx, k)
		}
		pending, err := s.Put(ctx, "a/pending", strings.NewReader("not yet"))
		if err != nil {
			t.Fatal(err)
		}
		defer pending.Abort(ctx)
		var keys []string
		err = s.Walk(ctx, "a", func(key string, mod time.Time) error {
			if time.Since(mod) > time.Hour || time.Until(mod) > time.Hour {
				t.Errorf("%s: modification time %v", key, mod)
			}
			keys = append(keys, key)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if strings.Join(keys, " ") != "a/b/c a/one" {
			t.Fatalf("Walk(a) = %q, want the committed objects under a/ only", keys)
		}
		if err := s.Walk(ctx, "nothing/here", func(string, time.Time) error { return errors.New("called") }); err != nil {
			t.Fatalf("Walk of an empty prefix = %v", err)
		}
		stop := errors.New("stop")
		n := 0
		err = s.Walk(ctx, "a", func(string, time.Time) error { n++; return stop })
		if !errors.Is(err, stop) || n != 1 {
			t.Fatalf("Walk after fn's error = %v after %d calls, want fn's error after 1", err, n)
		}
		if err := s.Walk(ctx, "../x", func(string, time.Time) error { return nil }); err == nil {
			t.Fatal("Walk(../x) succeeded")
		}
	})
	t.Run("Delete", func(t *testing.T) {
		if err := s.Delete(ctx, "a/one"); err != nil {
			t.Fatal(err)
		}
		if err := s.Delete(ctx, "a/one"); !errors.Is(err, blob.ErrNotFound) {
			t.Fatalf("second Delete = %v", err)
		}
	})
	t.Run("BelowAnObject", func(t *testing.T) {
		// a/b/c is an object: nothing is below it.
		if _, err := s.Open(ctx, "a/b/c/d"); !errors.Is(err, blob.ErrNotFound) {
			t.Fatalf("Open below an object = %v", err)
		}
		if err := s.Delete(ctx, "a/b/c/d"); !errors.Is(err, blob.ErrNotFound) {
			t.Fatalf("Delete below an object = %v", err)
		}
	})
	t.Run("InvalidKeys", func(t *testing.T) {
		for _, k := range []string{"", "../x", "a/../../x", "/abs", "a//b", ".hidden"} {
			if _, err := s.Put(ctx, k, strings.NewReader("x")); err == nil {
				t.Errorf("Put(%q) succeeded", k)
			}
		}
	})
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

func TestDir(t *testing.T) {
	root := t.TempDir()
	d, err := blob.OpenDir(root)
	if err != nil {
		t.Fatal(err)
	}
	testStore(t, d)
	// Nothing but committed objects remains: no temporary file of the
	// aborted or failed puts.
	var files []string
	filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err == nil && !e.IsDir() {
			files = append(files, path)
		}
		return nil
	})
	if len(files) != 0 {
		t.Fatalf("files left behind: %v", files)
	}
}

func TestDirMakesNothingUntilUsed(t *testing.T) {
	root := filepath.Join(t.TempDir(), "data")
	if _, err := blob.OpenDir(root); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(root); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("OpenDir made %s: %v", root, err)
	}
}

func TestDirRemovesStaleTemporaryFiles(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, ".tmp"), 0o755)
	stale := filepath.Join(root, ".tmp", "put-crashed")
	os.WriteFile(stale, bytes.Repeat([]byte("x"), 10), 0o644)
	old := filepath.Join(root, ".tmp")
	long := timeAgo(48)
	os.Chtimes(stale, long, long)
	fresh := filepath.Join(old, "put-in-progress")
	os.WriteFile(fresh, nil, 0o644)
	if _, err := blob.OpenDir(root); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a stale temporary file survived: %v", err)
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("a fresh temporary file was removed: %v", err)
	}
}

func timeAgo(hours int) time.Time { return time.Now().Add(-time.Duration(hours) * time.Hour) }
