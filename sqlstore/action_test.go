package sqlstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// mustDevices provisions devices with metadata.
func mustDevices(t testing.TB, db *sqlstore.DB, tenant string, devs map[string]map[string]string) {
	t.Helper()
	var nd []fleet.NewDevice
	for _, id := range slices.Sorted(func(yield func(string) bool) {
		for id := range devs {
			if !yield(id) {
				return
			}
		}
	}) {
		nd = append(nd, fleet.NewDevice{ID: id, Metadata: devs[id]})
	}
	if _, err := db.CreateDevices(context.Background(), tenant, nd); err != nil {
		t.Fatal(err)
	}
}

// dispatch builds a dispatch of action to search type st.
func dispatch(action, st string, ids ...string) *fleet.Dispatch {
	return &fleet.Dispatch{
		Action: action, Params: json.RawMessage(`{"delay":5}`), SearchType: st, DeviceIDs: ids,
		Timeout: 60, UserEmail: "ops@example.com", UserName: "ops",
	}
}

func mustDispatch(t testing.TB, db *sqlstore.DB, tenant string, d *fleet.Dispatch) *fleet.Action {
	t.Helper()
	a, err := db.DispatchAction(context.Background(), tenant, d)
	if err != nil {
		t.Fatalf("dispatch %s: %v", d.Action, err)
	}
	return a
}

