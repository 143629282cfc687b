package action_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/action"
	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/mqtt"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

func TestActionsEndToEnd(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		admin := s.Admin()
		tok := map[string]string{}
		for i, site := range []string{"Berlin", "Paris", "Berlin-South"} {
			id := fmt.Sprint("pump-", i+1)
			tok[id] = s.MustDevice(t, admin, id, map[string]string{"site": site}).Token
		}
		d1 := s.ConnectDevice(t, "default", "pump-1", tok["pump-1"])
		d2 := s.ConnectDevice(t, "default", "pump-2", tok["pump-2"])

		// S1, as the seed interface's clients call it.
		r := s.Do(t, admin, "POST", "/mock/api/v1/actions", map[string]any{
			"action": "reboot", "params": map[string]any{"delay": 5}, "search_type": "default",
			"device_ids": []string{"pump-1", "pump-2", "pump-3"}, "search_key": "string", "search_query": "string",
			"metadata": map[string]any{"ticket": "T-1"}, "timeout": 600,
		}).Want(t, 201)
		if len(r.Body) != 0 {
			t.Fatalf("S1 answered a body: %s", r.Body)
		}
		loc := r.Header.Get("Location")
		id, err := strconv.ParseInt(loc[strings.LastIndex(loc, "/")+1:], 10, 64)
		if err != nil || !strings.HasSuffix(loc, fmt.Sprintf("/api/v1/actions/%d", id)) {
			t.Fatalf("Location = %q", loc)
		}

		t.Run("ConnectedDevicesReceiveIt", func(t *testing.T) {
			for _, d := range []*fleetdtest.MQTTDevice{d1, d2} {
				m := d.Next(t)
				want := action.Message{ID: fmt.Sprint(id), Kind: "process", Name: "reboot", Payload: `{"delay":5}`}
				if m != want {
					t.Fatalf("%s received %+v, want %+v", d.ID, m, want)
				}
			}
			// paho acknowledged them: Initiated.
			da := s.AwaitActionStatus(t, admin, "pump-1", id, "Initiated")
			if da.Status != "Initiated" || da.Type != "reboot" || da.Params != `{"delay":5}` || da.UserName != "admin" ||
				da.SerialMetadata["site"] != "Berlin" || len(da.Errors) != 0 || da.Errors == nil || da.Phase != 0 {
				t.Fatalf("pump-1's record = %+v", da)
			}
			if da := s.DeviceAction(t, admin, "pump-3", id); da.ActionStatus != "Queued" || da.Status != "Queued" {
				t.Fatalf("offline pump-3 = %+v", da)
			}
		})

		t.Run("StatusOverMQTT", func(t *testing.T) {
			now := time.Now().UnixMilli()
			d1.Report(t, []map[string]any{
				{"id": fmt.Sprint(id), "state": "Received", "progress": 0, "errors": []string{}, "timestamp": now, "sequence": 1},
				{"id": fmt.Sprint(id), "state": "Downloading", "progress": 40, "errors": []string{}, "timestamp": now + 1, "sequence": 2},
			})
			// Acknowledged means committed: no waiting needed.
			da := s.DeviceAction(t, admin, "pump-1", id)
			if da.ActionStatus != "Progress" || da.Status != "Downloading" || da.Progress != 40 {
				t.Fatalf("after two reports: %+v", da)
			}
			// One report alone, not in an array, with uplink's field names.
			d1.Report(t, map[string]any{"id": fmt.Sprint(id), "state": "Completed", "progress": 100, "errors": []string{}, "timestamp": now + 2, "sequence": 3})
			// A late, older report changes nothing.
			d1.Report(t, []map[string]any{{"id": fmt.Sprint(id), "state": "Downloading", "progress": 50, "timestamp": now + 1, "sequence": 9}})
			if da := s.DeviceAction(t, admin, "pump-1", id); da.ActionStatus != "Completed" || da.Progress != 100 {
				t.Fatalf("after Completed and a late report: %+v", da)
			}
			var dev fleetdtest.Device
			s.Do(t, admin, "GET", "/api/v1/devices/pump-1", nil).Want(t, 200).Decode(t, &dev)
			if dev.LastSeenAt == nil {
				t.Fatal("last_seen_at is not set after the device reported")
			}
		})

		t.Run("StatusOverHTTP", func(t *testing.T) {
			gw := s.NewKey(t, admin, "gateway", "device")
			r := s.Do(t, gw, "POST", "/api/v1/devices/action/status", map[string]any{
				"device_id": "pump-2", "action_id": id, "state": "Installing", "progress": "70", "timestamp": 1, "sequence": 1,
			}).Want(t, 204)
			if len(r.Body) != 0 {
				t.Fatalf("S10 answered a body: %s", r.Body)
			}
			var da fleetdtest.DeviceActionBody
			s.Send(t, fleetdtest.Req{Method: "POST", Path: "/api/v1/devices/action/status", Creds: gw,
				Body:   map[string]any{"device_id": "pump-2", "action_id": fmt.Sprint(id), "state": "Failed", "errors": []string{"flash write failed", "rolled back"}, "timestamp": 2},
				Header: http.Header{"Prefer": {"return=representation"}}}).Want(t, 200).Decode(t, &da)
			if da.ActionStatus != "Failed" || da.Status != "Failed" || da.Progress != 70 || len(da.Errors["Failed"]) != 2 {
				t.Fatalf("S10's representation = %+v", da)
			}
			// After a final state: acknowledged and ignored.
			s.Do(t, gw, "POST", "/api/v1/devices/action/status", map[string]any{"device_id": "pump-2", "id": id, "state": "Completed"}).Want(t, 204)
			if da := s.DeviceAction(t, admin, "pump-2", id); da.ActionStatus != "Failed" {
				t.Fatalf("a final state changed: %+v", da)
			}
		})

		t.Run("OfflineDeviceGetsItOnSubscribe", func(t *testing.T) {
			d3 := s.ConnectDevice(t, "default", "pump-3", tok["pump-3"])
			if m := d3.Next(t); m.ID != fmt.Sprint(id) || m.Name != "reboot" {
				t.Fatalf("pump-3 received %+v", m)
			}
			s.AwaitActionStatus(t, admin, "pump-3", id, "Initiated")
			d3.Report(t, map[string]any{"action_id": id, "state": "Completed"})
			// Connected again, it is not sent the action a second time.
			d3.Client.Disconnect(100)
			d3 = s.ConnectDevice(t, "default", "pump-3", tok["pump-3"])
			d3.Nothing(t)
		})

		t.Run("Counts", func(t *testing.T) {
			a := s.Action(t, admin, id)
			if a.Targeted != 3 || a.Statuses["Completed"] != 2 || a.Statuses["Failed"] != 1 || len(a.Statuses) != 2 ||
				a.Action != "reboot" || string(a.Params) != `{"delay":5}` || string(a.Metadata) != `{"ticket":"T-1"}` || a.Timeout != 600 ||
				a.SearchType != "default" || a.UserName != "admin" {
				t.Fatalf("action = %+v", a)
			}
			var list struct {
				Actions []fleetdtest.ActionBody `json:"actions"`
				Count   int                     `json:"count"`
			}
			s.Do(t, admin, "GET", "/api/v1/actions?action=reboot", nil).Want(t, 200).Decode(t, &list)
			if list.Count != 1 || list.Actions[0].Statuses["Completed"] != 2 {
				t.Fatalf("list = %+v", list)
			}
			var devs struct {
				DeviceActions []fleetdtest.DeviceActionBody `json:"device_actions"`
				Count         int                           `json:"count"`
			}
			s.Do(t, admin, "GET", fmt.Sprintf("/api/v1/actions/%d/devices?action_status=Completed", id), nil).Want(t, 200).Decode(t, &devs)
			if devs.Count != 2 || devs.DeviceActions[0].DeviceID != "pump-1" || devs.DeviceActions[1].DeviceID != "pump-3" {
				t.Fatalf("completed devices = %+v", devs)
			}
		})

		t.Run("ModernDispatchAndSearch", func(t *testing.T) {
			var out map[string]any
			s.Do(t, admin, "POST", "/api/v1/actions", map[string]any{
				"action": "shell", "params": map[string]any{"cmd": "uptime"}, "search_type": "search", "search_query": "BERLIN",
			}).Want(t, 201).Decode(t, &out)
			if len(out) != 3 || out["targeted"] != float64(2) {
				t.Fatalf("answer = %v, want id, created_at and targeted 2", out)
			}
			nid := int64(out["id"].(float64))
			if m := d1.Next(t); m.ID != fmt.Sprint(nid) || m.Name != "shell" {
				t.Fatalf("pump-1 received %+v", m)
			}
			d2.Nothing(t)
			s.Do(t, admin, "POST", "/api/v1/actions", map[string]any{
				"action": "x", "params": map[string]any{}, "search_type": "metadata", "search_key": "site", "search_query": "Paris",
			}).Want(t, 201)
			if m := d2.Next(t); m.Name != "x" || m.Payload != "{}" {
				t.Fatalf("pump-2 received %+v", m)
			}
			s.Do(t, admin, "POST", "/api/v1/actions", map[string]any{"action": "all", "params": map[string]any{}, "search_type": "all"}).Want(t, 201)
			for _, d := range []*fleetdtest.MQTTDevice{d1, d2} {
				if m := d.Next(t); m.Name != "all" {
					t.Fatalf("%s received %+v", d.ID, m)
				}
			}
		})

		t.Run("EDNBody", func(t *testing.T) {
			r := s.Send(t, fleetdtest.Req{Method: "POST", Path: "/mock/api/v1/actions", Creds: admin, ContentType: "application/edn",
				Raw: []byte(`{:action "edn", :params {:a [1 2]}, :search_type "default", :device_ids ["pump-2"]}`)}).Want(t, 201)
			if r.Header.Get("Location") == "" {
				t.Fatal("no Location")
			}
			if m := d2.Next(t); m.Name != "edn" || m.Payload != `{"a":[1,2]}` {
				t.Fatalf("pump-2 received %+v", m)
			}
		})

		t.Run("PreferRepresentation", func(t *testing.T) {
			var a fleetdtest.ActionBody
			s.Send(t, fleetdtest.Req{Method: "POST", Path: "/mock/api/v1/actions", Creds: admin, Header: http.Header{"Prefer": {"return=representation"}},
				Body: map[string]any{"action": "rep", "params": map[string]any{}, "search_type": "default", "device_ids": []string{"pump-3"}}}).Want(t, 201).Decode(t, &a)
			if a.Action != "rep" || a.Targeted != 1 || a.Statuses["Queued"] != 1 || a.Timeout != 86400 {
				t.Fatalf("representation = %+v", a)
			}
		})
	})
}

