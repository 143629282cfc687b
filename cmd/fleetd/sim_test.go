package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/mqtt/mosquittotest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// simRun is `fleetd sim` running in the background.
type simRun struct {
	cancel context.CancelFunc
	done   chan error
	out    *LockedBuffer
}

func (s *testServer) startSim(t *testing.T, args ...string) *simRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &simRun{cancel: cancel, done: make(chan error, 1), out: &LockedBuffer{}}
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

// connected waits for the progress line that says all n are connected:
// for up to four times the usual bound, since the simulator provisions and
// connects its devices in another process's worth of goroutines, which a
// loaded machine runs last (15 s was seen to fall short at load 25).
func (r *simRun) connected(t *testing.T, n int) {
	t.Helper()
	eventuallyWithin(t, 4*bound, fmt.Sprintf("%d simulated devices to connect; output:\n%s", n, r.out), func() bool {
		return strings.Contains(r.out.String(), fmt.Sprintf("connected=%d/%d", n, n))
	})
}

func TestSimulator(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := startServer(t, b)
		admin := s.Admin()
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
			return s.Do(t, admin, "GET", "/api/v1/devices/sim-00002/streams/env/latest", nil).Status == 200
		})

		// A long action, cancelled while it runs.
		sim.stop(t)
		slow := s.startSim(t, "--devices", "2", "--tokens", tokens, "--step", "1s", "--telemetry-interval", "0")
		slow.connected(t, 2)
		id = s.dispatch(t, admin, map[string]any{"action": "long", "params": map[string]any{}, "search_type": "default", "device_ids": []string{"sim-00001"}})
		s.awaitActionStatus(t, admin, "sim-00001", id, "Progress")
		s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/cancel", id), nil).Want(t, 204)
		var list struct {
			Actions []actionBody `json:"actions"`
		}
		eventually(t, "the device to complete the cancel_action", func() bool {
			s.Do(t, admin, "GET", "/api/v1/actions?action=cancel_action", nil).Want(t, 200).Decode(t, &list)
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

// TestSimulatorNamesItsBroker: sim says which broker its devices connected
// to, and warns when it is not fleetd's, as when a Mosquitto holds port
// 1883: by asking fleetd with an API key, by the SUBACK without one.
func TestSimulatorNamesItsBroker(t *testing.T) {
	s := startServer(t, sqlstoretest.Backends()[0])
	other := mosquittotest.Start(t)
	tokens := filepath.Join(t.TempDir(), "tokens.csv")
	const warning = "WARNING: the broker at"

	for _, tc := range []struct {
		name, broker string
		args         []string
		want         string
	}{
		{"FleetdByAPI", s.MQTTAddr, []string{"--provision", "--url", s.URL, "--api-key", s.Key, "--tokens", tokens}, "the broker is fleetd's"},
		{"FleetdBySUBACK", s.MQTTAddr, []string{"--tokens", tokens}, "at QoS 1, as fleetd's does"},
		{"MosquittoByAPI", other.Addr, []string{"--tokens", tokens, "--url", s.URL, "--api-key", s.Key}, "has not seen sim-00001 connect"},
		{"MosquittoBySUBACK", other.Addr, []string{"--tokens", tokens}, "granted a QoS 2 subscription"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sim := s.startSim(t, append([]string{"--mqtt-addr", tc.broker, "--devices", "2", "--telemetry-interval", "0", "--broker-check-timeout", "2s"}, tc.args...)...)
			sim.connected(t, 2)
			named := "sim-00001 connected to the MQTT broker at tcp://" + tc.broker
			if strings.HasPrefix(tc.name, "Fleetd") {
				eventually(t, tc.want, func() bool { return strings.Contains(sim.out.String(), tc.want) })
				sim.stop(t)
				if out := sim.out.String(); !strings.Contains(out, named) || strings.Contains(out, warning) {
					t.Fatalf("want %q and no warning:\n%s", named, out)
				}
				return
			}
			eventually(t, "the warning", func() bool { return strings.Contains(sim.out.String(), warning) })
			sim.stop(t)
			out := sim.out.String()
			for _, want := range []string{named, tc.want, "--mqtt-addr :1884"} {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
		})
	}
}

// TestSimulatorForRollouts: what a rollout demonstration needs of sim.
// Devices carry metadata (--metadata for all, a CSV row for some), so a
// metadata canary has a ring to choose; --step paces firmware downloads
// as it does other actions, however small the archive.
func TestSimulatorForRollouts(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := startServer(t, b)
		admin := s.Admin()
		rings := filepath.Join(t.TempDir(), "rings.csv")
		os.WriteFile(rings, []byte("id,ring,rack\n# the lab's devices\nmd-00001,lab,r1\nmd-00003,lab,\n"), 0o644)
		const step = 50 * time.Millisecond
		sim := s.startSim(t, "--devices", "4", "--provision", "--url", s.URL, "--api-key", admin.Key, "--prefix", "md-",
			"--telemetry-interval", "0", "--metadata", "site=berlin", "--metadata", "ring=field", "--metadata-file", rings, "--step", step.String())
		sim.connected(t, 4)
		for id, want := range map[string]map[string]string{
			"md-00001": {"simulated": "true", "site": "berlin", "ring": "lab", "rack": "r1"},
			"md-00002": {"simulated": "true", "site": "berlin", "ring": "field"},
			"md-00003": {"simulated": "true", "site": "berlin", "ring": "lab"},
		} {
			var dev device
			s.Do(t, admin, "GET", "/api/v1/devices/"+id, nil).Want(t, 200).Decode(t, &dev)
			if fmt.Sprint(dev.Metadata) != fmt.Sprint(want) {
				t.Fatalf("%s's metadata = %v, want %v", id, dev.Metadata, want)
			}
		}

		s.mustUpload(t, admin, makeBundle(t, "2.3.0", bootloader, app230))
		start := time.Now()
		id := s.dispatch(t, admin, map[string]any{"action": "update_firmware", "params": map[string]any{"version": "2.3.0"},
			"search_type": "metadata", "search_key": "ring", "search_query": "lab"})
		if a := s.action(t, admin, id); a.Targeted != 2 {
			t.Fatalf("the lab ring: %d devices, want 2", a.Targeted)
		}
		da := s.awaitActionStatus(t, admin, "md-00003", id, "Progress")
		eventually(t, "a Downloading report", func() bool {
			da = s.deviceAction(t, admin, "md-00003", id)
			return da.Status == "Downloading" || da.ActionStatus == "Completed"
		})
		if da.Status != "Downloading" || da.Progress < 10 || da.Progress > 90 {
			t.Fatalf("md-00003's record while it downloads = %+v", da)
		}
		s.awaitActionStatus(t, admin, "md-00003", id, "Completed")
		// A step after each of the nine tenths reported.
		if took := time.Since(start); took < 9*step {
			t.Fatalf("the download took %s, want at least 9 steps of %s", took, step)
		}
	})
}

