package sqlstore_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestDesiredRolloutWindow: a desired rollout's phase that triggers while
// its maintenance window is shut changes no desired state; when the window
// opens, its devices' desired state changes and their device actions are
// Initiated, or Completed for a device that reports the values already.
// Its device actions are never pending for the device channel.
func TestDesiredRolloutWindow(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, clk := mustOpen(t, b) // 10:00 UTC
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustDevices(t, db, "acme", map[string]map[string]string{"a": nil, "b": nil})
		if _, err := db.UpdateReported(ctx, "acme", "b", map[string]any{"interval": 30, "extra": true}); err != nil {
			t.Fatal(err)
		}
		d := dispatch(fleet.ActionDesired, "default", "a", "b")
		d.Params = json.RawMessage(`{"desired":{"interval":30}}`)
		d.Schedule = &fleet.Schedule{Phases: []fleet.Phase{share("all", fleet.TriggerNow, 100)},
			MaintenanceWindow: &fleet.MaintenanceWindow{Start: "02:00", End: "03:00", Timezone: "UTC"}}
		a := mustDispatch(t, db, "acme", d)
		advance := func() *fleet.RolloutChange {
			t.Helper()
			c, err := db.AdvanceRollout(ctx, "acme", a.ID, clk.Now())
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
		status := func(dev string) fleet.ActionStatus {
			t.Helper()
			da, err := db.FindDeviceAction(ctx, "acme", a.ID, dev)
			if err != nil {
				t.Fatal(err)
			}
			return da.ActionStatus
		}
		desired := func(dev string) map[string]any {
			t.Helper()
			sh, err := db.FindShadow(ctx, "acme", dev)
			if err != nil {
				t.Fatal(err)
			}
			return sh.Desired
		}

		if c := advance(); c.Step.Kind != fleet.StepTrigger || len(c.Shadows) != 0 {
			t.Fatalf("the trigger outside the window: %+v", c)
		}
		if len(desired("a")) != 0 || status("a") != fleet.StatusQueued {
			t.Fatalf("outside the window a is %s with desired %v", status("a"), desired("a"))
		}
		clk.Add(16*time.Hour + 30*time.Minute) // 02:30 the next day
		// The window is open by the clock, and the rollout has not opened
		// it yet: the device channel, which sends a device its pending
		// actions in their window, must not find the desired_state action,
		// which no device is sent.
		if p, err := db.PendingActions(ctx, "acme", "a", 0, 10); err != nil || len(p) != 0 {
			t.Fatalf("the device channel finds %+v pending for a, %v", p, err)
		}
		var opened *fleet.RolloutChange
		for range 3 {
			if c := advance(); c.Step.Kind == fleet.StepOpenWindow {
				opened = c
				break
			}
		}
		if opened == nil || len(opened.Shadows) != 2 || opened.Shadows["a"] == nil || !opened.Shadows["a"].DeltaChanged {
			t.Fatalf("the window opened with %+v", opened)
		}
		if desired("a")["interval"] != int64(30) || status("a") != fleet.StatusInitiated {
			t.Fatalf("in the window a is %s with desired %v", status("a"), desired("a"))
		}
		if desired("b")["interval"] != int64(30) || status("b") != fleet.StatusCompleted {
			t.Fatalf("b, which reported the value already, is %s with desired %v", status("b"), desired("b"))
		}
		ws, err := db.DesiredWaiting(ctx, "acme", "a")
		if err != nil || len(ws) != 1 || ws[0].ActionID != a.ID || ws[0].Patch["interval"] != int64(30) {
			t.Fatalf("a waits for %+v, %v", ws, err)
		}
		if ws, err := db.DesiredWaiting(ctx, "acme", "b"); err != nil || len(ws) != 0 {
			t.Fatalf("b, completed, waits for %+v, %v", ws, err)
		}
	})
}