// TestActionBadInputs covers each bad input of a dispatch
// (docs/actions.md#dispatch) and shows that a rejected dispatch writes
// nothing.
func TestActionBadInputs(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		admin := s.Admin()
		s.MustDevice(t, admin, "d1", map[string]string{"site": "Berlin"})
		s.MustDevice(t, admin, "d2", nil)
		s.MustDevice(t, admin, "lonely", nil)
		id := s.Dispatch(t, admin, map[string]any{"action": "reboot", "params": map[string]any{}, "search_type": "default", "device_ids": []string{"d1"}})

		counts := func() (int, int, int) {
			var acts, devs struct{ Count int }
			s.Do(t, admin, "GET", "/api/v1/actions?limit=1", nil).Want(t, 200).Decode(t, &acts)
			s.Do(t, admin, "GET", "/api/v1/devices/d2/actions?limit=1", nil).Want(t, 200).Decode(t, &devs)
			var logs struct{ Count int }
			s.Do(t, admin, "GET", "/api/v1/audit-logs?limit=1", nil).Want(t, 200).Decode(t, &logs)
			return acts.Count, devs.Count, logs.Count
		}
		a0, d0, l0 := counts()
		ok := func() map[string]any {
			return map[string]any{"action": "reboot", "params": map[string]any{}, "search_type": "default", "device_ids": []string{"d2"}}
		}
		with := func(kv ...any) map[string]any {
			m := ok()
			for i := 0; i < len(kv); i += 2 {
				if kv[i+1] == nil {
					delete(m, kv[i].(string))
				} else {
					m[kv[i].(string)] = kv[i+1]
				}
			}
			return m
		}
		for _, tc := range []struct {
			name  string
			body  map[string]any
			field string
			words []string
		}{
			{"UnknownField", with("priority", "high"), "priority", []string{"not a known field"}},
			{"MissingSearchType", with("search_type", nil), "search_type", []string{"required"}},
			{"UnknownSearchType", with("search_type", "nearby"), "search_type", []string{"default, all, metadata, search, group"}},
			{"UnknownDeviceIDs", with("device_ids", []string{"d2", "ghost-1", "ghost-2"}), "device_ids", []string{"ghost-1", "ghost-2"}},
			{"NoMatch", with("search_type", "metadata", "search_key", "site", "search_query", "Atlantis", "device_ids", nil), "", []string{"no device matches"}},
			{"NoMatchSearch", with("search_type", "search", "search_query", "zzz", "device_ids", nil), "", []string{"no device matches"}},
			{"SearchNUL", with("search_type", "search", "search_query", "ab\x00c", "device_ids", nil), "search_query", []string{"NUL"}},
			{"TimeoutZero", with("timeout", 0), "timeout", []string{"between 1 and 31536000"}},
			{"TimeoutTooLong", with("timeout", 31536001), "timeout", []string{"between 1 and 31536000"}},
			{"TimeoutString", with("timeout", "60"), "timeout", nil},
			{"MissingDeviceIDs", with("device_ids", nil), "device_ids", []string{"required"}},
			{"MissingParams", with("params", nil), "params", []string{"required"}},
			{"MetadataWithoutKey", with("search_type", "metadata", "search_query", "x"), "search_key", []string{"required"}},
			{"CancelWithoutActionID", with("action", "cancel_action"), "params.action_id", nil},
			{"CancelUnknownAction", with("action", "cancel_action", "params", map[string]any{"action_id": "999"}), "params.action_id", []string{"no action 999"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				for _, path := range []string{"/mock/api/v1/actions", "/api/v1/actions"} {
					r := s.Do(t, admin, "POST", path, tc.body).Want(t, 400)
					var e struct {
						Error   string
						Message string
						Fields  map[string]string
					}
					r.Decode(t, &e)
					text := e.Message
					if tc.field != "" {
						p, ok := e.Fields[tc.field]
						if !ok {
							t.Fatalf("%s: fields %v do not name %s", path, e.Fields, tc.field)
						}
						text = p
					}
					for _, w := range tc.words {
						if !strings.Contains(text, w) {
							t.Fatalf("%s: %q does not say %q", path, text, w)
						}
					}
				}
			})
		}
		t.Run("NothingWritten", func(t *testing.T) {
			if a, d, l := counts(); a != a0 || d != d0 || l != l0 {
				t.Fatalf("after rejected dispatches: %d actions, %d of d2's, %d audit logs; before %d, %d, %d", a, d, l, a0, d0, l0)
			}
		})

		gw := s.NewKey(t, admin, "gw", "device")
		for _, tc := range []struct {
			name   string
			body   map[string]any
			status int
			field  string
		}{
			{"Progress101", map[string]any{"device_id": "d1", "action_id": id, "state": "Running", "progress": 101}, 400, "progress"},
			{"ProgressNotANumber", map[string]any{"device_id": "d1", "action_id": id, "state": "Running", "progress": "lots"}, 400, "progress"},
			{"UnknownField", map[string]any{"device_id": "d1", "action_id": id, "state": "Running", "phase": 2}, 400, "phase"},
			{"NoState", map[string]any{"device_id": "d1", "action_id": id}, 400, "state"},
			{"NoDevice", map[string]any{"action_id": id, "state": "Running"}, 400, "device_id"},
			{"BadActionID", map[string]any{"device_id": "d1", "action_id": "x", "state": "Running"}, 400, "action_id"},
			{"UnknownActionID", map[string]any{"device_id": "d1", "action_id": 999, "state": "Running"}, 404, ""},
			{"NotSentToDevice", map[string]any{"device_id": "d2", "action_id": id, "state": "Running"}, 404, ""},
			{"UnknownDevice", map[string]any{"device_id": "ghost", "action_id": id, "state": "Running"}, 404, ""},
		} {
			t.Run("S10/"+tc.name, func(t *testing.T) {
				r := s.Do(t, gw, "POST", "/api/v1/devices/action/status", tc.body).Want(t, tc.status)
				if tc.field != "" {
					var e struct{ Fields map[string]string }
					r.Decode(t, &e)
					if _, ok := e.Fields[tc.field]; !ok {
						t.Fatalf("fields %v do not name %s", e.Fields, tc.field)
					}
				}
			})
		}
		if da := s.DeviceAction(t, admin, "d1", id); da.ActionStatus != "Queued" {
			t.Fatalf("rejected reports changed the record: %+v", da)
		}

		t.Run("Paths", func(t *testing.T) {
			for _, tc := range []struct {
				method, path string
				status       int
			}{
				{"GET", "/api/v1/actions/abc", 400},
				{"GET", "/api/v1/actions/0", 400},
				{"GET", "/api/v1/actions/-1", 400},
				{"GET", "/api/v1/actions/99999999999999999999", 400},
				{"GET", "/api/v1/actions/999", 404},
				{"GET", "/api/v1/actions/999/devices", 404},
				{"POST", "/api/v1/actions/999/cancel", 404},
				{"POST", "/api/v1/actions/x/cancel", 400},
				{"GET", "/api/v1/devices/ghost/actions", 404},
				{"GET", "/api/v1/devices/lonely/actions", 200},
				{"GET", "/api/v1/devices/d1/actions?sort_by=colour", 400},
				{"GET", "/api/v1/devices/d1/actions?sort_order=up", 400},
				{"GET", "/api/v1/devices/d1/actions?action_status=Done", 400},
				{"GET", "/api/v1/devices/d1/actions?limit=1001", 400},
				{"GET", "/api/v1/devices/d1/actions?colour=red", 400},
				{"GET", "/api/v1/actions?page=0", 400},
			} {
				s.Do(t, admin, tc.method, tc.path, nil).Want(t, tc.status)
			}
			var empty struct {
				DeviceActions []fleetdtest.DeviceActionBody `json:"device_actions"`
				Count         int
			}
			s.Do(t, admin, "GET", "/api/v1/devices/lonely/actions", nil).Want(t, 200).Decode(t, &empty)
			if empty.DeviceActions == nil || len(empty.DeviceActions) != 0 || empty.Count != 0 {
				t.Fatalf("a device without actions: %+v", empty)
			}
		})
	})
}

