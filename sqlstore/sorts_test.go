package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime/metrics"
	"slices"
	"sync"
	"testing"
	"time"

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
// device's 10,000 actions (all final but the last 30), for four of the
// seven sorts: by id, a text column, a time and a count.
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
	errs := make([]error, 64)
	var wg sync.WaitGroup
	for w := range errs {
		wg.Go(func() {
			for i := w; i < n && errs[w] == nil; i += 64 {
				a, err := db.DispatchAction(ctx, "acme", dispatch(fmt.Sprintf("act-%d", i%7), "default", "dev-1"))
				if err != nil {
					errs[w] = err
				} else {
					ids[i] = a.ID
				}
			}
		})
	}
	wg.Wait() // b.Fatal only on the benchmark's goroutine
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
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
			// S7's tail is the calls a garbage collection overlaps: their
			// share (gc-%) and their median over the others' (gc-slowdown).
			var withGC, without []time.Duration
			asc := false
			for b.Loop() {
				asc = !asc
				gc, t0 := gcCycles(), time.Now()
				page, total, err := db.FindDeviceActions(ctx, "acme", fleet.DeviceActionFilter{DeviceID: "dev-1", SortBy: sort, Ascending: asc,
					Page: fleet.Page{Page: 1, Limit: 50}})
				if d := time.Since(t0); gcCycles() != gc {
					withGC = append(withGC, d)
				} else {
					without = append(without, d)
				}
				if err != nil || total != n || len(page) != 50 {
					b.Fatalf("%d of %d, %v", len(page), total, err)
				}
			}
			b.ReportMetric(100*float64(len(withGC))/float64(b.N), "gc-%")
			if len(withGC) > 0 && len(without) > 0 {
				b.ReportMetric(float64(median(withGC))/float64(median(without)), "gc-slowdown")
			}
		})
	}
}

// gcCycles is how many garbage collections this process has completed.
func gcCycles() uint64 {
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestDeviceActionListErrors checks the two device-action lists' failures,
// which their count, read beside the page, decides: a device or action
// that does not exist (with a filter too), and a request gone before the
// reads.
func TestDeviceActionListErrors(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db := sqlstoretest.MustOpen(t, b, sqlstoretest.Options{})
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustDevices(t, db, "acme", map[string]map[string]string{"dev-1": nil})
		a := mustDispatch(t, db, "acme", dispatch("reboot", "default", "dev-1"))
		page := fleet.Page{Page: 1, Limit: 50}
		for _, f := range []fleet.DeviceActionFilter{
			{DeviceID: "ghost", Page: page},
			{DeviceID: "ghost", ActionStatus: fleet.StatusQueued, Page: page},
			{ActionID: a.ID + 1000, Page: page},
			{ActionID: a.ID + 1000, Type: "reboot", Page: page},
		} {
			if _, _, err := db.FindDeviceActions(ctx, "acme", f); fleet.ErrorCode(err) != fleet.ENOTFOUND {
				t.Errorf("%+v: %v, want not found", f, err)
			}
		}
		// Another tenant's action is not found either.
		mustTenant(t, db, "beta")
		if _, _, err := db.FindDeviceActions(ctx, "beta", fleet.DeviceActionFilter{ActionID: a.ID, Page: page}); fleet.ErrorCode(err) != fleet.ENOTFOUND {
			t.Errorf("another tenant's action: %v, want not found", err)
		}
		gone, cancel := context.WithCancel(ctx)
		cancel()
		for _, f := range []fleet.DeviceActionFilter{{DeviceID: "dev-1", Page: page}, {ActionID: a.ID, Page: page}} {
			if das, n, err := db.FindDeviceActions(gone, "acme", f); err == nil {
				t.Errorf("%+v with the request gone: %d of %d, want an error", f, len(das), n)
			}
		}
		for _, f := range []fleet.DeviceActionFilter{{DeviceID: "dev-1", Page: page}, {ActionID: a.ID, Page: page}} {
			if das, n, err := db.FindDeviceActions(ctx, "acme", f); err != nil || n != 1 || len(das) != 1 {
				t.Errorf("%+v: %d of %d, %v; want the one", f, len(das), n, err)
			}
		}
	})
}
