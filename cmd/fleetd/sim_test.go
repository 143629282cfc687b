package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/mqtt/mosquittotest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

func TestSimulator(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := startServer(t, b)
		admin := s.Admin()
		tokens := filepath.Join(t.TempDir(), "tokens.csv")

		sim := s.StartSim(t, "--devices", "4", "--provision", "--url", s.URL, "--api-key", admin.Key,
			"--tokens", tokens, "--prefix", "sim-", "--telemetry-interval", "20ms", "--stream", "env")
		sim.Connected(t, 4)
		written, err := os.ReadFile(tokens)
		if err != nil || strings.Count(string(written), "\n") != 4 || !strings.HasPrefix(string(written), "sim-00001,fdt_") {
			t.Fatalf("tokens file: %q, %v", written, err)
		}

		id := s.Dispatch(t, admin, map[string]any{"action": "reboot", "params": map[string]any{}, "search_type": "search", "search_query": "sim-"})
		fleetdtest.Eventually(t, "the simulated devices to complete the action", func() bool {
			return s.Action(t, admin, id).Statuses["Completed"] == 4
		})
		da := s.DeviceAction(t, admin, "sim-00003", id)
		if da.Status != "Completed" || da.Progress != 100 {
			t.Fatalf("sim-00003's record = %+v", da)
		}
		// Telemetry reaches the stream.
		fleetdtest.Eventually(t, "a telemetry point", func() bool {
			return s.Do(t, admin, "GET", "/api/v1/devices/sim-00002/streams/env/latest", nil).Status == 200
		})

		// A long action, cancelled while it runs.
		sim.Stop(t)
		slow := s.StartSim(t, "--devices", "2", "--tokens", tokens, "--step", "1s", "--telemetry-interval", "0")
		slow.Connected(t, 2)
		id = s.Dispatch(t, admin, map[string]any{"action": "long", "params": map[string]any{}, "search_type": "default", "device_ids": []string{"sim-00001"}})
		s.AwaitActionStatus(t, admin, "sim-00001", id, "Progress")
		s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/cancel", id), nil).Want(t, 204)
		var list struct {
			Actions []fleetdtest.ActionBody `json:"actions"`
		}
		fleetdtest.Eventually(t, "the device to complete the cancel_action", func() bool {
			s.Do(t, admin, "GET", "/api/v1/actions?action=cancel_action", nil).Want(t, 200).Decode(t, &list)
			return len(list.Actions) == 1 && list.Actions[0].Statuses["Completed"] == 1
		})
		slow.Stop(t)

		// Every action fails with --fail-rate 1, and says why. --tokens
		// alone runs every device in the file.
		failing := s.StartSim(t, "--tokens", tokens, "--fail-rate", "1", "--telemetry-interval", "0", "--report-interval", "50ms")
		failing.Connected(t, 4)
		id = s.Dispatch(t, admin, map[string]any{"action": "doomed", "params": map[string]any{}, "search_type": "search", "search_query": "sim-"})
		fleetdtest.Eventually(t, "the simulated devices to fail the action", func() bool {
			return s.Action(t, admin, id).Statuses["Failed"] == 4
		})
		if da := s.DeviceAction(t, admin, "sim-00004", id); len(da.Errors["Failed"]) != 1 {
			t.Fatalf("sim-00004's record = %+v", da)
		}
		// fleetd commits a report before its PUBACK, and the device counts
		// a failure once acknowledged: the API can show all four before
		// the simulator has counted them.
		fleetdtest.Eventually(t, "a progress line that counts the failures", func() bool {
			return strings.Contains(failing.Out.String(), "failed=4")
		})
		failing.Stop(t)
		if out := failing.Out.String(); !strings.Contains(out[strings.LastIndex(out[:len(out)-1], "\n")+1:], "failed=4") {
			t.Fatalf("the last progress line does not count the failures:\n%s", out)
		}
	})
}

