package fleet_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet"
)

// readSchedule decodes a dispatch body with a schedule, as the modern
// endpoint does.
func readSchedule(t *testing.T, body string) (*fleet.Schedule, map[string]string) {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatal(err)
	}
	v = canonicalInts(v)
	f := fleet.NewFields(v)
	d := fleet.ReadDispatch(f, true)
	if e, ok := f.Err().(*fleet.Error); ok {
		return d.Schedule, e.Fields
	}
	return d.Schedule, nil
}

// canonicalInts turns integral float64s into int64s, as the codec does.
func canonicalInts(v any) any {
	switch x := v.(type) {
	case float64:
		if x == float64(int64(x)) {
			return int64(x)
		}
	case []any:
		for i := range x {
			x[i] = canonicalInts(x[i])
		}
	case map[string]any:
		for k := range x {
			x[k] = canonicalInts(x[k])
		}
	}
	return v
}

func TestReadSchedule(t *testing.T) {
	const base = `{"action": "update_firmware", "params": {}, "search_type": "all", "schedule": %s}`
	s, errs := readSchedule(t, fmt.Sprintf(base, `{"release_notes": "fixes", "end_timestamp": 1767225600000,
		"maintenance_window": {"start": "22:00", "end": "05:00", "timezone": "Europe/Berlin"},
		"phases": [
			{"name": "canary", "trigger_on": {"type": "now"}, "info": {"type": "fixed_list", "device_ids": ["pump-1", "pump-2"]}},
			{"name": "quarter", "trigger_on": {"type": "after_previous", "wait_seconds": 3600, "finished_ratio": 0.95}, "info": {"type": "percentage", "percentage": 25},
			 "gate": {"max_failure_rate": 0.1, "min_finished": 2, "alert_rules": ["6f1c9f7e-8d7a-4a59-9d1e-2b7c3f1a0b11"], "watch_seconds": 1800}},
			{"name": "lab", "trigger_on": {"type": "manual"}, "info": {"type": "metadata", "metadata": {"ring": "lab", "site": "b"}}},
			{"name": "berlin", "trigger_on": {"type": "manual"}, "info": {"type": "group", "group": "berlin.v2"}},
			{"name": "everyone", "trigger_on": {"type": "timestamp", "timestamp": 1766000000000}, "info": {"type": "percentage", "percentage": 100}}]}`))
	if errs != nil {
		t.Fatalf("valid schedule refused: %v", errs)
	}
	if len(s.Phases) != 5 || *s.Phases[1].Gate.MaxFailureRate != 0.1 || s.Phases[1].Gate.MinFinished != 2 || s.Phases[4].TriggerOn.Timestamp != 1766000000000 ||
		fmt.Sprint(s.Phases[2].Info) != "{metadata [] 0 map[ring:lab site:b] }" || fmt.Sprint(s.Phases[3].Info) != "{group [] 0 map[] berlin.v2}" ||
		s.Phases[1].TriggerOn.Ratio() != 0.95 || s.Phases[4].TriggerOn.Ratio() != 1 ||
		s.MaintenanceWindow.Timezone != "Europe/Berlin" || s.EndTimestamp != 1767225600000 {
		t.Fatalf("schedule %+v", s)
	}

	for _, tc := range []struct{ name, schedule, field, problem string }{
		{"NoPhases", `{"phases": []}`, "schedule.phases", "at least one"},
		{"UnknownField", `{"phases": [{"name": "a", "trigger_on": {"type": "now"}, "info": {"type": "percentage", "percentage": 100}}], "retry": 1}`, "schedule.retry", "not a known field"},
		{"BadTrigger", `{"phases": [{"name": "a", "trigger_on": {"type": "soon"}, "info": {"type": "percentage", "percentage": 100}}]}`, "schedule.phases[0].trigger_on.type", "must be one of"},
		{"FirstAfterPrevious", `{"phases": [{"name": "a", "trigger_on": {"type": "after_previous"}, "info": {"type": "percentage", "percentage": 100}}]}`, "schedule.phases[0].trigger_on.type", "first phase"},
		{"RatioZero", `{"phases": [{"name": "a", "trigger_on": {"type": "now"}, "info": {"type": "percentage", "percentage": 5}},
			{"name": "b", "trigger_on": {"type": "after_previous", "finished_ratio": 0}, "info": {"type": "percentage", "percentage": 100}}]}`, "schedule.phases[1].trigger_on.finished_ratio", "more than 0"},
		{"RatioAboveOne", `{"phases": [{"name": "a", "trigger_on": {"type": "now"}, "info": {"type": "percentage", "percentage": 5}},
			{"name": "b", "trigger_on": {"type": "after_previous", "finished_ratio": 1.5}, "info": {"type": "percentage", "percentage": 100}}]}`, "schedule.phases[1].trigger_on.finished_ratio", "between 0 and 1"},
		{"RatioNotANumber", `{"phases": [{"name": "a", "trigger_on": {"type": "now"}, "info": {"type": "percentage", "percentage": 5}},
			{"name": "b", "trigger_on": {"type": "after_previous", "finished_ratio": "most"}, "info": {"type": "percentage", "percentage": 100}}]}`, "schedule.phases[1].trigger_on.finished_ratio", "must be a number"},
		{"RatioOnManual", `{"phases": [{"name": "a", "trigger_on": {"type": "now"}, "info": {"type": "percentage", "percentage": 5}},
			{"name": "b", "trigger_on": {"type": "manual", "finished_ratio": 0.5}, "info": {"type": "percentage", "percentage": 100}}]}`, "schedule.phases[1].trigger_on.finished_ratio", "not a known field"},
		{"MetadataMissing", `{"phases": [{"name": "a", "trigger_on": {"type": "now"}, "info": {"type": "metadata"}}]}`, "schedule.phases[0].info.metadata", "required"},
		{"MetadataEmpty", `{"phases": [{"name": "a", "trigger_on": {"type": "now"}, "info": {"type": "metadata", "metadata": {}}}]}`, "schedule.phases[0].info.metadata", "at least one"},
		{"MetadataNotString", `{"phases": [{"name": "a", "trigger_on": {"type": "now"}, "info": {"type": "metadata", "metadata": {"ring": 1}}}]}`, "schedule.phases[0].info.metadata.ring", "must be a string"},
		{"MetadataEmptyKey", `{"phases": [{"name": "a", "trigger_on": {"type": "now"}, "info": {"type": "metadata", "metadata": {"": "x"}}}]}`, "schedule.phases[0].info.metadata", "1 to 64 characters"},
		{"MetadataWithIDs", `{"phases": [{"name": "a", "trigger_on": {"type": "now"}, "info": {"type": "metadata", "metadata": {"ring": "lab"}, "device_ids": ["d1"]}}]}`, "schedule.phases[0].info.device_ids", "not a known field"},
		{"InfoType", `{"phases": [{"name": "a", "trigger_on": {"type": "now"}, "info": {"type": "ring"}}]}`, "schedule.phases[0].info.type", "fixed_list, percentage, metadata or group"},
		{"GroupMissing", `{"phases": [{"name": "a", "trigger_on": {"type": "now"}, "info": {"type": "group"}}]}`, "schedule.phases[0].info.group", "required"},
		{"GroupName", `{"phases": [{"name": "a", "trigger_on": {"type": "now"}, "info": {"type": "group", "group": "berlin west"}}]}`, "schedule.phases[0].info.group", "A-Z a-z 0-9 . _ -"},
		{"GroupWithMetadata", `{"phases": [{"name": "a", "trigger_on": {"type": "now"}, "info": {"type": "group", "group": "g", "metadata": {"ring": "lab"}}}]}`, "schedule.phases[0].info.metadata", "not a known field"},
		{"TimestampMissing", `{"phases": [{"name": "a", "trigger_on": {"type": "timestamp"}, "info": {"type": "percentage", "percentage": 100}}]}`, "schedule.phases[0].trigger_on.timestamp", "required"},
		{"Percentage101", `{"phases": [{"name": "a", "trigger_on": {"type": "now"}, "info": {"type": "percentage", "percentage": 101}}]}`, "schedule.phases[0].info.percentage", "between 1 and 100"},
		{"PercentageShrinks", `{"phases": [{"name": "a", "trigger_on": {"type": "now"}, "info": {"type": "percentage", "percentage": 50}},
			{"name": "b", "trigger_on": {"type": "manual"}, "info": {"type": "percentage", "percentage": 50}}]}`, "schedule.phases[1].info.percentage", "cumulative"},
		{"DeviceTwice", `{"phases": [{"name": "a", "trigger_on": {"type": "now"}, "info": {"type": "fixed_list", "device_ids": ["d1"]}},
			{"name": "b", "trigger_on": {"type": "manual"}, "info": {"type": "fixed_list", "device_ids": ["d1"]}}]}`, "schedule.phases[1].info.device_ids", "in phase 0"},
		{"GateOnFirst", `{"phases": [{"name": "a", "trigger_on": {"type": "now"}, "info": {"type": "percentage", "percentage": 100}, "gate": {"max_failure_rate": 0.5}}]}`, "schedule.phases[0].gate", "first phase"},
		{"EmptyGate", `{"phases": [{"name": "a", "trigger_on": {"type": "now"}, "info": {"type": "percentage", "percentage": 5}},
			{"name": "b", "trigger_on": {"type": "now"}, "info": {"type": "percentage", "percentage": 100}, "gate": {}}]}`, "schedule.phases[1].gate.max_failure_rate", "a gate needs"},
		{"RateAboveOne", `{"phases": [{"name": "a", "trigger_on": {"type": "now"}, "info": {"type": "percentage", "percentage": 5}},
			{"name": "b", "trigger_on": {"type": "now"}, "info": {"type": "percentage", "percentage": 100}, "gate": {"max_failure_rate": 1.5}}]}`, "schedule.phases[1].gate.max_failure_rate", "between 0 and 1"},
		{"AlertsWithoutWatch", `{"phases": [{"name": "a", "trigger_on": {"type": "now"}, "info": {"type": "percentage", "percentage": 5}},
			{"name": "b", "trigger_on": {"type": "now"}, "info": {"type": "percentage", "percentage": 100}, "gate": {"alert_rules": ["6f1c9f7e-8d7a-4a59-9d1e-2b7c3f1a0b11"]}}]}`, "schedule.phases[1].gate.watch_seconds", "required"},
		{"AlertRuleNotUUID", `{"phases": [{"name": "a", "trigger_on": {"type": "now"}, "info": {"type": "percentage", "percentage": 5}},
			{"name": "b", "trigger_on": {"type": "now"}, "info": {"type": "percentage", "percentage": 100}, "gate": {"alert_rules": ["hot"], "watch_seconds": 60}}]}`, "schedule.phases[1].gate.alert_rules[0]", "UUID"},
		{"WindowClock", `{"maintenance_window": {"start": "25:00", "end": "05:00", "timezone": "UTC"}, "phases": [{"name": "a", "trigger_on": {"type": "now"}, "info": {"type": "percentage", "percentage": 100}}]}`, "schedule.maintenance_window.start", "HH:MM"},
		{"WindowZone", `{"maintenance_window": {"start": "01:00", "end": "05:00", "timezone": "Mars/Olympus"}, "phases": [{"name": "a", "trigger_on": {"type": "now"}, "info": {"type": "percentage", "percentage": 100}}]}`, "schedule.maintenance_window.timezone", "IANA"},
		{"WindowLocal", `{"maintenance_window": {"start": "01:00", "end": "05:00", "timezone": "Local"}, "phases": [{"name": "a", "trigger_on": {"type": "now"}, "info": {"type": "percentage", "percentage": 100}}]}`, "schedule.maintenance_window.timezone", "IANA"},
		{"WindowEmpty", `{"maintenance_window": {"start": "01:00", "end": "01:00", "timezone": "UTC"}, "phases": [{"name": "a", "trigger_on": {"type": "now"}, "info": {"type": "percentage", "percentage": 100}}]}`, "schedule.maintenance_window.end", "differ"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, errs := readSchedule(t, fmt.Sprintf(base, tc.schedule))
			if !strings.Contains(errs[tc.field], tc.problem) {
				t.Fatalf("problems %v; want %s: ...%s...", errs, tc.field, tc.problem)
			}
		})
	}

	t.Run("LegacyBodyRefusesIt", func(t *testing.T) {
		f := fleet.NewFields(map[string]any{"action": "x", "params": map[string]any{}, "search_type": "all", "schedule": map[string]any{}})
		fleet.ReadDispatch(f, false)
		if e, ok := f.Err().(*fleet.Error); !ok || e.Fields["schedule"] != "is not a known field" {
			t.Fatalf("S1 with a schedule: %v", f.Err())
		}
	})
}