// TestDeviceActionsQuery checks S7's sorts, orders, filters and paging over
// HTTP; the store's tests cover every combination.
func TestDeviceActionsQuery(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		admin := s.Admin()
		s.MustDevice(t, admin, "d1", nil)
		gw := s.NewKey(t, admin, "gw", "device")
		var ids []int64
		for i, name := range []string{"b", "a", "c", "a"} {
			id := s.Dispatch(t, admin, map[string]any{"action": name, "params": map[string]any{}, "search_type": "all"})
			ids = append(ids, id)
			if i%2 == 0 {
				s.Do(t, gw, "POST", "/api/v1/devices/action/status", map[string]any{"device_id": "d1", "action_id": id, "state": "Completed"}).Want(t, 204)
			}
		}
		page := func(q string) []int64 {
			var list struct {
				DeviceActions []fleetdtest.DeviceActionBody `json:"device_actions"`
				Count         int
			}
			s.Do(t, admin, "GET", "/api/v1/devices/d1/actions?"+q, nil).Want(t, 200).Decode(t, &list)
			var got []int64
			for _, da := range list.DeviceActions {
				got = append(got, da.ActionID)
			}
			return got
		}
		for _, tc := range []struct {
			q    string
			want []int64
		}{
			{"", []int64{ids[3], ids[2], ids[1], ids[0]}},
			{"sort_order=asc", []int64{ids[0], ids[1], ids[2], ids[3]}},
			{"sort_by=type&sort_order=asc", []int64{ids[1], ids[3], ids[0], ids[2]}},
			{"sort_by=type", []int64{ids[2], ids[0], ids[3], ids[1]}},
			{"sort_by=type&sort_order=asc&limit=2&page=2", []int64{ids[0], ids[2]}},
			{"type=a", []int64{ids[3], ids[1]}},
			{"action_status=Completed&sort_order=asc", []int64{ids[0], ids[2]}},
			{"sort_by=status&sort_order=asc", []int64{ids[0], ids[2], ids[1], ids[3]}},
		} {
			if got := page(tc.q); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("?%s: %v, want %v", tc.q, got, tc.want)
			}
		}
	})
}

