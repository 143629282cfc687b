package sqlstore_test

import (
	"context"
	"crypto/md5"
	"encoding/binary"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/internal/testclock"
	"github.com/fleetd/fleet/sqlstore"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

func fixed(name, trigger string, ids ...string) fleet.Phase {
	return fleet.Phase{Name: name, TriggerOn: fleet.Trigger{Type: trigger}, Info: fleet.PhaseInfo{Type: fleet.PhaseFixedList, DeviceIDs: ids}}
}

func share(name, trigger string, pct int) fleet.Phase {
	return fleet.Phase{Name: name, TriggerOn: fleet.Trigger{Type: trigger}, Info: fleet.PhaseInfo{Type: fleet.PhasePercentage, Percentage: pct}}
}

// phasesOf returns each device's phase in action id.
func phasesOf(t *testing.T, db *sqlstore.DB, tenant string, id int64) map[string]int {
	t.Helper()
	das, _, err := db.FindDeviceActions(context.Background(), tenant, fleet.DeviceActionFilter{ActionID: id, Page: fleet.Page{Page: 1, Limit: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, da := range das {
		out[da.DeviceID] = da.Phase
	}
	return out
}

// rankOrder sorts ids as percentage phases take them.
func rankOrder(ids []string) []string {
	rank := func(id string) int64 {
		sum := md5.Sum([]byte(id))
		return int64(binary.BigEndian.Uint64(sum[:8]))
	}
	out := slices.Clone(ids)
	sort.Slice(out, func(i, j int) bool { return rank(out[i]) < rank(out[j]) })
	return out
}

// TestRolloutPhases checks how dispatch partitions a rollout's targets:
// fixed lists first, then each percentage's cumulative quota, rounded up,
// in the stable order of the ids' MD5, the same on SQLite and PostgreSQL.
func TestRolloutPhases(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, _ := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		devs := map[string]map[string]string{}
		var ids []string
		for i := range 20 {
			id := fmt.Sprintf("pump-%02d", i)
			devs[id], ids = nil, append(ids, id)
		}
		mustDevices(t, db, "acme", devs)

		d := dispatch("update", "all")
		d.Schedule = &fleet.Schedule{Phases: []fleet.Phase{
			fixed("canary", fleet.TriggerManual, "pump-07", "pump-13"),
			share("quarter", fleet.TriggerManual, 25), // 5 of 20: 3 more
			fixed("late", fleet.TriggerManual, "pump-01"),
			share("everyone", fleet.TriggerManual, 100),
		}}
		a := mustDispatch(t, db, "acme", d)
		if a.Targeted != 20 || a.Statuses["Scheduled"] != 20 || a.Status != fleet.RolloutScheduled {
			t.Fatalf("dispatched %+v", a)
		}
		got := phasesOf(t, db, "acme", a.ID)
		want := map[string]int{"pump-07": 0, "pump-13": 0, "pump-01": 2}
		var rest []string
		for _, id := range rankOrder(ids) {
			if _, ok := want[id]; !ok {
				rest = append(rest, id)
			}
		}
		for i, id := range rest {
			want[id] = 3
			if i < 3 {
				want[id] = 1
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("phases\n got %v\nwant %v", got, want)
		}
		full, _ := db.FindAction(ctx, "acme", a.ID)
		if fmt.Sprint(full.StatusesPhased) != "map[0:map[Scheduled:2] 1:map[Scheduled:3] 2:map[Scheduled:1] 3:map[Scheduled:14]]" ||
			fmt.Sprint(full.PhasesTriggered) != "[false false false false]" || *full.NextPhaseIndex != 0 {
			t.Fatalf("action %+v", full)
		}

		t.Run("Unphased", func(t *testing.T) {
			u := mustDispatch(t, db, "acme", dispatch("reboot", "default", "pump-01"))
			full, _ := db.FindAction(ctx, "acme", u.ID)
			if fmt.Sprint(full.StatusesPhased) != "map[-1:map[Queued:1]]" || full.Schedule != nil || full.Status != "" {
				t.Fatalf("unphased action %+v", full)
			}
		})
		t.Run("NotTargets", func(t *testing.T) {
			d := dispatch("update", "default", "pump-01", "pump-02")
			d.Schedule = &fleet.Schedule{Phases: []fleet.Phase{fixed("c", fleet.TriggerNow, "pump-01", "pump-03", "ghost"), share("all", fleet.TriggerNow, 100)}}
			_, err := db.DispatchAction(ctx, "acme", d)
			if e, ok := err.(*fleet.Error); !ok || e.Code != fleet.EINVALID || e.Fields["schedule.phases[0].info.device_ids"] != "not targets of the dispatch: pump-03, ghost" {
				t.Fatalf("err = %#v", err)
			}
		})
		t.Run("NotPartitioned", func(t *testing.T) {
			d := dispatch("update", "all")
			d.Schedule = &fleet.Schedule{Phases: []fleet.Phase{share("half", fleet.TriggerNow, 50)}}
			_, err := db.DispatchAction(ctx, "acme", d)
			wantCode(t, err, fleet.EINVALID)
		})
		t.Run("CanaryRoundsUp", func(t *testing.T) {
			d := dispatch("update", "all")
			d.Schedule = &fleet.Schedule{Phases: []fleet.Phase{share("one", fleet.TriggerManual, 1), share("all", fleet.TriggerManual, 100)}}
			a := mustDispatch(t, db, "acme", d)
			full, _ := db.FindAction(ctx, "acme", a.ID)
			if fmt.Sprint(full.StatusesPhased) != "map[0:map[Scheduled:1] 1:map[Scheduled:19]]" {
				t.Fatalf("1%% of 20 devices: %v", full.StatusesPhased)
			}
		})
	})
}

// TestRolloutSteps drives a rollout through the store: triggers, a
// failure-rate gate that pauses, resume waiving it, reports on
// unreleased device actions, append_phase, abort.
func TestRolloutSteps(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, clk := mustOpen(t, b)
		ctx := fleet.NewContextWithActor(context.Background(), &fleet.Actor{Tenant: "acme", Role: fleet.RoleOperator, UserName: "ops"})
		mustTenant(t, db, "acme")
		mustDevices(t, db, "acme", map[string]map[string]string{"a": nil, "b": nil, "c": nil, "d": nil, "e": nil, "f": nil})
		rate := 0.4
		d := dispatch("update", "default", "a", "b", "c", "d", "e")
		d.Schedule = &fleet.Schedule{Phases: []fleet.Phase{
			fixed("canary", fleet.TriggerNow, "a", "b"),
			{Name: "rest", TriggerOn: fleet.Trigger{Type: fleet.TriggerAfterPrevious, WaitSeconds: 60},
				Info: fleet.PhaseInfo{Type: fleet.PhasePercentage, Percentage: 100}, Gate: &fleet.Gate{MaxFailureRate: &rate, MinFinished: 2}},
		}}
		a := mustDispatch(t, db, "acme", d)
		step := func(want fleet.StepKind) *fleet.RolloutChange {
			t.Helper()
			c, err := db.AdvanceRollout(ctx, "acme", a.ID, clk.Now(), false)
			if err != nil || c.Step.Kind != want {
				t.Fatalf("step %+v, %v; want kind %d", c, err, want)
			}
			return c
		}
		c := step(fleet.StepTrigger)
		if c.Event.Released != 2 || !c.Deliver || c.Action == nil || *c.Event.Phase != 0 {
			t.Fatalf("trigger %+v", c)
		}
		step(fleet.StepWait)
		// c, in phase 1, is Scheduled: not sent, so a report on it is an
		// action not sent to the device.
		errs, err := db.ReportStatus(ctx, "acme", []fleet.StatusReport{{DeviceID: "c", ActionID: a.ID, State: "Running"}})
		if err != nil {
			t.Fatal(err)
		}
		wantCode(t, errs[0], fleet.ENOTFOUND)
		pend, _ := db.PendingDevices(ctx, "acme", a.ID, nil)
		sort.Strings(pend)
		if fmt.Sprint(pend) != "[a b]" {
			t.Fatalf("pending %v", pend)
		}

		mustReport(t, db, "acme", fleet.StatusReport{DeviceID: "a", ActionID: a.ID, State: "Completed"})
		clk.Add(10 * time.Second)
		mustReport(t, db, "acme", fleet.StatusReport{DeviceID: "b", ActionID: a.ID, State: "Failed"})
		clk.Add(59 * time.Second)
		step(fleet.StepWait) // 59 s after the canary finished
		clk.Add(time.Second)
		c = step(fleet.StepPause)
		if want := "phase 1 (rest) not released: 1 of 2 finished devices failed (50% > 40%)"; c.Event.Reason != want {
			t.Fatalf("paused: %q, want %q", c.Event.Reason, want)
		}
		full, _ := db.FindAction(ctx, "acme", a.ID)
		if full.Status != fleet.RolloutPaused || full.PauseReason != c.Event.Reason {
			t.Fatalf("paused action %+v", full)
		}
		_, err = db.PauseRollout(ctx, "acme", a.ID, clk.Now())
		wantCode(t, err, fleet.ECONFLICT)
		_, err = db.TriggerNextPhase(ctx, "acme", a.ID, clk.Now())
		wantCode(t, err, fleet.ECONFLICT)

		if _, err := db.ResumeRollout(ctx, "acme", a.ID, clk.Now()); err != nil {
			t.Fatal(err)
		}
		c = step(fleet.StepTrigger) // the gate is waived
		if c.Event.Released != 3 {
			t.Fatalf("released %d", c.Event.Released)
		}
		_, err = db.TriggerNextPhase(ctx, "acme", a.ID, clk.Now())
		wantCode(t, err, fleet.ECONFLICT)

		// A phase of a new device; a device already targeted is refused.
		_, err = db.AppendPhase(ctx, "acme", a.ID, fixed("more", fleet.TriggerManual, "f", "a"), nil, clk.Now())
		wantCode(t, err, fleet.EINVALID)
		if _, err := db.AppendPhase(ctx, "acme", a.ID, fixed("more", fleet.TriggerManual, "f"), nil, clk.Now()); err != nil {
			t.Fatal(err)
		}
		full, _ = db.FindAction(ctx, "acme", a.ID)
		if full.Targeted != 6 || len(full.Schedule.Phases) != 3 || full.StatusesPhased["2"]["Scheduled"] != 1 || *full.NextPhaseIndex != 2 {
			t.Fatalf("after append %+v", full)
		}
		step(fleet.StepWait) // manual
		if c, err := db.TriggerNextPhase(ctx, "acme", a.ID, clk.Now()); err != nil || c.Event.Released != 1 {
			t.Fatalf("manual trigger: %+v, %v", c, err)
		}

		c, err = db.AbortRollout(ctx, "acme", a.ID, tell(a.ID, "update"), clk.Now())
		if err != nil || c.Event.Event != fleet.RolloutEventAborted {
			t.Fatalf("abort: %+v, %v", c, err)
		}
		_, err = db.AbortRollout(ctx, "acme", a.ID, tell(a.ID, "update"), clk.Now())
		wantCode(t, err, fleet.ECONFLICT)
		full, _ = db.FindAction(ctx, "acme", a.ID)
		if full.Status != fleet.RolloutAborted || full.Statuses["Cancelled"] != 4 {
			t.Fatalf("aborted %+v", full)
		}
		step(fleet.StepWait)

		logs, _, _ := db.FindAuditLogs(ctx, "acme", fleet.AuditFilter{Actor: "ops", Page: fleet.Page{Page: 1, Limit: 20}})
		var names []string
		for _, l := range logs {
			names = append(names, l.Action)
		}
		if fmt.Sprint(names) != "[rollout.abort rollout.trigger_next_phase rollout.append_phase rollout.resume]" {
			t.Fatalf("audit %v", names)
		}

		t.Run("Incomplete", func(t *testing.T) {
			done := mustDispatch(t, db, "acme", dispatch("x", "default", "a"))
			mustReport(t, db, "acme", fleet.StatusReport{DeviceID: "a", ActionID: done.ID, State: "Completed"})
			live := mustDispatch(t, db, "acme", dispatch("x", "default", "a"))
			acts, n, err := db.FindActions(ctx, "acme", fleet.ActionFilter{Incomplete: true, Page: fleet.Page{Page: 1, Limit: 10}})
			if err != nil || n != 1 || acts[0].ID != live.ID {
				t.Fatalf("incomplete: %d, %v", n, err)
			}
		})
	})
}

// TestRolloutFinishedRatio: an after_previous phase with finished_ratio
// 0.75 triggers once 3 of the 4 devices of the earlier phases are final,
// wait_seconds after the third finished; RolloutWait names the devices not
// finished, with their last sighting, and after the last phase the one
// never delivered keeps the rollout from completing.
func TestRolloutFinishedRatio(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, clk := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustDevices(t, db, "acme", map[string]map[string]string{"a": nil, "b": nil, "c": nil, "d": nil, "e": nil})
		d := dispatch("update", "default", "a", "b", "c", "d", "e")
		d.Schedule = &fleet.Schedule{Phases: []fleet.Phase{
			fixed("canary", fleet.TriggerNow, "a", "b"),
			fixed("more", fleet.TriggerNow, "c", "d"),
			{Name: "rest", TriggerOn: fleet.Trigger{Type: fleet.TriggerAfterPrevious, WaitSeconds: 30, FinishedRatio: 0.75},
				Info: fleet.PhaseInfo{Type: fleet.PhasePercentage, Percentage: 100}},
		}}
		a := mustDispatch(t, db, "acme", d)
		step := func(want fleet.StepKind) {
			t.Helper()
			if c, err := db.AdvanceRollout(ctx, "acme", a.ID, clk.Now(), false); err != nil || c.Step.Kind != want {
				t.Fatalf("step %+v, %v; want kind %d", c, err, want)
			}
		}
		wait := func(unfinished int, devices string) *fleet.RolloutWait {
			t.Helper()
			w, err := db.RolloutWait(ctx, "acme", a.ID, clk.Now())
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, d := range w.Devices {
				got = append(got, fmt.Sprintf("%s:%s:%v", d.ID, d.Status, d.LastSeenAt != nil))
			}
			if w.Unfinished != unfinished || fmt.Sprint(got) != devices {
				t.Fatalf("waits for %d: %v; want %d: %s", w.Unfinished, got, unfinished, devices)
			}
			return w
		}
		step(fleet.StepTrigger)
		step(fleet.StepTrigger)
		step(fleet.StepWait)
		mustReport(t, db, "acme", fleet.StatusReport{DeviceID: "a", ActionID: a.ID, State: "Completed"})
		mustReport(t, db, "acme", fleet.StatusReport{DeviceID: "c", ActionID: a.ID, State: "Failed"})
		mustReport(t, db, "acme", fleet.StatusReport{DeviceID: "d", ActionID: a.ID, State: "Running"})
		if err := db.TouchDevice(ctx, "acme", "d", clk.Now()); err != nil {
			t.Fatal(err)
		}
		step(fleet.StepWait) // 2 of 4
		w := wait(2, "[b:Queued:false d:Progress:true]")
		if want := "phase 2 (rest) waits for 1 more device of earlier phases to finish (finished_ratio 0.75: 3 of 4); not finished: " +
			"b (Queued, never seen), d (Progress, last seen " + clk.Now().UTC().Format(time.RFC3339) + ")"; w.Reason(clk.Now()) != want {
			t.Fatalf("reason %q\nwant   %q", w.Reason(clk.Now()), want)
		}
		clk.Add(time.Minute)
		mustReport(t, db, "acme", fleet.StatusReport{DeviceID: "d", ActionID: a.ID, State: "Completed"})
		clk.Add(29 * time.Second)
		step(fleet.StepWait) // 29 s after the third finished
		clk.Add(time.Second)
		step(fleet.StepTrigger)
		// e is released; b never received it: the rollout is not
		// completed while either is not final.
		mustReport(t, db, "acme", fleet.StatusReport{DeviceID: "e", ActionID: a.ID, State: "Completed"})
		step(fleet.StepWait)
		if w := wait(1, "[b:Queued:false]"); w.Reason(clk.Now()) != "every phase triggered; waiting for 1 device to finish: b (Queued, never seen)" {
			t.Fatalf("settling: %q", w.Reason(clk.Now()))
		}
		mustReport(t, db, "acme", fleet.StatusReport{DeviceID: "b", ActionID: a.ID, State: "Completed"})
		step(fleet.StepComplete)
		if w, err := db.RolloutWait(ctx, "acme", a.ID, clk.Now()); w != nil || err != nil {
			t.Fatalf("a completed rollout waits for %+v, %v", w, err)
		}
		// Tenants apart: another tenant's RolloutWait of the id is nothing.
		mustTenant(t, db, "other")
		if w, err := db.RolloutWait(ctx, "other", a.ID, clk.Now()); w != nil || err != nil {
			t.Fatalf("another tenant reads %+v, %v", w, err)
		}
	})
}

