package s3test

import (
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/fleetd/fleet/internal/loopback"
)

// TestPortTaken: a server told a port another process took since it was
// chosen says so, so that Start tries another, instead of taking the other
// process's answers for its own (as any HTTP answer was taken).
func TestPortTaken(t *testing.T) {
	bin, err := binary()
	if err != nil {
		t.Skip(err)
	}
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer other.Close()
	port := other.Listener.Addr().(*net.TCPAddr).Port
	s := &Server{AccessKey: "fleetd-test", SecretKey: "fleetd-test-secret", Dir: t.TempDir()}
	if err := s.start(t, bin, port, filepath.Join(t.TempDir(), "versitygw.log")); !errors.Is(err, loopback.ErrPortTaken) {
		t.Fatalf("start on a taken port: %v, want loopback.ErrPortTaken", err)
	}
}
