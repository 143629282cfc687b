package fleethttp_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/mqtt"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

func TestDevicesEndToEnd(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		admin := s.Admin()

		t.Run("ProvisionAndList", func(t *testing.T) {
			r := s.Do(t, admin, "POST", "/api/v1/devices", map[string]any{"id": "pump-1", "metadata": map[string]string{"site": "Berlin"}}).Want(t, 201)
			if loc := r.Header.Get("Location"); !strings.HasSuffix(loc, "/api/v1/devices/pump-1") {
				t.Fatalf("Location = %q", loc)
			}
			var d fleetdtest.Device
			r.Decode(t, &d)
			if d.ID != "pump-1" || !strings.HasPrefix(d.Token, "fdt_") || d.Metadata["site"] != "Berlin" || len(d.CreatedAt) != len("2026-11-21T10:00:00.123Z") {
				t.Fatalf("created = %+v", d)
			}
			var list struct {
				Devices []fleetdtest.Device
				Count   int
			}
			s.Do(t, admin, "GET", "/api/v1/devices", nil).Want(t, 200).Decode(t, &list)
			if list.Count != 1 || list.Devices[0].ID != "pump-1" || list.Devices[0].Token != "" {
				t.Fatalf("list = %+v", list)
			}
			if strings.Contains(string(s.Do(t, admin, "GET", "/api/v1/devices/pump-1", nil).Want(t, 200).Body), "token") {
				t.Fatal("a device read shows its token")
			}
		})
		t.Run("GeneratedID", func(t *testing.T) {
			var d fleetdtest.Device
			s.Do(t, admin, "POST", "/api/v1/devices", map[string]any{}).Want(t, 201).Decode(t, &d)
			if d.ID == "" || d.Token == "" {
				t.Fatalf("created = %+v", d)
			}
			s.Do(t, admin, "DELETE", "/api/v1/devices/"+d.ID, nil).Want(t, 204)
		})
		t.Run("Bulk", func(t *testing.T) {
			var devs []map[string]any
			for i := range 500 {
				devs = append(devs, map[string]any{"id": fmt.Sprint("bulk-", i), "metadata": map[string]string{"batch": "b1"}})
			}
			var out struct{ Devices []struct{ ID, Token string } }
			s.Do(t, admin, "POST", "/api/v1/devices/bulk", map[string]any{"devices": devs}).Want(t, 201).Decode(t, &out)
			if len(out.Devices) != 500 || out.Devices[499].ID != "bulk-499" || out.Devices[0].Token == "" {
				t.Fatalf("bulk answer has %d devices", len(out.Devices))
			}
			var list struct{ Count int }
			s.Do(t, admin, "GET", "/api/v1/devices?metadata.batch=b1&limit=1", nil).Want(t, 200).Decode(t, &list)
			if list.Count != 500 {
				t.Fatalf("count = %d, want 500", list.Count)
			}
			// A conflict anywhere rejects the whole batch.
			r := s.Do(t, admin, "POST", "/api/v1/devices/bulk", map[string]any{"devices": []any{map[string]any{"id": "fresh"}, map[string]any{"id": "bulk-7"}}}).Want(t, 409)
			if !strings.Contains(string(r.Body), "bulk-7") {
				t.Fatalf("conflict does not name bulk-7: %s", r.Body)
			}
			s.Do(t, admin, "GET", "/api/v1/devices/fresh", nil).Want(t, 404)
			// Problems in elements are named by index.
			r = s.Do(t, admin, "POST", "/api/v1/devices/bulk", map[string]any{"devices": []any{map[string]any{"id": "ok"}, map[string]any{"id": "bad id"}, "x", map[string]any{"idd": 1}}}).Want(t, 400)
			var e struct{ Fields map[string]string }
			r.Decode(t, &e)
			for _, f := range []string{"devices[1].id", "devices[2]", "devices[3].idd"} {
				if e.Fields[f] == "" {
					t.Errorf("no problem reported for %s: %v", f, e.Fields)
				}
			}
		})
		t.Run("PatchMerges", func(t *testing.T) {
			s.MustDevice(t, admin, "patch-1", map[string]string{"a": "1", "b": "2"})
			s.Do(t, admin, "PATCH", "/api/v1/devices/patch-1", map[string]any{"metadata": map[string]any{"a": "9", "b": nil, "c": "3"}}).Want(t, 204)
			var d fleetdtest.Device
			s.Do(t, admin, "GET", "/api/v1/devices/patch-1", nil).Want(t, 200).Decode(t, &d)
			if fmt.Sprint(d.Metadata) != "map[a:9 c:3]" {
				t.Fatalf("metadata = %v", d.Metadata)
			}
			r := s.Send(t, fleetdtest.Req{Method: "PATCH", Path: "/api/v1/devices/patch-1", Creds: admin, Body: map[string]any{"metadata": map[string]any{"d": "4"}},
				Header: http.Header{"Prefer": {"return=representation"}}}).Want(t, 200)
			r.Decode(t, &d)
			if d.Metadata["d"] != "4" || r.Header.Get("Preference-Applied") != "return=representation" {
				t.Fatalf("representation = %+v, Preference-Applied %q", d, r.Header.Get("Preference-Applied"))
			}
		})
		t.Run("RotateToken", func(t *testing.T) {
			d := s.MustDevice(t, admin, "rot-1", nil)
			var tok struct{ Token string }
			s.Do(t, admin, "POST", "/api/v1/devices/rot-1/token", nil).Want(t, 201).Decode(t, &tok)
			if tok.Token == "" || tok.Token == d.Token {
				t.Fatalf("new token %q", tok.Token)
			}
		})
		t.Run("BadInput", func(t *testing.T) {
			long := strings.Repeat("x", 129)
			for _, tc := range []struct {
				name   string
				rq     fleetdtest.Req
				status int
				field  string
			}{
				{"UnknownField", fleetdtest.Req{Method: "POST", Path: "/api/v1/devices", Body: map[string]any{"id": "x", "color": "red"}}, 400, "color"},
				{"IDNotString", fleetdtest.Req{Method: "POST", Path: "/api/v1/devices", Body: map[string]any{"id": 7}}, 400, "id"},
				{"IDTooLong", fleetdtest.Req{Method: "POST", Path: "/api/v1/devices", Body: map[string]any{"id": long}}, 400, "id"},
				{"IDBadChars", fleetdtest.Req{Method: "POST", Path: "/api/v1/devices", Body: map[string]any{"id": "a/b"}}, 400, "id"},
				{"MetadataNotString", fleetdtest.Req{Method: "POST", Path: "/api/v1/devices", Body: map[string]any{"metadata": map[string]any{"n": 1}}}, 400, "metadata.n"},
				{"MetadataValueTooLong", fleetdtest.Req{Method: "POST", Path: "/api/v1/devices", Body: map[string]any{"metadata": map[string]any{"n": strings.Repeat("v", 1025)}}}, 400, "metadata"},
				{"BodyNotObject", fleetdtest.Req{Method: "POST", Path: "/api/v1/devices", Body: []int{1}}, 400, "body"},
				{"DuplicateKey", fleetdtest.Req{Method: "POST", Path: "/api/v1/devices", Raw: []byte(`{"id":"a","id":"b"}`), ContentType: "application/json"}, 400, ""},
				{"Malformed", fleetdtest.Req{Method: "POST", Path: "/api/v1/devices", Raw: []byte(`{"id":`), ContentType: "application/json"}, 400, ""},
				{"Empty", fleetdtest.Req{Method: "POST", Path: "/api/v1/devices", Raw: []byte{}, ContentType: "application/json"}, 400, ""},
				{"NoContentType", fleetdtest.Req{Method: "POST", Path: "/api/v1/devices", Raw: []byte(`{}`)}, 415, ""},
				{"WrongContentType", fleetdtest.Req{Method: "POST", Path: "/api/v1/devices", Raw: []byte(`{}`), ContentType: "text/plain"}, 415, ""},
				{"CharsetIgnored", fleetdtest.Req{Method: "POST", Path: "/api/v1/devices", Raw: []byte(`{"id":"cs-1"}`), ContentType: "application/json; charset=utf-8"}, 201, ""},
				{"TooLarge", fleetdtest.Req{Method: "POST", Path: "/api/v1/devices", Raw: []byte(`{"id":"` + strings.Repeat("x", 1<<20) + `"}`), ContentType: "application/json"}, 413, ""},
				{"UnknownQuery", fleetdtest.Req{Method: "GET", Path: "/api/v1/devices?colour=red"}, 400, "colour"},
				{"QueryWhereNoneIsRead", fleetdtest.Req{Method: "POST", Path: "/api/v1/devices?dry_run=1", Body: map[string]any{"id": "dry"}}, 400, "dry_run"},
				{"LimitTooLarge", fleetdtest.Req{Method: "GET", Path: "/api/v1/devices?limit=1001"}, 400, "limit"},
				{"SearchNUL", fleetdtest.Req{Method: "GET", Path: "/api/v1/devices?search=ab%00cd"}, 400, "search"},
				{"SearchNotUTF8", fleetdtest.Req{Method: "GET", Path: "/api/v1/devices?search=caf%E9"}, 400, "search"},
				{"MetadataFilterNUL", fleetdtest.Req{Method: "GET", Path: "/api/v1/devices?metadata.site=%00"}, 400, "metadata"},
				{"SearchSpecial", fleetdtest.Req{Method: "GET", Path: "/api/v1/devices?search=%22%27%25_%5C%2A%20OR%20x"}, 200, ""},
				{"PageZero", fleetdtest.Req{Method: "GET", Path: "/api/v1/devices?page=0"}, 400, "page"},
				{"PageRepeated", fleetdtest.Req{Method: "GET", Path: "/api/v1/devices?page=1&page=2"}, 400, "page"},
				{"BadPathID", fleetdtest.Req{Method: "GET", Path: "/api/v1/devices/a%20b"}, 400, "id"},
				{"PatchNoMetadata", fleetdtest.Req{Method: "PATCH", Path: "/api/v1/devices/pump-1", Body: map[string]any{}}, 400, "metadata"},
				{"PatchNumber", fleetdtest.Req{Method: "PATCH", Path: "/api/v1/devices/pump-1", Body: map[string]any{"metadata": map[string]any{"x": 1}}}, 400, "metadata.x"},
				{"BulkEmpty", fleetdtest.Req{Method: "POST", Path: "/api/v1/devices/bulk", Body: map[string]any{"devices": []any{}}}, 400, "devices"},
				{"UnknownDevice", fleetdtest.Req{Method: "GET", Path: "/api/v1/devices/nope"}, 404, ""},
				{"NoRoute", fleetdtest.Req{Method: "GET", Path: "/api/v1/nothing"}, 404, ""},
				{"WrongMethod", fleetdtest.Req{Method: "PUT", Path: "/api/v1/devices"}, 405, ""},
			} {
				t.Run(tc.name, func(t *testing.T) {
					tc.rq.Creds = admin
					r := s.Send(t, tc.rq).Want(t, tc.status)
					if tc.status < 400 {
						return
					}
					var e struct {
						Error, Message string
						Fields         map[string]string
					}
					r.Decode(t, &e)
					if e.Error == "" || e.Message == "" {
						t.Fatalf("error body = %s", r.Body)
					}
					if tc.field != "" && e.Fields[tc.field] == "" {
						t.Fatalf("fields = %v, want a problem for %s", e.Fields, tc.field)
					}
				})
			}
		})
	})
}