// targets returns the device ids of an action, sorted.
func targets(t *testing.T, db *sqlstore.DB, tenant string, id int64) []string {
	t.Helper()
	das, _, err := db.FindDeviceActions(context.Background(), tenant, fleet.DeviceActionFilter{ActionID: id, Page: fleet.Page{Page: 1, Limit: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, da := range das {
		ids = append(ids, da.DeviceID)
	}
	return ids
}

// counts returns how many actions and device actions the tenant has.
func counts(t *testing.T, db *sqlstore.DB, tenant string) (int, int) {
	t.Helper()
	acts, n, err := db.FindActions(context.Background(), tenant, fleet.ActionFilter{Page: fleet.Page{Page: 1, Limit: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	das := 0
	for _, a := range acts {
		for _, c := range a.Statuses {
			das += c
		}
	}
	return n, das
}

func TestDispatch(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, clk := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustTenant(t, db, "beta")
		mustDevices(t, db, "acme", map[string]map[string]string{
			"pump-1":  {"site": "Berlin", "model": "x1"},
			"pump-2":  {"site": "Paris", "model": "x1"},
			"valve-1": {"site": "berlin-south", "model": "v2"},
			"gauge-9": nil,
		})
		mustDevices(t, db, "beta", map[string]map[string]string{"pump-1": {"site": "Berlin"}})

		for _, tc := range []struct {
			name string
			d    *fleet.Dispatch
			want []string
		}{
			{"Default", dispatch("reboot", "default", "pump-2", "gauge-9"), []string{"gauge-9", "pump-2"}},
			{"All", dispatch("reboot", "all"), []string{"gauge-9", "pump-1", "pump-2", "valve-1"}},
			{"Metadata", &fleet.Dispatch{Action: "x", Params: json.RawMessage(`{}`), SearchType: "metadata", SearchKey: "model", SearchQuery: "x1", Timeout: 1}, []string{"pump-1", "pump-2"}},
			{"MetadataIsExact", &fleet.Dispatch{Action: "x", Params: json.RawMessage(`{}`), SearchType: "metadata", SearchKey: "site", SearchQuery: "Berlin", Timeout: 1}, []string{"pump-1"}},
			{"SearchAnyValue", &fleet.Dispatch{Action: "x", Params: json.RawMessage(`{}`), SearchType: "search", SearchQuery: "BERLIN", Timeout: 1}, []string{"pump-1", "valve-1"}},
			{"SearchID", &fleet.Dispatch{Action: "x", Params: json.RawMessage(`{}`), SearchType: "search", SearchQuery: "Gauge", Timeout: 1}, []string{"gauge-9"}},
			{"SearchUnderKey", &fleet.Dispatch{Action: "x", Params: json.RawMessage(`{}`), SearchType: "search", SearchKey: "model", SearchQuery: "V", Timeout: 1}, []string{"valve-1"}},
			{"SearchUnderKeyOrID", &fleet.Dispatch{Action: "x", Params: json.RawMessage(`{}`), SearchType: "search", SearchKey: "site", SearchQuery: "pump", Timeout: 1}, []string{"pump-1", "pump-2"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				a := mustDispatch(t, db, "acme", tc.d)
				if got := targets(t, db, "acme", a.ID); !slices.Equal(got, tc.want) {
					t.Fatalf("targets = %v, want %v", got, tc.want)
				}
				if a.Targeted != len(tc.want) || a.Statuses["Queued"] != len(tc.want) || len(a.Statuses) != 1 {
					t.Fatalf("targeted %d, statuses %v; want %d Queued", a.Targeted, a.Statuses, len(tc.want))
				}
			})
		}

		t.Run("Record", func(t *testing.T) {
			clk.Add(time.Second)
			d := dispatch("reboot", "default", "pump-1")
			d.Metadata = json.RawMessage(`{"ticket":"T-1"}`)
			a := mustDispatch(t, db, "acme", d)
			got, err := db.FindAction(ctx, "acme", a.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.Action != "reboot" || string(got.Params) != `{"delay":5}` || string(got.Metadata) != `{"ticket":"T-1"}` ||
				got.Timeout != 60 || got.UserName != "ops" || got.UserEmail != "ops@example.com" || !got.CreatedAt.Equal(clk.Now()) ||
				got.Targeted != 1 || got.Statuses["Queued"] != 1 || got.SearchType != "default" {
				t.Fatalf("action = %+v", got)
			}
			da, err := db.FindDeviceAction(ctx, "acme", a.ID, "pump-1")
			if err != nil {
				t.Fatal(err)
			}
			want := fleet.DeviceAction{ActionID: a.ID, DeviceID: "pump-1", Type: "reboot", Status: "Queued", ActionStatus: fleet.StatusQueued,
				Params: `{"delay":5}`, UserEmail: "ops@example.com", UserName: "ops"}
			if da.ActionID != want.ActionID || da.DeviceID != want.DeviceID || da.Type != want.Type || da.Status != want.Status ||
				da.ActionStatus != want.ActionStatus || da.Params != want.Params || da.UserEmail != want.UserEmail || da.UserName != want.UserName ||
				da.Progress != 0 || len(da.Errors) != 0 || da.Errors == nil || da.SerialMetadata["site"] != "Berlin" ||
				!da.CreatedAt.Equal(clk.Now()) || !da.UpdatedAt.Equal(clk.Now()) {
				t.Fatalf("device action = %+v", da)
			}
			// The snapshot of metadata does not follow later changes.
			if _, err := db.UpdateDeviceMetadata(ctx, "acme", "pump-1", map[string]*string{"site": ptr("Rome")}); err != nil {
				t.Fatal(err)
			}
			da, _ = db.FindDeviceAction(ctx, "acme", a.ID, "pump-1")
			if da.SerialMetadata["site"] != "Berlin" {
				t.Fatalf("-serial_metadata = %v, want the metadata at dispatch", da.SerialMetadata)
			}
			if _, err := db.UpdateDeviceMetadata(ctx, "acme", "pump-1", map[string]*string{"site": ptr("Berlin")}); err != nil {
				t.Fatal(err)
			}
		})

		t.Run("IDsPerTenant", func(t *testing.T) {
			a1 := mustDispatch(t, db, "beta", dispatch("reboot", "all"))
			a2 := mustDispatch(t, db, "beta", dispatch("reboot", "all"))
			if a1.ID != 1 || a2.ID != 2 {
				t.Fatalf("beta's ids = %d, %d; want 1, 2", a1.ID, a2.ID)
			}
		})

		t.Run("RejectedWritesNothing", func(t *testing.T) {
			acts, das := counts(t, db, "acme")
			before, _, _ := db.FindAuditLogs(ctx, "acme", fleet.AuditFilter{Page: fleet.Page{Page: 1, Limit: 1}})
			_, err := db.DispatchAction(ctx, "acme", dispatch("reboot", "default", "pump-1", "nope-1", "pump-2", "nope-2"))
			wantCode(t, err, fleet.EINVALID)
			fe := err.(*fleet.Error)
			if !strings.Contains(fe.Fields["device_ids"], "nope-1, nope-2") || strings.Contains(fe.Message, "pump") {
				t.Fatalf("error %v must list nope-1 and nope-2 alone", err)
			}
			_, err = db.DispatchAction(ctx, "acme", &fleet.Dispatch{Action: "x", Params: json.RawMessage(`{}`), SearchType: "metadata", SearchKey: "site", SearchQuery: "Atlantis", Timeout: 1})
			wantCode(t, err, fleet.EINVALID)
			// A device of another tenant is unknown here.
			mustDevices(t, db, "beta", map[string]map[string]string{"beta-only": nil})
			_, err = db.DispatchAction(ctx, "acme", dispatch("reboot", "default", "beta-only"))
			wantCode(t, err, fleet.EINVALID)

			if a, d := counts(t, db, "acme"); a != acts || d != das {
				t.Fatalf("after rejected dispatches: %d actions, %d device actions; want %d, %d", a, d, acts, das)
			}
			after, _, _ := db.FindAuditLogs(ctx, "acme", fleet.AuditFilter{Page: fleet.Page{Page: 1, Limit: 1}})
			if after[0].ID != before[0].ID {
				t.Fatalf("a rejected dispatch wrote an audit log: %+v", after[0])
			}
			// Nor did it use up an id.
			a := mustDispatch(t, db, "acme", dispatch("reboot", "default", "pump-1"))
			if a.ID != int64(acts+1) {
				t.Fatalf("next id = %d, want %d", a.ID, acts+1)
			}
		})

		t.Run("Audit", func(t *testing.T) {
			logs, _, _ := db.FindAuditLogs(ctx, "acme", fleet.AuditFilter{Page: fleet.Page{Page: 1, Limit: 1}})
			if logs[0].Action != "action.dispatch" || !strings.HasPrefix(logs[0].Target, "actions/") || logs[0].Details["targeted"] != int64(1) {
				t.Fatalf("audit log = %+v", logs[0])
			}
		})

		t.Run("List", func(t *testing.T) {
			acts, n, err := db.FindActions(ctx, "acme", fleet.ActionFilter{Page: fleet.Page{Page: 1, Limit: 2}})
			if err != nil {
				t.Fatal(err)
			}
			if len(acts) != 2 || n < 10 || acts[0].ID <= acts[1].ID || acts[0].Statuses["Queued"] != acts[0].Targeted {
				t.Fatalf("page = %d items of %d, first %+v", len(acts), n, acts[0])
			}
			_, n2, _ := db.FindActions(ctx, "acme", fleet.ActionFilter{Action: "x", Page: fleet.Page{Page: 1, Limit: 50}})
			if n2 != 6 {
				t.Fatalf("actions named x = %d, want 6", n2)
			}
		})

		t.Run("OtherTenant", func(t *testing.T) {
			_, err := db.FindAction(ctx, "beta", 5)
			wantCode(t, err, fleet.ENOTFOUND)
			_, _, err = db.FindDeviceActions(ctx, "beta", fleet.DeviceActionFilter{ActionID: 5, Page: fleet.Page{Page: 1, Limit: 5}})
			wantCode(t, err, fleet.ENOTFOUND)
			_, _, err = db.FindDeviceActions(ctx, "beta", fleet.DeviceActionFilter{DeviceID: "valve-1", Page: fleet.Page{Page: 1, Limit: 5}})
			wantCode(t, err, fleet.ENOTFOUND)
			_, err = db.CancelAction(ctx, "beta", 5, tell(5, "reboot"))
			wantCode(t, err, fleet.ENOTFOUND)
			errs, err := db.ReportStatus(ctx, "beta", []fleet.StatusReport{{DeviceID: "valve-1", ActionID: 2, State: "Running"}})
			if err != nil {
				t.Fatal(err)
			}
			wantCode(t, errs[0], fleet.ENOTFOUND)
			// beta's pump-1 has beta's actions 1 and 2 only.
			das, n, err := db.FindDeviceActions(ctx, "beta", fleet.DeviceActionFilter{DeviceID: "pump-1", Page: fleet.Page{Page: 1, Limit: 50}})
			if err != nil || n != 2 || das[0].ActionID != 2 {
				t.Fatalf("beta pump-1: %d, %v", n, err)
			}
		})
	})
}

func TestDispatchCheckDevice(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, _ := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustDevices(t, db, "acme", map[string]map[string]string{"old": nil, "new": nil, "blank": nil})
		// Record versions by completing an update_firmware on two devices.
		fw := dispatch(fleet.ActionUpdateFirmware, "default", "old", "new")
		fw.DeviceParams = json.RawMessage(`{"version":"1.0.0","components":[{"component_name":"app","version_number":"1.0.0"},{"component_name":"boot","version_number":"1.0.0"}]}`)
		a := mustDispatch(t, db, "acme", fw)
		for _, dev := range []string{"old", "new"} {
			mustReport(t, db, "acme", fleet.StatusReport{DeviceID: dev, ActionID: a.ID, State: "Completed"})
		}
		fw2 := dispatch(fleet.ActionUpdateFirmware, "default", "new")
		fw2.DeviceParams = json.RawMessage(`{"components":[{"component_name":"boot","version_number":"1.2.0"}]}`)
		a2 := mustDispatch(t, db, "acme", fw2)
		mustReport(t, db, "acme", fleet.StatusReport{DeviceID: "new", ActionID: a2.ID, State: "Completed"})
		d, _ := db.FindDevice(ctx, "acme", "new")
		if d.Components["app"] != "1.0.0" || d.Components["boot"] != "1.2.0" {
			t.Fatalf("components after two updates = %v", d.Components)
		}

		var asked []string
		check := dispatch(fleet.ActionUpdateFirmware, "all")
		check.DeviceParams = json.RawMessage(`{"version":"2.0.0"}`)
		check.CheckDevice = func(c map[string]string) string {
			asked = append(asked, c["boot"])
			if c["boot"] < "1.1.0" {
				return "boot 1.1.0 or later is required; the device has " + c["boot"]
			}
			return ""
		}
		a3 := mustDispatch(t, db, "acme", check)
		if a3.Statuses["Failed"] != 1 || a3.Statuses["Queued"] != 2 {
			t.Fatalf("statuses of the dispatch = %v", a3.Statuses)
		}
		sort.Strings(asked)
		if fmt.Sprint(asked) != "[1.0.0 1.2.0]" {
			t.Fatalf("CheckDevice asked about %v; want the two devices with components", asked)
		}
		got, _ := db.FindDeviceAction(ctx, "acme", a3.ID, "old")
		if got.ActionStatus != fleet.StatusFailed || got.Status != "Failed" || !strings.Contains(got.Errors["Failed"][0], "boot 1.1.0") || got.Params != `{"version":"2.0.0"}` {
			t.Fatalf("rejected device action = %+v", got)
		}
		pending, err := db.PendingDevices(ctx, "acme", a3.ID, nil)
		if err != nil {
			t.Fatal(err)
		}
		sort.Strings(pending)
		if fmt.Sprint(pending) != "[blank new]" {
			t.Fatalf("pending = %v, want the devices not rejected", pending)
		}
		full, _ := db.FindAction(ctx, "acme", a3.ID)
		if full.Statuses["Failed"] != 1 || full.Statuses["Queued"] != 2 || string(full.Params) != `{"delay":5}` {
			t.Fatalf("action = %+v", full)
		}
	})
}

func mustReport(t testing.TB, db *sqlstore.DB, tenant string, rs ...fleet.StatusReport) {
	t.Helper()
	errs, err := db.ReportStatus(context.Background(), tenant, rs)
	if err != nil {
		t.Fatal(err)
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("report %d: %v", i, err)
		}
	}
}

func i64(n int64) *int64 { return &n }
func intp(n int) *int    { return &n }

func TestReportStatus(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, clk := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustDevices(t, db, "acme", map[string]map[string]string{"d1": nil, "d2": nil, "d3": nil})
		a := mustDispatch(t, db, "acme", dispatch("reboot", "default", "d1", "d2"))
		other := mustDispatch(t, db, "acme", dispatch("reboot", "default", "d3"))
		get := func(dev string) *fleet.DeviceAction {
			t.Helper()
			da, err := db.FindDeviceAction(ctx, "acme", a.ID, dev)
			if err != nil {
				t.Fatal(err)
			}
			return da
		}

		t.Run("FirstReportInitiates", func(t *testing.T) {
			clk.Add(time.Second)
			mustReport(t, db, "acme", fleet.StatusReport{DeviceID: "d1", ActionID: a.ID, State: "Received", Timestamp: i64(1000), Sequence: i64(1)})
			da := get("d1")
			if da.ActionStatus != fleet.StatusProgress || da.Status != "Received" || !da.UpdatedAt.Equal(clk.Now()) {
				t.Fatalf("after Received: %+v", da)
			}
			// Sightings are recorded in batches, never backwards.
			if err := db.TouchDevices(ctx, "acme", []string{"d1", "d2", "ghost"}, clk.Now()); err != nil {
				t.Fatal(err)
			}
			if err := db.TouchDevices(ctx, "acme", []string{"d1"}, clk.Now().Add(-time.Minute)); err != nil {
				t.Fatal(err)
			}
			d, _ := db.FindDevice(ctx, "acme", "d1")
			if d.LastSeenAt == nil || !d.LastSeenAt.Equal(clk.Now()) {
				t.Fatalf("last_seen_at = %v, want %v", d.LastSeenAt, clk.Now())
			}
			// Its timeout runs from now: 60 s later the sweeper fails it.
			n, err := db.TimeOutDeviceActions(ctx, clk.Now().Add(59*time.Second), 100)
			if err != nil || n != 0 {
				t.Fatalf("swept %d (%v) before the timeout", n, err)
			}
		})

		t.Run("Ordering", func(t *testing.T) {
			for _, step := range []struct {
				name       string
				r          fleet.StatusReport
				wantStatus string
				wantAS     fleet.ActionStatus
				wantProg   int
			}{
				{"Newer", fleet.StatusReport{State: "Downloading", Progress: intp(10), Timestamp: i64(2000), Sequence: i64(2)}, "Downloading", fleet.StatusProgress, 10},
				{"Older", fleet.StatusReport{State: "Stale", Progress: intp(5), Timestamp: i64(1500), Sequence: i64(9)}, "Downloading", fleet.StatusProgress, 10},
				{"Duplicate", fleet.StatusReport{State: "Dup", Progress: intp(99), Timestamp: i64(2000), Sequence: i64(2)}, "Downloading", fleet.StatusProgress, 10},
				{"SameTimeNextSequence", fleet.StatusReport{State: "Downloading", Progress: intp(40), Timestamp: i64(2000), Sequence: i64(3)}, "Downloading", fleet.StatusProgress, 40},
				{"SameTimeOlderSequence", fleet.StatusReport{State: "Downloading", Progress: intp(20), Timestamp: i64(2000), Sequence: i64(1)}, "Downloading", fleet.StatusProgress, 40},
				{"NoProgressKeepsIt", fleet.StatusReport{State: "Installing", Timestamp: i64(3000)}, "Installing", fleet.StatusProgress, 40},
				{"Failed", fleet.StatusReport{State: "Failed", Errors: []string{"disk full"}, Timestamp: i64(4000)}, "Failed", fleet.StatusFailed, 40},
				{"AfterFinal", fleet.StatusReport{State: "Completed", Progress: intp(100), Timestamp: i64(5000)}, "Failed", fleet.StatusFailed, 40},
			} {
				t.Run(step.name, func(t *testing.T) {
					step.r.DeviceID, step.r.ActionID = "d1", a.ID
					mustReport(t, db, "acme", step.r)
					da := get("d1")
					if da.Status != step.wantStatus || da.ActionStatus != step.wantAS || da.Progress != step.wantProg {
						t.Fatalf("status %q %s %d, want %q %s %d", da.Status, da.ActionStatus, da.Progress, step.wantStatus, step.wantAS, step.wantProg)
					}
				})
			}
			if da := get("d1"); fmt.Sprint(da.Errors) != "map[Failed:[disk full]]" {
				t.Fatalf("errors = %v", da.Errors)
			}
			// The final state no longer times out.
			n, err := db.TimeOutDeviceActions(ctx, clk.Now().Add(time.Hour), 100)
			if err != nil || n != 0 {
				t.Fatalf("swept %d (%v); a final device action must not time out", n, err)
			}
		})

		t.Run("ErrorsPerState", func(t *testing.T) {
			mustReport(t, db, "acme",
				fleet.StatusReport{DeviceID: "d2", ActionID: a.ID, State: "Downloading", Errors: []string{"retrying", "slow link"}, Timestamp: i64(1)},
				fleet.StatusReport{DeviceID: "d2", ActionID: a.ID, State: "Installing", Timestamp: i64(2)},
				fleet.StatusReport{DeviceID: "d2", ActionID: a.ID, State: "Completed", Errors: []string{"warning: reboot pending"}, Timestamp: i64(3)},
			)
			da := get("d2")
			if da.ActionStatus != fleet.StatusCompleted || da.Progress != 100 || len(da.Errors) != 2 ||
				len(da.Errors["Downloading"]) != 2 || da.Errors["Completed"][0] != "warning: reboot pending" {
				t.Fatalf("d2 = %+v", da)
			}
			full, _ := db.FindAction(ctx, "acme", a.ID)
			if full.Statuses["Completed"] != 1 || full.Statuses["Failed"] != 1 {
				t.Fatalf("statuses = %v", full.Statuses)
			}
		})

		t.Run("ManyRowsInOneCall", func(t *testing.T) {
			m := mustDispatch(t, db, "acme", dispatch("multi", "all"))
			m2 := mustDispatch(t, db, "acme", dispatch("multi2", "default", "d2"))
			mustReport(t, db, "acme",
				fleet.StatusReport{DeviceID: "d3", ActionID: m.ID, State: "Completed", Timestamp: i64(5)},
				fleet.StatusReport{DeviceID: "d1", ActionID: m.ID, State: "Downloading", Progress: intp(30), Errors: []string{"slow"}, Timestamp: i64(5)},
				fleet.StatusReport{DeviceID: "d2", ActionID: m2.ID, State: "Failed", Timestamp: i64(5)},
				fleet.StatusReport{DeviceID: "d2", ActionID: m.ID, State: "Old", Timestamp: i64(5)},
				fleet.StatusReport{DeviceID: "d1", ActionID: m.ID, State: "Installing", Progress: intp(60), Timestamp: i64(6)},
				fleet.StatusReport{DeviceID: "d2", ActionID: m.ID, State: "Older", Timestamp: i64(4)},
			)
			for _, w := range []struct {
				id       int64
				dev, st  string
				as       fleet.ActionStatus
				progress int
				errs     int
			}{
				{m.ID, "d1", "Installing", fleet.StatusProgress, 60, 1},
				{m.ID, "d2", "Old", fleet.StatusProgress, 0, 0},
				{m.ID, "d3", "Completed", fleet.StatusCompleted, 100, 0},
				{m2.ID, "d2", "Failed", fleet.StatusFailed, 0, 0},
			} {
				da, err := db.FindDeviceAction(ctx, "acme", w.id, w.dev)
				if err != nil {
					t.Fatal(err)
				}
				if da.Status != w.st || da.ActionStatus != w.as || da.Progress != w.progress || fleet.ErrorCount(da.Errors) != w.errs || !da.UpdatedAt.Equal(clk.Now()) {
					t.Fatalf("%s/%d = %+v", w.dev, w.id, da)
				}
			}
			// Deadlines were set from the first report: 60 s from now.
			if n, _ := db.TimeOutDeviceActions(ctx, clk.Now().Add(59*time.Second), 100); n != 0 {
				t.Fatalf("swept %d before the deadline", n)
			}
			if n, _ := db.TimeOutDeviceActions(ctx, clk.Now().Add(60*time.Second), 100); n != 2 {
				t.Fatalf("swept %d at the deadline, want d1 and d2 of multi", n)
			}
		})

		t.Run("WithoutTimestampsInArrivalOrder", func(t *testing.T) {
			b := mustDispatch(t, db, "acme", dispatch("reboot", "default", "d3"))
			for _, st := range []string{"One", "Two", "Three"} {
				mustReport(t, db, "acme", fleet.StatusReport{DeviceID: "d3", ActionID: b.ID, State: st})
			}
			da, _ := db.FindDeviceAction(ctx, "acme", b.ID, "d3")
			if da.Status != "Three" {
				t.Fatalf("status = %q, want the last report's", da.Status)
			}
		})

		t.Run("NotFound", func(t *testing.T) {
			errs, err := db.ReportStatus(ctx, "acme", []fleet.StatusReport{
				{DeviceID: "ghost", ActionID: a.ID, State: "Running"},
				{DeviceID: "d3", ActionID: a.ID, State: "Running"},
				{DeviceID: "d1", ActionID: 999, State: "Running"},
				{DeviceID: "d3", ActionID: other.ID, State: "Running", Timestamp: i64(1)},
			})
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 3; i++ {
				wantCode(t, errs[i], fleet.ENOTFOUND)
			}
			if !strings.Contains(fleet.ErrorMessage(errs[0]), `device "ghost"`) || !strings.Contains(fleet.ErrorMessage(errs[1]), "was not sent") {
				t.Fatalf("messages: %v; %v", errs[0], errs[1])
			}
			// The good report in the same batch was applied.
			if errs[3] != nil {
				t.Fatal(errs[3])
			}
			da, _ := db.FindDeviceAction(ctx, "acme", other.ID, "d3")
			if da.Status != "Running" {
				t.Fatalf("the valid report of a mixed batch was not applied: %+v", da)
			}
		})
	})
}