// TestSimulatorNamesItsBroker: sim says which broker its devices connected
// to, and warns when it is not fleetd's, as when a Mosquitto holds port
// 1883: by asking fleetd with an API key, by the SUBACK without one.
func TestSimulatorNamesItsBroker(t *testing.T) {
	t.Parallel()
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
			sim := s.StartSim(t, append([]string{"--mqtt-addr", tc.broker, "--devices", "2", "--telemetry-interval", "0", "--broker-check-timeout", "2s"}, tc.args...)...)
			sim.Connected(t, 2)
			named := "sim-00001 connected to the MQTT broker at tcp://" + tc.broker
			if strings.HasPrefix(tc.name, "Fleetd") {
				fleetdtest.Eventually(t, tc.want, func() bool { return strings.Contains(sim.Out.String(), tc.want) })
				sim.Stop(t)
				if out := sim.Out.String(); !strings.Contains(out, named) || strings.Contains(out, warning) {
					t.Fatalf("want %q and no warning:\n%s", named, out)
				}
				return
			}
			fleetdtest.Eventually(t, "the warning", func() bool { return strings.Contains(sim.Out.String(), warning) })
			sim.Stop(t)
			out := sim.Out.String()
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
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := startServer(t, b)
		admin := s.Admin()
		rings := filepath.Join(t.TempDir(), "rings.csv")
		os.WriteFile(rings, []byte("id,ring,rack\n# the lab's devices\nmd-00001,lab,r1\nmd-00003,lab,\n"), 0o644)
		const step = 50 * time.Millisecond
		sim := s.StartSim(t, "--devices", "4", "--provision", "--url", s.URL, "--api-key", admin.Key, "--prefix", "md-",
			"--telemetry-interval", "0", "--metadata", "site=berlin", "--metadata", "ring=field", "--metadata-file", rings, "--step", step.String())
		sim.Connected(t, 4)
		for id, want := range map[string]map[string]string{
			"md-00001": {"simulated": "true", "site": "berlin", "ring": "lab", "rack": "r1"},
			"md-00002": {"simulated": "true", "site": "berlin", "ring": "field"},
			"md-00003": {"simulated": "true", "site": "berlin", "ring": "lab"},
		} {
			var dev fleetdtest.Device
			s.Do(t, admin, "GET", "/api/v1/devices/"+id, nil).Want(t, 200).Decode(t, &dev)
			if fmt.Sprint(dev.Metadata) != fmt.Sprint(want) {
				t.Fatalf("%s's metadata = %v, want %v", id, dev.Metadata, want)
			}
		}

		s.MustUpload(t, admin, fleetdtest.MakeBundle(t, "2.3.0", fleetdtest.Bootloader, fleetdtest.App230))
		start := time.Now()
		id := s.Dispatch(t, admin, map[string]any{"action": "update_firmware", "params": map[string]any{"version": "2.3.0"},
			"search_type": "metadata", "search_key": "ring", "search_query": "lab"})
		if a := s.Action(t, admin, id); a.Targeted != 2 {
			t.Fatalf("the lab ring: %d devices, want 2", a.Targeted)
		}
		da := s.AwaitActionStatus(t, admin, "md-00003", id, "Progress")
		fleetdtest.Eventually(t, "a Downloading report", func() bool {
			da = s.DeviceAction(t, admin, "md-00003", id)
			return da.Status == "Downloading" || da.ActionStatus == "Completed"
		})
		if da.Status != "Downloading" || da.Progress < 10 || da.Progress > 90 {
			t.Fatalf("md-00003's record while it downloads = %+v", da)
		}
		s.AwaitActionStatus(t, admin, "md-00003", id, "Completed")
		// A step after each of the nine tenths reported.
		if took := time.Since(start); took < 9*step {
			t.Fatalf("the download took %s, want at least 9 steps of %s", took, step)
		}
	})
}

func TestSimulatorFlags(t *testing.T) {
	t.Parallel()
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
		var out fleetdtest.LockedBuffer
		err := run(context.Background(), append([]string{"sim"}, tc.args...), fleetdtest.NoEnv, strings.NewReader(""), &out, &out)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("fleetd sim %s: %v, want an error about %s", strings.Join(tc.args, " "), err, tc.want)
		}
	}
}