// TestTenantIsolationDevices: a key of one tenant never reaches another's
// devices: every device endpoint answers 404, and lists are empty.
func TestTenantIsolationDevices(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		a := s.Admin()
		bt := s.NewTenant(t, "beta")
		s.MustDevice(t, a, "a-dev", map[string]string{"owner": "a"})

		for _, tc := range []struct {
			method, path string
			body         any
		}{
			{"GET", "/api/v1/devices/a-dev", nil},
			{"PATCH", "/api/v1/devices/a-dev", map[string]any{"metadata": map[string]any{"x": "y"}}},
			{"DELETE", "/api/v1/devices/a-dev", nil},
			{"POST", "/api/v1/devices/a-dev/token", nil},
		} {
			t.Run(tc.method+tc.path, func(t *testing.T) {
				if code := s.Do(t, bt, tc.method, tc.path, tc.body).Want(t, 404).ErrorCode(t); code != "not_found" {
					t.Fatalf("error = %q", code)
				}
			})
		}
		var list struct{ Count int }
		s.Do(t, bt, "GET", "/api/v1/devices?search=a-dev", nil).Want(t, 200).Decode(t, &list)
		if list.Count != 0 {
			t.Fatalf("beta lists %d of default's devices", list.Count)
		}
		// beta may use the same id for its own device.
		s.MustDevice(t, bt, "a-dev", nil)
		var d fleetdtest.Device
		s.Do(t, a, "GET", "/api/v1/devices/a-dev", nil).Want(t, 200).Decode(t, &d)
		if d.Metadata["owner"] != "a" {
			t.Fatalf("default's device changed: %+v", d)
		}
	})
}

