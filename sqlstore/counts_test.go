package sqlstore_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestCountsUnderConcurrentWrites runs the write paths of device actions
// at once, from many goroutines (on PostgreSQL, in transactions that
// commit in parallel): deliveries and status reports of two actions,
// time-outs, a cancellation, device deletions and new dispatches. Then
// each action's counts are those of its listed device actions, and
// MustOpen's check finds every count equal to a count of the rows.
func TestCountsUnderConcurrentWrites(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, clk := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		ids := numberedDevices(t, db, "acme", "d%03d", 320)
		a := mustDispatch(t, db, "acme", dispatch("reboot", "all"))
		other := mustDispatch(t, db, "acme", dispatch("update", "all"))

		var wg sync.WaitGroup
		const workers = 16
		per := len(ids) / workers
		for w := range workers {
			mine := ids[w*per : (w+1)*per]
			wg.Go(func() {
				for i, dev := range mine {
					if err := db.MarkDelivered(ctx, []fleet.ActionReceipt{{Tenant: "acme", ActionID: a.ID, DeviceID: dev}}); err != nil {
						t.Error(err)
						return
					}
					final := "Completed"
					if i%3 == 0 {
						final = "Failed"
					}
					reports := []fleet.StatusReport{
						{ActionID: a.ID, DeviceID: dev, State: "Downloading", Timestamp: i64(1), Sequence: i64(1)},
						{ActionID: other.ID, DeviceID: dev, State: "Downloading", Timestamp: i64(1), Sequence: i64(1)},
					}
					if i%2 == 0 {
						reports = append(reports, fleet.StatusReport{ActionID: a.ID, DeviceID: dev, State: final, Timestamp: i64(2), Sequence: i64(2)})
					}
					if _, err := db.ReportStatus(ctx, "acme", reports); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Go(func() {
			for range 20 {
				if _, err := db.TimeOutDeviceActions(ctx, clk.Now().Add(time.Hour), 7); err != nil {
					t.Error(err)
					return
				}
			}
		})
		wg.Go(func() {
			if _, err := db.CancelAction(ctx, "acme", other.ID, tell(other.ID, "update")); err != nil {
				t.Error(err)
			}
		})
		wg.Go(func() {
			for _, dev := range ids[len(ids)-8:] {
				if err := db.DeleteDevice(ctx, "acme", dev); err != nil {
					t.Error(err)
				}
			}
		})
		wg.Go(func() {
			for range 3 {
				if _, err := db.DispatchAction(ctx, "acme", dispatch("ping", "all")); err != nil {
					t.Error(err)
				}
			}
		})
		wg.Wait()
		if t.Failed() {
			return
		}

		acts, _, err := db.FindActions(ctx, "acme", fleet.ActionFilter{Page: fleet.Page{Page: 1, Limit: 100}})
		if err != nil {
			t.Fatal(err)
		}
		for _, act := range acts {
			listed := map[string]int{}
			for page := 1; ; page++ {
				das, total, err := db.FindDeviceActions(ctx, "acme", fleet.DeviceActionFilter{ActionID: act.ID, Page: fleet.Page{Page: page, Limit: 100}})
				if err != nil {
					t.Fatal(err)
				}
				for _, da := range das {
					listed[string(da.ActionStatus)]++
				}
				if page*100 >= total {
					break
				}
			}
			if !maps.Equal(act.Statuses, listed) {
				t.Errorf("action %d (%s) counts %v, lists %v", act.ID, act.Action, act.Statuses, listed)
			}
			// Each status's list, rare or common, has its rows in device
			// order and its total.
			for st, n := range listed {
				var got []string
				for page := 1; ; page++ {
					das, total, err := db.FindDeviceActions(ctx, "acme", fleet.DeviceActionFilter{ActionID: act.ID, ActionStatus: fleet.ActionStatus(st),
						Page: fleet.Page{Page: page, Limit: 30}})
					if err != nil || total != n {
						t.Fatalf("action %d: %d %s listed, the %s list's total is %d (%v)", act.ID, n, st, st, total, err)
					}
					for _, da := range das {
						if string(da.ActionStatus) != st {
							t.Fatalf("action %d: the %s list has %s", act.ID, st, da.ActionStatus)
						}
						got = append(got, da.DeviceID)
					}
					if page*30 >= total {
						break
					}
				}
				if len(got) != n || !slices.IsSorted(got) {
					t.Errorf("action %d: the %s list has %d devices, want %d in order: %v", act.ID, st, len(got), n, got)
				}
			}
		}
		first := acts[len(acts)-1]
		total := 0
		for _, n := range first.Statuses {
			total += n
		}
		if first.ID != a.ID || total != len(ids)-8 || first.Statuses["Queued"] != 0 {
			t.Errorf("action %d counts %v; want action %d's %d devices, none Queued", first.ID, first.Statuses, a.ID, len(ids)-8)
		}
	})
}

// TestCountsMigration fills a database at migration 17 with device actions
// of two tenants in several actions, phases and statuses, written as the
// store of then wrote them, and migrates it: 0018 counts them all.
func TestCountsMigration(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		ctx := context.Background()
		db, raw, dsn := openAtMigration(t, b, 17)
		statuses := []string{"Queued", "Initiated", "Progress", "Completed", "Failed", "Scheduled"}
		// 120 rows in 60 counts of 2: the residues' combinations repeat
		// every 60 rows.
		for i := range 120 {
			if _, err := raw.Exec(`INSERT INTO device_actions (tenant, action_id, device_id, type, status, action_status, progress, errors,
				error_count, user_email, user_name, serial_metadata, created_at, updated_at, phase)
				VALUES ($1, $2, $3, 'reboot', 'x', $4, 0, '{}', 0, '', '', '{}', 0, 0, $5)`,
				[]string{"acme", "beta"}[i%2], 1+i%5, fmt.Sprintf("d%03d", i), statuses[i%len(statuses)], i%4-1); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := db.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		var groups int
		if err := raw.QueryRow("SELECT count(*) FROM device_action_counts WHERE n = 2").Scan(&groups); err != nil || groups != 60 {
			t.Fatalf("%d counts of 2 (%v), want 60", groups, err)
		}
		if drift, err := sqlstoretest.CountDrift(b, dsn); err != nil || len(drift) > 0 {
			t.Fatalf("counts after migrating: %q, %v", drift, err)
		}
	})
}
