package twin_test

import (
	"fmt"
	"testing"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestDesiredRollout rolls a fleet-wide desired change out in phases to
// `fleetd sim` devices, which take the delta and report it back, and to a
// device that reports only when told: a phase changes the desired state
// of its devices only when it triggers, each device action is Completed
// once the device reports every value of the patch (a part is not
// enough; a device that reports them already is Completed at once), and
// the rollout completes. Bad requests are refused with nothing changed.
func TestDesiredRollout(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b, "--rollout-interval", "50ms")
		admin := s.Admin()
		const simDevices = 3
		sim := s.StartSim(t, "--devices", fmt.Sprint(simDevices), "--provision", "--url", s.URL, "--api-key", admin.Key,
			"--prefix", "sim-", "--telemetry-interval", "0")
		sim.Connected(t, simDevices)
		s.MustDevice(t, admin, "sim-mute", nil)
		s.MustDevice(t, admin, "sim-ready", nil)
		report := func(device string, seq int, data map[string]any) {
			t.Helper()
			point := map[string]any{"timestamp": 1_700_000_000_000 + seq, "sequence": seq}
			for k, v := range data {
				point[k] = v
			}
			s.Do(t, admin, "POST", "/api/v1/devices/"+device+"/streams/device_shadow", []any{point}).Want(t, 200)
		}
		patch := map[string]any{"interval": 30, "log": map[string]any{"level": "debug"}}
		report("sim-ready", 1, patch) // reports the values before it is asked
		desired := func(device string) map[string]any {
			t.Helper()
			var sh fleet.Shadow
			s.Do(t, admin, "GET", "/api/v1/devices/"+device+"/shadow", nil).Want(t, 200).Decode(t, &sh)
			return sh.Desired
		}

		var fd fleet.FleetDesired
		s.Do(t, admin, "PATCH", "/api/v1/shadows", map[string]any{"search_type": "search", "search_query": "sim-", "desired": patch,
			"schedule": map[string]any{"phases": []any{
				map[string]any{"name": "canary", "trigger_on": map[string]any{"type": "now"}, "info": map[string]any{"type": "fixed_list", "device_ids": []string{"sim-00001"}}},
				map[string]any{"name": "rest", "trigger_on": map[string]any{"type": "manual"}, "info": map[string]any{"type": "percentage", "percentage": 100}},
			}}}).Want(t, 200).Decode(t, &fd)
		if fd.Matched != simDevices+2 || fd.Changed != 0 || fd.ActionID == 0 {
			t.Fatalf("answered %+v", fd)
		}
		id := fd.ActionID
		if a := s.Action(t, admin, id); a.Action != fleet.ActionDesired || a.Targeted != simDevices+2 {
			t.Fatalf("the rollout's action is %+v", a)
		}

		// The canary takes the delta and reports it: Completed. The others
		// are not released, and their desired state is untouched.
		s.AwaitActionStatus(t, admin, "sim-00001", id, "Completed")
		for _, d := range []string{"sim-00002", "sim-00003", "sim-mute", "sim-ready"} {
			if got := desired(d); len(got) != 0 {
				t.Fatalf("%s's desired state is %v before its phase triggered", d, got)
			}
			if da := s.DeviceAction(t, admin, d, id); da.ActionStatus != "Scheduled" {
				t.Fatalf("%s's device action is %s before its phase triggered", d, da.ActionStatus)
			}
		}

		s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/trigger_next_phase", id), nil).Want(t, 204)
		s.AwaitActionStatus(t, admin, "sim-00002", id, "Completed")
		s.AwaitActionStatus(t, admin, "sim-00003", id, "Completed")
		s.AwaitActionStatus(t, admin, "sim-ready", id, "Completed")
		if got := desired("sim-mute"); got["interval"] != 30.0 {
			t.Fatalf("sim-mute's desired state is %v after its phase triggered", got)
		}
		if da := s.DeviceAction(t, admin, "sim-mute", id); da.ActionStatus != "Initiated" {
			t.Fatalf("sim-mute, which reported nothing, is %s", da.ActionStatus)
		}
		report("sim-mute", 1, map[string]any{"interval": 30})
		if da := s.DeviceAction(t, admin, "sim-mute", id); da.ActionStatus != "Initiated" {
			t.Fatalf("sim-mute, which reported a part of the patch, is %s", da.ActionStatus)
		}
		report("sim-mute", 2, map[string]any{"log": map[string]any{"level": "debug", "file": "/var/log/m"}})
		s.AwaitActionStatus(t, admin, "sim-mute", id, "Completed")
		fleetdtest.Eventually(t, "the rollout to complete", func() bool {
			var a struct {
				Status   string         `json:"status"`
				Statuses map[string]int `json:"statuses"`
			}
			s.Do(t, admin, "GET", fmt.Sprintf("/api/v1/actions/%d", id), nil).Want(t, 200).Decode(t, &a)
			return a.Status == "completed" && a.Statuses["Completed"] == simDevices+2
		})

		// Aborted: the released device's device action is cancelled at
		// once, as no device was sent anything to be told to stop; the
		// others are cancelled unreleased; the change made stays.
		s.Do(t, admin, "PATCH", "/api/v1/shadows", map[string]any{"search_type": "search", "search_query": "sim-", "desired": map[string]any{"interval": 45},
			"schedule": map[string]any{"phases": []any{
				map[string]any{"name": "canary", "trigger_on": map[string]any{"type": "now"}, "info": map[string]any{"type": "fixed_list", "device_ids": []string{"sim-mute"}}},
				map[string]any{"name": "rest", "trigger_on": map[string]any{"type": "manual"}, "info": map[string]any{"type": "percentage", "percentage": 100}},
			}}}).Want(t, 200).Decode(t, &fd)
		s.AwaitActionStatus(t, admin, "sim-mute", fd.ActionID, "Initiated")
		dispatched := len(actions(t, s, admin))
		s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/abort", fd.ActionID), nil).Want(t, 204)
		for _, d := range []string{"sim-mute", "sim-00001", "sim-ready"} {
			if da := s.DeviceAction(t, admin, d, fd.ActionID); da.ActionStatus != "Cancelled" {
				t.Fatalf("after the abort, %s's device action is %s", d, da.ActionStatus)
			}
		}
		if n := len(actions(t, s, admin)); n != dispatched {
			t.Fatalf("the abort dispatched %d actions (a cancel_action to devices never sent the rollout)", n-dispatched)
		}
		if got := desired("sim-mute")["interval"]; got != 45.0 {
			t.Fatalf("sim-mute's desired interval is %v after the abort, want the change kept", got)
		}
		if got := desired("sim-00001")["interval"]; got != 30.0 {
			t.Fatalf("sim-00001, never released, has desired interval %v", got)
		}

		// Refused, and nothing dispatched: a timeout without a schedule, a
		// desired_state action without one, a patch too deep, a bad phase.
		before := len(actions(t, s, admin))
		s.Do(t, admin, "PATCH", "/api/v1/shadows", map[string]any{"search_type": "all", "desired": patch, "timeout": 60}).Want(t, 400)
		s.Do(t, admin, "POST", "/api/v1/actions", map[string]any{"action": fleet.ActionDesired, "params": map[string]any{"desired": patch}, "search_type": "all"}).Want(t, 400)
		deep := map[string]any{"a": map[string]any{"b": map[string]any{"c": map[string]any{"d": map[string]any{"e": map[string]any{"f": map[string]any{"g": map[string]any{"h": map[string]any{"i": 1}}}}}}}}}
		s.Do(t, admin, "PATCH", "/api/v1/shadows", map[string]any{"search_type": "all", "desired": deep,
			"schedule": map[string]any{"phases": []any{map[string]any{"name": "all", "trigger_on": map[string]any{"type": "now"}, "info": map[string]any{"type": "percentage", "percentage": 100}}}}}).Want(t, 400)
		s.Do(t, admin, "PATCH", "/api/v1/shadows", map[string]any{"search_type": "all", "desired": patch,
			"schedule": map[string]any{"phases": []any{map[string]any{"name": "x", "trigger_on": map[string]any{"type": "now"}, "info": map[string]any{"type": "percentage", "percentage": 0}}}}}).Want(t, 400)
		other := s.NewTenant(t, "other")
		s.Do(t, other, "PATCH", "/api/v1/shadows", map[string]any{"search_type": "default", "device_ids": []string{"sim-00001"}, "desired": patch,
			"schedule": map[string]any{"phases": []any{map[string]any{"name": "all", "trigger_on": map[string]any{"type": "now"}, "info": map[string]any{"type": "percentage", "percentage": 100}}}}}).Want(t, 400)
		if after := len(actions(t, s, admin)); after != before {
			t.Fatalf("refused requests dispatched %d actions", after-before)
		}
	})
}