func TestDeliveryAndTimeouts(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, clk := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustDevices(t, db, "acme", map[string]map[string]string{"d1": nil, "d2": nil, "d3": nil})
		d := dispatch("reboot", "all")
		d.Timeout = 10
		a := mustDispatch(t, db, "acme", d)

		pending, err := db.PendingActions(ctx, "acme", "d1", 0, 100)
		if err != nil || len(pending) != 1 || pending[0].ActionID != a.ID || pending[0].Name != "reboot" || pending[0].Params != `{"delay":5}` {
			t.Fatalf("pending = %+v, %v", pending, err)
		}
		start := clk.Now()
		if err := db.MarkDelivered(ctx, []fleet.ActionReceipt{{Tenant: "acme", DeviceID: "d1", ActionID: a.ID}, {Tenant: "acme", DeviceID: "d2", ActionID: a.ID}}); err != nil {
			t.Fatal(err)
		}
		da, _ := db.FindDeviceAction(ctx, "acme", a.ID, "d1")
		if da.ActionStatus != fleet.StatusInitiated || da.Status != "Initiated" {
			t.Fatalf("delivered = %+v", da)
		}
		if p, _ := db.PendingActions(ctx, "acme", "d1", 0, 100); len(p) != 0 {
			t.Fatalf("pending after delivery = %+v", p)
		}
		// The backlog is read a window at a time: above an id, up to a
		// limit, oldest first.
		var ids []int64
		for range 5 {
			ids = append(ids, mustDispatch(t, db, "acme", dispatch("ping", "default", "d3")).ID)
		}
		for _, c := range []struct {
			after int64
			limit int
			want  []int64
		}{
			{0, 3, []int64{a.ID, ids[0], ids[1]}},
			{ids[1], 3, ids[2:5]},
			{ids[2], 100, ids[3:5]},
			{ids[4], 10, nil},
		} {
			p, err := db.PendingActions(ctx, "acme", "d3", c.after, c.limit)
			var got []int64
			for _, x := range p {
				got = append(got, x.ActionID)
			}
			if err != nil || fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Errorf("PendingActions after %d, limit %d = %v, %v; want %v", c.after, c.limit, got, err, c.want)
			}
		}
		// A second acknowledgement (a redelivery) changes nothing.
		clk.Add(5 * time.Second)
		if err := db.MarkDelivered(ctx, []fleet.ActionReceipt{{Tenant: "acme", DeviceID: "d1", ActionID: a.ID}}); err != nil {
			t.Fatal(err)
		}
		// d2 reports, which keeps it in flight but does not move its deadline.
		mustReport(t, db, "acme", fleet.StatusReport{DeviceID: "d2", ActionID: a.ID, State: "Running", Timestamp: i64(1)})

		if n, err := db.TimeOutDeviceActions(ctx, start.Add(9999*time.Millisecond), 100); err != nil || n != 0 {
			t.Fatalf("before the deadline: swept %d, %v", n, err)
		}
		if n, err := db.TimeOutDeviceActions(ctx, start.Add(10*time.Second), 1); err != nil || n != 1 {
			t.Fatalf("at the deadline, limit 1: swept %d, %v", n, err)
		}
		if n, err := db.TimeOutDeviceActions(ctx, start.Add(10*time.Second), 100); err != nil || n != 1 {
			t.Fatalf("the rest: swept %d, %v", n, err)
		}
		if n, err := db.TimeOutDeviceActions(ctx, start.Add(time.Hour), 100); err != nil || n != 0 {
			t.Fatalf("again: swept %d, %v; Queued d3 must never time out", n, err)
		}
		for _, dev := range []string{"d1", "d2"} {
			da, _ := db.FindDeviceAction(ctx, "acme", a.ID, dev)
			if da.ActionStatus != fleet.StatusFailed || da.Status != fleet.StateTimedOut || len(da.Errors[fleet.StateTimedOut]) != 1 {
				t.Fatalf("%s after the timeout = %+v", dev, da)
			}
		}
		// A report after the timeout is acknowledged and ignored.
		mustReport(t, db, "acme", fleet.StatusReport{DeviceID: "d1", ActionID: a.ID, State: "Completed"})
		if da, _ := db.FindDeviceAction(ctx, "acme", a.ID, "d1"); da.ActionStatus != fleet.StatusFailed {
			t.Fatalf("a timed-out device action changed: %+v", da)
		}
		if da, _ := db.FindDeviceAction(ctx, "acme", a.ID, "d3"); da.ActionStatus != fleet.StatusQueued {
			t.Fatalf("d3 = %+v", da)
		}
	})
}

