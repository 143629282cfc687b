package main

import (
	"io"
	"testing"
)

// TestAddrWatcher reads the addresses fleetd says it listens on from its
// two outputs, written in pieces that split lines, as a pipe delivers them.
func TestAddrWatcher(t *testing.T) {
	a := newAddrWatcher()
	stdout, stderr := a.stream(), a.stream()
	write := func(w io.Writer, s string) {
		if _, err := io.WriteString(w, s); err != nil {
			t.Fatal(err)
		}
	}
	write(stderr, `time=2026-11-26T06:00:00Z level=WARN msg="serving runtime profiles; do not expose this address" pprof_a`)
	write(stdout, "fleetd: listening http=127.0.0.1:40001 mq")
	write(stderr, "ddr=127.0.0.1:40003\ntime=2026-11-26T06:00:00Z level=WARN msg=other http=10.0.0.1:1\n")
	select {
	case <-a.found:
		t.Fatal("found before fleetd said where its HTTP server listens")
	default:
	}
	write(stdout, "tt=127.0.0.1:40002\n")
	select {
	case <-a.found:
	default:
		t.Fatal("not found once fleetd said all three")
	}
	if got, want := [3]string{a.http, a.mqtt, a.pprof}, [3]string{"127.0.0.1:40001", "127.0.0.1:40002", "127.0.0.1:40003"}; got != want {
		t.Errorf("addresses %q, want %q", got, want)
	}
}