// TestAuthentication covers docs/api.md#authentication and #roles: one 401
// for every kind of bad credential, 403 for a role without the right.
func TestAuthentication(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		a := s.Admin()
		beta := s.NewTenant(t, "beta")
		for _, c := range []struct {
			name  string
			creds fleetdtest.Creds
		}{
			{"NoHeaders", fleetdtest.Creds{}},
			{"NoKey", fleetdtest.Creds{Tenant: "default"}},
			{"NoTenant", fleetdtest.Creds{Key: a.Key}},
			{"UnknownKey", fleetdtest.Creds{Tenant: "default", Key: "fk_unknown"}},
			{"UnknownTenant", fleetdtest.Creds{Tenant: "nobody", Key: a.Key}},
			{"OtherTenantsKey", fleetdtest.Creds{Tenant: "default", Key: beta.Key}},
		} {
			t.Run(c.name, func(t *testing.T) {
				r := s.Do(t, c.creds, "GET", "/api/v1/devices", nil).Want(t, 401)
				if r.ErrorCode(t) != "unauthenticated" {
					t.Fatalf("body = %s", r.Body)
				}
			})
		}

		keys := map[string]fleetdtest.Creds{"admin": a}
		for _, role := range []string{"viewer", "device", "operator"} {
			keys[role] = s.NewKey(t, a, role+"-key", role)
		}
		s.MustDevice(t, a, "d1", nil)
		for _, tc := range []struct {
			method, path string
			body         any
			allowed      []string
		}{
			{"GET", "/api/v1/devices", nil, []string{"viewer", "operator", "admin"}},
			{"GET", "/api/v1/devices/d1", nil, []string{"viewer", "operator", "admin"}},
			{"POST", "/api/v1/devices", map[string]any{}, []string{"operator", "admin"}},
			{"POST", "/api/v1/devices/bulk", map[string]any{"devices": []any{map[string]any{}}}, []string{"operator", "admin"}},
			{"PATCH", "/api/v1/devices/d1", map[string]any{"metadata": map[string]any{}}, []string{"operator", "admin"}},
			{"POST", "/api/v1/devices/d1/token", nil, []string{"operator", "admin"}},
			{"GET", "/api/v1/apikeys", nil, []string{"admin"}},
			{"POST", "/api/v1/apikeys", map[string]any{"name": "k-%s", "role": "viewer"}, []string{"admin"}},
			{"GET", "/api/v1/audit-logs", nil, []string{"admin"}},
		} {
			for _, role := range []string{"viewer", "device", "operator", "admin"} {
				t.Run(role+" "+tc.method+" "+tc.path, func(t *testing.T) {
					body := tc.body
					if m, ok := body.(map[string]any); ok && m["name"] != nil {
						body = map[string]any{"name": fmt.Sprintf("k-%s", role), "role": "viewer"}
					}
					r := s.Do(t, keys[role], tc.method, tc.path, body)
					allowed := false
					for _, a := range tc.allowed {
						allowed = allowed || a == role
					}
					if allowed && r.Status >= 400 {
						t.Fatalf("%s may %s %s, got %d: %s", role, tc.method, tc.path, r.Status, r.Body)
					}
					if !allowed && (r.Status != 403 || r.ErrorCode(t) != "forbidden") {
						t.Fatalf("%s may not %s %s, got %d: %s", role, tc.method, tc.path, r.Status, r.Body)
					}
				})
			}
		}
	})
}