// triggerer returns a function that triggers the rollout's next phase by
// hand and fails t unless it released so many devices.
func triggerer(t *testing.T, db *sqlstore.DB, clk *testclock.Clock, tenant string, id int64) func(released int) {
	return func(released int) {
		t.Helper()
		c, err := db.TriggerNextPhase(context.Background(), tenant, id, clk.Now())
		if err != nil || c.Event.Released != released {
			t.Fatalf("trigger: %+v, %v; want %d released", c, err, released)
		}
	}
}

// TestRolloutMetadataPhase: a metadata phase takes, when it triggers, the
// targets of later phases not released yet whose device metadata match
// then: a device that joined the ring after the dispatch is taken, one
// that left it is not, and one released already stays where it was.
func TestRolloutMetadataPhase(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, clk := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		lab := map[string]string{"ring": "lab", "site": "b"}
		mustDevices(t, db, "acme", map[string]map[string]string{
			"a": lab, "b": lab, "c": {"ring": "lab", "site": "a"}, "d": nil, "e": nil, "f": lab})
		d := dispatch("update", "default", "a", "b", "c", "d", "e", "f")
		d.Schedule = &fleet.Schedule{Phases: []fleet.Phase{
			fixed("first", fleet.TriggerManual, "f"),
			{Name: "lab", TriggerOn: fleet.Trigger{Type: fleet.TriggerManual}, Info: fleet.PhaseInfo{Type: fleet.PhaseMetadata, Metadata: map[string]string{"ring": "lab", "site": "b"}}},
			share("rest", fleet.TriggerManual, 100),
		}}
		a := mustDispatch(t, db, "acme", d)
		if got := fmt.Sprint(phasesOf(t, db, "acme", a.ID)); got != "map[a:2 b:2 c:2 d:2 e:2 f:0]" {
			t.Fatalf("at dispatch %s", got)
		}
		trigger := triggerer(t, db, clk, "acme", a.ID)
		trigger(1) // first: f
		// Between the dispatch and the trigger, d joins the ring and b
		// leaves it; f, released already, is not taken again.
		site := "b"
		ring := "lab"
		if _, err := db.UpdateDeviceMetadata(ctx, "acme", "d", map[string]*string{"ring": &ring, "site": &site}); err != nil {
			t.Fatal(err)
		}
		if _, err := db.UpdateDeviceMetadata(ctx, "acme", "b", map[string]*string{"ring": nil}); err != nil {
			t.Fatal(err)
		}
		trigger(2) // lab: a and d
		if got := fmt.Sprint(phasesOf(t, db, "acme", a.ID)); got != "map[a:1 b:2 c:2 d:1 e:2 f:0]" {
			t.Fatalf("after the metadata phase %s", got)
		}
		full, err := db.FindAction(ctx, "acme", a.ID)
		if err != nil || fmt.Sprint(full.StatusesPhased) != "map[0:map[Queued:1] 1:map[Queued:2] 2:map[Scheduled:3]]" {
			t.Fatalf("counts %v, %v", full.StatusesPhased, err)
		}
		trigger(3) // rest: b, c, e
	})
}

