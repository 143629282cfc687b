package sqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestFinalStatusesSortFirst guards migration 0009: its sort indexes hold
// the device actions whose action_status sorts before 'Initiated', which
// must be exactly the final ones.
func TestFinalStatusesSortFirst(t *testing.T) {
	for _, s := range fleet.ActionStatuses {
		if got, want := string(s) < "Initiated", s.Final(); got != want {
			t.Errorf("%s sorts before Initiated: %v, but Final() is %v", s, got, want)
		}
	}
}

// BenchmarkDeviceActionsOfDevice is S7 in the store: one page of 50 of a
// device's 10,000 actions (all final but the last 30), for each sort.
//
//	go test ./sqlstore -run '^$' -bench DeviceActionsOfDevice
func BenchmarkDeviceActionsOfDevice(b *testing.B) {
	for _, be := range sqlstoretest.Backends() {
		b.Run(be.Name, func(b *testing.B) { benchDeviceActionsOfDevice(b, be) })
	}
}

func benchDeviceActionsOfDevice(b *testing.B, be sqlstoretest.Backend) {
	const n, live = 10_000, 30
	dsn := be.DSN(b)
	db := sqlstoretest.MustOpen(b, sqlstoretest.Backend{Name: be.Name, DSN: func(testing.TB) string { return dsn }}, sqlstoretest.Options{})
	ctx := context.Background()
	mustTenant(b, db, "acme")
	mustDevices(b, db, "acme", map[string]map[string]string{"dev-1": nil})
	ids := make([]int64, n)
	var wg sync.WaitGroup
	for w := range 64 {
		wg.Go(func() {
			for i := w; i < n; i += 64 {
				ids[i] = mustDispatch(b, db, "acme", dispatch(fmt.Sprintf("act-%d", i%7), "default", "dev-1")).ID
			}
		})
	}
	wg.Wait()
	var reports []fleet.StatusReport
	for i, id := range ids[:n-live] {
		state := "Completed"
		if i%3 == 0 {
			state = "Failed"
		}
		reports = append(reports, fleet.StatusReport{DeviceID: "dev-1", ActionID: id, State: state, Errors: []string{"e"}[:i%2]})
	}
	for start := 0; start < len(reports); start += 500 {
		if _, err := db.ReportStatus(ctx, "acme", reports[start:min(start+500, len(reports))]); err != nil {
			b.Fatal(err)
		}
	}
	if be.Name == "postgres" {
		// As autovacuum would within a minute of the bulk setup.
		pg, err := sql.Open("pgx", dsn)
		if err != nil {
			b.Fatal(err)
		}
		defer pg.Close()
		if _, err := pg.Exec("VACUUM (ANALYZE) device_actions, actions"); err != nil {
			b.Fatal(err)
		}
	}
	for _, sort := range []string{"action_id", "type", "updated_at", "errors"} {
		b.Run("sort_by="+sort, func(b *testing.B) {
			asc := false
			for b.Loop() {
				asc = !asc
				page, total, err := db.FindDeviceActions(ctx, "acme", fleet.DeviceActionFilter{DeviceID: "dev-1", SortBy: sort, Ascending: asc,
					Page: fleet.Page{Page: 1, Limit: 50}})
				if err != nil || total != n || len(page) != 50 {
					b.Fatalf("%d of %d, %v", len(page), total, err)
				}
			}
		})
	}
}
