package bundle_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/firmware/bundle"
)

// TestOpenDownload: a resumed download gets the rest of the archive it
// started, the whole of one that changed, and a message it can show for
// an answer that is not the archive, final unless the server failed.
func TestOpenDownload(t *testing.T) {
	archive := []byte("0123456789abcdefghij")
	checksum := "AB12"
	mux := http.NewServeMux()
	mux.HandleFunc("/bundle", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("ETag", `"ab12"`)
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(archive))
	})
	mux.HandleFunc("/gone", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, `{"message":"the URL's signature has expired"}`)
	})
	mux.HandleFunc("/down", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "  storage unavailable ", http.StatusServiceUnavailable)
	})
	mux.HandleFunc("/elsewhere", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Range", "bytes 0-19/20")
		w.WriteHeader(http.StatusPartialContent)
		w.Write(archive)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	ctx := context.Background()

	read := func(url, sum string, offset int64) (string, int64) {
		t.Helper()
		body, from, err := bundle.OpenDownload(ctx, srv.URL+url, sum, offset)
		if err != nil {
			t.Fatal(err)
		}
		defer body.Close()
		b, _ := io.ReadAll(body)
		return string(b), from
	}
	if got, from := read("/bundle", checksum, 0); got != string(archive) || from != 0 {
		t.Fatalf("whole: %q from %d", got, from)
	}
	if got, from := read("/bundle", checksum, 12); got != string(archive[12:]) || from != 12 {
		t.Fatalf("resumed: %q from %d", got, from)
	}
	if got, from := read("/bundle", "cd34", 12); got != string(archive) || from != 0 {
		t.Fatalf("changed archive: %q from %d, want it whole from 0", got, from)
	}
	_, _, err := bundle.OpenDownload(ctx, srv.URL+"/gone", checksum, 0)
	if !errors.Is(err, bundle.ErrFinal) || !strings.Contains(err.Error(), "404 Not Found: the URL's signature has expired") {
		t.Fatalf("404: %v", err)
	}
	_, _, err = bundle.OpenDownload(ctx, srv.URL+"/elsewhere", checksum, 12)
	if !errors.Is(err, bundle.ErrFinal) || !strings.Contains(err.Error(), `from byte 12, the server sent Content-Range "bytes 0-19/20"`) {
		t.Fatalf("a 206 from another byte: %v", err)
	}
	_, _, err = bundle.OpenDownload(ctx, srv.URL+"/down", checksum, 5)
	if err == nil || errors.Is(err, bundle.ErrFinal) || !strings.HasSuffix(err.Error(), ": storage unavailable") {
		t.Fatalf("503: %v, want an error worth another attempt", err)
	}
}
