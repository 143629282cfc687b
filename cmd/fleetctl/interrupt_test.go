//go:build linux

package main

import (
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestSecondInterruptExits interrupts fleetctl ssh whose session fleetd
// does not end: a proxy before fleetd swallows the half-close, and the
// device never dials back. The first interrupt leaves fleetctl its few
// seconds' patience; a second ends it at once, by the signal (docs/cli.md).
func TestSecondInterruptExits(t *testing.T) {
	s := fleetdtest.Start(t, sqlstoretest.Backends()[0], "--remote-connect-timeout", "1m")
	admin := s.Admin()
	s.MustDevice(t, admin, "edge-off", nil)
	bin := filepath.Join(t.TempDir(), "fleetctl")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	u, err := url.Parse(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	// The proxy passes each way's bytes, but not the client's end.
	proxy := fleetdtest.DeviceService(t, func(c net.Conn) {
		up, err := net.Dial("tcp", u.Host)
		if err != nil {
			return
		}
		defer up.Close()
		go io.Copy(up, c)
		io.Copy(c, up)
	})
	cmd := exec.Command(bin, "ssh", "edge-off", "--", "cat")
	cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+t.TempDir(), "FLEETCTL_URL=http://"+proxy,
		"FLEETCTL_TENANT="+admin.Tenant, "FLEETCTL_API_KEY="+admin.Key)
	stdin, err := cmd.StdinPipe() // held open: the session's stdin never ends
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer cmd.Process.Kill()
	fleetdtest.Eventually(t, "the session to open", func() bool {
		var list struct{ Count int }
		s.Do(t, admin, "GET", "/api/v1/devices/edge-off/remote-sessions?open=true", nil).Want(t, 200).Decode(t, &list)
		return list.Count == 1
	})
	fleetdtest.Eventually(t, "the operator's leg to join", func() bool {
		return fleetdtest.MetricSum(t, s.URL, "fleetd_remote_legs_total", `side="operator"`) == 1
	})
	cmd.Process.Signal(os.Interrupt)
	select {
	case err := <-done:
		t.Fatalf("fleetctl ended at the first interrupt, while its session is still open: %v", err)
	case <-time.After(time.Second):
	}
	cmd.Process.Signal(os.Interrupt)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("fleetctl still runs 10s after a second interrupt")
	}
	ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGINT {
		t.Fatalf("after the second interrupt fleetctl ended otherwise than by it: %v", cmd.ProcessState)
	}
}