func TestActionCancelEndToEnd(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		admin := s.Admin()
		busy := s.MustDevice(t, admin, "busy", nil)
		away := s.MustDevice(t, admin, "away", nil)
		s.MustDevice(t, admin, "queued", nil)
		db := s.ConnectDevice(t, "default", "busy", busy.Token)
		da := s.ConnectDevice(t, "default", "away", away.Token)
		id := s.Dispatch(t, admin, map[string]any{"action": "update", "params": map[string]any{"v": 2}, "search_type": "all"})
		db.Next(t)
		da.Next(t)
		db.Report(t, map[string]any{"id": fmt.Sprint(id), "state": "Downloading", "progress": 10})
		s.AwaitActionStatus(t, admin, "away", id, "Initiated")
		da.Client.Disconnect(100) // it has the action, and goes away

		var a fleetdtest.ActionBody
		s.Send(t, fleetdtest.Req{Method: "POST", Path: fmt.Sprintf("/api/v1/actions/%d/cancel", id), Creds: admin,
			Header: http.Header{"Prefer": {"return=representation"}}}).Want(t, 200).Decode(t, &a)
		// The devices that have it keep it until they answer.
		if a.Statuses["Cancelled"] != 1 || a.Statuses["Initiated"] != 1 || a.Statuses["Progress"] != 1 || len(a.Statuses) != 3 {
			t.Fatalf("after cancel: %+v", a)
		}
		m := db.Next(t)
		if m.Name != "cancel_action" || m.ID == fmt.Sprint(id) || m.Payload != fmt.Sprintf(`{"action_id":"%d","name":"update"}`, id) {
			t.Fatalf("busy received %+v", m)
		}
		cid, _ := strconv.ParseInt(m.ID, 10, 64)
		cancel := s.Action(t, admin, cid)
		if cancel.Action != "cancel_action" || cancel.Targeted != 2 || cancel.UserName != "admin" {
			t.Fatalf("the cancel_action = %+v", cancel)
		}
		// The device's reports as uplink sends them: the cancelled action
		// Failed, the cancellation Completed: it stopped.
		db.Report(t, []map[string]any{
			{"id": m.ID, "state": "Completed", "progress": 100},
			{"id": fmt.Sprint(id), "state": "Failed", "errors": []string{"cancelled"}},
		})
		if r := s.DeviceAction(t, admin, "busy", id); r.ActionStatus != "Cancelled" || r.Status != "Cancelled" {
			t.Fatalf("busy's cancelled action = %+v", r)
		}
		if r := s.DeviceAction(t, admin, "busy", cid); r.ActionStatus != "Completed" {
			t.Fatalf("busy's cancel_action = %+v", r)
		}
		// away is told when it returns, and refuses: its update goes on,
		// and its result counts.
		da = s.ConnectDevice(t, "default", "away", away.Token)
		if m := da.Next(t); m.ID != fmt.Sprint(cid) {
			t.Fatalf("away received %+v", m)
		}
		da.Report(t, map[string]any{"id": fmt.Sprint(cid), "state": "Failed", "errors": []string{"Cancellation request failed as action completed execution!"}})
		if r := s.AwaitActionStatus(t, admin, "away", cid, "Failed"); r.ActionStatus != "Failed" {
			t.Fatalf("away's cancel_action = %+v", r)
		}
		if r := s.DeviceAction(t, admin, "away", id); r.ActionStatus != "Initiated" || r.Status != "CancelRejected" {
			t.Fatalf("away's update after it refused = %+v", r)
		}
		da.Report(t, map[string]any{"id": fmt.Sprint(id), "state": "Completed"})
		s.AwaitActionStatus(t, admin, "away", id, "Completed")
		// queued never had it: cancelled without a word.
		if r := s.DeviceAction(t, admin, "queued", id); r.ActionStatus != "Cancelled" {
			t.Fatalf("queued = %+v", r)
		}
		// Cancelling again: 204, nothing changes, nothing is sent.
		s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/cancel", id), nil).Want(t, 204)
		db.Nothing(t)
		var list struct{ Count int }
		s.Do(t, admin, "GET", "/api/v1/actions?action=cancel_action", nil).Want(t, 200).Decode(t, &list)
		if list.Count != 1 {
			t.Fatalf("%d cancel_actions, want 1", list.Count)
		}

		t.Run("CancelActionDispatch", func(t *testing.T) {
			id := s.Dispatch(t, admin, map[string]any{"action": "reboot", "params": map[string]any{}, "search_type": "default", "device_ids": []string{"busy"}})
			db.Next(t)
			db.Report(t, map[string]any{"id": fmt.Sprint(id), "state": "Rebooting"})
			cid := s.Dispatch(t, admin, map[string]any{"action": "cancel_action", "params": map[string]any{"action_id": fmt.Sprint(id)}, "search_type": "default", "device_ids": []string{"busy"}})
			m := db.Next(t)
			if m.ID != fmt.Sprint(cid) || m.Name != "cancel_action" || m.Payload != fmt.Sprintf(`{"action_id":"%d","name":"reboot"}`, id) {
				t.Fatalf("busy received %+v", m)
			}
			if r := s.DeviceAction(t, admin, "busy", id); r.ActionStatus != "Progress" || r.Status != "Cancelling" {
				t.Fatalf("busy's reboot = %+v", r)
			}
			db.Report(t, map[string]any{"id": m.ID, "state": "Completed"})
			s.AwaitActionStatus(t, admin, "busy", id, "Cancelled")
		})
	})
}

