package mosquittotest

import (
	"errors"
	"net"
	"path/filepath"
	"testing"

	"github.com/fleetd/fleet/internal/loopback"
)

// TestPortTaken: a broker told a port another process took since it was
// chosen says so, so that Start tries another, instead of taking the other
// process's answers for its own (as a dial of the port did).
func TestPortTaken(t *testing.T) {
	bin := binary(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // the other process answers, as a broker would accept
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	dir := t.TempDir()
	b := &Broker{conf: filepath.Join(dir, "mosquitto.conf"), log: filepath.Join(dir, "mosquitto.log")}
	if err := b.configure(dir, []int{ln.Addr().(*net.TCPAddr).Port}, nil); err != nil {
		t.Fatal(err)
	}
	err = b.start(bin)
	defer b.stop()
	if !errors.Is(err, loopback.ErrPortTaken) {
		t.Fatalf("start on a taken port: %v, want loopback.ErrPortTaken", err)
	}
}

// TestStartAndRestart: a broker starts on a free port and restarts on it.
func TestStartAndRestart(t *testing.T) {
	b := Start(t)
	b.Restart(t)
	c, err := net.Dial("tcp", b.Addr)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}