// actions lists the tenant's actions.
func actions(t *testing.T, s *fleetdtest.Server, c fleetdtest.Creds) []fleetdtest.ActionBody {
	t.Helper()
	var list struct {
		Actions []fleetdtest.ActionBody `json:"actions"`
	}
	s.Do(t, c, "GET", "/api/v1/actions?limit=1000", nil).Want(t, 200).Decode(t, &list)
	return list.Actions
}

// TestDesiredRolloutRetry retries a desired rollout's device that did not
// report the patch by its deadline, as the console's "Retry the N failed
// devices" does: the retry is a desired rollout too, of one phase released
// at once (a desired change is never sent to a device, so it cannot be
// retried as an action without a schedule), and completes when the device
// reports the values.
func TestDesiredRolloutRetry(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b, "--rollout-interval", "50ms", "--action-sweep-interval", "100ms")
		admin := s.Admin()
		s.MustDevice(t, admin, "mute", nil)
		var fd fleet.FleetDesired
		s.Do(t, admin, "PATCH", "/api/v1/shadows", map[string]any{"search_type": "default", "device_ids": []string{"mute"},
			"desired": map[string]any{"interval": 30}, "timeout": 1,
			"schedule": map[string]any{"phases": []any{map[string]any{"name": "all", "trigger_on": map[string]any{"type": "now"},
				"info": map[string]any{"type": "percentage", "percentage": 100}}}}}).Want(t, 200).Decode(t, &fd)
		s.AwaitActionStatus(t, admin, "mute", fd.ActionID, "Failed")

		var retry fleetdtest.ActionBody
		s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/retry", fd.ActionID), nil).Want(t, 201).Decode(t, &retry)
		if a := s.Action(t, admin, retry.ID); a.Action != fleet.ActionDesired || a.Targeted != 1 {
			t.Fatalf("the retry is %+v", a)
		}
		s.AwaitActionStatus(t, admin, "mute", retry.ID, "Initiated")
		s.Do(t, admin, "POST", "/api/v1/devices/mute/streams/device_shadow",
			[]any{map[string]any{"timestamp": 1_700_000_000_000, "sequence": 1, "interval": 30}}).Want(t, 200)
		s.AwaitActionStatus(t, admin, "mute", retry.ID, "Completed")
	})
}
