package sqlstore_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestStatusIndexMigration migrates a database holding device actions of
// every live and final status through 0023, which rebuilds
// device_actions_by_status with initiated_at after phase: the reads of one
// status of an action (an action's devices by status, the delivery's
// pending devices, a cancel) find what they found before, and still do
// after reports move device actions between statuses. Migration 0045
// leaves Queued device actions out of the index: they are read through
// the key.
func TestStatusIndexMigration(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		ctx := context.Background()
		dsn := b.DSN(t)
		clk := time.Date(2026, 11, 26, 9, 0, 0, 0, time.UTC)
		db, err := sqlstore.Open(ctx, dsn, sqlstore.Options{Now: func() time.Time { return clk }})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if err := db.MigrateTo(ctx, 22); err != nil {
			t.Fatal(err)
		}
		mustTenant(t, db, "acme")
		devs := map[string]map[string]string{}
		var ids []string
		for i := range 12 {
			id := fmt.Sprintf("d%02d", i)
			devs[id], ids = nil, append(ids, id)
		}
		mustDevices(t, db, "acme", devs)
		a := mustDispatch(t, db, "acme", dispatch("reboot", "default", ids...))
		other := mustDispatch(t, db, "acme", dispatch("shell", "default", ids...))
		// d00-d01 delivered (Initiated), d02-d04 in progress, d05 Completed,
		// d06 Failed, the rest Queued; each a minute after the last.
		for _, d := range ids[:2] {
			clk = clk.Add(time.Minute)
			if err := db.MarkDelivered(ctx, []fleet.ActionReceipt{{Tenant: "acme", DeviceID: d, ActionID: a.ID}}); err != nil {
				t.Fatal(err)
			}
		}
		for i, st := range []string{"Downloading", "Installing", "Downloading", "Completed", "Failed"} {
			clk = clk.Add(time.Minute)
			mustReport(t, db, "acme", fleet.StatusReport{DeviceID: ids[2+i], ActionID: a.ID, State: st})
		}
		want := map[fleet.ActionStatus][]string{
			fleet.StatusInitiated: ids[:2], fleet.StatusProgress: ids[2:5],
			fleet.StatusCompleted: ids[5:6], fleet.StatusFailed: ids[6:7], fleet.StatusQueued: ids[7:],
		}
		check := func(when string) {
			t.Helper()
			for _, st := range fleet.ActionStatuses {
				page, n, err := db.FindDeviceActions(ctx, "acme", fleet.DeviceActionFilter{ActionID: a.ID, ActionStatus: st, Page: fleet.Page{Page: 1, Limit: 100}})
				if err != nil {
					t.Fatal(err)
				}
				var got []string
				for _, da := range page {
					got = append(got, da.DeviceID)
				}
				if !slices.Equal(got, want[st]) || n != len(want[st]) {
					t.Errorf("%s: %s device actions %v (%d), want %v", when, st, got, n, want[st])
				}
			}
			pending, err := db.PendingDevices(ctx, "acme", a.ID, nil)
			if err != nil {
				t.Fatal(err)
			}
			if slices.Sort(pending); !slices.Equal(pending, want[fleet.StatusQueued]) {
				t.Errorf("%s: pending devices %v, want %v", when, pending, want[fleet.StatusQueued])
			}
		}
		check("before 0023")

		if _, err := db.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		check("after 0023")
		raw := openRaw(t, b, dsn)
		var def string
		if b.Name == "sqlite" {
			var ok string
			if err := raw.QueryRow("PRAGMA integrity_check").Scan(&ok); err != nil || ok != "ok" {
				t.Errorf("integrity_check: %q, %v", ok, err)
			}
			err = raw.QueryRow("SELECT group_concat(name, ', ') FROM (SELECT name FROM pragma_index_info('device_actions_by_status') ORDER BY seqno)").Scan(&def)
		} else {
			err = raw.QueryRow("SELECT indexdef FROM pg_indexes WHERE schemaname = current_schema() AND indexname = 'device_actions_by_status'").Scan(&def)
		}
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(def, "tenant, action_id, action_status, phase, initiated_at") {
			t.Errorf("device_actions_by_status: %s", def)
		}
		// Migration 0045 leaves Queued device actions out of it.
		var pred string
		if b.Name == "sqlite" {
			err = raw.QueryRow("SELECT sql FROM sqlite_master WHERE name = 'device_actions_by_status'").Scan(&pred)
		} else {
			pred = def
		}
		if err != nil || !strings.Contains(pred, "action_status <> 'Queued'") {
			t.Errorf("device_actions_by_status's predicate: %s, %v", pred, err)
		}

		// Reports move device actions from Queued and Initiated, and to a
		// final status, in one batch.
		clk = clk.Add(time.Minute)
		mustReport(t, db, "acme",
			fleet.StatusReport{DeviceID: "d07", ActionID: a.ID, State: "Downloading"},
			fleet.StatusReport{DeviceID: "d00", ActionID: a.ID, State: "Downloading"},
			fleet.StatusReport{DeviceID: "d02", ActionID: a.ID, State: "Completed"})
		want[fleet.StatusInitiated] = ids[1:2]
		want[fleet.StatusProgress] = []string{"d00", "d03", "d04", "d07"}
		want[fleet.StatusCompleted] = []string{"d02", "d05"}
		want[fleet.StatusQueued] = ids[8:]
		check("after reports")

		// A cancel reads each live status of the other action.
		clk = clk.Add(time.Minute)
		mustReport(t, db, "acme", fleet.StatusReport{DeviceID: "d11", ActionID: other.ID, State: "Downloading"})
		if _, err := db.CancelAction(ctx, "acme", other.ID, tell(other.ID, "shell")); err != nil {
			t.Fatal(err)
		}
		got, err := db.FindAction(ctx, "acme", other.ID)
		if err != nil {
			t.Fatal(err)
		}
		// d11 has it in flight: it keeps it until it answers.
		if want := map[string]int{"Cancelled": 11, "Progress": 1}; !maps.Equal(got.Statuses, want) {
			t.Errorf("the cancelled action's counts %v, want %v", got.Statuses, want)
		}
	})
}
