package action_test

import (
	"crypto/md5"
	"encoding/binary"
	"fmt"
	"net/http"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet/codec"
	"github.com/fleetd/fleet/internal/fleetdtest"
	simulator "github.com/fleetd/fleet/internal/sim"
	"github.com/fleetd/fleet/notify"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// rankOrder sorts device ids as percentage phases take them: by the first
// 64 bits of their MD5, as a signed integer.
func rankOrder(ids []string) []string {
	rank := func(id string) int64 {
		sum := md5.Sum([]byte(id))
		return int64(binary.BigEndian.Uint64(sum[:8]))
	}
	out := slices.Clone(ids)
	sort.Slice(out, func(i, j int) bool { return rank(out[i]) < rank(out[j]) })
	return out
}

// simActions is the number of actions the simulator received, from its
// last progress line.
func simActions(r *fleetdtest.SimRun) int {
	lines := regexp.MustCompile(`actions=(\d+)`).FindAllStringSubmatch(r.Out.String(), -1)
	if len(lines) == 0 {
		return 0
	}
	var n int
	fmt.Sscan(lines[len(lines)-1][1], &n)
	return n
}

// TestRolloutEndToEnd runs rollouts on simulated MQTT devices: phases
// release exactly their devices, the failure-rate and alert gates pause with
// their reasons, resume waives a gate, trigger_next_phase, append_phase and
// abort do what they say, end_timestamp cancels what was never released,
// and every change of state reaches the tenant's webhook.
func TestRolloutEndToEnd(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		// The test polls actions every 5 ms with the key fleetd sim uses
		// too: no rate limit (TestRateLimits tests those), or a quiet
		// machine polls past 100 requests a second and is answered 429.
		s := fleetdtest.Start(t, b, append([]string{"--rollout-interval", "20ms", "--rate-limit", "-1"}, fleetdtest.AlertFlags...)...)
		admin := s.Admin()
		hook := fleetdtest.NewReceiver(t, 0)
		s.Do(t, admin, "POST", "/api/v1/rollout-notification-rules", map[string]any{
			"channel_parameters": map[string]any{"type": "webhook", "url": hook.URL, "secret": "s3cret"}}).Want(t, 201)
		tokens := filepath.Join(t.TempDir(), "tokens.csv")
		var ids []string
		for i := 1; i <= 10; i++ {
			ids = append(ids, fmt.Sprintf("ro-%05d", i))
		}
		sim := s.StartSim(t, "--devices", "10", "--provision", "--url", s.URL, "--api-key", admin.Key,
			"--tokens", tokens, "--prefix", "ro-", "--telemetry-interval", "0")
		sim.Connected(t, 10)

		t.Run("PhasesReleaseTheirDevices", func(t *testing.T) {
			id := s.Dispatch(t, admin, map[string]any{"action": "reboot", "params": map[string]any{}, "search_type": "search", "search_query": "ro-",
				"schedule": map[string]any{"release_notes": "a reboot, in three", "phases": []any{
					fleetdtest.Phase("canary", fleetdtest.TriggerNow, fleetdtest.FixedList("ro-00003", "ro-00007")),
					fleetdtest.Phase("half", fleetdtest.TriggerManual, fleetdtest.Percent(50)),
					fleetdtest.Phase("rest", fleetdtest.TriggerAfter, fleetdtest.Percent(100)),
				}}})
			fleetdtest.Eventually(t, "the canary to complete", func() bool { return s.Rollout(t, admin, id).StatusesPhased["0"]["Completed"] == 2 })
			a := s.Rollout(t, admin, id)
			if a.Status != "running" || fmt.Sprint(a.PhasesTriggered) != "[true false false]" || *a.NextPhaseIndex != 1 ||
				fmt.Sprint(a.StatusesPhased) != "map[0:map[Completed:2] 1:map[Scheduled:3] 2:map[Scheduled:5]]" || len(a.Schedule.Phases) != 3 {
				t.Fatalf("after the canary: %+v", a)
			}
			// Half of ten is five released: the canary's two and the first
			// three of the others in the stable order.
			var others []string
			for _, d := range ids {
				if d != "ro-00003" && d != "ro-00007" {
					others = append(others, d)
				}
			}
			order := rankOrder(others)
			for i, d := range order {
				want := 2
				if i < 3 {
					want = 1
				}
				if da := s.DeviceAction(t, admin, d, id); da.Phase != want || da.ActionStatus != "Scheduled" || da.Status != "Scheduled" {
					t.Fatalf("%s: %+v, want Scheduled in phase %d", d, da, want)
				}
			}
			if da := s.DeviceAction(t, admin, "ro-00003", id); da.Phase != 0 {
				t.Fatalf("ro-00003: phase %d", da.Phase)
			}
			if n := simActions(sim); n != 2 {
				t.Fatalf("the devices received %d actions; only the canary's two were released", n)
			}
			// A device reporting on an action its phase has not released
			// is told it has no such action.
			fleetdtest.WantCode(t, s.Do(t, admin, "POST", "/api/v1/devices/action/status", map[string]any{"device_id": order[0], "action_id": id, "state": "Running"}), 404, "not_found")

			s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/trigger_next_phase", id), nil).Want(t, 204)
			a = s.AwaitRollout(t, admin, id, "completed")
			if a.Statuses["Completed"] != 10 || fmt.Sprint(a.PhasesTriggered) != "[true true true]" || *a.NextPhaseIndex != 3 {
				t.Fatalf("completed: %+v", a)
			}
			fleetdtest.AwaitEvents(t, hook, id, "phase_triggered:0", "phase_triggered:1", "phase_triggered:2", "completed")
			fleetdtest.WantCode(t, s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/trigger_next_phase", id), nil), 409, "conflict")
			fleetdtest.WantCode(t, s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/pause", id), nil), 409, "conflict")
			// An action without a schedule has none of these operations.
			plain := s.Dispatch(t, admin, map[string]any{"action": "x", "params": map[string]any{}, "search_type": "default", "device_ids": []string{"ro-00001"}})
			fleetdtest.WantCode(t, s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/pause", plain), nil), 409, "conflict")
			if pa := s.Rollout(t, admin, plain); pa.Status != "" || pa.Schedule != nil || pa.StatusesPhased["-1"] == nil {
				t.Fatalf("an action without a schedule shows %+v", pa)
			}
		})

		t.Run("FailureRateGate", func(t *testing.T) {
			sim.Stop(t)
			failing := s.StartSim(t, "--devices", "10", "--tokens", tokens, "--fail-rate", "0.5", "--telemetry-interval", "0")
			failing.Connected(t, 10)
			var bad, good string
			for _, d := range ids {
				if simulator.Fails(d, 0.5) && bad == "" {
					bad = d
				} else if !simulator.Fails(d, 0.5) && good == "" {
					good = d
				}
			}
			id := s.Dispatch(t, admin, map[string]any{"action": "reboot", "params": map[string]any{}, "search_type": "search", "search_query": "ro-",
				"schedule": map[string]any{"phases": []any{
					fleetdtest.Phase("canary", fleetdtest.TriggerNow, fleetdtest.FixedList(bad, good)),
					map[string]any{"name": "rest", "trigger_on": fleetdtest.TriggerNow, "info": fleetdtest.Percent(100), "gate": map[string]any{"max_failure_rate": 0.3, "min_finished": 2}},
				}}})
			a := s.AwaitRollout(t, admin, id, "paused")
			if want := "phase 1 (rest) not released: 1 of 2 finished devices failed (50% > 30%)"; a.PauseReason != want || a.StatusesPhased["1"]["Scheduled"] != 8 {
				t.Fatalf("paused: %q, want %q; %+v", a.PauseReason, want, a)
			}
			fleetdtest.AwaitEvents(t, hook, id, "phase_triggered:0", "paused")
			fleetdtest.WantCode(t, s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/trigger_next_phase", id), nil), 409, "conflict")
			fleetdtest.WantCode(t, s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/pause", id), nil), 409, "conflict")
			// Resuming waives the gate: the rest is released at once.
			s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/resume", id), nil).Want(t, 204)
			a = s.AwaitRollout(t, admin, id, "completed")
			if a.Statuses["Completed"]+a.Statuses["Failed"] != 10 || a.PauseReason != "" {
				t.Fatalf("after the resume: %+v", a)
			}
			fleetdtest.AwaitEvents(t, hook, id, "phase_triggered:0", "paused", "resumed", "phase_triggered:1", "completed")
			failing.Stop(t)
		})

		t.Run("AlertGate", func(t *testing.T) {
			s.MustUpload(t, admin, fleetdtest.MakeBundle(t, "2.3.0", fleetdtest.Bootloader, fleetdtest.Part{Name: "app", Version: "2.3.0", Body: "app 2.3.0"}))
			// A windowed rule: the hottest reading of the last minute.
			rule := s.MustAlertRule(t, admin, map[string]any{"name": "overheating", "stream": "telemetry",
				"condition": map[string]any{"field": "temperature", "aggregate": "max", "window_seconds": 60, "operator": ">", "value": 80}})
			sick := s.StartSim(t, "--devices", "10", "--tokens", tokens, "--unhealthy-after-update", "--telemetry-interval", "50ms")
			sick.Connected(t, 10)
			id := s.Dispatch(t, admin, map[string]any{"action": "update_firmware", "params": map[string]any{"version": "2.3.0"}, "search_type": "search", "search_query": "ro-",
				"schedule": map[string]any{"phases": []any{
					fleetdtest.Phase("canary", fleetdtest.TriggerNow, fleetdtest.FixedList("ro-00004")),
					map[string]any{"name": "everyone", "trigger_on": fleetdtest.TriggerNow, "info": fleetdtest.Percent(100),
						"gate": map[string]any{"alert_rules": []string{rule.ID}, "watch_seconds": 600}},
				}}})
			a := s.AwaitRollout(t, admin, id, "paused")
			if !regexp.MustCompile(`^phase 1 \(everyone\) not released: alert 'overheating' opened on ro-00004 \d+ seconds? after its update completed$`).MatchString(a.PauseReason) {
				t.Fatalf("paused: %q", a.PauseReason)
			}
			if a.StatusesPhased["0"]["Completed"] != 1 || a.StatusesPhased["1"]["Scheduled"] != 9 {
				t.Fatalf("paused: %+v", a)
			}
			// Abort: nothing more is released; what was never released
			// is cancelled without a word to its devices.
			s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/abort", id), nil).Want(t, 204)
			a = s.Rollout(t, admin, id)
			if a.Status != "aborted" || a.StatusesPhased["1"]["Cancelled"] != 9 {
				t.Fatalf("aborted: %+v", a)
			}
			fleetdtest.WantCode(t, s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/abort", id), nil), 409, "conflict")
			fleetdtest.WantCode(t, s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/resume", id), nil), 409, "conflict")
			fleetdtest.AwaitEvents(t, hook, id, "phase_triggered:0", "paused", "aborted")
			sick.Stop(t)
		})

		t.Run("ManualAppendAbort", func(t *testing.T) {
			slow := s.StartSim(t, "--devices", "10", "--tokens", tokens, "--step", "300ms", "--telemetry-interval", "0")
			slow.Connected(t, 10)
			id := s.Dispatch(t, admin, map[string]any{"action": "configure", "params": map[string]any{}, "search_type": "default",
				"device_ids": []string{"ro-00001", "ro-00002", "ro-00003", "ro-00004", "ro-00005"},
				"schedule": map[string]any{"phases": []any{
					fleetdtest.Phase("first", fleetdtest.TriggerManual, fleetdtest.FixedList("ro-00001")),
					fleetdtest.Phase("rest", fleetdtest.TriggerManual, fleetdtest.Percent(100)),
				}}})
			if a := s.Rollout(t, admin, id); a.Status != "scheduled" || a.Statuses["Scheduled"] != 5 {
				t.Fatalf("before any trigger: %+v", a)
			}
			s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/trigger_next_phase", id), nil).Want(t, 204)
			s.AwaitActionStatus(t, admin, "ro-00001", id, "Completed")

			// append_phase takes devices the action does not target yet.
			fleetdtest.WantCode(t, s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/append_phase", id), fleetdtest.Phase("late", fleetdtest.TriggerManual, fleetdtest.FixedList("ro-00002"))), 400, "invalid")
			fleetdtest.WantCode(t, s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/append_phase", id), fleetdtest.Phase("late", fleetdtest.TriggerManual, fleetdtest.FixedList("ghost"))), 400, "invalid")
			fleetdtest.WantCode(t, s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/append_phase", id), fleetdtest.Phase("late", fleetdtest.TriggerManual, fleetdtest.Percent(100))), 400, "invalid")
			s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/append_phase", id), fleetdtest.Phase("late", fleetdtest.TriggerManual, fleetdtest.FixedList("ro-00009"))).Want(t, 204)
			a := s.Rollout(t, admin, id)
			if a.Targeted != 6 || len(a.Schedule.Phases) != 3 || fmt.Sprint(a.PhasesTriggered) != "[true false false]" || a.StatusesPhased["2"]["Scheduled"] != 1 {
				t.Fatalf("after append_phase: %+v", a)
			}
			if da := s.DeviceAction(t, admin, "ro-00009", id); da.Phase != 2 || da.ActionStatus != "Scheduled" {
				t.Fatalf("ro-00009: %+v", da)
			}

			// The slow devices are busy with phase 1 when it is aborted:
			// they are sent a cancel_action, ro-00009 nothing.
			s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/trigger_next_phase", id), nil).Want(t, 204)
			for _, d := range []string{"ro-00002", "ro-00003", "ro-00004", "ro-00005"} {
				s.AwaitActionStatus(t, admin, d, id, "Progress")
			}
			s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/abort", id), nil).Want(t, 204)
			a = s.Rollout(t, admin, id)
			// ro-00009 is Cancelled at once. The busy devices keep the action,
			// Cancelling, until they answer the cancel_action, and the
			// simulator answers at once: by the time of this read some or all
			// may have (docs/actions.md, Cancel). Either way phase 1 is four
			// device actions, none finished otherwise.
			if a.Status != "aborted" || a.StatusesPhased["0"]["Completed"] != 1 || a.StatusesPhased["2"]["Cancelled"] != 1 ||
				a.StatusesPhased["1"]["Progress"]+a.StatusesPhased["1"]["Cancelled"] != 4 || a.Statuses["Completed"] != 1 {
				t.Fatalf("aborted: %+v", a)
			}
			for _, d := range []string{"ro-00002", "ro-00003", "ro-00004", "ro-00005"} {
				if da := s.DeviceAction(t, admin, d, id); da.ActionStatus != "Cancelled" && (da.ActionStatus != "Progress" || da.Status != "Cancelling") {
					t.Fatalf("%s after the abort: %+v, want Progress and Cancelling until it answers, then Cancelled", d, da)
				}
			}
			var list struct {
				Actions []fleetdtest.ActionBody `json:"actions"`
			}
			fleetdtest.Eventually(t, "the busy devices to complete the cancel_action", func() bool {
				s.Do(t, admin, "GET", "/api/v1/actions?action=cancel_action", nil).Want(t, 200).Decode(t, &list)
				return len(list.Actions) == 1 && list.Actions[0].Targeted == 4 && list.Actions[0].Statuses["Completed"] == 4
			})
			if a = s.Rollout(t, admin, id); a.Statuses["Cancelled"] != 5 || a.Statuses["Completed"] != 1 {
				t.Fatalf("after the devices stopped: %+v", a)
			}
			fleetdtest.AwaitEvents(t, hook, id, "phase_triggered:0", "phase_triggered:1", "aborted")
			slow.Stop(t)
		})

		t.Run("EndTimestamp", func(t *testing.T) {
			plain := s.StartSim(t, "--devices", "10", "--tokens", tokens, "--telemetry-interval", "0")
			plain.Connected(t, 10)
			end := time.Now().Add(1500 * time.Millisecond).UnixMilli()
			id := s.Dispatch(t, admin, map[string]any{"action": "reboot", "params": map[string]any{}, "search_type": "search", "search_query": "ro-",
				"schedule": map[string]any{"end_timestamp": end, "phases": []any{
					fleetdtest.Phase("canary", fleetdtest.TriggerNow, fleetdtest.FixedList("ro-00001")),
					fleetdtest.Phase("rest", fleetdtest.TriggerManual, fleetdtest.Percent(100)),
				}}})
			a := s.AwaitRollout(t, admin, id, "completed")
			if a.StatusesPhased["0"]["Completed"] != 1 || a.StatusesPhased["1"]["Cancelled"] != 9 || fmt.Sprint(a.PhasesTriggered) != "[true false]" {
				t.Fatalf("ended: %+v", a)
			}
			if da := s.DeviceAction(t, admin, "ro-00005", id); da.Status != "ScheduleEnded" || da.ActionStatus != "Cancelled" {
				t.Fatalf("a device never released: %+v", da)
			}
			fleetdtest.WantCode(t, s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/trigger_next_phase", id), nil), 409, "conflict")
			fleetdtest.AwaitEvents(t, hook, id, "phase_triggered:0", "completed")
			// An end already past is refused at dispatch.
			fleetdtest.WantCode(t, s.Do(t, admin, "POST", "/api/v1/actions", map[string]any{"action": "x", "params": map[string]any{}, "search_type": "all",
				"schedule": map[string]any{"end_timestamp": end, "phases": []any{fleetdtest.Phase("all", fleetdtest.TriggerNow, fleetdtest.Percent(100))}}}), 400, "invalid")
		})

		t.Run("Incomplete", func(t *testing.T) {
			var list struct {
				Actions []fleetdtest.RolloutBody `json:"actions"`
				Count   int                      `json:"count"`
			}
			s.Do(t, admin, "GET", "/api/v1/actions?incomplete=true&limit=100", nil).Want(t, 200).Decode(t, &list)
			for _, a := range list.Actions {
				live := a.Statuses["Scheduled"] + a.Statuses["Queued"] + a.Statuses["Initiated"] + a.Statuses["Progress"]
				if live == 0 {
					t.Fatalf("incomplete=true lists action %d, whose device actions are final: %v", a.ID, a.Statuses)
				}
			}
			s.Do(t, admin, "GET", "/api/v1/actions?incomplete=maybe", nil).Want(t, 400)
		})

		// Every rollout notification was signed with the rule's secret.
		for _, req := range hook.Got() {
			if sig := req.Header.Get("X-Fleet-Signature"); sig != notify.Sign("s3cret", req.Body) {
				t.Fatalf("signature %q of %s", sig, req.Body)
			}
		}
	})
}

// TestRolloutOfflineDevice runs rollouts whose canary has a device that
// went offline: with after_previous's default share of every device the
// next phase waits, and waiting_reason names the device and says it is
// offline; with finished_ratio 0.5 the next phase goes on, and the rollout
// stays running (not completed) while the device has not received its
// action, saying so; once the device comes back both complete.
func TestRolloutOfflineDevice(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b, "--rollout-interval", "20ms", "--rate-limit", "-1")
		admin := s.Admin()
		online := s.StartSim(t, "--devices", "4", "--provision", "--url", s.URL, "--api-key", admin.Key, "--prefix", "st-", "--telemetry-interval", "0")
		online.Connected(t, 4)
		tokens := filepath.Join(t.TempDir(), "off.csv")
		off := s.StartSim(t, "--devices", "1", "--provision", "--url", s.URL, "--api-key", admin.Key, "--tokens", tokens, "--prefix", "off-", "--telemetry-interval", "0")
		off.Connected(t, 1)
		fleetdtest.Eventually(t, "off-00001 to be seen", func() bool {
			var seen struct {
				LastSeenAt *time.Time `json:"last_seen_at"`
			}
			s.Do(t, admin, "GET", "/api/v1/devices/off-00001", nil).Want(t, 200).Decode(t, &seen)
			return seen.LastSeenAt != nil
		})
		off.Stop(t)

		targets := []string{"st-00001", "st-00002", "st-00003", "st-00004", "off-00001"}
		rollout := func(rest map[string]any) int64 {
			return s.Dispatch(t, admin, map[string]any{"action": "reboot", "params": map[string]any{}, "search_type": "default", "device_ids": targets,
				"schedule": map[string]any{"phases": []any{
					fleetdtest.Phase("canary", fleetdtest.TriggerNow, fleetdtest.FixedList("st-00001", "off-00001")),
					fleetdtest.Phase("rest", rest, fleetdtest.Percent(100)),
				}}})
		}
		offline := `off-00001 \(Queued, offline, last seen \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\)`

		stalled := rollout(fleetdtest.TriggerAfter)
		s.AwaitActionStatus(t, admin, "st-00001", stalled, "Completed")
		var a fleetdtest.RolloutBody
		fleetdtest.Eventually(t, "the stalled rollout to say why it waits", func() bool {
			a = s.Rollout(t, admin, stalled)
			return regexp.MustCompile(`^phase 1 \(rest\) waits for 1 more device of earlier phases to finish; not finished: ` + offline + `$`).MatchString(a.WaitingReason)
		})
		if a.Status != "running" || fmt.Sprint(a.PhasesTriggered) != "[true false]" {
			t.Fatalf("stalled: %+v", a)
		}

		half := rollout(map[string]any{"type": "after_previous", "finished_ratio": 0.5})
		fleetdtest.Eventually(t, "finished_ratio 0.5 to release the rest without the offline device", func() bool {
			a = s.Rollout(t, admin, half)
			return a.StatusesPhased["1"]["Completed"] == 3
		})
		// Every phase triggered, but a device never received the action:
		// the rollout is not completed, and says what it waits for.
		fleetdtest.Eventually(t, "the rollout to say it waits for the offline device", func() bool {
			a = s.Rollout(t, admin, half)
			return regexp.MustCompile(`^every phase triggered; waiting for 1 device to finish: ` + offline + `$`).MatchString(a.WaitingReason)
		})
		if a.Status != "running" || a.Statuses["Queued"] != 1 || a.Statuses["Completed"] != 4 {
			t.Fatalf("waiting for the offline device: %+v", a)
		}
		// The console's action page says it too, and shows which devices
		// are online.
		console := fleetdtest.NewBrowser(t, s.URL)
		console.SignIn(admin.Tenant, admin.Key)
		page := console.Get(fmt.Sprintf("/console/actions/%d", half)).Want(t, 200).Body
		for _, want := range []string{`data-waiting-reason>every phase triggered; waiting for 1 device to finish: off-00001 (Queued, offline`,
			`<a href="/console/devices/off-00001">off-00001</a></td>` + "\n" + `<td><span class="offline">offline</span></td>`,
			`<a href="/console/devices/st-00001">st-00001</a></td>` + "\n" + `<td><span class="online">online</span></td>`} {
			if !strings.Contains(page, want) {
				t.Fatalf("the action page lacks %q:\n%s", want, page)
			}
		}

		// The device comes back: it receives both actions, and both
		// rollouts complete.
		back := s.StartSim(t, "--tokens", tokens, "--telemetry-interval", "0")
		back.Connected(t, 1)
		for _, id := range []int64{stalled, half} {
			a = s.AwaitRollout(t, admin, id, "completed")
			if a.Statuses["Completed"] != 5 || a.WaitingReason != "" {
				t.Fatalf("completed: %+v", a)
			}
		}
	})
}

// TestRolloutEncodings reads a rollout (GET /api/v1/actions/{id}, the
// list, S7 of a device of each phase, the action's device actions) in each
// of the four encodings: each shows the phases as they are, and says what
// the JSON says.
func TestRolloutEncodings(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		admin := s.Admin()
		for _, d := range []string{"enc-1", "enc-2", "enc-3"} {
			s.MustDevice(t, admin, d, nil)
		}
		rate := 0.25
		id := s.Dispatch(t, admin, map[string]any{"action": "reboot", "params": map[string]any{}, "search_type": "search", "search_query": "enc-",
			"schedule": map[string]any{"release_notes": "notes", "end_timestamp": time.Now().Add(time.Hour).UnixMilli(),
				"maintenance_window": map[string]any{"start": "22:00", "end": "04:30", "timezone": "Europe/Berlin"},
				"phases": []any{
					fleetdtest.Phase("canary", fleetdtest.TriggerManual, fleetdtest.FixedList("enc-2")),
					map[string]any{"name": "rest", "trigger_on": map[string]any{"type": "after_previous", "wait_seconds": 60, "finished_ratio": 0.75}, "info": fleetdtest.Percent(100),
						"gate": map[string]any{"max_failure_rate": rate, "min_finished": 1}},
				}}})
		s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/pause", id), nil).Want(t, 204)
		phased := "map[0:map[Scheduled:1] 1:map[Scheduled:2]]"
		waiting := s.Dispatch(t, admin, map[string]any{"action": "reboot", "params": map[string]any{}, "search_type": "default", "device_ids": []string{"enc-1"},
			"schedule": map[string]any{"phases": []any{fleetdtest.Phase("by hand", fleetdtest.TriggerManual, fleetdtest.Percent(100))}}})
		rollout := func(t *testing.T, a any) {
			t.Helper()
			for _, c := range []struct {
				path []any
				want string
			}{
				{[]any{"id"}, fmt.Sprint(id)},
				{[]any{"status"}, "paused"},
				{[]any{"pause_reason"}, "paused by admin"},
				{[]any{"phases_triggered"}, "[false false]"},
				{[]any{"next_phase_index"}, "0"},
				{[]any{"statuses_phased"}, phased},
				{[]any{"statuses"}, "map[Scheduled:3]"},
				{[]any{"schedule", "release_notes"}, "notes"},
				{[]any{"schedule", "maintenance_window", "timezone"}, "Europe/Berlin"},
				{[]any{"schedule", "phases", 0, "info", "device_ids"}, "[enc-2]"},
				{[]any{"schedule", "phases", 1, "trigger_on", "wait_seconds"}, "60"},
				{[]any{"schedule", "phases", 1, "trigger_on", "finished_ratio"}, "0.75"},
				{[]any{"schedule", "phases", 1, "gate", "max_failure_rate"}, "0.25"},
			} {
				if got := fmt.Sprint(fleetdtest.At(a, c.path...)); got != c.want {
					t.Fatalf("%v: %s, want %s", c.path, got, c.want)
				}
			}
		}
		deviceActions := func(want string) func(*testing.T, any) {
			return func(t *testing.T, v any) {
				t.Helper()
				got := map[string]string{}
				for _, da := range fleetdtest.At(v, "device_actions").([]any) {
					got[fmt.Sprint(fleetdtest.At(da, "device_id"))] = fmt.Sprintf("%v %v %v", fleetdtest.At(da, "phase"), fleetdtest.At(da, "action_status"), fleetdtest.At(da, "status"))
				}
				if fmt.Sprint(got) != want {
					t.Fatalf("device actions %v, want %s", got, want)
				}
			}
		}
		for _, c := range []struct {
			path  string
			check func(*testing.T, any)
		}{
			{fmt.Sprintf("/api/v1/actions/%d", id), rollout},
			{"/api/v1/actions?limit=5", func(t *testing.T, v any) { rollout(t, fleetdtest.At(v, "actions", 1)) }},
			{fmt.Sprintf("/api/v1/actions/%d", waiting), func(t *testing.T, v any) {
				if got := fmt.Sprint(fleetdtest.At(v, "waiting_reason")); got != "phase 0 (by hand) waits for an operator to trigger it" {
					t.Fatalf("waiting_reason %s", got)
				}
			}},
			{"/api/v1/actions?incomplete=true", func(t *testing.T, v any) { rollout(t, fleetdtest.At(v, "actions", 1)) }},
			{"/api/v1/devices/enc-2/actions", deviceActions("map[enc-2:0 Scheduled Scheduled]")},
			{"/api/v1/devices/enc-3/actions", deviceActions("map[enc-3:1 Scheduled Scheduled]")},
			{fmt.Sprintf("/api/v1/actions/%d/devices", id), deviceActions("map[enc-1:1 Scheduled Scheduled enc-2:0 Scheduled Scheduled enc-3:1 Scheduled Scheduled]")},
		} {
			t.Run(c.path, func(t *testing.T) {
				var want any
				for _, f := range codec.Formats {
					r := s.Send(t, fleetdtest.Req{Method: "GET", Path: c.path, Creds: admin, Header: http.Header{"Accept": {f.ContentType()}}}).Want(t, 200)
					got, err := codec.Decode(f, r.Body)
					if err != nil {
						t.Fatalf("%s: %v", f, err)
					}
					t.Run(f.String(), func(t *testing.T) { c.check(t, got) })
					if f == codec.JSON {
						want = got
						continue
					}
					if !reflect.DeepEqual(fleetdtest.Times(got), fleetdtest.Times(want)) {
						t.Fatalf("%s says\n%v\nwhere JSON says\n%v", f, got, want)
					}
				}
			})
		}
	})
}

// TestRolloutOperations runs each of a rollout's operations through the
// API where its state allows it (204) and where it forbids it (409): each
// that went through is in the audit log, with its actor and what it did,
// and none that was refused is.
func TestRolloutOperations(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		admin := s.Admin()
		for _, d := range []string{"op-1", "op-2", "op-3", "op-4"} {
			s.MustDevice(t, admin, d, nil)
		}
		id := s.Dispatch(t, admin, map[string]any{"action": "reboot", "params": map[string]any{}, "search_type": "default",
			"device_ids": []string{"op-1", "op-2", "op-3"},
			"schedule": map[string]any{"phases": []any{
				fleetdtest.Phase("first", fleetdtest.TriggerManual, fleetdtest.FixedList("op-1")),
				fleetdtest.Phase("rest", fleetdtest.TriggerManual, fleetdtest.Percent(100)),
			}}})
		// The console's action page shows the buttons of the operations
		// the API allows, and no other.
		console := fleetdtest.NewBrowser(t, s.URL)
		console.SignIn(admin.Tenant, admin.Key)
		buttons := func(id int64) string {
			t.Helper()
			var shown []string
			for _, m := range regexp.MustCompile(`data-op="([a-z_]+)"( hidden)?>`).FindAllStringSubmatch(console.Get(fmt.Sprintf("/console/actions/%d", id)).Want(t, 200).Body, -1) {
				if m[2] == "" {
					shown = append(shown, m[1])
				}
			}
			return strings.Join(shown, " ")
		}
		op := func(name string, body any, status int) {
			t.Helper()
			r := s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/%s", id, name), body)
			if status == 409 {
				fleetdtest.WantCode(t, r, 409, "conflict")
				if !strings.Contains(string(r.Body), "the rollout is ") {
					t.Fatalf("%s: %s does not say the rollout's state", name, r.Body)
				}
				return
			}
			r.Want(t, status)
		}
		late := fleetdtest.Phase("late", fleetdtest.TriggerManual, fleetdtest.FixedList("op-4"))
		for _, step := range []struct {
			op      string
			body    any
			status  int
			buttons string // after it
		}{
			{"", nil, 0, "pause trigger_next_phase abort"},
			{"resume", nil, 409, "pause trigger_next_phase abort"}, // scheduled, not paused
			{"pause", nil, 204, "resume abort"},
			{"pause", nil, 409, "resume abort"},
			{"trigger_next_phase", nil, 409, "resume abort"},
			{"resume", nil, 204, "pause trigger_next_phase abort"},
			{"trigger_next_phase", nil, 204, "pause trigger_next_phase abort"},
			{"append_phase", late, 204, "pause trigger_next_phase abort"},
			{"abort", nil, 204, ""},
			{"pause", nil, 409, ""},
			{"resume", nil, 409, ""},
			{"trigger_next_phase", nil, 409, ""},
			{"abort", nil, 409, ""},
			{"append_phase", fleetdtest.Phase("later", fleetdtest.TriggerManual, fleetdtest.FixedList("op-4")), 409, ""},
		} {
			if step.op != "" {
				op(step.op, step.body, step.status)
			}
			if got := buttons(id); got != step.buttons {
				t.Fatalf("after %s (%d) the console shows %q, want %q", step.op, step.status, got, step.buttons)
			}
		}
		// A running rollout whose every phase triggered has no next phase
		// to trigger: the console does not offer it.
		s.MustDevice(t, admin, "op-5", nil)
		last := s.Dispatch(t, admin, map[string]any{"action": "reboot", "params": map[string]any{}, "search_type": "default",
			"device_ids": []string{"op-5"}, "schedule": map[string]any{"phases": []any{fleetdtest.Phase("all", fleetdtest.TriggerNow, fleetdtest.Percent(100))}}})
		// The scheduler releases a phase that triggers now just after the
		// dispatch commits, not in it.
		fleetdtest.Eventually(t, "the rollout's one phase to be released", func() bool { return s.Rollout(t, admin, last).Status == "running" })
		fleetdtest.WantCode(t, s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/trigger_next_phase", last), nil), 409, "conflict")
		if got := buttons(last); got != "pause abort" {
			t.Fatalf("a running rollout with no phase left shows %q", got)
		}
		if a := s.Rollout(t, admin, id); a.Status != "aborted" || a.Targeted != 4 || a.Statuses["Cancelled"] != 4 {
			t.Fatalf("after the operations: %+v", a)
		}

		var logs struct {
			AuditLogs []struct {
				Actor   string         `json:"actor"`
				Action  string         `json:"action"`
				Target  string         `json:"target"`
				Details map[string]any `json:"details"`
			} `json:"audit_logs"`
		}
		s.Do(t, admin, "GET", "/api/v1/audit-logs?limit=1000", nil).Want(t, 200).Decode(t, &logs)
		var got []string
		for _, l := range slices.Backward(logs.AuditLogs) { // newest first
			if !strings.HasPrefix(l.Action, "rollout.") {
				continue
			}
			if l.Target != fmt.Sprintf("actions/%d", id) || l.Actor != "admin" {
				t.Fatalf("audit log %+v", l)
			}
			got = append(got, fmt.Sprintf("%s %v->%v", l.Action, l.Details["was"], l.Details["status"]))
		}
		want := []string{
			"rollout.pause scheduled->paused",
			"rollout.resume paused->scheduled",
			"rollout.trigger_next_phase scheduled->running",
			"rollout.append_phase running->running",
			"rollout.abort running->aborted",
		}
		if !slices.Equal(got, want) {
			t.Fatalf("audited\n%v\nwant\n%v", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	})
}

// testClock is a clock a test sets, which counts how often the server read
// it since: a test waits for reads rather than for time to pass.
type testClock struct {
	mu    sync.Mutex
	t     time.Time
	reads int
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reads++
	return c.t
}

// set moves the clock to an RFC 3339 time.
func (c *testClock) set(t *testing.T, at string) {
	t.Helper()
	tm, err := time.Parse(time.RFC3339, at)
	if err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	c.t, c.reads = tm, 0
	c.mu.Unlock()
}

// looked waits until the server read the clock n times since it was set:
// the rollout driver has made several passes at the time.
func (c *testClock) looked(t *testing.T, n int) {
	t.Helper()
	fleetdtest.Eventually(t, fmt.Sprintf("the server to read the clock %d times", n), func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.reads >= n
	})
}

// TestRolloutMaintenanceWindowDST runs a rollout with a 02:00-05:00
// maintenance window in Europe/Berlin on simulated devices, with the
// server's clock moved across the night the clocks go forward (29 March
// 2026, 02:00 CET becomes 03:00 CEST): released device actions wait outside
// the window, are sent when it opens, and the window of that night lasts
// two hours.
func TestRolloutMaintenanceWindowDST(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		clock := &testClock{}
		clock.set(t, "2026-03-29T00:50:00Z") // 01:50 CET: before the window
		s := fleetdtest.New(b.DSN(t), t.TempDir())
		s.Now = clock.Now
		s.Start(t, "--rollout-interval", "10ms")
		t.Cleanup(func() { s.Stop(t) })
		admin := s.Admin()
		tokens := filepath.Join(t.TempDir(), "tokens.csv")
		sim := s.StartSim(t, "--devices", "3", "--provision", "--url", s.URL, "--api-key", admin.Key,
			"--tokens", tokens, "--prefix", "win-", "--telemetry-interval", "0")
		sim.Connected(t, 3)

		id := s.Dispatch(t, admin, map[string]any{"action": "reboot", "params": map[string]any{}, "search_type": "search", "search_query": "win-",
			"schedule": map[string]any{"maintenance_window": map[string]any{"start": "02:00", "end": "05:00", "timezone": "Europe/Berlin"},
				"phases": []any{
					fleetdtest.Phase("first", fleetdtest.TriggerNow, fleetdtest.FixedList("win-00001")),
					fleetdtest.Phase("second", fleetdtest.TriggerManual, fleetdtest.FixedList("win-00002")),
					fleetdtest.Phase("third", fleetdtest.TriggerManual, fleetdtest.FixedList("win-00003")),
				}}})
		// Released, but 01:50 is outside the window: it waits, Queued, even
		// for a device that subscribes anew.
		clock.looked(t, 10)
		if da := s.DeviceAction(t, admin, "win-00001", id); da.ActionStatus != "Queued" {
			t.Fatalf("win-00001 at 01:50 CET: %+v", da)
		}
		sim.Stop(t)
		sim = s.StartSim(t, "--devices", "3", "--tokens", tokens, "--telemetry-interval", "0")
		sim.Connected(t, 3)
		clock.set(t, "2026-03-29T00:59:59Z") // 01:59:59 CET
		clock.looked(t, 10)
		if da := s.DeviceAction(t, admin, "win-00001", id); da.ActionStatus != "Queued" || simActions(sim) != 0 {
			t.Fatalf("win-00001 at 01:59:59 CET: %+v; %d actions received", da, simActions(sim))
		}

		// 01:00 UTC is 03:00 CEST: the clocks skipped 02:00-03:00, and the
		// window is open. The device is sent what waited.
		clock.set(t, "2026-03-29T01:00:00Z")
		s.AwaitActionStatus(t, admin, "win-00001", id, "Completed")

		// At 04:59 CEST a phase released is sent at once.
		clock.set(t, "2026-03-29T02:59:00Z")
		s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/trigger_next_phase", id), nil).Want(t, 204)
		s.AwaitActionStatus(t, admin, "win-00002", id, "Completed")

		// 03:00 UTC is 05:00 CEST: two hours after it opened, the window of
		// this night is shut. The third phase waits for the next night.
		clock.set(t, "2026-03-29T03:00:00Z")
		s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/trigger_next_phase", id), nil).Want(t, 204)
		clock.looked(t, 10)
		if da := s.DeviceAction(t, admin, "win-00003", id); da.ActionStatus != "Queued" || simActions(sim) != 2 {
			t.Fatalf("win-00003 at 05:00 CEST: %+v; %d actions received", da, simActions(sim))
		}
		clock.set(t, "2026-03-29T23:59:00Z") // 01:59 CEST on the 30th
		clock.looked(t, 10)
		if da := s.DeviceAction(t, admin, "win-00003", id); da.ActionStatus != "Queued" {
			t.Fatalf("win-00003 at 01:59 CEST: %+v", da)
		}
		clock.set(t, "2026-03-30T00:00:00Z") // 02:00 CEST
		s.AwaitActionStatus(t, admin, "win-00003", id, "Completed")
		s.AwaitRollout(t, admin, id, "completed")
	})
}

// TestRolloutMetadataPhase dispatches a rollout whose canary is a ring:
// the devices whose metadata say ring=lab when it triggers, shown in every
// encoding; a metadata phase without its pairs is refused naming the field.
func TestRolloutMetadataPhase(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		admin := s.Admin()
		for _, d := range []string{"m1", "m2", "m3", "m4"} {
			meta := map[string]string{"ring": "main"}
			if d == "m2" || d == "m4" {
				meta["ring"] = "lab"
			}
			s.MustDevice(t, admin, d, meta)
		}
		ring := map[string]any{"type": "metadata", "metadata": map[string]any{"ring": "lab"}}
		id := s.Dispatch(t, admin, map[string]any{"action": "reboot", "params": map[string]any{}, "search_type": "search", "search_query": "m",
			"schedule": map[string]any{"phases": []any{fleetdtest.Phase("lab", fleetdtest.TriggerNow, ring), fleetdtest.Phase("rest", fleetdtest.TriggerAfter, fleetdtest.Percent(100))}}})
		a := s.Rollout(t, admin, id)
		if fmt.Sprint(a.StatusesPhased) != "map[0:map[Queued:2] 1:map[Scheduled:2]]" {
			t.Fatalf("after the lab phase: %+v", a)
		}
		for d, want := range map[string]int{"m1": 1, "m2": 0, "m3": 1, "m4": 0} {
			if da := s.DeviceAction(t, admin, d, id); da.Phase != want {
				t.Fatalf("%s in phase %d, want %d", d, da.Phase, want)
			}
		}
		var want any
		for _, f := range codec.Formats {
			r := s.Send(t, fleetdtest.Req{Method: "GET", Path: fmt.Sprintf("/api/v1/actions/%d", id), Creds: admin, Header: http.Header{"Accept": {f.ContentType()}}}).Want(t, 200)
			v, err := codec.Decode(f, r.Body)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if got := fmt.Sprint(fleetdtest.At(v, "schedule", "phases", 0, "info")); got != "map[metadata:map[ring:lab] type:metadata]" {
				t.Fatalf("%s: the lab phase is %s", f, got)
			}
			if want == nil {
				want = v
			} else if !reflect.DeepEqual(fleetdtest.Times(v), fleetdtest.Times(want)) {
				t.Fatalf("%s says\n%v\nwhere JSON says\n%v", f, v, want)
			}
		}
		r := s.Do(t, admin, "POST", "/api/v1/actions", map[string]any{"action": "reboot", "params": map[string]any{}, "search_type": "all",
			"schedule": map[string]any{"phases": []any{fleetdtest.Phase("lab", fleetdtest.TriggerNow, map[string]any{"type": "metadata"}), fleetdtest.Phase("rest", fleetdtest.TriggerAfter, fleetdtest.Percent(100))}}})
		fleetdtest.WantCode(t, r, 400, "invalid")
		if !strings.Contains(string(r.Body), `"schedule.phases[0].info.metadata"`) {
			t.Fatalf("the refusal does not name the field: %s", r.Body)
		}
	})
}