// TestActionTimeoutWired checks that serve runs the sweeper; the sweeper's
// own tests drive it with a fake clock.
func TestActionTimeoutWired(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b, "--action-sweep-interval", "20ms")
		admin := s.Admin()
		dev := s.MustDevice(t, admin, "slow", nil)
		d := s.ConnectDevice(t, "default", "slow", dev.Token)
		id := s.Dispatch(t, admin, map[string]any{"action": "reboot", "params": map[string]any{}, "search_type": "all", "timeout": 1})
		d.Next(t)
		da := s.AwaitActionStatus(t, admin, "slow", id, "Failed")
		if da.Status != "TimedOut" || len(da.Errors["TimedOut"]) != 1 {
			t.Fatalf("timed out record = %+v", da)
		}
	})
}

func TestActionsTenantIsolation(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		admin := s.Admin()
		s.MustDevice(t, admin, "d1", nil)
		id := s.Dispatch(t, admin, map[string]any{"action": "reboot", "params": map[string]any{}, "search_type": "all"})
		other := s.NewTenant(t, "other")
		s.MustDevice(t, other, "own", nil)
		otherGW := s.NewKey(t, other, "gw", "device")
		for _, tc := range []struct {
			c            fleetdtest.Creds
			method, path string
			body         any
			status       int
		}{
			{other, "GET", fmt.Sprintf("/api/v1/actions/%d", id), nil, 404},
			{other, "GET", fmt.Sprintf("/api/v1/actions/%d/devices", id), nil, 404},
			{other, "POST", fmt.Sprintf("/api/v1/actions/%d/cancel", id), nil, 404},
			{other, "GET", "/api/v1/devices/d1/actions", nil, 404},
			{otherGW, "POST", "/api/v1/devices/action/status", map[string]any{"device_id": "d1", "action_id": id, "state": "Completed"}, 404},
			{other, "POST", "/api/v1/actions", map[string]any{"action": "x", "params": map[string]any{}, "search_type": "default", "device_ids": []string{"d1"}}, 400},
			{other, "POST", "/mock/api/v1/actions", map[string]any{"action": "x", "params": map[string]any{}, "search_type": "search", "search_query": "d1"}, 400},
		} {
			s.Do(t, tc.c, tc.method, tc.path, tc.body).Want(t, tc.status)
		}
		var list struct{ Count int }
		s.Do(t, other, "GET", "/api/v1/actions", nil).Want(t, 200).Decode(t, &list)
		if list.Count != 0 {
			t.Fatalf("other tenant lists %d actions", list.Count)
		}
		// The other tenant's first action is its own number 1; ours is untouched.
		oid := s.Dispatch(t, other, map[string]any{"action": "x", "params": map[string]any{}, "search_type": "all"})
		if oid != 1 {
			t.Fatalf("the other tenant's first action id = %d", oid)
		}
		if a := s.Action(t, admin, id); a.Statuses["Queued"] != 1 {
			t.Fatalf("our action = %+v", a)
		}
		// A device of another tenant cannot log in to ours over MQTT, nor
		// receive our actions: covered by the mqtt package's tests.
	})
}

