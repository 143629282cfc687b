package ctl

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/remote"
)

// TestCpGetTakesWhatWasAnnounced: a device (or a fleetd) that announces a
// file's size and sends more is refused at the first byte past it, and
// nothing is left on fleetctl's disk: a device cannot fill it.
func TestCpGetTakesWhatWasAnnounced(t *testing.T) {
	const announced = 4
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "POST" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			json.NewEncoder(w).Encode(fleet.RemoteSession{ID: "s1", Kind: fleet.RemoteGet})
			return
		}
		c, err := remote.Upgrade(w, r)
		if err != nil {
			return
		}
		defer c.Close()
		c.Send(remote.Control{Type: remote.TypeFile, Size: announced})
		for range 64 { // 2 MiB where 4 bytes were announced
			if c.Write([]byte(strings.Repeat("x", remote.MaxMessage))) != nil {
				return
			}
		}
		c.Send(remote.Control{Type: remote.TypeEOF})
		c.Read()
	}))
	defer srv.Close()
	cl, err := newClient(target{URL: srv.URL, Tenant: "acme", APIKey: "fk_x"})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	a := &app{client: cl, env: Env{Getenv: func(string) string { return "" }}}
	err = a.cpGet(context.Background(), "pump-1", "/etc/motd", filepath.Join(dir, "motd"))
	if err == nil || !strings.Contains(err.Error(), "more than the 4 bytes") {
		t.Fatalf("cp got %v, want refused for the bytes past the 4 announced", err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Fatalf("left behind: %v", left)
	}
}

// TestFinishStopsTheInterruptWatch: a session finished lets go of the
// command's context (openRemote's watch for an interrupt), so that a long
// fleetctl forward does not hold every session it finished until it exits.
func TestFinishStopsTheInterruptWatch(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "POST" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			json.NewEncoder(w).Encode(fleet.RemoteSession{ID: "s1", Kind: fleet.RemoteForward})
			return
		}
		c, err := remote.Upgrade(w, r)
		if err != nil {
			return
		}
		defer c.Close()
		for {
			if _, _, err := c.ReadRaw(); err != nil {
				return
			}
		}
	}))
	defer srv.Close()
	cl, err := newClient(target{URL: srv.URL, Tenant: "acme", APIKey: "fk_x"})
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	a := &app{client: cl, env: Env{Getenv: func(string) string { return "1" }, Stderr: &stderr}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 3 {
		conn, err := a.openRemote(ctx, "pump-1", fleet.RemoteForward, "22")
		if err != nil {
			t.Fatal(err)
		}
		a.finish(conn)
		if conn.stop() {
			t.Fatal("the session's watch on the command's context outlived it")
		}
	}
	if stderr.Len() != 0 {
		t.Fatalf("stderr: %s", stderr.String())
	}
}