// tell is the cancel_action a cancel of action id sends, as the action
// service builds it.
func tell(id int64, name string) *fleet.Dispatch {
	d := dispatch(fleet.ActionCancel, "default")
	d.Params = json.RawMessage(fmt.Sprintf(`{"action_id":"%d"}`, id))
	d.DeviceParams = json.RawMessage(fmt.Sprintf(`{"action_id":"%d","name":"%s"}`, id, name))
	d.CancelActionID = id
	d.UserEmail, d.UserName = "boss@example.com", "boss"
	return d
}

func TestCancel(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, _ := mustOpen(t, b)
		ctx := fleet.NewContextWithActor(context.Background(), &fleet.Actor{Tenant: "acme", Role: fleet.RoleOperator, UserName: "boss", UserEmail: "boss@example.com"})
		mustTenant(t, db, "acme")
		mustDevices(t, db, "acme", map[string]map[string]string{"queued": nil, "sent": nil, "busy": nil, "done": nil})
		a := mustDispatch(t, db, "acme", dispatch("reboot", "all"))
		if err := db.MarkDelivered(ctx, []fleet.ActionReceipt{{Tenant: "acme", DeviceID: "sent", ActionID: a.ID}}); err != nil {
			t.Fatal(err)
		}
		mustReport(t, db, "acme",
			fleet.StatusReport{DeviceID: "busy", ActionID: a.ID, State: "Running"},
			fleet.StatusReport{DeviceID: "done", ActionID: a.ID, State: "Completed"})

		c, err := db.CancelAction(ctx, "acme", a.ID, tell(a.ID, "reboot"))
		ca, n := c.Sent, c.Cancelled
		if err != nil || n != 3 || ca == nil {
			t.Fatalf("cancelled %d, %v; want 3 and a cancel_action", n, err)
		}
		// The devices that have the action keep it until they answer.
		full, _ := db.FindAction(ctx, "acme", a.ID)
		if want := map[string]int{"Cancelled": 1, "Initiated": 1, "Progress": 1, "Completed": 1}; !maps.Equal(full.Statuses, want) {
			t.Fatalf("statuses = %v, want %v", full.Statuses, want)
		}
		// The devices that have the action are sent a cancel_action.
		sent, err := db.FindAction(ctx, "acme", ca.ID)
		if err != nil || sent.Action != fleet.ActionCancel || sent.Targeted != 2 || sent.Statuses["Queued"] != 2 ||
			string(sent.Params) != fmt.Sprintf(`{"action_id":"%d"}`, a.ID) || sent.UserName != "boss" || sent.Timeout != a.Timeout {
			t.Fatalf("cancel_action = %+v, %v", sent, err)
		}
		notify, err := db.PendingDevices(ctx, "acme", ca.ID, nil)
		sort.Strings(notify)
		if err != nil || fmt.Sprint(notify) != "[busy sent]" {
			t.Fatalf("devices to tell = %v, %v", notify, err)
		}
		if got, _ := db.PendingDevices(ctx, "acme", ca.ID, []string{"busy", "queued", "done"}); fmt.Sprint(got) != "[busy]" {
			t.Fatalf("among candidates = %v", got)
		}
		p, _ := db.PendingActions(ctx, "acme", "busy", 0, 100)
		if len(p) != 1 || p[0].ActionID != ca.ID || p[0].Name != fleet.ActionCancel || p[0].Params != fmt.Sprintf(`{"action_id":"%d","name":"reboot"}`, a.ID) {
			t.Fatalf("busy's pending = %+v", p)
		}
		if da, _ := db.FindDeviceAction(ctx, "acme", a.ID, "busy"); da.ActionStatus != fleet.StatusProgress || da.Status != fleet.StateCancelling {
			t.Fatalf("busy = %+v", da)
		}
		// Cancelling again does not ask again devices that have not answered.
		if c, err := db.CancelAction(ctx, "acme", a.ID, tell(a.ID, "reboot")); err != nil || c.Cancelled != 0 || c.Sent != nil {
			t.Fatalf("second cancel: %+v, %v", c, err)
		}
		// busy stops: its device action is Cancelled, and a late report on it
		// is ignored.
		mustReport(t, db, "acme", fleet.StatusReport{DeviceID: "busy", ActionID: ca.ID, State: "Completed"})
		mustReport(t, db, "acme", fleet.StatusReport{DeviceID: "busy", ActionID: a.ID, State: "Completed"})
		if da, _ := db.FindDeviceAction(ctx, "acme", a.ID, "busy"); da.ActionStatus != fleet.StatusCancelled || da.Status != "Cancelled" {
			t.Fatalf("busy = %+v", da)
		}
		// sent refuses: the action goes on on it, and its result counts.
		mustReport(t, db, "acme", fleet.StatusReport{DeviceID: "sent", ActionID: ca.ID, State: "Failed", Errors: []string{"too late"}})
		if da, _ := db.FindDeviceAction(ctx, "acme", a.ID, "sent"); da.ActionStatus != fleet.StatusInitiated || da.Status != fleet.StateCancelRejected {
			t.Fatalf("sent = %+v", da)
		}
		mustReport(t, db, "acme", fleet.StatusReport{DeviceID: "sent", ActionID: a.ID, State: "Completed"})
		full, _ = db.FindAction(ctx, "acme", a.ID)
		if want := map[string]int{"Cancelled": 2, "Completed": 2}; !maps.Equal(full.Statuses, want) {
			t.Fatalf("statuses = %v, want %v", full.Statuses, want)
		}
		// Queued only: nobody to tell, no cancel_action, no id used.
		q := mustDispatch(t, db, "acme", dispatch("reboot", "default", "queued"))
		if c, err := db.CancelAction(ctx, "acme", q.ID, tell(q.ID, "reboot")); err != nil || c.Cancelled != 1 || c.Sent != nil {
			t.Fatalf("cancel of a queued action: %+v, %v", c, err)
		}
		if next := mustDispatch(t, db, "acme", dispatch("reboot", "default", "queued")); next.ID != q.ID+1 {
			t.Fatalf("next id %d, want %d", next.ID, q.ID+1)
		}
		_, err = db.CancelAction(ctx, "acme", 99, tell(99, "reboot"))
		wantCode(t, err, fleet.ENOTFOUND)
		logs, _, _ := db.FindAuditLogs(ctx, "acme", fleet.AuditFilter{Actor: "boss", Page: fleet.Page{Page: 1, Limit: 10}})
		if len(logs) != 3 || logs[0].Action != "action.cancel" || logs[1].Action != "action.cancel" || logs[2].Action != "action.dispatch" {
			t.Fatalf("audit logs of the cancels: %d", len(logs))
		}
	})
}