func TestActionsRoles(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		admin := s.Admin()
		s.MustDevice(t, admin, "d1", nil)
		id := s.Dispatch(t, admin, map[string]any{"action": "reboot", "params": map[string]any{}, "search_type": "all"})
		keys := map[string]fleetdtest.Creds{"admin": admin}
		for _, role := range []string{"viewer", "device", "operator"} {
			keys[role] = s.NewKey(t, admin, role, role)
		}
		dispatchBody := map[string]any{"action": "x", "params": map[string]any{}, "search_type": "all"}
		report := map[string]any{"device_id": "d1", "action_id": id, "state": "Running"}
		for _, tc := range []struct {
			method, path string
			body         any
			ok           int
			allowed      []string
		}{
			{"POST", "/mock/api/v1/actions", dispatchBody, 201, []string{"operator", "admin"}},
			{"POST", "/api/v1/actions", dispatchBody, 201, []string{"operator", "admin"}},
			{"GET", "/api/v1/actions", nil, 200, []string{"viewer", "operator", "admin"}},
			{"GET", fmt.Sprintf("/api/v1/actions/%d", id), nil, 200, []string{"viewer", "operator", "admin"}},
			{"GET", fmt.Sprintf("/api/v1/actions/%d/devices", id), nil, 200, []string{"viewer", "operator", "admin"}},
			{"GET", "/api/v1/devices/d1/actions", nil, 200, []string{"viewer", "operator", "admin"}},
			{"POST", "/api/v1/devices/action/status", report, 204, []string{"device", "operator", "admin"}},
			{"POST", fmt.Sprintf("/api/v1/actions/%d/cancel", id), nil, 204, []string{"operator", "admin"}},
		} {
			for _, role := range []string{"viewer", "device", "operator", "admin"} {
				want := 403
				for _, a := range tc.allowed {
					if a == role {
						want = tc.ok
					}
				}
				s.Do(t, keys[role], tc.method, tc.path, tc.body).Want(t, want)
			}
			s.Do(t, fleetdtest.Creds{Tenant: "default", Key: "fk_wrong"}, tc.method, tc.path, tc.body).Want(t, 401)
		}
	})
}

