package sqlstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestLifecycle drives each transition of fleet.Lifecycle through the
// store, the way fleetd makes it happen, and checks that the device action
// ends as the table says: its status, its status word, and its deadline,
// which the sweeper shows (a deadline started at the event, kept from
// before, or gone).
func TestLifecycle(t *testing.T) {
	for _, tr := range fleet.Lifecycle {
		t.Run(fmt.Sprintf("%s/%s", tr.From, tr.Event), func(t *testing.T) {
			sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
				db, clk := mustOpen(t, b)
				mustTenant(t, db, "acme")
				mustDevices(t, db, "acme", map[string]map[string]string{"dev": nil, "other": nil})
				lc := &lifecycle{t: t, db: db, ctx: context.Background(), start: clk.Now()}
				id := lc.drive(tr, func() { clk.Add(10 * time.Second) })
				lc.check(tr, id, clk.Now())
			})
		})
	}
}

type lifecycle struct {
	t     *testing.T
	db    *sqlstore.DB
	ctx   context.Context
	start time.Time // when the device action was dispatched (and delivered)
}

// timeout is the device actions' timeout, in seconds.
const lifecycleTimeout = 60

// drive brings a device action of "dev" to tr.From, calls later, makes
// tr.Event happen, and returns the id of the action whose record on "dev"
// the event moved.
func (lc *lifecycle) drive(tr fleet.Transition, later func()) int64 {
	t := lc.t
	t.Helper()
	d := dispatch("reboot", "default", "dev")
	d.Timeout = lifecycleTimeout
	if tr.From == fleet.StatusScheduled {
		// A rollout whose first phase, dev's, an operator triggers, and
		// which ends 5 seconds after it starts.
		d = dispatch("reboot", "default", "dev", "other")
		d.Timeout = lifecycleTimeout
		d.Schedule = &fleet.Schedule{EndTimestamp: lc.start.Add(5 * time.Second).UnixMilli(), Phases: []fleet.Phase{
			{Name: "dev", TriggerOn: fleet.Trigger{Type: fleet.TriggerManual}, Info: fleet.PhaseInfo{Type: fleet.PhaseFixedList, DeviceIDs: []string{"dev"}}},
			{Name: "rest", TriggerOn: fleet.Trigger{Type: fleet.TriggerManual}, Info: fleet.PhaseInfo{Type: fleet.PhasePercentage, Percentage: 100}},
		}}
	}
	switch tr.Event {
	case fleet.EventRefused, fleet.EventNothingToCancel:
		// Events of the dispatch itself, on a record it has just made.
		if tr.From != fleet.StatusQueued && (tr.From != fleet.StatusScheduled || tr.Event != fleet.EventRefused) {
			t.Fatalf("%s happens at dispatch, to a new device action; from %s is not driven", tr.Event, tr.From)
		}
		later()
		if tr.Event == fleet.EventRefused {
			d.CheckDevice = func(map[string]string) string { return "the device is too old" }
			lc.install("dev")
			return mustDispatch(t, lc.db, "acme", d).ID
		}
		other := mustDispatch(t, lc.db, "acme", dispatch("reboot", "default", "other"))
		c := tell(other.ID, "reboot")
		c.DeviceIDs = []string{"dev"}
		return mustDispatch(t, lc.db, "acme", c).ID
	}
	a := mustDispatch(t, lc.db, "acme", d)
	switch tr.From {
	case fleet.StatusScheduled:
		if da, _ := lc.db.FindDeviceAction(lc.ctx, "acme", a.ID, "dev"); da.ActionStatus != fleet.StatusScheduled {
			t.Fatalf("a rollout's device action is %s at dispatch", da.ActionStatus)
		}
	case fleet.StatusQueued:
	case fleet.StatusInitiated:
		lc.deliver(a.ID)
	case fleet.StatusProgress:
		lc.deliver(a.ID)
		mustReport(t, lc.db, "acme", fleet.StatusReport{DeviceID: "dev", ActionID: a.ID, State: "Running"})
	default:
		t.Fatalf("no way to bring a device action to %s", tr.From)
	}
	later()
	switch tr.Event {
	case fleet.EventDelivered:
		lc.deliver(a.ID)
	case fleet.EventProgress:
		mustReport(t, lc.db, "acme", fleet.StatusReport{DeviceID: "dev", ActionID: a.ID, State: "Downloading"})
	case fleet.EventCompleted:
		mustReport(t, lc.db, "acme", fleet.StatusReport{DeviceID: "dev", ActionID: a.ID, State: "Completed"})
	case fleet.EventFailed:
		mustReport(t, lc.db, "acme", fleet.StatusReport{DeviceID: "dev", ActionID: a.ID, State: "Failed"})
	case fleet.EventCancel:
		c, err := lc.db.CancelAction(lc.ctx, "acme", a.ID, tell(a.ID, "reboot"))
		if err != nil {
			t.Fatal(err)
		}
		if told := c.Sent != nil && c.Sent.Targeted == 1; told != tr.TellDevice {
			t.Fatalf("the device was sent a cancel_action: %v, want %v", told, tr.TellDevice)
		}
	case fleet.EventCancelAccepted, fleet.EventCancelRejected:
		c, err := lc.db.CancelAction(lc.ctx, "acme", a.ID, tell(a.ID, "reboot"))
		if err != nil || c.Sent == nil {
			t.Fatalf("cancel: %+v, %v; want a cancel_action sent", c, err)
		}
		answer := map[fleet.Event]string{fleet.EventCancelAccepted: "Completed", fleet.EventCancelRejected: "Failed"}[tr.Event]
		mustReport(t, lc.db, "acme", fleet.StatusReport{DeviceID: "dev", ActionID: c.Sent.ID, State: answer})
	case fleet.EventTimeout:
		if n, err := lc.db.TimeOutDeviceActions(lc.ctx, lc.start.Add(lifecycleTimeout*time.Second), 10); err != nil || n != 1 {
			t.Fatalf("timed out %d, %v; want 1", n, err)
		}
	case fleet.EventRelease:
		if c, err := lc.db.TriggerNextPhase(lc.ctx, "acme", a.ID, lc.start.Add(time.Second)); err != nil || c.Step.Kind != fleet.StepTrigger {
			t.Fatalf("trigger: %+v, %v", c, err)
		}
	case fleet.EventConfirmed, fleet.EventDenied:
		if err := lc.db.ConfirmDeviceAction(lc.ctx, "acme", "dev", a.ID, tr.Event == fleet.EventConfirmed); err != nil {
			t.Fatal(err)
		}
	case fleet.EventScheduleEnded:
		if c, err := lc.db.AdvanceRollout(lc.ctx, "acme", a.ID, lc.start.Add(5*time.Second), false); err != nil || c.Step.Kind != fleet.StepEnd {
			t.Fatalf("advance at the end: %+v, %v", c, err)
		}
	default:
		t.Fatalf("no way to make %s happen", tr.Event)
	}
	return a.ID
}

