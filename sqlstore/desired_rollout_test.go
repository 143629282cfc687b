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
			c, err := db.AdvanceRollout(ctx, "acme", a.ID, clk.Now(), false)
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

// TestDesiredRolloutChunks: a phase of more devices than a release's
// chunk is released a chunk a transaction: the phase's trigger releases
// the first chunk and says more wait; each ReleaseDesired the next, each
// device in exactly one chunk; a pass that finds the release unfinished
// (a replica stopped between chunks) says so again, and a release with
// nothing left does nothing.
func TestDesiredRolloutChunks(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		defer sqlstore.SetDesiredChunk(3)()
		db, clk := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		devs := map[string]map[string]string{}
		var ids []string
		for i := range 8 {
			id := fmt.Sprintf("d%d", i)
			devs[id], ids = nil, append(ids, id)
		}
		mustDevices(t, db, "acme", devs)
		if _, err := db.UpdateReported(ctx, "acme", "d4", map[string]any{"interval": 30}); err != nil {
			t.Fatal(err)
		}
		d := dispatch(fleet.ActionDesired, "default", ids...)
		d.Params = json.RawMessage(`{"desired":{"interval":30}}`)
		d.Schedule = &fleet.Schedule{Phases: []fleet.Phase{share("all", fleet.TriggerNow, 100)}}
		a := mustDispatch(t, db, "acme", d)

		seen := map[string]int{}
		take := func(shadows map[string]*fleet.Shadow) {
			t.Helper()
			if len(shadows) == 0 || len(shadows) > 3 {
				t.Fatalf("a chunk changed %d shadows", len(shadows))
			}
			for id := range shadows {
				seen[id]++
			}
		}
		c, err := db.AdvanceRollout(ctx, "acme", a.ID, clk.Now(), false)
		if err != nil || c.Step.Kind != fleet.StepTrigger || !c.MoreDesired {
			t.Fatalf("the trigger: %+v, %v", c, err)
		}
		take(c.Shadows)
		// A pass after a stop between chunks finds the release unfinished.
		if c, err := db.AdvanceRollout(ctx, "acme", a.ID, clk.Now(), false); err != nil || c.Step.Kind != fleet.StepWait || !c.MoreDesired {
			t.Fatalf("the next pass: %+v, %v", c, err)
		}
		chunks := 1
		for more := true; more; chunks++ {
			var shadows map[string]*fleet.Shadow
			if shadows, more, err = db.ReleaseDesired(ctx, "acme", a.ID, clk.Now()); err != nil {
				t.Fatal(err)
			}
			take(shadows)
		}
		if chunks != 3 {
			t.Fatalf("8 devices took %d chunks of 3", chunks)
		}
		for _, id := range ids {
			if seen[id] != 1 {
				t.Fatalf("%s was released %d times: %v", id, seen[id], seen)
			}
			sh, err := db.FindShadow(ctx, "acme", id)
			if err != nil || sh.Desired["interval"] != int64(30) || sh.Version != 1 {
				t.Fatalf("%s: %+v, %v", id, sh, err)
			}
			da, err := db.FindDeviceAction(ctx, "acme", a.ID, id)
			want := fleet.StatusInitiated
			if id == "d4" {
				want = fleet.StatusCompleted
			}
			if err != nil || da.ActionStatus != want {
				t.Fatalf("%s's device action: %+v, %v", id, da, err)
			}
		}
		if shadows, more, err := db.ReleaseDesired(ctx, "acme", a.ID, clk.Now()); err != nil || more || len(shadows) != 0 {
			t.Fatalf("a release with nothing left: %v, %v, %v", shadows, more, err)
		}
		if c, err := db.AdvanceRollout(ctx, "acme", a.ID, clk.Now(), false); err != nil || c.MoreDesired {
			t.Fatalf("the pass after: %+v, %v", c, err)
		}
	})
}
