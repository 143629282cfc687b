package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// simRun is `fleetd sim` running in the background.
type simRun struct {
	cancel context.CancelFunc
	done   chan error
	out    *lockedBuffer
}

func (s *testServer) startSim(t *testing.T, args ...string) *simRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &simRun{cancel: cancel, done: make(chan error, 1), out: &lockedBuffer{}}
	args = append([]string{"sim", "--mqtt-addr", s.MQTTAddr, "--report-interval", "20ms", "--step", "5ms"}, args...)
	go func() { r.done <- run(ctx, args, noEnv, strings.NewReader(""), r.out, r.out) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop interrupts the simulator, which must end cleanly.
func (r *simRun) stop(t *testing.T) {
	t.Helper()
	if r.cancel == nil {
		return
	}
	r.cancel()
	r.cancel = nil
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("fleetd sim: %v\n%s", err, r.out)
		}
	case <-time.After(bound):
		t.Errorf("fleetd sim did not stop; output:\n%s", r.out)
	}
}

// connected waits for the progress line that says all n are connected.
func (r *simRun) connected(t *testing.T, n int) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d simulated devices to connect; output:\n%s", n, r.out), func() bool {
		return strings.Contains(r.out.String(), fmt.Sprintf("connected=%d/%d", n, n))
	})
}

func TestSimulator(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := startServer(t, b)
		admin := s.admin()
		tokens := filepath.Join(t.TempDir(), "tokens.csv")

		sim := s.startSim(t, "--devices", "4", "--provision", "--url", s.URL, "--api-key", admin.Key,
			"--tokens", tokens, "--prefix", "sim-", "--telemetry-interval", "20ms", "--stream", "env")
		sim.connected(t, 4)
		written, err := os.ReadFile(tokens)
		if err != nil || strings.Count(string(written), "\n") != 4 || !strings.HasPrefix(string(written), "sim-00001,fdt_") {
			t.Fatalf("tokens file: %q, %v", written, err)
		}

		id := s.dispatch(t, admin, map[string]any{"action": "reboot", "params": map[string]any{}, "search_type": "search", "search_query": "sim-"})
		eventually(t, "the simulated devices to complete the action", func() bool {
			return s.action(t, admin, id).Statuses["Completed"] == 4
		})
		da := s.deviceAction(t, admin, "sim-00003", id)
		if da.Status != "Completed" || da.Progress != 100 {
			t.Fatalf("sim-00003's record = %+v", da)
		}
		// Telemetry reaches the stream.
		eventually(t, "a telemetry point", func() bool {
			return s.do(t, admin, "GET", "/api/v1/devices/sim-00002/streams/env/latest", nil).Status == 200
		})

		// A long action, cancelled while it runs.
		sim.stop(t)
		slow := s.startSim(t, "--devices", "2", "--tokens", tokens, "--step", "1s", "--telemetry-interval", "0")
		slow.connected(t, 2)
		id = s.dispatch(t, admin, map[string]any{"action": "long", "params": map[string]any{}, "search_type": "default", "device_ids": []string{"sim-00001"}})
		s.awaitActionStatus(t, admin, "sim-00001", id, "Progress")
		s.do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/cancel", id), nil).want(t, 204)
		var list struct {
			Actions []actionBody `json:"actions"`
		}
		eventually(t, "the device to complete the cancel_action", func() bool {
			s.do(t, admin, "GET", "/api/v1/actions?action=cancel_action", nil).want(t, 200).decode(t, &list)
			return len(list.Actions) == 1 && list.Actions[0].Statuses["Completed"] == 1
		})
		slow.stop(t)

		// Every action fails with --fail-rate 1, and says why. --tokens
		// alone runs every device in the file.
		failing := s.startSim(t, "--tokens", tokens, "--fail-rate", "1", "--telemetry-interval", "0")
		failing.connected(t, 4)
		id = s.dispatch(t, admin, map[string]any{"action": "doomed", "params": map[string]any{}, "search_type": "search", "search_query": "sim-"})
		eventually(t, "the simulated devices to fail the action", func() bool {
			return s.action(t, admin, id).Statuses["Failed"] == 4
		})
		if da := s.deviceAction(t, admin, "sim-00004", id); len(da.Errors["Failed"]) != 1 {
			t.Fatalf("sim-00004's record = %+v", da)
		}
		failing.stop(t)
		if out := failing.out.String(); !strings.Contains(out, "failed=4") {
			t.Fatalf("the last progress line does not count the failures:\n%s", out)
		}
	})
}

func TestSimulatorFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--devices", "-1", "--tokens", "x"}, "--devices"},
		{[]string{"--devices", "1"}, "--provision, or --tokens"},
		{[]string{"--provision"}, "--api-key"},
		{[]string{"--tokens", "x", "--fail-rate", "2"}, "--fail-rate"},
		{[]string{"--tokens", "/nonexistent/tokens"}, "--tokens"},
		{[]string{"--tokens", "x", "--tenant", "Bad"}, "--tenant"},
	} {
		var out lockedBuffer
		err := run(context.Background(), append([]string{"sim"}, tc.args...), noEnv, strings.NewReader(""), &out, &out)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("fleetd sim %s: %v, want an error about %s", strings.Join(tc.args, " "), err, tc.want)
		}
	}
}