// TestMaintenanceWindow checks the window across both of Europe/Berlin's
// daylight saving time changes in 2026: clocks go forward at 02:00 on 29
// March (02:00-02:59 does not exist) and back at 03:00 on 25 October
// (02:00-02:59 happens twice).
func TestMaintenanceWindow(t *testing.T) {
	w := &fleet.MaintenanceWindow{Start: "02:00", End: "05:00", Timezone: "Europe/Berlin"}
	utc := func(s string) time.Time {
		tm, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	for _, tc := range []struct {
		at   string
		open bool
		occ  int64
	}{
		{"2026-03-28T00:59:00Z", false, 0},       // 01:59 CET
		{"2026-03-28T01:00:00Z", true, 20260328}, // 02:00 CET
		{"2026-03-28T03:59:00Z", true, 20260328}, // 04:59 CET
		{"2026-03-28T04:00:00Z", false, 0},       // 05:00 CET
		{"2026-03-29T00:59:00Z", false, 0},       // 01:59 CET
		{"2026-03-29T01:00:00Z", true, 20260329}, // 03:00 CEST: the clocks jumped over 02:00
		{"2026-03-29T02:59:00Z", true, 20260329}, // 04:59 CEST
		{"2026-03-29T03:00:00Z", false, 0},       // 05:00 CEST: two hours after it opened
		{"2026-10-25T00:00:00Z", true, 20261025}, // 02:00 CEST
		{"2026-10-25T01:30:00Z", true, 20261025}, // 02:30 CET, the second time
		{"2026-10-25T03:59:00Z", true, 20261025}, // 04:59 CET
		{"2026-10-25T04:00:00Z", false, 0},       // 05:00 CET: four hours after it opened
		{"2026-10-24T23:59:00Z", false, 0},       // 01:59 CEST
	} {
		open, occ := w.Open(utc(tc.at))
		if open != tc.open || occ != tc.occ {
			t.Errorf("%s: open %v, occurrence %d; want %v, %d", tc.at, open, occ, tc.open, tc.occ)
		}
	}
	overnight := &fleet.MaintenanceWindow{Start: "22:00", End: "02:00", Timezone: "UTC"}
	if open, occ := overnight.Open(utc("2026-05-02T01:00:00Z")); !open || occ != 20260501 {
		t.Errorf("01:00 in a 22:00-02:00 window: %v, %d; want the window that opened on the 1st", open, occ)
	}
	if open, _ := overnight.Open(utc("2026-05-02T12:00:00Z")); open {
		t.Error("noon in a 22:00-02:00 window is open")
	}
}

// rollout builds a rollout of three phases whose second has gate g.
func rollout(g *fleet.Gate, trigger fleet.Trigger) *fleet.Rollout {
	return &fleet.Rollout{Action: fleet.ActionUpdateFirmware, Status: fleet.RolloutRunning, NextPhase: 1, WaivedPhase: -1,
		TriggeredAt: []time.Time{time.UnixMilli(1000)},
		Schedule: fleet.Schedule{Phases: []fleet.Phase{
			{Name: "canary", TriggerOn: fleet.Trigger{Type: fleet.TriggerNow}},
			{Name: "quarter", TriggerOn: trigger, Gate: g},
			{Name: "rest", TriggerOn: fleet.Trigger{Type: fleet.TriggerManual}},
		}}}
}

// TestRolloutNext is the table of a rollout's decisions.
func TestRolloutNext(t *testing.T) {
	now := time.UnixMilli(1_000_000)
	rate := 0.1
	rateGate := &fleet.Gate{MaxFailureRate: &rate, MinFinished: 2}
	alertGate := &fleet.Gate{AlertRules: []string{"r"}, WatchSeconds: 1800}
	nowTrigger := fleet.Trigger{Type: fleet.TriggerNow}
	for _, tc := range []struct {
		name   string
		r      *fleet.Rollout
		f      fleet.RolloutFacts
		kind   fleet.StepKind
		reason string
	}{
		{"NoGate", rollout(nil, nowTrigger), fleet.RolloutFacts{}, fleet.StepTrigger, ""},
		{"RateHolds", rollout(rateGate, nowTrigger), fleet.RolloutFacts{Finished: 10, Failed: 1}, fleet.StepTrigger, ""},
		{"RateFails", rollout(rateGate, nowTrigger), fleet.RolloutFacts{Finished: 10, Failed: 3}, fleet.StepPause,
			"phase 1 (quarter) not released: 3 of 10 finished devices failed (30% > 10%)"},
		{"RateFailsByAThird", rollout(rateGate, nowTrigger), fleet.RolloutFacts{Finished: 3, Failed: 1}, fleet.StepPause,
			"phase 1 (quarter) not released: 1 of 3 finished devices failed (33.3% > 10%)"},
		{"TooFewFinished", rollout(rateGate, nowTrigger), fleet.RolloutFacts{Finished: 1, Failed: 1}, fleet.StepWait, ""},
		{"Waived", func() *fleet.Rollout { r := rollout(rateGate, nowTrigger); r.WaivedPhase = 1; return r }(),
			fleet.RolloutFacts{Finished: 10, Failed: 9}, fleet.StepTrigger, ""},
		{"Alert", rollout(alertGate, nowTrigger), fleet.RolloutFacts{Alert: &fleet.GateAlert{RuleName: "overheating", DeviceID: "pump-2", After: 12 * time.Minute}},
			fleet.StepPause, "phase 1 (quarter) not released: alert 'overheating' opened on pump-2 12 minutes after its update completed"},
		{"Watching", rollout(alertGate, nowTrigger), fleet.RolloutFacts{WatchedUntil: now.Add(time.Second)}, fleet.StepWait, ""},
		{"Watched", rollout(alertGate, nowTrigger), fleet.RolloutFacts{WatchedUntil: now}, fleet.StepTrigger, ""},
		{"Paused", func() *fleet.Rollout { r := rollout(nil, nowTrigger); r.Status = fleet.RolloutPaused; return r }(), fleet.RolloutFacts{}, fleet.StepWait, ""},
		{"TimestampAhead", rollout(nil, fleet.Trigger{Type: fleet.TriggerTimestamp, Timestamp: now.UnixMilli() + 1}), fleet.RolloutFacts{}, fleet.StepWait, ""},
		{"TimestampCame", rollout(nil, fleet.Trigger{Type: fleet.TriggerTimestamp, Timestamp: now.UnixMilli()}), fleet.RolloutFacts{}, fleet.StepTrigger, ""},
		{"PreviousBusy", rollout(nil, fleet.Trigger{Type: fleet.TriggerAfterPrevious}), fleet.RolloutFacts{EarlierDevices: 2, EarlierFinal: 1}, fleet.StepWait, ""},
		{"PreviousWaiting", rollout(nil, fleet.Trigger{Type: fleet.TriggerAfterPrevious, WaitSeconds: 60}),
			fleet.RolloutFacts{EarlierDevices: 2, EarlierFinal: 2, ReachedAt: now.Add(-59 * time.Second)}, fleet.StepWait, ""},
		{"PreviousDone", rollout(nil, fleet.Trigger{Type: fleet.TriggerAfterPrevious, WaitSeconds: 60}),
			fleet.RolloutFacts{EarlierDevices: 2, EarlierFinal: 2, ReachedAt: now.Add(-60 * time.Second)}, fleet.StepTrigger, ""},
		// An empty earlier phase is final when it triggered.
		{"PreviousEmpty", rollout(nil, fleet.Trigger{Type: fleet.TriggerAfterPrevious, WaitSeconds: 60}), fleet.RolloutFacts{}, fleet.StepTrigger, ""},
		{"PreviousEmptyWaiting", rollout(nil, fleet.Trigger{Type: fleet.TriggerAfterPrevious, WaitSeconds: 1000}), fleet.RolloutFacts{}, fleet.StepWait, ""},
		// finished_ratio: 0.9 of 15 devices is 14 final.
		{"RatioShort", rollout(nil, fleet.Trigger{Type: fleet.TriggerAfterPrevious, FinishedRatio: 0.9}),
			fleet.RolloutFacts{EarlierDevices: 15, EarlierFinal: 13, ReachedAt: now}, fleet.StepWait, ""},
		{"RatioReached", rollout(nil, fleet.Trigger{Type: fleet.TriggerAfterPrevious, FinishedRatio: 0.9}),
			fleet.RolloutFacts{EarlierDevices: 15, EarlierFinal: 14, ReachedAt: now}, fleet.StepTrigger, ""},
		{"RatioOfOne", rollout(nil, fleet.Trigger{Type: fleet.TriggerAfterPrevious, FinishedRatio: 0.01}),
			fleet.RolloutFacts{EarlierDevices: 1, EarlierFinal: 0}, fleet.StepWait, ""},
		// The wait counts from the share reached, not before the previous
		// phase triggered.
		{"RatioReachedBeforeTrigger", rollout(nil, fleet.Trigger{Type: fleet.TriggerAfterPrevious, FinishedRatio: 0.5, WaitSeconds: 1000}),
			fleet.RolloutFacts{EarlierDevices: 2, EarlierFinal: 1, ReachedAt: time.UnixMilli(0)}, fleet.StepWait, ""},
		{"Manual", rollout(nil, fleet.Trigger{Type: fleet.TriggerManual}), fleet.RolloutFacts{}, fleet.StepWait, ""},
		{"Ends", func() *fleet.Rollout {
			r := rollout(nil, nowTrigger)
			r.Schedule.EndTimestamp = now.UnixMilli()
			return r
		}(), fleet.RolloutFacts{}, fleet.StepEnd, ""},
		{"EndedCompletes", func() *fleet.Rollout { r := rollout(nil, nowTrigger); r.Ended = true; return r }(), fleet.RolloutFacts{Live: 0}, fleet.StepComplete, ""},
		{"EndedSettling", func() *fleet.Rollout { r := rollout(nil, nowTrigger); r.Ended = true; return r }(), fleet.RolloutFacts{Live: 2}, fleet.StepWait, ""},
		{"AllTriggeredCompletes", func() *fleet.Rollout { r := rollout(nil, nowTrigger); r.NextPhase = 3; return r }(), fleet.RolloutFacts{}, fleet.StepComplete, ""},
		{"Aborted", func() *fleet.Rollout { r := rollout(nil, nowTrigger); r.Status = fleet.RolloutAborted; return r }(), fleet.RolloutFacts{}, fleet.StepWait, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			step := tc.r.Next(now, tc.f)
			if step.Kind != tc.kind || step.Reason != tc.reason {
				t.Fatalf("step %+v; want kind %d, reason %q", step, tc.kind, tc.reason)
			}
		})
	}

	t.Run("TriggerNow", func(t *testing.T) {
		r := rollout(nil, fleet.Trigger{Type: fleet.TriggerManual})
		if step, err := r.TriggerNow(now, fleet.RolloutFacts{}); err != nil || step.Kind != fleet.StepTrigger || step.Phase != 1 {
			t.Fatalf("manual phase: %+v, %v", step, err)
		}
		r.Status = fleet.RolloutPaused
		if _, err := r.TriggerNow(now, fleet.RolloutFacts{}); fleet.ErrorCode(err) != fleet.ECONFLICT {
			t.Fatalf("paused: %v", err)
		}
		r = rollout(rateGate, nowTrigger)
		if _, err := r.TriggerNow(now, fleet.RolloutFacts{Finished: 1}); fleet.ErrorCode(err) != fleet.ECONFLICT || !strings.Contains(err.Error(), "cannot judge yet") {
			t.Fatalf("undecided gate: %v", err)
		}
		if step, err := r.TriggerNow(now, fleet.RolloutFacts{Finished: 2, Failed: 2}); err != nil || step.Kind != fleet.StepPause {
			t.Fatalf("failing gate: %+v, %v", step, err)
		}
	})
}