// TestLastSeenFollowsEveryMessage checks that a device's last_seen_at moves
// with its data points over MQTT and its DDI polls, not only with its
// connection and reports.
func TestLastSeenFollowsEveryMessage(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b, "--ddi-poll-interval", "1s")
		admin := s.Admin()
		lastSeen := func(id string) time.Time {
			t.Helper()
			var d fleetdtest.Device
			s.Do(t, admin, "GET", "/api/v1/devices/"+id, nil).Want(t, 200).Decode(t, &d)
			if d.LastSeenAt == nil {
				return time.Time{}
			}
			at, err := time.Parse(time.RFC3339Nano, *d.LastSeenAt)
			if err != nil {
				t.Fatal(err)
			}
			return at
		}
		// Each message, sent until last_seen_at passes the time before it,
		// must move it: on its own it would stay where it was.
		movesWith := func(id, what string, send func()) {
			t.Helper()
			before := lastSeen(id)
			for time.Now().UnixMilli() <= before.UnixMilli() {
				time.Sleep(time.Millisecond) // last_seen_at has milliseconds
			}
			send()
			fleetdtest.Eventually(t, "last_seen_at of "+id+" after "+what, func() bool { return lastSeen(id).After(before) })
		}

		sensor := s.MustDevice(t, admin, "sensor-1", nil)
		d := s.ConnectDevice(t, "default", "sensor-1", sensor.Token)
		fleetdtest.Eventually(t, "last_seen_at at the connection", func() bool { return !lastSeen("sensor-1").IsZero() })
		movesWith("sensor-1", "a data point", func() {
			tok := d.Client.Publish(mqtt.StreamTopic("default", "sensor-1", "temperature"), 1, false,
				[]byte(fmt.Sprintf(`[{"timestamp":%d,"sequence":1,"celsius":21.5}]`, time.Now().UnixMilli())))
			if !tok.WaitTimeout(fleetdtest.Bound) || tok.Error() != nil {
				t.Fatalf("publish: %v", tok.Error())
			}
		})

		ecu := s.MustDevice(t, admin, "ecu-1", nil)
		poll := func() {
			if resp, body := s.DDI(t, "GET", "/default/controller/v1/ecu-1", "TargetToken "+ecu.Token, nil); resp.StatusCode != 200 {
				t.Fatalf("poll: %d %s", resp.StatusCode, body)
			}
		}
		movesWith("ecu-1", "its first DDI poll", poll)
		movesWith("ecu-1", "another DDI poll", poll)
	})
}