// TestRolloutGroupPhase: a group phase takes, when it triggers, the
// targets of later phases not released yet that are in the group then,
// by metadata and by reported state; a group that is not there at dispatch
// is refused naming the phase, and one deleted before the trigger takes
// nobody.
func TestRolloutGroupPhase(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, clk := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustTenant(t, db, "other")
		lab := map[string]string{"ring": "lab"}
		mustDevices(t, db, "acme", map[string]map[string]string{"a": lab, "b": lab, "c": nil, "d": nil, "e": lab, "f": nil})
		mustDevices(t, db, "other", map[string]map[string]string{"a": nil})
		if _, err := db.CreateGroup(ctx, "acme", &fleet.Group{Name: "canary", Selector: "ring=lab,reported.fw!=2"}); err != nil {
			t.Fatal(err)
		}
		if _, err := db.CreateGroup(ctx, "other", &fleet.Group{Name: "late", Selector: "ring"}); err != nil {
			t.Fatal(err)
		}
		groupPhase := func(name, group string) fleet.Phase {
			return fleet.Phase{Name: name, TriggerOn: fleet.Trigger{Type: fleet.TriggerManual}, Info: fleet.PhaseInfo{Type: fleet.PhaseGroup, Group: group}}
		}
		d := dispatch("update", "default", "a", "b", "c", "d", "e", "f")
		// Another tenant's group of the same kind is unknown here.
		d.Schedule = &fleet.Schedule{Phases: []fleet.Phase{groupPhase("late", "late"), share("rest", fleet.TriggerManual, 100)}}
		if _, err := db.DispatchAction(ctx, "acme", d); fleet.ErrorCode(err) != fleet.EINVALID ||
			!strings.Contains(err.Error(), `schedule.phases[0].info.group: no group is named "late"`) {
			t.Fatalf("an unknown group: %v", err)
		}
		d.Schedule = &fleet.Schedule{Phases: []fleet.Phase{
			fixed("first", fleet.TriggerManual, "e"),
			groupPhase("canary", "canary"),
			groupPhase("late", "late"),
			share("rest", fleet.TriggerManual, 100),
		}}
		if _, err := db.CreateGroup(ctx, "acme", &fleet.Group{Name: "late", Selector: "site"}); err != nil {
			t.Fatal(err)
		}
		a := mustDispatch(t, db, "acme", d)
		if got := fmt.Sprint(phasesOf(t, db, "acme", a.ID)); got != "map[a:3 b:3 c:3 d:3 e:0 f:3]" {
			t.Fatalf("at dispatch %s", got)
		}
		trigger := triggerer(t, db, clk, "acme", a.ID)
		trigger(1) // first: e
		// Before the canary triggers, c joins the ring, b reports the
		// firmware that takes it out of the group; e, released already,
		// is not taken again.
		ring := "lab"
		if _, err := db.UpdateDeviceMetadata(ctx, "acme", "c", map[string]*string{"ring": &ring}); err != nil {
			t.Fatal(err)
		}
		if _, err := db.UpdateReported(ctx, "acme", "b", map[string]any{"fw": 2}); err != nil {
			t.Fatal(err)
		}
		trigger(2) // canary: a and c
		if got := fmt.Sprint(phasesOf(t, db, "acme", a.ID)); got != "map[a:1 b:3 c:1 d:3 e:0 f:3]" {
			t.Fatalf("after the group phase %s", got)
		}
		if err := db.DeleteGroup(ctx, "acme", "late"); err != nil {
			t.Fatal(err)
		}
		trigger(0) // late: its group is gone
		full, err := db.FindAction(ctx, "acme", a.ID)
		if err != nil || fmt.Sprint(full.StatusesPhased) != "map[0:map[Queued:1] 1:map[Queued:2] 3:map[Scheduled:3]]" {
			t.Fatalf("counts %v, %v", full.StatusesPhased, err)
		}
		trigger(3) // rest: b, d, f
	})
}