// deliver records that "dev" acknowledged action id.
func (lc *lifecycle) deliver(id int64) {
	lc.t.Helper()
	if err := lc.db.MarkDelivered(lc.ctx, []fleet.ActionReceipt{{Tenant: "acme", DeviceID: "dev", ActionID: id}}); err != nil {
		lc.t.Fatal(err)
	}
}

// install records component versions on a device, by completing an
// update_firmware, so that a dispatch's CheckDevice is asked about it.
func (lc *lifecycle) install(dev string) {
	lc.t.Helper()
	fw := dispatch(fleet.ActionUpdateFirmware, "default", dev)
	fw.DeviceParams = json.RawMessage(`{"components":[{"component_name":"app","version_number":"1.0.0"}]}`)
	a := mustDispatch(lc.t, lc.db, "acme", fw)
	mustReport(lc.t, lc.db, "acme", fleet.StatusReport{DeviceID: dev, ActionID: a.ID, State: "Completed"})
}

// check compares "dev"'s record of action id, moved at now, with tr.
func (lc *lifecycle) check(tr fleet.Transition, id int64, now time.Time) {
	t := lc.t
	t.Helper()
	da, err := lc.db.FindDeviceAction(lc.ctx, "acme", id, "dev")
	if err != nil {
		t.Fatal(err)
	}
	word := tr.Status
	if word == "" {
		word = map[fleet.Event]string{fleet.EventProgress: "Downloading", fleet.EventCompleted: "Completed", fleet.EventFailed: "Failed"}[tr.Event]
	}
	if da.ActionStatus != tr.To || da.Status != word {
		t.Fatalf("after %s: %s (%s), want %s (%s)", tr.Event, da.ActionStatus, da.Status, tr.To, word)
	}
	if tr.To == fleet.StatusCompleted && da.Progress != 100 {
		t.Errorf("Completed with progress %d, want 100", da.Progress)
	}
	sweep := func(at time.Time) int {
		t.Helper()
		n, err := lc.db.TimeOutDeviceActions(lc.ctx, at, 10)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	timeout := lifecycleTimeout * time.Second
	switch tr.Deadline {
	case fleet.DeadlineCleared:
		if n := sweep(now.Add(365 * 24 * time.Hour)); n != 0 {
			t.Fatalf("a device action whose deadline the event cleared timed out")
		}
	case fleet.DeadlineStarted, fleet.DeadlineKept:
		deadline := now.Add(timeout)
		if tr.Deadline == fleet.DeadlineKept {
			deadline = lc.start.Add(timeout)
		}
		if n := sweep(deadline.Add(-time.Millisecond)); n != 0 {
			t.Fatalf("timed out before the deadline %s", deadline)
		}
		if n := sweep(deadline); n != 1 {
			t.Fatalf("not timed out at the deadline %s", deadline)
		}
	}
}
