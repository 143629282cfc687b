package sqlstore_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestInFlightReportsAreHOT guards migration 0022: a report on a device
// action in flight (its action_status stays Progress), with or without
// errors, changes no column of any of device_actions' indexes, so
// PostgreSQL updates the row in place (HOT) and writes no index entry.
// Four device actions and a few rounds of reports fit on the table's one
// page with room to spare, so every update has room on its page whether or
// not PostgreSQL has pruned the versions the rounds before left: what is
// checked is the columns alone. The reports go through the store's own
// code (ReportStatus's), and the counters are the transaction's own.
func TestInFlightReportsAreHOT(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, clk := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		devs := []string{"d1", "d2", "d3", "d4"}
		mustDevices(t, db, "acme", map[string]map[string]string{"d1": nil, "d2": nil, "d3": nil, "d4": nil})
		a := mustDispatch(t, db, "acme", dispatch("update", "default", devs...))
		round := func(state string, progress int, errs []string) []fleet.StatusReport {
			var rs []fleet.StatusReport
			for _, d := range devs {
				rs = append(rs, fleet.StatusReport{DeviceID: d, ActionID: a.ID, State: state, Progress: intp(progress), Errors: errs})
			}
			return rs
		}
		// The first report moves each from Queued to Progress: not in place.
		clk.Add(time.Second)
		mustReport(t, db, "acme", round("Received", 0, nil)...)
		for i, step := range []struct {
			state string
			errs  []string
		}{
			{"Downloading", nil},
			{"Downloading", nil},
			{"Downloading", []string{"slow link"}}, // errors and error_count change
			{"Installing", nil},                    // the status word changes
			{"Installing", []string{"retrying"}},
		} {
			clk.Add(time.Second)
			updated, hot, err := db.ReportStatusCountingHOT(ctx, "acme", round(step.state, 10*(i+1), step.errs))
			if err != nil {
				t.Fatal(err)
			}
			if b.Name == "postgres" && (updated != int64(len(devs)) || hot != updated) {
				t.Errorf("round %d (%s, errors %q): %d rows updated, %d in place (HOT); want %d and %d",
					i, step.state, step.errs, updated, hot, len(devs), len(devs))
			}
		}
		for _, d := range devs {
			da, err := db.FindDeviceAction(ctx, "acme", a.ID, d)
			if err != nil {
				t.Fatal(err)
			}
			if da.ActionStatus != fleet.StatusProgress || da.Status != "Installing" || da.Progress != 50 ||
				fleet.ErrorCount(da.Errors) != 2 || !da.UpdatedAt.Equal(clk.Now()) {
				t.Errorf("%s after the rounds: %+v", d, da)
			}
		}
		if b.Name == "postgres" {
			for _, table := range []string{"device_actions", "devices"} {
				if opts, err := db.Reloptions(ctx, table); err != nil || opts != "fillfactor=90" {
					t.Errorf("%s's storage parameters %q (%v), want fillfactor=90", table, opts, err)
				}
			}
		}
	})
}