// benchTenant makes a tenant "bench" of n devices, dev-0000000 on.
func benchTenant(b *testing.B, db *sqlstore.DB, n int) {
	b.Helper()
	ctx := context.Background()
	if _, _, err := db.CreateTenant(ctx, "bench"); err != nil {
		b.Fatal(err)
	}
	devs := make([]fleet.NewDevice, 0, fleet.MaxBulkDevices)
	for i := 0; i < n; i++ {
		devs = append(devs, fleet.NewDevice{ID: fmt.Sprintf("dev-%07d", i), Metadata: map[string]string{"fleet": "bench", "n": strconv.Itoa(i % 100)}})
		if len(devs) == fleet.MaxBulkDevices || i == n-1 {
			if _, err := db.CreateDevices(ctx, "bench", devs); err != nil {
				b.Fatal(err)
			}
			devs = devs[:0]
		}
	}
}

// BenchmarkRolloutDispatch measures a dispatch to every device of a tenant
// (100,000 by default) with a schedule of a one-device canary, a 10% phase
// and the rest: the targets partitioned in the stable order.
func BenchmarkRolloutDispatch(b *testing.B) {
	for _, be := range sqlstoretest.Backends() {
		b.Run(be.Name, func(b *testing.B) {
			db := sqlstoretest.MustOpen(b, be, sqlstoretest.Options{})
			n := benchDevices()
			benchTenant(b, db, n)
			for b.Loop() {
				d := dispatch("update", "all")
				d.Schedule = &fleet.Schedule{Phases: []fleet.Phase{
					fixed("canary", fleet.TriggerManual, "dev-0000000"), share("tenth", fleet.TriggerManual, 10), share("rest", fleet.TriggerManual, 100)}}
				if a, err := db.DispatchAction(context.Background(), "bench", d); err != nil || a.Targeted != n {
					b.Fatalf("dispatch: %v", err)
				}
			}
			b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "devices/s")
		})
	}
}

