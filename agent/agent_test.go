package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"testing"

	"github.com/fleetd/fleet/mqtt/broker"
	"github.com/fleetd/fleet/mqtt/mqtttest"
)

// TestReportsPublishedOnce runs the agent against fleetd's own broker and
// checks that each status report reaches fleetd once: a report fleetd
// acknowledged is not published again.
func TestReportsPublishedOnce(t *testing.T) {
	h := mqtttest.NewHandler()
	s := broker.NewServer(broker.Config{Addr: "127.0.0.1:0"}, h)
	if err := s.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	const actions = 8
	for id := int64(1); id <= actions; id++ {
		h.Queue("acme/dev-1", id, mqtttest.Message(id)) // "x": no program, so Received then Failed
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int)
	go func() {
		getenv := func(k string) string {
			if k == tokenEnv {
				return "tok-1"
			}
			return ""
		}
		done <- Run(ctx, []string{"--mqtt-addr", s.Addr().String(), "--tenant", "acme", "--device", "dev-1", "--actions-dir", t.TempDir()}, getenv, io.Discard, t.Output())
	}()
	t.Cleanup(func() { cancel(); <-done })

	seen := map[string]int{}
	final := 0
	for final < actions {
		c := mqtttest.Receive(t, h.Statuses, "a status report")
		var r struct {
			ID    string `json:"action_id"`
			State string `json:"state"`
		}
		if err := json.Unmarshal(c.Payload, &r); err != nil {
			t.Fatalf("report %s: %v", c.Payload, err)
		}
		k := fmt.Sprintf("%s %s", r.ID, r.State)
		if seen[k]++; seen[k] > 1 {
			t.Fatalf("report %q published again after fleetd acknowledged it", k)
		}
		if r.State == "Failed" {
			final++
		}
	}
	// A republished report would follow within the first retry's wait.
	mqtttest.Quiet(t, h.Statuses, "a status report published again")
}
