package sqlstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestAdvancedReportsMatchReadFirst checks the reports a batch writes
// without reading first (advanceReports) against the same batches applied
// by reading every device action first: two stores, the same fleet, the
// same clock and the same batches of random reports on two actions and a
// cancel_action, with repeats, older and equal keys, reports without a
// timestamp or a sequence or a progress, errors, final states, batches
// larger than a size class, a device
// action delivered but not reported (Initiated), a cancellation (the
// status word Cancelling kept through progress), unknown devices. Every
// column a report writes, the counts and each report's answer must end
// the same.
func TestAdvancedReportsMatchReadFirst(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		ctx := fleet.NewContextWithActor(context.Background(), &fleet.Actor{Tenant: "acme", Role: fleet.RoleOperator, UserName: "boss", UserEmail: "boss@example.com"})
		advance, clkA := mustOpen(t, b)
		readFirst, clkR := mustOpen(t, b)
		readFirst.SetReportsReadFirst(true)
		const n = 60
		ids := make([]string, n)
		devs := map[string]map[string]string{}
		for i := range ids {
			ids[i] = fmt.Sprintf("dev-%02d", i)
			devs[ids[i]] = nil
		}
		var actions []int64
		for _, db := range []*sqlstore.DB{advance, readFirst} {
			mustTenant(t, db, "acme")
			mustDevices(t, db, "acme", devs)
			a1 := mustDispatch(t, db, "acme", dispatch("update", "default", ids...))
			a2 := mustDispatch(t, db, "acme", dispatch("reboot", "default", ids[:n/2]...))
			if err := db.MarkDelivered(ctx, []fleet.ActionReceipt{{Tenant: "acme", DeviceID: ids[1], ActionID: a1.ID},
				{Tenant: "acme", DeviceID: ids[2], ActionID: a2.ID}}); err != nil {
				t.Fatal(err)
			}
			actions = []int64{a1.ID, a2.ID}
		}
		rng := rand.New(rand.NewPCG(7, 36))
		states := []string{"Downloading", "Downloading", "Installing", "Downloading", "Completed", "Failed"}
		batch := func(round int) []fleet.StatusReport {
			var rs []fleet.StatusReport
			for range 10 + rng.IntN(50) {
				r := fleet.StatusReport{DeviceID: ids[rng.IntN(n)], ActionID: actions[rng.IntN(len(actions))],
					State: states[rng.IntN(len(states))]}
				if rng.IntN(20) == 0 {
					r.DeviceID = "nobody"
				}
				if rng.IntN(60) > round {
					r.State = "Downloading" // fewer final states early
				}
				if rng.IntN(5) > 0 {
					r.Progress = intp(rng.IntN(101))
				}
				if rng.IntN(10) == 0 {
					r.Errors = []string{fmt.Sprintf("error %d", rng.IntN(3))}
				}
				if rng.IntN(7) > 0 {
					// Around the round's: older, equal and newer keys.
					r.Timestamp = i64(int64(round + rng.IntN(3)))
				}
				if rng.IntN(7) > 0 {
					r.Sequence = i64(int64(rng.IntN(2)))
				}
				rs = append(rs, r)
			}
			return rs
		}
		for round := range 30 {
			if round == 12 {
				var ca int64
				for _, db := range []*sqlstore.DB{advance, readFirst} {
					c, err := db.CancelAction(ctx, "acme", actions[0], tell(actions[0], "update"))
					if err != nil || c.Sent == nil {
						t.Fatalf("cancel: %+v, %v", c, err)
					}
					ca = c.Sent.ID
				}
				actions = append(actions, ca)
			}
			if round%3 != 2 { // some rounds at the same instant as the last
				clkA.Add(time.Second)
				clkR.Add(time.Second)
			}
			rs := batch(round)
			if round%10 == 5 {
				// A report on every device action of the first two
				// actions: more than a size class (on PostgreSQL, arrays).
				rs = rs[:0]
				for _, a := range actions[:2] {
					for _, d := range ids {
						rs = append(rs, fleet.StatusReport{DeviceID: d, ActionID: a, State: "Downloading", Progress: intp(round),
							Timestamp: i64(int64(round + 1)), Sequence: i64(int64(rng.IntN(2)))})
					}
				}
			}
			got, err := advance.ReportStatus(ctx, "acme", rs)
			if err != nil {
				t.Fatal(err)
			}
			want, err := readFirst.ReportStatus(ctx, "acme", rs)
			if err != nil {
				t.Fatal(err)
			}
			for i := range rs {
				if fmt.Sprint(got[i]) != fmt.Sprint(want[i]) {
					t.Errorf("round %d, report %d %+v: answered %v, read first %v", round, i, rs[i], got[i], want[i])
				}
			}
			for _, a := range actions {
				for _, d := range ids {
					got, errG := advance.ReportColumns(ctx, "acme", a, d)
					want, errW := readFirst.ReportColumns(ctx, "acme", a, d)
					if got != want || fmt.Sprint(errG) != fmt.Sprint(errW) {
						t.Fatalf("round %d, action %d, %s: %s (%v), read first %s (%v)", round, a, d, got, errG, want, errW)
					}
				}
			}
		}
		for _, a := range actions {
			gotA, err := advance.FindAction(ctx, "acme", a)
			if err != nil {
				t.Fatal(err)
			}
			wantA, err := readFirst.FindAction(ctx, "acme", a)
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(gotA.Statuses) != fmt.Sprint(wantA.Statuses) {
				t.Errorf("action %d statuses %v, read first %v", a, gotA.Statuses, wantA.Statuses)
			}
		}
	})
}

// TestAdvancedReportsReadOnlyTheirDeviceActions checks the plan of
// advanceReports' statement for a batch of 16 reports on an action of
// 2,000 device actions in Progress: on SQLite each report's device action
// found by its key, not the action's device actions in Progress by
// device_actions_by_status (1.3 ms a report); on PostgreSQL, with the
// generic plan, at most the batch's rows read.
func TestAdvancedReportsReadOnlyTheirDeviceActions(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, _ := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		const n = 2000
		ids := make([]string, n)
		devs := map[string]map[string]string{}
		for i := range ids {
			ids[i] = fmt.Sprintf("dev-%04d", i)
			devs[ids[i]] = nil
		}
		mustDevices(t, db, "acme", devs)
		a := mustDispatch(t, db, "acme", dispatch("reboot", "default", ids...))
		report := func(seq int64, devs []string) []fleet.StatusReport {
			var rs []fleet.StatusReport
			for _, d := range devs {
				rs = append(rs, fleet.StatusReport{DeviceID: d, ActionID: a.ID, State: "Downloading", Progress: intp(1),
					Timestamp: i64(seq), Sequence: i64(seq)})
			}
			return rs
		}
		for start := 0; start < n; start += 500 {
			mustReport(t, db, "acme", report(1, ids[start:start+500])...)
		}
		some := make([]string, 0, 16)
		for i := 0; i < n; i += n / 16 {
			some = append(some, ids[i])
		}
		advanced, read, plan, err := db.AdvanceReportsPlan(ctx, "acme", report(2, some))
		if err != nil {
			t.Fatal(err)
		}
		if advanced != len(some) {
			t.Fatalf("advanced %d reports, want %d", advanced, len(some))
		}
		if b.Name == "sqlite" {
			if strings.Contains(plan, "device_actions_by_status") || !strings.Contains(plan, "device_id=?") {
				t.Fatalf("plan:\n%s", plan)
			}
			return
		}
		if read > int64(len(some)) {
			t.Fatalf("read %d device actions for %d reports", read, len(some))
		}
	})
}