func TestCancelActionDispatch(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, _ := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustDevices(t, db, "acme", map[string]map[string]string{"queued": nil, "busy": nil, "done": nil, "spare": nil, "untouched": nil})
		a := mustDispatch(t, db, "acme", dispatch("reboot", "default", "queued", "busy", "done", "untouched"))
		mustReport(t, db, "acme",
			fleet.StatusReport{DeviceID: "busy", ActionID: a.ID, State: "Running"},
			fleet.StatusReport{DeviceID: "done", ActionID: a.ID, State: "Completed"})

		c := dispatch(fleet.ActionCancel, "default", "queued", "busy", "done", "spare")
		c.CancelActionID = a.ID
		c.DeviceParams = json.RawMessage(fmt.Sprintf(`{"action_id":"%d","name":"reboot"}`, a.ID))
		ca := mustDispatch(t, db, "acme", c)
		if ca.Statuses["Completed"] != 3 || ca.Statuses["Queued"] != 1 || len(ca.Statuses) != 2 {
			t.Fatalf("statuses of the cancel_action = %v", ca.Statuses)
		}
		want := map[string][2]fleet.ActionStatus{ // device: the action's status, the cancel_action's
			"queued":    {fleet.StatusCancelled, fleet.StatusCompleted},
			"busy":      {fleet.StatusProgress, fleet.StatusQueued}, // until busy answers
			"done":      {fleet.StatusCompleted, fleet.StatusCompleted},
			"untouched": {fleet.StatusQueued, ""},
			"spare":     {"", fleet.StatusCompleted},
		}
		for dev, w := range want {
			for i, id := range []int64{a.ID, ca.ID} {
				da, err := db.FindDeviceAction(ctx, "acme", id, dev)
				var got fleet.ActionStatus
				if err == nil {
					got = da.ActionStatus
				}
				if got != w[i] {
					t.Errorf("%s, action %d: %q, want %q", dev, id, got, w[i])
				}
			}
		}
		p, _ := db.PendingActions(ctx, "acme", "busy", 0, 100)
		if len(p) != 1 || p[0].ActionID != ca.ID || p[0].Name != fleet.ActionCancel || p[0].Params != fmt.Sprintf(`{"action_id":"%d","name":"reboot"}`, a.ID) {
			t.Fatalf("busy's pending = %+v", p)
		}
	})
}

