package sqlstore_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestRetry dispatches a retry of an action: only once every device action
// is final, only to its devices in the statuses asked for, with retry_of,
// and never across tenants.
func TestRetry(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, _ := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustTenant(t, db, "other")
		mustDevices(t, db, "acme", map[string]map[string]string{"a": nil, "b": nil, "c": nil, "d": nil})
		mustDevices(t, db, "other", map[string]map[string]string{"a": nil})
		orig := mustDispatch(t, db, "acme", dispatch("update", "default", "a", "b", "c", "d"))
		mustReport(t, db, "acme",
			fleet.StatusReport{DeviceID: "a", ActionID: orig.ID, State: "Completed"},
			fleet.StatusReport{DeviceID: "b", ActionID: orig.ID, State: "Failed"},
			fleet.StatusReport{DeviceID: "c", ActionID: orig.ID, State: "Failed"})
		retry := func(tenant string, statuses ...fleet.ActionStatus) (*fleet.Action, error) {
			d := dispatch("update", fleet.SearchDefault)
			d.RetryOf, d.RetryStatuses = orig.ID, statuses
			return db.DispatchAction(ctx, tenant, d)
		}
		_, err := retry("acme", fleet.StatusFailed)
		wantCode(t, err, fleet.ECONFLICT) // d is Queued
		if _, err := db.CancelAction(ctx, "acme", orig.ID, tell(orig.ID, "update")); err != nil {
			t.Fatal(err)
		}
		_, err = retry("other", fleet.StatusFailed)
		wantCode(t, err, fleet.ENOTFOUND)

		a, err := retry("acme", fleet.StatusFailed)
		if err != nil {
			t.Fatal(err)
		}
		if a.Targeted != 2 || a.RetryOf == nil || *a.RetryOf != orig.ID {
			t.Fatalf("retry %+v", a)
		}
		got, err := db.FindAction(ctx, "acme", a.ID)
		if err != nil || got.RetryOf == nil || *got.RetryOf != orig.ID || got.Statuses["Queued"] != 2 {
			t.Fatalf("read back %+v, %v", got, err)
		}
		das, _, err := db.FindDeviceActions(ctx, "acme", fleet.DeviceActionFilter{ActionID: a.ID, Page: fleet.Page{Page: 1, Limit: 10}})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, da := range das {
			ids = append(ids, da.DeviceID)
		}
		sort.Strings(ids)
		if fmt.Sprint(ids) != "[b c]" {
			t.Fatalf("retried %v", ids)
		}
		list, _, err := db.FindActions(ctx, "acme", fleet.ActionFilter{Page: fleet.Page{Page: 1, Limit: 10}})
		if err != nil || list[0].ID != a.ID || list[0].RetryOf == nil || list[1].RetryOf != nil {
			t.Fatalf("list %+v, %v", list, err)
		}
		if a, err := retry("acme", fleet.StatusCancelled, fleet.StatusCompleted); err != nil || a.Targeted != 2 {
			t.Fatalf("Cancelled and Completed: %+v, %v", a, err)
		}
		// An action of none in the statuses.
		done := mustDispatch(t, db, "acme", dispatch("update", "default", "a"))
		mustReport(t, db, "acme", fleet.StatusReport{DeviceID: "a", ActionID: done.ID, State: "Completed"})
		d := dispatch("update", fleet.SearchDefault)
		d.RetryOf, d.RetryStatuses = done.ID, []fleet.ActionStatus{fleet.StatusFailed}
		_, err = db.DispatchAction(ctx, "acme", d)
		wantCode(t, err, fleet.ECONFLICT)
	})
}

// TestRetryConcurrent retries one action many times at once from two
// stores on one database, as two replicas (or a client's double click)
// would: each device action is retried once, by one of them, and the
// others are 409.
func TestRetryConcurrent(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		ctx := context.Background()
		dbs := mustReplicas(t, b)
		mustTenant(t, dbs[0], "acme")
		devs := map[string]map[string]string{}
		var ids []string
		for i := range 8 {
			id := fmt.Sprintf("d%d", i)
			devs[id], ids = nil, append(ids, id)
		}
		mustDevices(t, dbs[0], "acme", devs)
		orig := mustDispatch(t, dbs[0], "acme", dispatch("update", "default", ids...))
		var reports []fleet.StatusReport
		for _, id := range ids {
			reports = append(reports, fleet.StatusReport{DeviceID: id, ActionID: orig.ID, State: "Failed"})
		}
		mustReport(t, dbs[0], "acme", reports...)

		const n = 8
		var wg sync.WaitGroup
		targeted := make(chan int, n)
		errs := make(chan error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d := dispatch("update", fleet.SearchDefault)
				d.RetryOf, d.RetryStatuses = orig.ID, []fleet.ActionStatus{fleet.StatusFailed}
				a, err := dbs[i%2].DispatchAction(ctx, "acme", d)
				if err != nil {
					errs <- err
					return
				}
				targeted <- a.Targeted
			}()
		}
		wg.Wait()
		close(targeted)
		close(errs)
		total, retries := 0, 0
		for n := range targeted {
			total, retries = total+n, retries+1
		}
		for err := range errs {
			if fleet.ErrorCode(err) != fleet.ECONFLICT {
				t.Errorf("retry: %v, want a conflict", err)
			}
		}
		if total != len(ids) {
			t.Fatalf("%d retries targeted %d device actions, want each of the %d once", retries, total, len(ids))
		}
		das, _, err := dbs[0].FindDeviceActions(ctx, "acme", fleet.DeviceActionFilter{DeviceID: "d0", Page: fleet.Page{Page: 1, Limit: 100}})
		if err != nil || len(das) != 2 {
			t.Fatalf("d0 has %d device actions (%v), want the original and one retry", len(das), err)
		}
	})
}

// mustReplicas opens two stores on one new database of backend b, as two
// replicas of fleetd would; they are closed when the test ends.
func mustReplicas(t *testing.T, b sqlstoretest.Backend) [2]*sqlstore.DB {
	t.Helper()
	ctx := context.Background()
	dsn := b.DSN(t)
	var dbs [2]*sqlstore.DB
	for i := range dbs {
		db, err := sqlstore.Open(ctx, dsn, sqlstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		if _, err := db.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		dbs[i] = db
	}
	return dbs
}
