package main

import (
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

// TestMosquittoBaseline runs the MQTT baseline as mqtt-status runs it: a
// real Mosquitto on a free port, real paho clients publishing status
// reports at QoS 1, each waiting for its PUBACK.
func TestMosquittoBaseline(t *testing.T) {
	r := &runner{o: &options{duration: 500 * time.Millisecond}, sz: sizes{warmup: 100 * time.Millisecond},
		t: &target{tenant: "bench"}, dir: t.TempDir(), p: &progress{w: io.Discard, start: time.Now()}, rep: &report{}}
	toks := []deviceToken{{ID: "d1", Token: "x"}, {ID: "d2", Token: "y"}, {ID: "d3", Token: "z"}}
	unmeasured, err := r.mosquittoBaseline(context.Background(), toks, 42)
	if err != nil {
		t.Fatal(err)
	}
	if unmeasured != "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("under CI: %s", unmeasured)
		}
		t.Skip(unmeasured)
	}
	b := r.rep.baselines["mosquitto"]
	if b == nil || b.Value <= 0 || !strings.Contains(b.Name, "Mosquitto 2.") || !strings.Contains(b.Name, "the same 3 clients") {
		t.Fatalf("baseline %+v", b)
	}
	// Measured once a run: a second call keeps the first figure.
	if _, err := r.mosquittoBaseline(context.Background(), toks, 42); err != nil || r.rep.baselines["mosquitto"] != b || len(r.rep.Figures) != 1 {
		t.Errorf("second call: %v, %d figures", err, len(r.rep.Figures))
	}
}