// TestDeviceActionSorts checks every S7 sort in both orders, with ties
// broken by action id, filters and paging.
func TestDeviceActionSorts(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, clk := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustDevices(t, db, "acme", map[string]map[string]string{"d1": nil, "lonely": nil})
		types := []string{"reboot", "update", "reboot", "shell", "update", "reboot", "shell", "reboot"}
		users := []string{"bob", "alice", "carol", "alice", "bob", "alice", "carol", "bob"}
		states := []string{"", "Running", "Completed", "Failed", "", "Running", "Downloading", "Completed"}
		nerrs := []int{0, 1, 0, 2, 0, 1, 3, 0}
		for i := range types {
			clk.Add(time.Second)
			d := dispatch(types[i], "default", "d1")
			d.UserName, d.UserEmail = users[i], users[i]+"@example.com"
			mustDispatch(t, db, "acme", d)
		}
		// Reports in reverse, so that updated_at does not follow ids.
		for i := len(types) - 1; i >= 0; i-- {
			if states[i] != "" {
				var errs []string
				for j := range nerrs[i] {
					errs = append(errs, fmt.Sprint("e", j))
				}
				clk.Add(time.Minute)
				mustReport(t, db, "acme", fleet.StatusReport{DeviceID: "d1", ActionID: int64(i + 1), State: states[i], Errors: errs})
			}
		}
		checkDeviceActionSorts(t, db, "acme", "d1", len(types))
		t.Run("Filters", func(t *testing.T) {
			das, n, err := db.FindDeviceActions(ctx, "acme", fleet.DeviceActionFilter{DeviceID: "d1", Type: "reboot", ActionStatus: fleet.StatusCompleted, Page: fleet.Page{Page: 1, Limit: 50}})
			if err != nil || n != 2 || len(das) != 2 || das[0].ActionID != 8 || das[1].ActionID != 3 {
				t.Fatalf("reboot Completed: %d %v", n, err)
			}
			_, n, _ = db.FindDeviceActions(ctx, "acme", fleet.DeviceActionFilter{DeviceID: "d1", ActionStatus: fleet.StatusQueued, Page: fleet.Page{Page: 1, Limit: 50}})
			if n != 2 {
				t.Fatalf("Queued: %d, want 2", n)
			}
		})
		t.Run("NoActions", func(t *testing.T) {
			das, n, err := db.FindDeviceActions(ctx, "acme", fleet.DeviceActionFilter{DeviceID: "lonely", Page: fleet.Page{Page: 1, Limit: 50}})
			if err != nil || n != 0 || das == nil || len(das) != 0 {
				t.Fatalf("lonely: %v %d %v", das, n, err)
			}
		})
		t.Run("UnknownDevice", func(t *testing.T) {
			_, _, err := db.FindDeviceActions(ctx, "acme", fleet.DeviceActionFilter{DeviceID: "ghost", Page: fleet.Page{Page: 1, Limit: 50}})
			wantCode(t, err, fleet.ENOTFOUND)
		})
		t.Run("DeletedDeviceTakesItsRecords", func(t *testing.T) {
			if err := db.DeleteDevice(ctx, "acme", "d1"); err != nil {
				t.Fatal(err)
			}
			a, err := db.FindAction(ctx, "acme", 1)
			if err != nil || len(a.Statuses) != 0 {
				t.Fatalf("action 1 after its device was deleted: %v %v", a.Statuses, err)
			}
		})
	})
}

// benchDevices is how many devices BenchmarkDispatch targets;
// FLEETD_BENCH_DEVICES=1000000 measures a million.
func benchDevices() int {
	if n, err := strconv.Atoi(os.Getenv("FLEETD_BENCH_DEVICES")); err == nil && n > 0 {
		return n
	}
	return 100_000
}

// BenchmarkDispatch measures a dispatch to every device of a tenant
// (100,000 by default). The target is under a second on SQLite, and under
// ten seconds for 1,000,000.
func BenchmarkDispatch(b *testing.B) {
	for _, be := range sqlstoretest.Backends() {
		b.Run(be.Name, func(b *testing.B) {
			db := sqlstoretest.MustOpen(b, be, sqlstoretest.Options{})
			ctx := context.Background()
			n := benchDevices()
			benchTenant(b, db, n)
			b.ResetTimer()
			for b.Loop() {
				a, err := db.DispatchAction(ctx, "bench", dispatch("reboot", "all"))
				if err != nil {
					b.Fatal(err)
				}
				if a.Targeted != n {
					b.Fatalf("targeted %d, want %d", a.Targeted, n)
				}
			}
			b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "devices/s")
		})
	}
}