// BenchmarkPhaseTrigger measures triggering a phase of every device of a
// tenant (100,000 by default): the rollout's row locked, the gate's facts
// read, the phase's device actions released in one statement, the state
// and its notification written, in one transaction. Each iteration
// dispatches a new rollout outside the timer.
func BenchmarkPhaseTrigger(b *testing.B) {
	for _, be := range sqlstoretest.Backends() {
		b.Run(be.Name, func(b *testing.B) {
			db := sqlstoretest.MustOpen(b, be, sqlstoretest.Options{})
			ctx := context.Background()
			n := benchDevices()
			benchTenant(b, db, n)
			rate := 0.5
			for b.Loop() {
				b.StopTimer()
				d := dispatch("update", "all")
				d.Schedule = &fleet.Schedule{Phases: []fleet.Phase{
					fixed("canary", fleet.TriggerManual, "dev-0000000"),
					{Name: "everyone", TriggerOn: fleet.Trigger{Type: fleet.TriggerManual}, Info: fleet.PhaseInfo{Type: fleet.PhasePercentage, Percentage: 100},
						Gate: &fleet.Gate{MaxFailureRate: &rate}}}}
				a, err := db.DispatchAction(ctx, "bench", d)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := db.TriggerNextPhase(ctx, "bench", a.ID, time.Now()); err != nil {
					b.Fatal(err)
				}
				mustReport(b, db, "bench", fleet.StatusReport{DeviceID: "dev-0000000", ActionID: a.ID, State: "Completed"})
				b.StartTimer()
				c, err := db.TriggerNextPhase(ctx, "bench", a.ID, time.Now())
				if err != nil || c.Event.Released != n-1 {
					b.Fatalf("trigger: %+v, %v", c, err)
				}
			}
			b.ReportMetric(float64(b.N*(n-1))/b.Elapsed().Seconds(), "devices/s")
		})
	}
}
