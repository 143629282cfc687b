package sqlstore_test

import (
	"context"
	"fmt"
	"sort"
	"testing"

	"github.com/fleetd/fleet"
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