// BenchmarkReportStatus measures status reports applied through the store
// by many concurrent writers (as S10's handlers are), each report its own
// transaction job so that group commit batches them.
func BenchmarkReportStatus(b *testing.B) {
	for _, be := range sqlstoretest.Backends() {
		b.Run(be.Name, func(b *testing.B) {
			db := sqlstoretest.MustOpen(b, be, sqlstoretest.Options{})
			ctx := context.Background()
			if _, _, err := db.CreateTenant(ctx, "bench"); err != nil {
				b.Fatal(err)
			}
			const devices = 10_000
			devs := make([]fleet.NewDevice, devices)
			for i := range devs {
				devs[i] = fleet.NewDevice{ID: fmt.Sprintf("dev-%05d", i)}
			}
			if _, err := db.CreateDevices(ctx, "bench", devs); err != nil {
				b.Fatal(err)
			}
			a, err := db.DispatchAction(ctx, "bench", dispatch("reboot", "all"))
			if err != nil {
				b.Fatal(err)
			}
			var seq atomic.Int64
			b.SetParallelism(32) // 32 × GOMAXPROCS concurrent reporters
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := seq.Add(1)
					r := fleet.StatusReport{DeviceID: fmt.Sprintf("dev-%05d", i%devices), ActionID: a.ID, State: "Downloading",
						Progress: intp(int(i % 100)), Timestamp: i64(i), Sequence: i64(i)}
					errs, err := db.ReportStatus(ctx, "bench", []fleet.StatusReport{r})
					if err != nil || errs[0] != nil {
						b.Fatal(err, errs)
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "reports/s")
		})
	}
}

// BenchmarkReportBatch applies status reports in one store call of each
// batch size, as the action service hands them over: each report moves one
// of 10,000 device actions along (the usual report, progress only; each
// device action's first report, from Queued, is applied before the
// measure). The write path's cost per report falls as batches grow;
// fleetbench's S10 makes batches of about 10, its MQTT scenario of several
// hundred. The CPU figure is this process's; on PostgreSQL,
// FLEETD_BENCH_PG_DATA naming the data directory of a cluster of the
// benchmark's own adds the server's (serverCPU).
//
//	go test ./sqlstore -run '^$' -bench ReportBatch -benchtime 2s
func BenchmarkReportBatch(b *testing.B) {
	for _, be := range sqlstoretest.Backends() {
		b.Run(be.Name, func(b *testing.B) { benchReportBatch(b, be) })
	}
}

func benchReportBatch(b *testing.B, be sqlstoretest.Backend) {
	const n = 10_000
	for _, batch := range []int{1, 20, 100, 500} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			db := sqlstoretest.MustOpen(b, be, sqlstoretest.Options{})
			ctx := context.Background()
			mustTenant(b, db, "acme")
			devs := map[string]map[string]string{}
			ids := make([]string, n)
			for i := range ids {
				ids[i] = fmt.Sprintf("dev-%05d", i)
				devs[ids[i]] = nil
			}
			mustDevices(b, db, "acme", devs)
			a := mustDispatch(b, db, "acme", dispatch("reboot", "default", ids...))
			seq := make([]int64, n)
			base := time.Now().UnixMilli()
			// One report on each device action first, outside the
			// measure: a device action's first report moves it from
			// Queued, and the measured ones are the usual report after it.
			for start := 0; start < n; start += 500 {
				var first []fleet.StatusReport
				for d := start; d < min(start+500, n); d++ {
					seq[d]++
					first = append(first, fleet.StatusReport{DeviceID: ids[d], ActionID: a.ID, State: "Downloading",
						Progress: intp(0), Timestamp: i64(base + seq[d]), Sequence: i64(seq[d])})
				}
				if _, err := db.ReportStatus(ctx, "acme", first); err != nil {
					b.Fatal(err)
				}
			}
			next := 0
			cpu0, server0 := cpuTime(), serverCPU()
			for b.Loop() {
				reports := make([]fleet.StatusReport, batch)
				for i := range reports {
					// A stride that spreads a batch over the table, as
					// concurrent devices do.
					d := (next * 7919) % n
					next++
					seq[d]++
					reports[i] = fleet.StatusReport{DeviceID: ids[d], ActionID: a.ID, State: "Downloading",
						Progress: intp(int(seq[d] % 100)), Timestamp: i64(base + seq[d]), Sequence: i64(seq[d])}
				}
				errs, err := db.ReportStatus(ctx, "acme", reports)
				if err != nil {
					b.Fatal(err)
				}
				for _, err := range errs {
					if err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*batch), "µs/report")
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N*batch), "cpu-µs/report")
			if be.Name == "postgres" && os.Getenv("FLEETD_BENCH_PG_DATA") != "" {
				b.ReportMetric(float64((serverCPU()-server0).Microseconds())/float64(b.N*batch), "pg-cpu-µs/report")
			}
		})
	}
}

var _ sync.Mutex

// BenchmarkReportRandom is S10's tail in the store: 64 reporters, each
// report for a device drawn at random from an action dispatched to 100,000
// (FLEETD_BENCH_DEVICES), one report per store call, for 10 s per
// iteration. It reports the latencies' p50, p99 and max, the size the
// SQLite WAL grew to, and its restarts: how long the writer waited for
// each and the frames each copied or synced meanwhile.
// FLEETD_BENCH_TRACE=1 prints the slow reports and the checkpoints on one
// timeline.
//
//	go test ./sqlstore -run '^$' -bench ReportRandom -benchtime 1x
func BenchmarkReportRandom(b *testing.B) {
	for _, be := range sqlstoretest.Backends() {
		b.Run(be.Name, func(b *testing.B) {
			var logBuf lockedLog
			limit, _ := strconv.ParseInt(os.Getenv("FLEETD_BENCH_WAL_LIMIT"), 10, 64) // bytes; -1 never restarts
			every, _ := time.ParseDuration(os.Getenv("FLEETD_BENCH_CHECKPOINT_EVERY"))
			db := sqlstoretest.MustOpen(b, be, sqlstoretest.Options{WALLimit: limit, CheckpointInterval: every,
				Logger: slog.New(slog.NewTextHandler(&logBuf, &slog.HandlerOptions{Level: slog.LevelDebug}))})
			ctx := context.Background()
			n := benchDevices()
			benchTenant(b, db, n)
			a, err := db.DispatchAction(ctx, "bench", dispatch("reboot", "all"))
			if err != nil {
				b.Fatal(err)
			}
			var seq atomic.Int64
			var lat []time.Duration
			var slow []string
			for b.Loop() {
				t0 := time.Now()
				end := t0.Add(10 * time.Second)
				var mu sync.Mutex
				var wg sync.WaitGroup
				for range 64 {
					wg.Go(func() {
						var mine []time.Duration
						for time.Now().Before(end) {
							i := seq.Add(1)
							r := fleet.StatusReport{DeviceID: fmt.Sprintf("dev-%07d", rand.IntN(n)), ActionID: a.ID, State: "Downloading",
								Progress: intp(int(i % 100)), Timestamp: i64(i), Sequence: i64(i)}
							t1 := time.Now()
							if _, err := db.ReportStatus(ctx, "bench", []fleet.StatusReport{r}); err != nil {
								b.Error(err)
								return
							}
							d := time.Since(t1)
							mine = append(mine, d)
							if d > 50*time.Millisecond {
								mu.Lock()
								slow = append(slow, fmt.Sprintf("slow at %s took %s", t1.UTC().Format(time.RFC3339Nano), d))
								mu.Unlock()
							}
						}
						mu.Lock()
						lat = append(lat, mine...)
						mu.Unlock()
					})
				}
				wg.Wait()
			}
			slices.Sort(lat)
			q := func(p float64) float64 { return float64(lat[min(len(lat)-1, int(float64(len(lat))*p))]) / 1e6 }
			b.ReportMetric(float64(len(lat))/b.Elapsed().Seconds(), "reports/s")
			b.ReportMetric(q(0.5), "p50-ms")
			b.ReportMetric(q(0.99), "p99-ms")
			b.ReportMetric(q(1), "max-ms")
			st := db.Stats()
			b.ReportMetric(float64(st.WALMaxFrames), "wal-max-frames")
			b.ReportMetric(float64(st.WALRestarts), "restarts")
			if st.WALRestarts > 0 {
				b.ReportMetric(1000*st.WALRestartSeconds/float64(st.WALRestarts), "restart-ms")
				b.ReportMetric(float64(st.WALRestartFrames)/float64(st.WALRestarts), "restart-frames")
			}
			if os.Getenv("FLEETD_BENCH_TRACE") != "" {
				fmt.Println(strings.Join(slow, "\n"))
				fmt.Print(logBuf.String())
			}
		})
	}
}

type lockedLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// checkDeviceActionSorts checks every S7 sort of a device's n actions in
// both orders, with ties broken by action id, read in pages of 3, against
// its actions sorted here.
func checkDeviceActionSorts(t *testing.T, db *sqlstore.DB, tenant, device string, n int) {
	t.Helper()
	ctx := context.Background()
	all, total, err := db.FindDeviceActions(ctx, tenant, fleet.DeviceActionFilter{DeviceID: device, Page: fleet.Page{Page: 1, Limit: 100}})
	if err != nil || total != n {
		t.Fatalf("all: %d, %v", total, err)
	}
	key := map[string]func(da *fleet.DeviceAction) string{
		"action_id":  func(da *fleet.DeviceAction) string { return fmt.Sprintf("%09d", da.ActionID) },
		"type":       func(da *fleet.DeviceAction) string { return da.Type },
		"status":     func(da *fleet.DeviceAction) string { return da.Status },
		"user_email": func(da *fleet.DeviceAction) string { return da.UserEmail },
		"user_name":  func(da *fleet.DeviceAction) string { return da.UserName },
		"updated_at": func(da *fleet.DeviceAction) string { return da.UpdatedAt.Format(time.RFC3339Nano) },
		"errors":     func(da *fleet.DeviceAction) string { return fmt.Sprintf("%09d", fleet.ErrorCount(da.Errors)) },
	}
	for _, sortBy := range fleet.DeviceActionSorts {
		for _, asc := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/asc=%v", sortBy, asc), func(t *testing.T) {
				want := slices.Clone(all)
				sort.SliceStable(want, func(i, j int) bool {
					ki, kj := key[sortBy](want[i]), key[sortBy](want[j])
					if ki == kj {
						ki, kj = key["action_id"](want[i]), key["action_id"](want[j])
					}
					if asc {
						return ki < kj
					}
					return ki > kj
				})
				var got []int64
				for page := 1; page <= (n+2)/3; page++ {
					das, total, err := db.FindDeviceActions(ctx, tenant, fleet.DeviceActionFilter{DeviceID: device, SortBy: sortBy, Ascending: asc, Page: fleet.Page{Page: page, Limit: 3}})
					if err != nil || total != n {
						t.Fatalf("page %d: n %d, %v", page, total, err)
					}
					for _, da := range das {
						got = append(got, da.ActionID)
					}
				}
				var wantIDs []int64
				for _, da := range want {
					wantIDs = append(wantIDs, da.ActionID)
				}
				if !slices.Equal(got, wantIDs) {
					t.Fatalf("order %v, want %v", got, wantIDs)
				}
			})
		}
	}
}

func TestRecentFailures(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, clk := mustOpen(t, b)
		ctx := context.Background()
		for _, tenant := range []string{"acme", "beta"} {
			mustTenant(t, db, tenant)
			mustDevices(t, db, tenant, map[string]map[string]string{"d1": nil, "d2": nil, "d3": nil})
		}
		a := mustDispatch(t, db, "acme", dispatch("reboot", "default", "d1", "d2", "d3"))
		u := mustDispatch(t, db, "acme", dispatch("update", "default", "d2"))
		theirs := mustDispatch(t, db, "beta", dispatch("reboot", "default", "d1"))
		clk.Add(time.Second)
		mustReport(t, db, "acme", fleet.StatusReport{DeviceID: "d1", ActionID: a.ID, State: "Failed", Errors: []string{"disk full"}})
		mustReport(t, db, "acme", fleet.StatusReport{DeviceID: "d3", ActionID: a.ID, State: "Completed"})
		clk.Add(time.Second)
		mustReport(t, db, "acme", fleet.StatusReport{DeviceID: "d2", ActionID: u.ID, State: "Failed"})
		clk.Add(time.Second)
		mustReport(t, db, "beta", fleet.StatusReport{DeviceID: "d1", ActionID: theirs.ID, State: "Failed"})

		got, err := db.FindRecentFailures(ctx, "acme", 10)
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, da := range got {
			keys = append(keys, fmt.Sprintf("%s/%d/%s", da.DeviceID, da.ActionID, da.Type))
		}
		if want := []string{fmt.Sprintf("d2/%d/update", u.ID), fmt.Sprintf("d1/%d/reboot", a.ID)}; !slices.Equal(keys, want) {
			t.Fatalf("recent failures %v, want %v (newest first, this tenant's, failed only)", keys, want)
		}
		if len(got[1].Errors) == 0 {
			t.Errorf("the failure's errors are not read: %+v", got[1])
		}
		if got, _ := db.FindRecentFailures(ctx, "acme", 1); len(got) != 1 || got[0].ActionID != u.ID {
			t.Fatalf("limit 1: %+v", got)
		}
	})
}

// TestWritesCounted checks that the write path's metrics (Stats) count
// every committed write, those of the commit loop and those that run in a
// transaction of their own on PostgreSQL (a cancel, a device's deletion)
// alike: fleetd_db_commits_total says "write transactions committed".
func TestWritesCounted(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, _ := mustOpen(t, b)
		ctx := fleet.NewContextWithActor(context.Background(), &fleet.Actor{Tenant: "acme", Role: fleet.RoleOperator, UserName: "boss", UserEmail: "boss@example.com"})
		mustTenant(t, db, "acme")
		mustDevices(t, db, "acme", map[string]map[string]string{"one": nil, "two": nil})
		a := mustDispatch(t, db, "acme", dispatch("reboot", "all"))
		for _, w := range []struct {
			name  string
			write func() error
		}{
			{"report", func() error {
				_, err := db.ReportStatus(ctx, "acme", []fleet.StatusReport{{DeviceID: "one", ActionID: a.ID, State: "Running"}})
				return err
			}},
			{"cancel", func() error { _, err := db.CancelAction(ctx, "acme", a.ID, tell(a.ID, "reboot")); return err }},
			{"deletion", func() error { return db.DeleteDevice(ctx, "acme", "two") }},
		} {
			before := db.Stats()
			if err := w.write(); err != nil {
				t.Fatalf("%s: %v", w.name, err)
			}
			after := db.Stats()
			if after.Commits <= before.Commits || after.Jobs <= before.Jobs || after.CommitSeconds <= before.CommitSeconds {
				t.Errorf("%s: commits %d → %d, jobs %d → %d, seconds %g → %g; want each to grow",
					w.name, before.Commits, after.Commits, before.Jobs, after.Jobs, before.CommitSeconds, after.CommitSeconds)
			}
		}
	})
}
