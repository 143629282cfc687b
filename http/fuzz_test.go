package fleethttp_test

import (
	"bufio"
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/action"
	"github.com/fleetd/fleet/alert"
	"github.com/fleetd/fleet/blob"
	"github.com/fleetd/fleet/enduser"
	"github.com/fleetd/fleet/firmware"
	fleethttp "github.com/fleetd/fleet/http"
	"github.com/fleetd/fleet/pki"
	"github.com/fleetd/fleet/sqlstore"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// api is the whole API in process, on a real SQLite store, with keys of
// every role in tenant acme and an admin key of tenant other.
type api struct {
	h    http.Handler
	db   *sqlstore.DB
	keys map[string]string // role (or "other") -> key
}

// offline is a device channel on which no device is ever connected.
type offline struct{}

func (offline) SendAction(string, string, int64, []byte) bool { return false }
func (offline) Online(string, string) bool                    { return false }

func newAPI(tb testing.TB) *api {
	tb.Helper()
	ctx := context.Background()
	db := sqlstoretest.MustOpen(tb, sqlstoretest.Backends()[0], sqlstoretest.Options{})
	a := &api{db: db, keys: map[string]string{}}
	_, admin, err := db.CreateTenant(ctx, "acme")
	if err != nil {
		tb.Fatal(err)
	}
	a.keys["admin"] = admin
	for _, role := range []fleet.Role{fleet.RoleViewer, fleet.RoleDevice, fleet.RoleOperator} {
		k := &fleet.APIKey{Name: string(role), Role: role}
		if err := db.CreateAPIKey(ctx, "acme", k); err != nil {
			tb.Fatal(err)
		}
		a.keys[string(role)] = k.Key
	}
	if _, a.keys["other"], err = db.CreateTenant(ctx, "other"); err != nil {
		tb.Fatal(err)
	}
	if _, err := db.CreateDevices(ctx, "acme", []fleet.NewDevice{{ID: "d1", Metadata: map[string]string{"site": "x"}}}); err != nil {
		tb.Fatal(err)
	}

	blobs, err := blob.OpenDir(tb.TempDir())
	if err != nil {
		tb.Fatal(err)
	}
	fw := &firmware.Service{Store: db, Blobs: blobs}
	engine := &alert.Engine{Store: db, Devices: db}
	if err := engine.Load(ctx); err != nil {
		tb.Fatal(err)
	}
	alerts := &alert.Service{ServiceStore: db, Engine: engine}
	actions := &action.Service{Store: db, Sender: offline{},
		Preparers: map[string]fleet.ActionPreparer{fleet.ActionUpdateFirmware: fw}}
	actions.Open()
	tb.Cleanup(func() { actions.Close() })
	users := &enduser.Authenticator{Store: db}
	caPEM, err := pki.NewAuthorityPEM(time.Now())
	if err != nil {
		tb.Fatal(err)
	}
	ca, err := pki.ParseAuthority([]byte(caPEM), []byte(caPEM))
	if err != nil {
		tb.Fatal(err)
	}
	s := &fleethttp.Server{
		Tenants: db, Devices: &alert.Devices{DeviceService: db, Engine: engine}, Audit: db,
		Alerts: alerts, Streams: alerts, History: db, Groups: db, Firmware: fw, Actions: actions,
		TenantAuth: users, Tokens: users, Ready: []fleethttp.Pinger{db},
		DeviceCerts:  &pki.Service{Store: db, Authority: ca, ServerTrust: ca.CertificatePEM},
		UplinkBroker: fleethttp.UplinkBroker{Host: "fleet.example.com", Port: 8883},
		// The fuzzer sends far more than any key may; limits are tested
		// elsewhere.
		Security: fleethttp.Security{Rate: -1, DeviceDataRate: -1},
		Follows:  &fleethttp.Follows{PerTenant: apiFollows},
	}
	a.h = s.Handler()
	return a
}

// serve sends one request through the handler, as the fuzzer builds it:
// a method, a target, header lines, a body, and who it is from (0: nobody;
// 1–4: a key of role viewer, device, operator, admin; 5: another
// tenant's admin; 6: a wrong key).
func (a *api) serve(method, target, header string, body []byte, who byte) (*httptest.ResponseRecorder, bool) {
	if !validMethod(method) || target == "" || target[0] != '/' || strings.ContainsAny(target, " \r\n\t#") {
		return nil, false // net/http would refuse such a request line before any handler
	}
	r, err := http.NewRequest(method, "http://fleet.example.com"+target, bytes.NewReader(body))
	if err != nil {
		return nil, false
	}
	tp := textproto.NewReader(bufio.NewReader(strings.NewReader(header + "\r\n\r\n")))
	if h, err := tp.ReadMIMEHeader(); err == nil {
		for k, vs := range h {
			r.Header[k] = vs
		}
	}
	r.Header.Set("X-Service-Tenant", "acme")
	switch who % 7 {
	case 0:
		r.Header.Del("X-Service-Tenant")
	case 1:
		r.Header.Set("X-Service-Api-Key", a.keys["viewer"])
	case 2:
		r.Header.Set("X-Service-Api-Key", a.keys["device"])
	case 3:
		r.Header.Set("X-Service-Api-Key", a.keys["operator"])
	case 4:
		r.Header.Set("X-Service-Api-Key", a.keys["admin"])
	case 5:
		r.Header.Set("X-Service-Tenant", "other")
		r.Header.Set("X-Service-Api-Key", a.keys["other"])
	case 6:
		r.Header.Set("X-Service-Api-Key", "fk_wrong")
	}
	w := httptest.NewRecorder()
	a.h.ServeHTTP(w, r)
	return w, true
}

func validMethod(m string) bool {
	if m == "" || len(m) > 16 {
		return false
	}
	for _, c := range m {
		if !(c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return true
}

// FuzzHTTP sends arbitrary requests through the whole API, in process, on
// a real store: no answer may be a 5xx, and nothing may panic (the
// handler recovers a panic into a 500, so that is caught too).
func FuzzHTTP(f *testing.F) {
	ct := "Content-Type: application/json"
	seeds := []struct {
		method, target, header, body string
		who                          byte
	}{
		{"GET", "/api/v1/devices?search=d&metadata.site=x&page=1&limit=5", "", "", 1},
		{"POST", "/api/v1/devices", ct, `{"id": "d2", "metadata": {"a": "b"}}`, 3},
		{"POST", "/api/v1/devices/bulk", ct, `{"devices": [{"id": "b1"}, {"id": "b2"}]}`, 3},
		{"PATCH", "/api/v1/devices/d1", ct, `{"metadata": {"a": null, "b": "c"}}`, 4},
		{"POST", "/api/v1/devices/d1/token", "", "", 3},
		{"POST", "/api/v1/devices/d1/certificate", "", "", 3},
		{"POST", "/api/v1/devices/d1/uplink-config", "", "", 3},
		{"DELETE", "/api/v1/devices/zz", "", "", 4},
		{"POST", "/api/v1/actions", ct, `{"action": "reboot", "params": {}, "search_type": "default", "device_ids": ["d1"], "timeout": 60}`, 3},
		{"POST", "/mock/api/v1/actions", "Content-Type: application/edn", `{:action "x" :params {} :search_type "all"}`, 3},
		{"POST", "/api/v1/actions", "Content-Type: application/transit+json", `["^ ","~:action","x","~:params",["^ "],"~:search_type","metadata","~:search_key","site","~:search_query","x"]`, 4},
		{"GET", "/api/v1/actions?page=2", "Accept: application/edn", "", 1},
		{"GET", "/api/v1/actions/1/devices?action_status=Queued", "", "", 1},
		{"POST", "/api/v1/actions/1/cancel", "", "", 3},
		{"GET", "/api/v1/devices/d1/actions?sort_by=errors&sort_order=asc", "Accept: application/transit+msgpack", "", 1},
		{"POST", "/api/v1/devices/action/status", ct, `{"device_id": "d1", "action_id": "1", "state": "Running", "progress": "50"}`, 2},
		{"POST", "/api/v1/devices/d1/streams/env", ct, `[{"timestamp": 1795341600000, "temp": 81}]`, 2},
		{"GET", "/api/v1/devices/d1/streams/env/latest", "", "", 1},
		{"GET", "/api/v1/devices/d1/streams/env/points?order=desc&limit=2&from=2026-11-21T10:00:00Z", "Accept: application/transit+json", "", 1},
		{"GET", "/api/v1/devices/d1/streams/env/aggregate?field=temp&fn=max&interval=1m", "Accept: application/edn", "", 1},
		{"GET", "/api/v1/streams/env/aggregate?field=temp&metadata.site=x&by=device", "Accept: application/transit+msgpack", "", 1},
		{"GET", "/api/v1/devices/d1/logs?level=warn&q=x&limit=3", "", "", 1},
		{"PUT", "/api/v1/tenants/acme/stream-retention", ct, `{"retention_seconds": 86400}`, 4},
		{"POST", "/api/v1/alert-rules", ct, `{"name": "hot", "stream": "env", "condition": {"all": [{"field": "temp", "operator": ">", "value": 80}, {"not": {"no_data_seconds": 5}}]}}`, 3},
		{"POST", "/api/v1/alert-rules/00000000-0000-0000-0000-000000000000/alert-notification-rules", ct, `{"channel_parameters": {"type": "webhook", "url": "https://x.example.com"}, "notification_template": {"subject": "{{.Event}}"}}`, 3},
		{"PUT", "/api/v1/alert-rules/00000000-0000-0000-0000-000000000000/alert-notification-rules/00000000-0000-0000-0000-000000000001", ct, `{"interval_seconds": 5}`, 3},
		{"GET", "/api/v1/alerts?state=active&rule_id=00000000-0000-0000-0000-000000000000", "", "", 1},
		{"POST", "/api/v1/firmware-bundles", ct, `{"version": "1.0.0", "file_name": "fw.tar"}`, 3},
		{"PUT", "/api/v1/firmware-bundles/id/00000000-0000-0000-0000-000000000000", ct, `{"checksum": "ab", "content_length": 1, "uncompressed_size": 1}`, 3},
		{"PUT", "/api/v1/firmware-bundles/id/00000000-0000-0000-0000-000000000000/file", "Content-Type: application/octet-stream", "\x1f\x8b", 3},
		{"POST", "/api/v1/firmware-bundles", "Content-Type: multipart/form-data; boundary=x", "--x\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\nabc\r\n--x--\r\n", 3},
		{"GET", "/api/v1/firmware-bundles/id/00000000-0000-0000-0000-000000000000/artifact?tenant=acme&expires=1&signature=x", "Range: bytes=0-1", "", 0},
		{"PUT", "/api/v1/firmwares/component/app/1.0.0", ct, `{"is_deactivated": true}`, 3},
		{"PUT", "/api/v1/tenants/acme/auth", ct, `{"method": "webhook", "webhook_url": "http://127.0.0.1:1/x"}`, 4},
		{"POST", "/api/v1/apikeys", ct, `{"name": "n", "role": "viewer"}`, 4},
		{"GET", "/api/v1/audit-logs?since=2026-01-01T00:00:00Z", "", "", 4},
		{"GET", "/metrics", "", "", 0},
		{"OPTIONS", "/api/v1/devices", "", "", 1},
		{"GET", "/api/v1/devices", "Authorization: Bearer a.b.c", "", 0},
	}
	for _, s := range seeds {
		f.Add(s.method, s.target, s.header, []byte(s.body), s.who)
	}
	a := newAPI(f)
	f.Fuzz(func(t *testing.T, method, target, header string, body []byte, who byte) {
		w, ok := a.serve(method, target, header, body, who)
		if !ok {
			return
		}
		if w.Code >= 500 {
			t.Fatalf("%s %s (%q, who %d) answered %d: %s", method, target, header, who, w.Code, w.Body)
		}
	})
}

// TestFuzzSeedsReachHandlers checks that the seeds get past routing and
// authentication, so the fuzzer starts from requests that exercise
// handlers rather than 401s and 404s.
func TestFuzzSeedsReachHandlers(t *testing.T) {
	a := newAPI(t)
	for _, tc := range []struct {
		method, target, header, body string
		who                          byte
		want                         int
	}{
		{"GET", "/api/v1/devices", "", "", 1, 200},
		{"POST", "/api/v1/devices", "Content-Type: application/json", `{"id": "x1"}`, 3, 201},
		{"POST", "/api/v1/devices/d1/certificate", "", "", 3, 201},
		{"GET", "/api/v1/devices", "", "", 5, 200},
		{"GET", "/api/v1/devices/d1", "", "", 5, 404},
		{"GET", "/api/v1/devices", "", "", 6, 401},
		{"POST", "/api/v1/devices", "Content-Type: text/plain", "x", 3, 415},
	} {
		w, ok := a.serve(tc.method, tc.target, tc.header, []byte(tc.body), tc.who)
		if !ok || w.Code != tc.want {
			t.Errorf("%s %s as %d: %v %d, want %d: %s", tc.method, tc.target, tc.who, ok, w.Code, tc.want, w.Body)
		}
	}
}
