package agent

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestDownloadResumes: a download cut halfway continues with Range and
// If-Range from what the file holds, and the whole is checked.
func TestDownloadResumes(t *testing.T) {
	body := bytes.Repeat([]byte("firmware "), 100_000)
	sum := sha256.Sum256(body)
	checksum := hex.EncodeToString(sum[:])
	var mu sync.Mutex
	var ranges []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		ranges = append(ranges, r.Header.Get("Range")+" "+r.Header.Get("If-Range"))
		first := len(ranges) == 1
		mu.Unlock()
		if first { // half of it, then the connection drops
			w.Header().Set("Content-Length", "900000")
			w.WriteHeader(200)
			w.Write(body[:len(body)/2])
			w.(http.Flusher).Flush()
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
			return
		}
		w.Header().Set("ETag", `"`+checksum+`"`)
		http.ServeContent(w, r, "fw", time.Time{}, bytes.NewReader(body))
	}))
	defer srv.Close()

	a := testAgent(t)
	p := firmwarePayload{URL: srv.URL, Checksum: checksum, ContentLength: int64(len(body))}
	file := filepath.Join(t.TempDir(), "fw")
	if err := a.download(t.Context(), "1", p, file); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(file); !bytes.Equal(got, body) {
		t.Errorf("downloaded %d bytes, not the body", len(got))
	}
	if len(ranges) != 2 || ranges[1] != "bytes=450000- \""+checksum+"\"" {
		t.Errorf("requests: %q", ranges)
	}

	// A file whose bytes are wrong is fetched again whole, once, then fails.
	p.Checksum = strings.Repeat("0", 64)
	os.Remove(file)
	err := a.download(t.Context(), "2", p, file)
	if err == nil || !strings.Contains(err.Error(), "checksum mismatch") {
		t.Errorf("err = %v", err)
	}
}

// testAgent is an agent whose reports go nowhere.
func testAgent(t *testing.T) *Agent {
	a := &Agent{cfg: &Config{}, log: slog.New(slog.NewTextHandler(io.Discard, nil)), now: time.Now,
		running: map[string]*run{}, seen: newRecent(4), reports: make(chan outgoing, 1000)}
	stopped := make(chan struct{})
	t.Cleanup(func() { close(stopped) })
	a.stopped = stopped
	return a
}