// TestActionsWithMosquittoClients plays the device with Debian's
// mosquitto_sub and mosquitto_pub.
func TestActionsWithMosquittoClients(t *testing.T) {
	t.Parallel()
	for _, bin := range []string{"/usr/bin/mosquitto_sub", "/usr/bin/mosquitto_pub"} {
		if _, err := os.Stat(bin); err != nil {
			t.Skipf("%s is not installed (Debian package mosquitto-clients; .ci/run installs it)", bin)
		}
	}
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		admin := s.Admin()
		dev := s.MustDevice(t, admin, "mq-1", nil)
		host, port, _ := strings.Cut(s.MQTTAddr, ":")
		common := []string{"-h", host, "-p", port, "-q", "1", "-u", "default/mq-1", "-P", dev.Token}

		// Queued while the device is offline; mosquitto_sub receives it on
		// subscribing, prints it and exits after one message.
		id := s.Dispatch(t, admin, map[string]any{"action": "reboot", "params": map[string]any{"delay": 1}, "search_type": "all"})
		ctx, cancel := context.WithTimeout(context.Background(), fleetdtest.Bound)
		defer cancel()
		sub := exec.CommandContext(ctx, "/usr/bin/mosquitto_sub", append(common, "-i", "mq-1", "-C", "1", "-t", mqtt.ActionsTopic("default", "mq-1"))...)
		out, err := sub.Output()
		if err != nil {
			t.Fatalf("mosquitto_sub: %v; %s", err, out)
		}
		var m action.Message
		if err := json.Unmarshal(out, &m); err != nil || m.ID != fmt.Sprint(id) || m.Name != "reboot" || m.Payload != `{"delay":1}` {
			t.Fatalf("mosquitto_sub printed %s (%v)", out, err)
		}
		s.AwaitActionStatus(t, admin, "mq-1", id, "Initiated")

		// mosquitto_pub exits 0 once its report was acknowledged: committed.
		for _, payload := range []string{
			fmt.Sprintf(`[{"id": "%d", "state": "Downloading", "progress": 50, "errors": [], "timestamp": 1000, "sequence": 1}]`, id),
			fmt.Sprintf(`{"id": "%d", "state": "Completed", "progress": 100, "errors": [], "timestamp": 2000, "sequence": 2}`, id),
		} {
			pub := exec.CommandContext(ctx, "/usr/bin/mosquitto_pub", append(common, "-t", mqtt.ActionStatusTopic("default", "mq-1"), "-m", payload)...)
			if out, err := pub.CombinedOutput(); err != nil {
				t.Fatalf("mosquitto_pub: %v; %s", err, out)
			}
		}
		if da := s.DeviceAction(t, admin, "mq-1", id); da.ActionStatus != "Completed" || da.Progress != 100 {
			t.Fatalf("after mosquitto_pub: %+v", da)
		}
	})
}
