package action_test

import (
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"testing"

	"github.com/fleetd/fleet/codec"
	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestRetryAction retries an action's failed devices: the new action has
// the same name, params and timeout, targets exactly the devices asked for,
// shows retry_of in every encoding and is audited; an action not finished,
// one with no device in the statuses, a bad body, another tenant's action
// and a viewer are refused with what to do.
func TestRetryAction(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		admin := s.Admin()
		for _, d := range []string{"r1", "r2", "r3", "r4"} {
			s.MustDevice(t, admin, d, nil)
		}
		id := s.Dispatch(t, admin, map[string]any{"action": "configure", "params": map[string]any{"level": 3}, "timeout": 90,
			"search_type": "default", "device_ids": []string{"r1", "r2", "r3", "r4"}})
		s.Report(t, "r1", id, "Completed")
		s.Report(t, "r2", id, "Failed")
		s.Report(t, "r3", id, "Failed")
		retry := fmt.Sprintf("/api/v1/actions/%d/retry", id)

		// r4 has not finished: the action is not finished.
		r := s.Do(t, admin, "POST", retry, nil)
		fleetdtest.WantCode(t, r, 409, "conflict")
		if !strings.Contains(string(r.Body), "1 device action is not final") || !strings.Contains(string(r.Body), "cancel them first") {
			t.Fatalf("not finished: %s", r.Body)
		}
		s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/cancel", id), nil).Want(t, 204)

		// No body: the Failed devices.
		var out struct {
			ID       int64
			Targeted int
		}
		r = s.Do(t, admin, "POST", retry, nil).Want(t, 201).Decode(t, &out)
		if out.Targeted != 2 || !strings.HasSuffix(r.Header.Get("Location"), fmt.Sprintf("/api/v1/actions/%d", out.ID)) {
			t.Fatalf("retry: %+v, Location %q", out, r.Header.Get("Location"))
		}
		var got struct {
			Action   string
			Params   map[string]any
			Timeout  int
			RetryOf  *int64 `json:"retry_of"`
			Statuses map[string]int
		}
		s.Do(t, admin, "GET", fmt.Sprintf("/api/v1/actions/%d", out.ID), nil).Want(t, 200).Decode(t, &got)
		if got.Action != "configure" || fmt.Sprint(got.Params) != "map[level:3]" || got.Timeout != 90 || got.RetryOf == nil || *got.RetryOf != id ||
			fmt.Sprint(got.Statuses) != "map[Queued:2]" {
			t.Fatalf("the retry: %+v", got)
		}
		for _, d := range []string{"r2", "r3"} {
			if da := s.DeviceAction(t, admin, d, out.ID); da.ActionStatus != "Queued" {
				t.Fatalf("%s: %+v", d, da)
			}
		}
		var original struct {
			RetryOf *int64 `json:"retry_of"`
		}
		if s.Do(t, admin, "GET", fmt.Sprintf("/api/v1/actions/%d", id), nil).Want(t, 200).Decode(t, &original); original.RetryOf != nil {
			t.Fatalf("the original shows retry_of %d", *original.RetryOf)
		}
		// retry_of in every encoding.
		var want any
		for _, f := range codec.Formats {
			r := s.Send(t, fleetdtest.Req{Method: "GET", Path: fmt.Sprintf("/api/v1/actions/%d", out.ID), Creds: admin, Header: http.Header{"Accept": {f.ContentType()}}}).Want(t, 200)
			v, err := codec.Decode(f, r.Body)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if fmt.Sprint(fleetdtest.At(v, "retry_of")) != fmt.Sprint(id) {
				t.Fatalf("%s: retry_of %v", f, fleetdtest.At(v, "retry_of"))
			}
			if want == nil {
				want = v
			} else if !reflect.DeepEqual(fleetdtest.Times(v), fleetdtest.Times(want)) {
				t.Fatalf("%s says\n%v\nwhere JSON says\n%v", f, v, want)
			}
		}

		// A device action is retried once: the Failed ones were.
		r = s.Do(t, admin, "POST", retry, nil)
		fleetdtest.WantCode(t, r, 409, "conflict")
		if !strings.Contains(string(r.Body), fmt.Sprintf("retried already, by action %d", out.ID)) {
			t.Fatalf("retried twice: %s", r.Body)
		}
		// The statuses asked for: Failed and Cancelled, of which only the
		// Cancelled one is left.
		s.Do(t, admin, "POST", retry, map[string]any{"statuses": []string{"Failed", "Cancelled"}}).Want(t, 201).Decode(t, &out)
		if out.Targeted != 1 {
			t.Fatalf("Failed and Cancelled: %+v", out)
		}
		for _, c := range []struct {
			body  any
			field string
		}{
			{map[string]any{"statuses": []string{"Queued"}}, "statuses[0]"},
			{map[string]any{"statuses": []string{"Nope"}}, "statuses[0]"},
			{map[string]any{"statuses": []string{}}, "statuses"},
			{map[string]any{"statuses": "Failed"}, "statuses"},
			{map[string]any{"status": []string{"Failed"}}, "status"},
		} {
			r := s.Do(t, admin, "POST", retry, c.body)
			fleetdtest.WantCode(t, r, 400, "invalid")
			if !strings.Contains(string(r.Body), `"`+c.field+`"`) {
				t.Fatalf("%v: the error does not name %s: %s", c.body, c.field, r.Body)
			}
		}
		// An action whose devices all completed has nothing Failed.
		done := s.Dispatch(t, admin, map[string]any{"action": "configure", "params": map[string]any{}, "search_type": "default", "device_ids": []string{"r1"}})
		s.Report(t, "r1", done, "Completed")
		r = s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/retry", done), nil)
		fleetdtest.WantCode(t, r, 409, "conflict")
		if !strings.Contains(string(r.Body), "is Failed; nothing was dispatched") {
			t.Fatalf("nothing Failed: %s", r.Body)
		}
		fleetdtest.WantCode(t, s.Do(t, admin, "POST", "/api/v1/actions/999999/retry", nil), 404, "not_found")
		// A cancel_action is not retried.
		busy := s.Dispatch(t, admin, map[string]any{"action": "configure", "params": map[string]any{}, "search_type": "default", "device_ids": []string{"r2"}})
		s.Report(t, "r2", busy, "Running")
		s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/cancel", busy), nil).Want(t, 204)
		s.Report(t, "r2", busy, "Failed")
		var cancels struct {
			Actions []struct{ ID int64 } `json:"actions"`
		}
		s.Do(t, admin, "GET", "/api/v1/actions?action=cancel_action", nil).Want(t, 200).Decode(t, &cancels)
		if len(cancels.Actions) != 1 {
			t.Fatalf("cancel_actions %+v", cancels)
		}
		cancelID := cancels.Actions[0].ID
		s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/cancel", cancelID), nil).Want(t, 204)
		r = s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/retry", cancelID), map[string]any{"statuses": []string{"Cancelled", "Completed", "Failed"}})
		fleetdtest.WantCode(t, r, 409, "conflict")
		if !strings.Contains(string(r.Body), "is a cancel_action") {
			t.Fatalf("retry of a cancel_action: %s", r.Body)
		}

		// Another tenant's action is not found; a viewer may not retry.
		other := s.NewTenant(t, "other")
		fleetdtest.WantCode(t, s.Do(t, other, "POST", retry, nil), 404, "not_found")
		viewer := s.NewKey(t, admin, "victor", "viewer")
		s.Do(t, viewer, "POST", retry, nil).Want(t, 403)

		// The console's action page offers the retry of a finished action
		// with failed devices, and shows the new action as a retry.
		console := fleetdtest.NewBrowser(t, s.URL)
		page := console.SignIn(admin.Tenant, admin.Key)
		failed := s.Dispatch(t, admin, map[string]any{"action": "configure", "params": map[string]any{}, "search_type": "default", "device_ids": []string{"r1", "r2", "r3"}})
		s.Report(t, "r1", failed, "Completed")
		s.Report(t, "r2", failed, "Failed")
		s.Report(t, "r3", failed, "Failed")
		page = console.Get(fmt.Sprintf("/console/actions/%d", failed)).Want(t, 200)
		if !strings.Contains(page.Body, "Retry the 2 failed devices") {
			t.Fatalf("no retry button:\n%s", page.Body)
		}
		if strings.Contains(console.Get(fmt.Sprintf("/console/actions/%d", done)).Want(t, 200).Body, ">Retry the ") {
			t.Fatal("a retry button on an action without failed devices")
		}
		res := console.Do("POST", fmt.Sprintf("/console/actions/%d/retry", failed), url.Values{"csrf": {page.CSRF(t)}})
		if res.Status != http.StatusSeeOther {
			t.Fatalf("the console's retry answered %d:\n%s", res.Status, res.Body)
		}
		page = console.Get(res.Header.Get("Location")).Want(t, 200)
		if want := fmt.Sprintf(`<dt>Retry of</dt><dd><a href="/console/actions/%d">#%d</a></dd>`, failed, failed); !strings.Contains(page.Body, want) {
			t.Fatalf("the retry's page lacks %s:\n%s", want, page.Body)
		}
		// Its failed devices were retried once: the action's page offers
		// no second retry of them (the API would refuse it).
		if body := console.Get(fmt.Sprintf("/console/actions/%d", failed)).Want(t, 200).Body; strings.Contains(body, ">Retry the ") {
			t.Fatalf("a retry button for device actions already retried:\n%s", body)
		}

		var logs struct {
			AuditLogs []struct {
				Action  string         `json:"action"`
				Target  string         `json:"target"`
				Details map[string]any `json:"details"`
			} `json:"audit_logs"`
		}
		s.Do(t, admin, "GET", "/api/v1/audit-logs?action=action.retry", nil).Want(t, 200).Decode(t, &logs)
		if len(logs.AuditLogs) != 3 || fmt.Sprint(logs.AuditLogs[0].Details["retry_of"]) != fmt.Sprint(failed) ||
			fmt.Sprint(logs.AuditLogs[1].Details["statuses"]) != "[Failed Cancelled]" || fmt.Sprint(logs.AuditLogs[2].Details["targeted"]) != "2" {
			t.Fatalf("audited %+v", logs.AuditLogs)
		}
	})
}