// TestFinalColumnsMigration fills a database at migration 21 with a
// device's actions, final and in flight, and the recent failures of two
// tenants, written by the store (whose writes do not name 0022's columns),
// and migrates it: S7's every sort and the recent failures read 0022's
// columns and must list the same rows in the same order as before, and
// each column holds its source's value exactly when the row is final.
func TestFinalColumnsMigration(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		ctx := context.Background()
		dsn := b.DSN(t)
		clk := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
		db, err := sqlstore.Open(ctx, dsn, sqlstore.Options{Now: func() time.Time { return clk }})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if err := db.MigrateTo(ctx, 21); err != nil {
			t.Fatal(err)
		}
		for _, tenant := range []string{"acme", "beta"} {
			mustTenant(t, db, tenant)
			mustDevices(t, db, tenant, map[string]map[string]string{"d1": nil, "d2": nil})
		}
		// Twelve actions on d1: finished, failed, cancelled, in flight and
		// queued, by several users, reported in an order unlike the ids'.
		types := []string{"reboot", "update", "reboot", "shell", "update", "reboot", "shell", "reboot", "update", "shell", "reboot", "update"}
		users := []string{"bob", "alice", "carol", "alice", "bob", "alice", "carol", "bob", "carol", "bob", "alice", "alice"}
		states := []string{"", "Running", "Completed", "Failed", "", "Running", "Downloading", "Completed", "Failed", "Cancel", "Failed", "Completed"}
		nerrs := []int{0, 1, 0, 2, 0, 1, 3, 0, 1, 0, 4, 2}
		var ids []int64
		for i := range types {
			clk = clk.Add(time.Second)
			d := dispatch(types[i], "default", "d1", "d2")
			d.UserName, d.UserEmail = users[i], users[i]+"@example.com"
			ids = append(ids, mustDispatch(t, db, "acme", d).ID)
		}
		for _, i := range []int{7, 3, 11, 1, 9, 5, 0, 10, 2, 6, 8, 4} {
			clk = clk.Add(time.Minute)
			switch states[i] {
			case "":
			case "Cancel":
				if _, err := db.CancelAction(ctx, "acme", ids[i], tell(ids[i], types[i])); err != nil {
					t.Fatal(err)
				}
			default:
				var errs []string
				for j := range nerrs[i] {
					errs = append(errs, fmt.Sprint("e", j))
				}
				mustReport(t, db, "acme", fleet.StatusReport{DeviceID: "d1", ActionID: ids[i], State: states[i], Errors: errs})
			}
		}
		b1 := mustDispatch(t, db, "beta", dispatch("reboot", "default", "d1"))
		clk = clk.Add(time.Minute)
		mustReport(t, db, "beta", fleet.StatusReport{DeviceID: "d1", ActionID: b1.ID, State: "Failed"})
		recent := func() []int64 {
			t.Helper()
			got, err := db.FindRecentFailures(ctx, "acme", 10)
			if err != nil {
				t.Fatal(err)
			}
			var out []int64
			for _, da := range got {
				out = append(out, da.ActionID)
			}
			return out
		}
		// Before 0022 its reads would name columns that are not there: the
		// expected failures are those reported, newest first.
		wantRecent := []int64{ids[8], ids[10], ids[3]}

		if _, err := db.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		checkDeviceActionSorts(t, db, "acme", "d1", len(types))
		if got := recent(); !slices.Equal(got, wantRecent) {
			t.Errorf("recent failures %v, want %v", got, wantRecent)
		}
		raw := openRaw(t, b, dsn)
		var wrong, final, all int
		if err := raw.QueryRow(`SELECT
				count(*) FILTER (WHERE CASE WHEN action_status IN ('Completed', 'Failed', 'Cancelled')
					THEN final_status IS DISTINCT FROM status OR final_updated_at IS DISTINCT FROM updated_at OR final_error_count IS DISTINCT FROM error_count
					ELSE final_status IS NOT NULL OR final_updated_at IS NOT NULL OR final_error_count IS NOT NULL END),
				count(*) FILTER (WHERE final_updated_at IS NOT NULL), count(*)
			FROM device_actions`).Scan(&wrong, &final, &all); err != nil {
			t.Fatal(err)
		}
		// d1: 3 Completed, 3 Failed, 1 Cancelled; d2: 1 Cancelled; beta's 1 Failed.
		if wrong != 0 || final != 9 || all != 25 {
			t.Errorf("%d rows whose final columns are wrong, %d final, %d in all; want 0, 9, 25", wrong, final, all)
		}
		// A device action that ends after the migration enters the sorts.
		clk = clk.Add(time.Minute)
		mustReport(t, db, "acme", fleet.StatusReport{DeviceID: "d1", ActionID: ids[6], State: "Failed", Errors: []string{"late"}})
		checkDeviceActionSorts(t, db, "acme", "d1", len(types))
		if got, want := recent(), append([]int64{ids[6]}, wantRecent...); !slices.Equal(got, want) {
			t.Errorf("recent failures after a new one %v, want %v", got, want)
		}
	})
}