func TestSimulatorFlags(t *testing.T) {
	dir := t.TempDir()
	noHeader, stranger := filepath.Join(dir, "no-header.csv"), filepath.Join(dir, "stranger.csv")
	os.WriteFile(noHeader, []byte("sim-00001,lab\n"), 0o644)
	os.WriteFile(stranger, []byte("id,ring\nsim-00001,lab\nsim-00011,lab\n"), 0o644)
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
		{[]string{"--tokens", "x", "--metadata", "ring=lab"}, "with --provision"},
		{[]string{"--provision", "--api-key", "k", "--metadata", "ring"}, "KEY=VALUE"},
		{[]string{"--provision", "--api-key", "k", "--metadata-file", "/nonexistent/rings.csv"}, "--metadata-file"},
		{[]string{"--provision", "--api-key", "k", "--metadata-file", noHeader}, "want a header line id,KEY"},
		{[]string{"--provision", "--api-key", "k", "--metadata-file", stranger}, `stranger.csv:3: "sim-00011" is not one of the 10 devices provisioned (sim-00001 to sim-00010)`},
	} {
		var out LockedBuffer
		err := run(context.Background(), append([]string{"sim"}, tc.args...), noEnv, strings.NewReader(""), &out, &out)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("fleetd sim %s: %v, want an error about %s", strings.Join(tc.args, " "), err, tc.want)
		}
	}
}