func TestSpan(t *testing.T) {
	for d, want := range map[time.Duration]string{
		40 * time.Second: "40 seconds", time.Second: "1 second", 12 * time.Minute: "12 minutes",
		time.Hour: "1 hour", 3*time.Hour + 5*time.Minute: "3 hours 5 minutes",
	} {
		if got := fleet.Span(d); got != want {
			t.Errorf("Span(%v) = %q, want %q", d, got, want)
		}
	}
}

// TestRolloutWaitReason is the table of what a waiting rollout says it
// waits for.
func TestRolloutWaitReason(t *testing.T) {
	now := time.UnixMilli(1_000_000).UTC()
	yes, no := true, false
	seen := now.Add(-3 * time.Minute)
	devices := []fleet.WaitingDevice{
		{ID: "a", Status: fleet.StatusQueued, Online: &no},
		{ID: "b", Status: fleet.StatusProgress, Online: &yes},
		{ID: "c", Status: fleet.StatusQueued, Online: &no, LastSeenAt: &seen},
		{ID: "d", Status: fleet.StatusInitiated, LastSeenAt: &seen}, // online unknown
	}
	after := func(ratio float64, wait int64) *fleet.Rollout {
		return rollout(nil, fleet.Trigger{Type: fleet.TriggerAfterPrevious, FinishedRatio: ratio, WaitSeconds: wait})
	}
	rateGate := func() *fleet.Rollout {
		r := 0.1
		return rollout(&fleet.Gate{MaxFailureRate: &r, MinFinished: 5}, fleet.Trigger{Type: fleet.TriggerNow})
	}
	for _, tc := range []struct {
		name string
		w    fleet.RolloutWait
		want string
	}{
		{"Devices", fleet.RolloutWait{Rollout: after(0, 0), Facts: fleet.RolloutFacts{EarlierDevices: 10, EarlierFinal: 6}, Devices: devices, Unfinished: 4},
			"phase 1 (quarter) waits for 4 more devices of earlier phases to finish; not finished: a (Queued, offline, never seen), b (Progress, online), " +
				"c (Queued, offline, last seen 1970-01-01T00:13:40Z), d (Initiated, last seen 1970-01-01T00:13:40Z)"},
		{"Ratio", fleet.RolloutWait{Rollout: after(0.9, 0), Facts: fleet.RolloutFacts{EarlierDevices: 100, EarlierFinal: 80}, Devices: devices[:1], Unfinished: 20},
			"phase 1 (quarter) waits for 10 more devices of earlier phases to finish (finished_ratio 0.9: 90 of 100); not finished: a (Queued, offline, never seen) and 19 more"},
		{"Wait", fleet.RolloutWait{Rollout: after(0, 60), Facts: fleet.RolloutFacts{EarlierDevices: 1, EarlierFinal: 1, ReachedAt: now.Add(-time.Second)}},
			"phase 1 (quarter) triggers at 1970-01-01T00:17:39Z, 60 seconds after the earlier phases' devices finished"},
		{"Due", fleet.RolloutWait{Rollout: after(0, 0), Facts: fleet.RolloutFacts{EarlierDevices: 1, EarlierFinal: 1, ReachedAt: now}}, ""},
		{"Manual", fleet.RolloutWait{Rollout: rollout(nil, fleet.Trigger{Type: fleet.TriggerManual})}, "phase 1 (quarter) waits for an operator to trigger it"},
		{"Timestamp", fleet.RolloutWait{Rollout: rollout(nil, fleet.Trigger{Type: fleet.TriggerTimestamp, Timestamp: now.UnixMilli() + 60_000})},
			"phase 1 (quarter) triggers at 1970-01-01T00:17:40Z"},
		{"GateCannotJudge", fleet.RolloutWait{Rollout: rateGate(), Facts: fleet.RolloutFacts{Finished: 3}, Devices: devices[1:2], Unfinished: 2},
			"the gate of phase 1 (quarter) cannot judge yet: 3 of the 5 finished devices it needs have finished; not finished: b (Progress, online) and 1 more"},
		{"Settling", fleet.RolloutWait{Rollout: func() *fleet.Rollout { r := after(0, 0); r.NextPhase = 3; return r }(), Facts: fleet.RolloutFacts{Live: 1}, Devices: devices[:1], Unfinished: 1},
			"every phase triggered; waiting for 1 device to finish: a (Queued, offline, never seen)"},
		{"Ended", fleet.RolloutWait{Rollout: func() *fleet.Rollout { r := after(0, 0); r.Ended = true; return r }(), Facts: fleet.RolloutFacts{Live: 2}, Devices: devices[:2], Unfinished: 2},
			"the schedule ended; waiting for 2 devices released before it to finish: a (Queued, offline, never seen), b (Progress, online)"},
		{"Paused", fleet.RolloutWait{Rollout: func() *fleet.Rollout { r := after(0, 0); r.Status = fleet.RolloutPaused; return r }(), Devices: devices, Unfinished: 4}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.w.Reason(now); got != tc.want {
				t.Fatalf("reason\n%q\nwant\n%q", got, tc.want)
			}
		})
	}
}
