package codec_test

import (
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/fleetd/fleet/codec"
	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestClojureClient drives fleetd as a Clojure client does
// (docs/encodings.md#what-a-clojure-client-should-expect): bodies exactly as
// Clojure's printer writes them (pr-str; namespaced maps, doubles such as
// 1.0E10 and 3.5517595525155558E17), answers read back in all four
// encodings. Numbers keep their type and value from the request to the store
// to every answer and to the device; every UUID-valued field is a UUID in
// EDN and Transit; S1's empty 201 has no Content-Type for clj-http's
// :as :auto to trip on.
func TestClojureClient(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		admin := s.Admin()
		dev := s.MustDevice(t, admin, "pump-1", nil)
		d := s.ConnectDevice(t, "default", "pump-1", dev.Token)
		edn := func(method, path, body string, status int) *fleetdtest.Response {
			t.Helper()
			return s.Send(t, fleetdtest.Req{Method: method, Path: path, Creds: admin, Raw: []byte(body), ContentType: "application/edn"}).Want(t, status)
		}
		// read returns the canonical value of path's answer in format f.
		read := func(f codec.Format, path string) map[string]any {
			t.Helper()
			r := s.Send(t, fleetdtest.Req{Method: "GET", Path: path, Creds: admin, Header: http.Header{"Accept": {f.ContentType()}}}).Want(t, 200)
			v, err := codec.Decode(f, r.Body)
			if err != nil {
				t.Fatalf("%s in %v: %v\n%s", path, f, err, r.Body)
			}
			return v.(map[string]any)
		}
		same := func(what string, f codec.Format, got, want any) {
			t.Helper()
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s in %v = %#v, want %#v", what, f, got, want)
			}
		}

		// S1, as pr-str writes it.
		r := edn("POST", "/mock/api/v1/actions", `{:action "configure", :params {:ratio 80.0, :e 1.0E10, :big 3.5517595525155558E17, :n 80, :neg -0.5, :html "a<b&c", :fw #:firmware{:version "2.3.0"}}, :metadata #:ticket{:id 42, :weight 1.0}, :search_type :default, :device_ids ["pump-1"]}`, 201)
		if ct := r.Header.Get("Content-Type"); ct != "" || len(r.Body) != 0 {
			t.Errorf("S1's 201: Content-Type %q and %d bytes, want neither", ct, len(r.Body))
		}
		action := strings.TrimPrefix(r.Header.Get("Location"), s.URL)
		const sent = `{"big":3.551759552515556e+17,"e":10000000000.0,"fw":{"firmware/version":"2.3.0"},"html":"a<b&c","n":80,"neg":-0.5,"ratio":80.0}`
		if m := d.Next(t); m.Payload != sent {
			t.Errorf("the device received params %s, want %s", m.Payload, sent)
		}
		wantParams := map[string]any{"big": 3.551759552515556e17, "e": 1e10, "fw": map[string]any{"firmware/version": "2.3.0"},
			"html": "a<b&c", "n": int64(80), "neg": -0.5, "ratio": 80.0}
		wantMeta := map[string]any{"ticket/id": int64(42), "ticket/weight": 1.0}
		for _, f := range codec.Formats {
			a := read(f, action)
			same("the action's params", f, a["params"], wantParams)
			same("the action's metadata", f, a["metadata"], wantMeta)
			das := read(f, "/api/v1/devices/pump-1/actions")["device_actions"].([]any)
			same("S7's params", f, das[0].(map[string]any)["params"], sent)
		}

		// S2 and a data point with doubles.
		r = edn("POST", "/api/v1/alert-rules", `#:alert{:_/name "hot", :_/stream "heat", :_/condition {:field "temp", :operator ">", :value 80.0}}`, 201)
		if ct := r.Header.Get("Content-Type"); ct != "" || len(r.Body) != 0 {
			t.Errorf("S2's 201: Content-Type %q and %d bytes, want neither", ct, len(r.Body))
		}
		rule := strings.TrimPrefix(r.Header.Get("Location"), s.URL)
		edn("POST", "/api/v1/devices/pump-1/streams/heat", `[{:timestamp 1795255200123, :temp 80.5, :level 1.0E10, :count 3}]`, 200)
		for _, f := range codec.Formats {
			same("the condition", f, read(f, rule)["condition"], map[string]any{"field": "temp", "operator": ">", "value": 80.0})
			same("the latest point", f, read(f, "/api/v1/devices/pump-1/streams/heat/latest")["data"],
				map[string]any{"temp": 80.5, "level": 1e10, "count": int64(3)})
		}
		var alertID string
		fleetdtest.Eventually(t, "the alert to open", func() bool {
			alerts := read(codec.JSON, "/api/v1/alerts")["alerts"].([]any)
			if len(alerts) == 1 {
				alertID = alerts[0].(map[string]any)["id"].(string)
			}
			return alertID != ""
		})
		edn("POST", rule+"/alert-notification-rules", `{:channel_parameters {:type "webhook", :url "https://hooks.example.com/fleet"}}`, 201)
		edn("POST", "/api/v1/rollout-notification-rules", `{:channel_parameters {:type "webhook", :url "https://hooks.example.com/rollouts"}}`, 201)

		// Every UUID-valued field is a UUID.
		for _, path := range []string{"/api/v1/alert-rules", rule, rule + "/alert-notification-rules", "/api/v1/alerts",
			"/api/v1/alerts/" + alertID, "/api/v1/rollout-notification-rules"} {
			for _, f := range []codec.Format{codec.EDN, codec.TransitJSON, codec.TransitMsgpack} {
				r := s.Send(t, fleetdtest.Req{Method: "GET", Path: path, Creds: admin, Header: http.Header{"Accept": {f.ContentType()}}}).Want(t, 200)
				v, err := readFull(f, r.Body)
				if err != nil {
					t.Fatalf("%s in %v: %v", path, f, err)
				}
				uuids := 0
				walkValues(v, "", func(at string, x any) {
					switch x := x.(type) {
					case uuid.UUID:
						uuids++
					case string:
						if _, err := uuid.Parse(x); err == nil && len(x) == 36 {
							t.Errorf("%s in %v: %s is the string %q, want a UUID", path, f, at, x)
						}
					}
				})
				if uuids == 0 {
					t.Errorf("%s in %v holds no UUID", path, f)
				}
			}
		}
	})
}

// readFull reads an answer in full fidelity: UUIDs stay UUIDs.
func readFull(f codec.Format, b []byte) (any, error) {
	switch f {
	case codec.EDN:
		return codec.ReadEDN(b)
	case codec.TransitJSON:
		return codec.ReadTransitJSON(b)
	case codec.TransitMsgpack:
		return codec.ReadTransitMsgpack(b)
	}
	return codec.Decode(f, b)
}

// walkValues calls visit with every value in v and its path.
func walkValues(v any, at string, visit func(at string, v any)) {
	visit(at, v)
	switch v := v.(type) {
	case []any:
		for i, x := range v {
			walkValues(x, fmt.Sprintf("%s[%d]", at, i), visit)
		}
	case *codec.Map:
		for _, e := range v.Entries {
			walkValues(e.Value, fmt.Sprintf("%s.%v", at, e.Key), visit)
		}
	}
}
