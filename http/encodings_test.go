package fleethttp_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/fleetd/fleet/codec"
	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// encoder writes a request body in one encoding.
type encoder struct {
	name        string
	contentType string
	encode      func(t *testing.T, body any) []byte
}

// encoders are fleetd's own four writers and, where Node and the pinned
// packages of codec/testdata/independent are installed (CI installs them),
// two independent ones: transit-js and edn-data, which write maps with
// keyword keys as a Clojure or ClojureScript client would.
func encoders(t *testing.T) []encoder {
	var es []encoder
	for _, f := range codec.Formats {
		es = append(es, encoder{f.String(), f.ContentType(), func(t *testing.T, body any) []byte {
			b, err := codec.Marshal(f, body)
			if err != nil {
				t.Fatalf("encode %s: %v", f, err)
			}
			return b
		}})
	}
	dir, _ := filepath.Abs("../codec/testdata/independent")
	if _, err := os.Stat(filepath.Join(dir, "node_modules")); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI must install the independent encoders: npm ci --prefix codec/testdata/independent")
		}
		t.Log("independent encoders not installed; run npm ci --prefix codec/testdata/independent")
		return es
	}
	independent := func(t *testing.T, body any, which string) []byte {
		in, _ := json.Marshal([]any{body})
		cmd := exec.Command("node", "encode.js")
		cmd.Dir = dir
		cmd.Stdin = strings.NewReader(string(in))
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("node encode.js: %v", err)
		}
		var encoded []map[string]string
		if err := json.Unmarshal(out, &encoded); err != nil {
			t.Fatal(err)
		}
		return []byte(encoded[0][which])
	}
	return append(es,
		encoder{"transit-js", "application/transit+json", func(t *testing.T, body any) []byte { return independent(t, body, "transit") }},
		encoder{"edn-data", "application/edn", func(t *testing.T, body any) []byte { return independent(t, body, "edn") }},
	)
}

// bodyCase is one endpoint that takes a body. Paths and bodies may name
// {m} (unique per encoding) and whatever setup returns; read is the GET
// whose answer shows what was stored ("" to compare the answer itself,
// "Location" to follow the Location header).
type bodyCase struct {
	route  string
	setup  func(t *testing.T, s *fleetdtest.Server, v vars)
	path   string
	body   func(v vars) any
	status int
	read   string
}

type vars map[string]string

var varPattern = regexp.MustCompile(`\{[a-z]+\}`)

func (v vars) fill(s string) string {
	return varPattern.ReplaceAllStringFunc(s, func(p string) string {
		if x, ok := v[p[1:len(p)-1]]; ok {
			return x
		}
		return p
	})
}

// normalize makes what two encodings stored comparable: it forgets what is
// rightly different (ids, secrets, times) and the per-encoding names.
func (v vars) normalize(t *testing.T, b []byte) string {
	var x any
	if err := json.Unmarshal(b, &x); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	x = forget(x)
	out, _ := json.Marshal(x)
	s := string(out)
	keys := make([]string, 0, len(v))
	for k := range v {
		if k != "n" { // too short to replace safely; bodies use it only inside longer values
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return len(v[keys[i]]) > len(v[keys[j]]) })
	for _, k := range keys {
		s = strings.ReplaceAll(s, v[k], "<"+k+">")
	}
	return s
}

var forgotten = map[string]bool{"id": true, "token": true, "key": true, "created_at": true, "updated_at": true,
	"last_seen_at": true, "action_id": true, "url": true, "expires_at": true, "serial": true, "received_at": true,
	"started_at": true, "ended_at": true, "desired_updated_at": true, "reported_updated_at": true}

func forget(x any) any {
	switch x := x.(type) {
	case map[string]any:
		for k, e := range x {
			if forgotten[k] {
				delete(x, k)
			} else {
				x[k] = forget(e)
			}
		}
	case []any:
		for i, e := range x {
			x[i] = forget(e)
		}
	}
	return x
}

// TestEveryEndpointTakesEveryEncoding sends each endpoint that takes a body
// the same body in every encoding and checks that each stored exactly what
// its JSON twin stored. A new endpoint with a body is one more line here.
func TestEveryEndpointTakesEveryEncoding(t *testing.T) {
	t.Parallel()
	device := func(id string) func(t *testing.T, s *fleetdtest.Server, v vars) {
		return func(t *testing.T, s *fleetdtest.Server, v vars) {
			s.MustDevice(t, s.Admin(), v.fill(id), map[string]string{"a": "1", "b": "2"})
			v["dev"] = v.fill(id)
		}
	}
	dispatched := func(t *testing.T, s *fleetdtest.Server, v vars) {
		device("st-{m}")(t, s, v)
		v["action"] = fmt.Sprint(s.Dispatch(t, s.Admin(), map[string]any{"action": "reboot", "params": map[string]any{}, "search_type": "default", "device_ids": []string{v["dev"]}}))
	}
	pending := func(t *testing.T, s *fleetdtest.Server, v vars) {
		var b struct{ ID string }
		v["ver"] = "2.0." + v["n"]
		s.Do(t, s.Admin(), "POST", "/api/v1/firmware-bundles", map[string]any{"version": v["ver"], "file_name": "fw.tar.gz"}).Want(t, 201).Decode(t, &b)
		v["bundle"] = b.ID
	}
	component := func(t *testing.T, s *fleetdtest.Server, v vars) {
		v["comp"] = "comp-" + v["m"]
		s.MustUpload(t, s.Admin(), fleetdtest.MakeBundle(t, "3.0."+v["n"], fleetdtest.Part{Name: v["comp"], Version: "1.0.0", Body: "firmware"}))
	}
	rule := func(t *testing.T, s *fleetdtest.Server, v vars) {
		v["rule"] = s.MustAlertRule(t, s.Admin(), map[string]any{"name": "r-" + v["c"] + "-" + v["m"], "stream": "temp",
			"condition": map[string]any{"field": "t", "operator": ">", "value": 1}}).ID
	}
	notification := func(t *testing.T, s *fleetdtest.Server, v vars) {
		rule(t, s, v)
		// S3 answers with its Location alone, as a seed endpoint.
		loc := s.Do(t, s.Admin(), "POST", "/api/v1/alert-rules/"+v["rule"]+"/alert-notification-rules", map[string]any{
			"channel_parameters": map[string]any{"type": "webhook", "url": "https://hooks.example.com/x"}}).Want(t, 201).Header.Get("Location")
		v["notification"] = loc[strings.LastIndex(loc, "/")+1:]
	}
	dispatch := func(v vars) any {
		return map[string]any{"action": "configure", "search_type": "default", "device_ids": []string{v["dev"]}, "timeout": 600,
			"params":   map[string]any{"delay": 5, "ratio": 2.5, "why": "test", "nested": map[string]any{"list": []any{1, "x", true, nil}}},
			"metadata": map[string]any{"ticket": "T-1"}, "search_key": "string", "search_query": "string"}
	}
	rollout := func(t *testing.T, s *fleetdtest.Server, v vars) {
		device("ap-{m}")(t, s, v)
		s.MustDevice(t, s.Admin(), v.fill("ap2-{m}"), nil)
		v["dev2"] = v.fill("ap2-{m}")
		v["action"] = fmt.Sprint(s.Dispatch(t, s.Admin(), map[string]any{"action": "reboot", "params": map[string]any{}, "search_type": "default", "device_ids": []string{v["dev"]},
			"schedule": map[string]any{"phases": []any{map[string]any{"name": "one", "trigger_on": map[string]any{"type": "manual"},
				"info": map[string]any{"type": "fixed_list", "device_ids": []string{v["dev"]}}}}}}))
	}
	rolloutRule := func(t *testing.T, s *fleetdtest.Server, v vars) {
		var r struct{ ID string }
		s.Do(t, s.Admin(), "POST", "/api/v1/rollout-notification-rules", map[string]any{
			"channel_parameters": map[string]any{"type": "webhook", "url": "https://hooks.example.com/" + v["m"]}}).Want(t, 201).Decode(t, &r)
		v["rrule"] = r.ID
	}
	cases := []bodyCase{
		{"POST /api/v1/devices", nil, "/api/v1/devices", func(v vars) any {
			return map[string]any{"id": "dev-" + v["m"], "metadata": map[string]any{"site": "Berlin", "ü": "ß"}}
		}, 201, "/api/v1/devices/dev-{m}"},
		{"POST /api/v1/devices/bulk", nil, "/api/v1/devices/bulk", func(v vars) any {
			return map[string]any{"devices": []any{map[string]any{"id": "bulk-" + v["m"] + "-1", "metadata": map[string]any{"k": "v"}}, map[string]any{"id": "bulk-" + v["m"] + "-2"}}}
		}, 201, "/api/v1/devices?search=bulk-{m}"},
		{"PATCH /api/v1/devices/{id}", device("patch-{m}"), "/api/v1/devices/{dev}", func(v vars) any {
			return map[string]any{"metadata": map[string]any{"a": "9", "b": nil, "c": "3"}}
		}, 204, "/api/v1/devices/{dev}"},
		{"PATCH /api/v1/devices/{id}/shadow", device("shadow-{m}"), "/api/v1/devices/{dev}/shadow", func(v vars) any {
			return map[string]any{"version": 0, "desired": map[string]any{"rate": 5, "ratio": 2.5, "name": "ü", "on": true,
				"nested": map[string]any{"list": []any{1, "x", true, nil}, "gone": nil}}}
		}, 200, "/api/v1/devices/{dev}/shadow"},
		{"POST /api/v1/groups", nil, "/api/v1/groups", func(v vars) any {
			return map[string]any{"name": "grp-" + v["m"], "selector": "site in (berlin, paris),!retired,reported.fw.version!=2.0", "description": "ü"}
		}, 201, "/api/v1/groups/grp-{m}"},
		{"PUT /api/v1/groups/{name}", func(t *testing.T, s *fleetdtest.Server, v vars) {
			v["grp"] = "put-" + v["m"]
			s.Do(t, s.Admin(), "POST", "/api/v1/groups", map[string]any{"name": v["grp"], "selector": "a"}).Want(t, 201)
		}, "/api/v1/groups/{grp}", func(v vars) any {
			return map[string]any{"selector": "ring=canary", "description": "canaries"}
		}, 204, "/api/v1/groups/{grp}"},
		{"POST /api/v1/apikeys", nil, "/api/v1/apikeys", func(v vars) any {
			return map[string]any{"name": "key-" + v["m"], "role": "viewer", "user_email": "ops@example.com"}
		}, 201, ""},
		{"PUT /api/v1/tenants/{tenant_id}/auth", nil, "/api/v1/tenants/default/auth", func(v vars) any {
			return map[string]any{"method": "webhook", "webhook_url": "https://auth.example.com/" + v["m"], "default_role": "operator"}
		}, 204, "/api/v1/tenants/default/auth"},
		{"POST /mock/api/v1/actions (S1)", device("s1-{m}"), "/mock/api/v1/actions", dispatch, 201, "Location"},
		{"POST /api/v1/actions", device("act-{m}"), "/api/v1/actions", dispatch, 201, "Location"},
		{"POST /api/v1/actions (rollout)", device("ro-{m}"), "/api/v1/actions", func(v vars) any {
			return map[string]any{"action": "update", "params": map[string]any{"v": 2}, "search_type": "default", "device_ids": []string{v["dev"]},
				"schedule": map[string]any{"release_notes": "fixes ü", "end_timestamp": 4102444800000,
					"maintenance_window": map[string]any{"start": "02:00", "end": "05:00", "timezone": "Europe/Berlin"},
					"phases": []any{
						map[string]any{"name": "canary", "trigger_on": map[string]any{"type": "timestamp", "timestamp": 4102444700000},
							"info": map[string]any{"type": "fixed_list", "device_ids": []string{v["dev"]}}},
						map[string]any{"name": "rest", "trigger_on": map[string]any{"type": "after_previous", "wait_seconds": 3600},
							"info": map[string]any{"type": "percentage", "percentage": 100},
							"gate": map[string]any{"max_failure_rate": 0.1, "min_finished": 2}},
					}}}
		}, 201, "Location"},
		{"POST /api/v1/actions/{id}/append_phase", rollout, "/api/v1/actions/{action}/append_phase", func(v vars) any {
			return map[string]any{"name": "late", "trigger_on": map[string]any{"type": "manual"},
				"info": map[string]any{"type": "fixed_list", "device_ids": []string{v["dev2"]}}}
		}, 204, "/api/v1/actions/{action}"},
		{"POST /api/v1/rollout-notification-rules", nil, "/api/v1/rollout-notification-rules", func(v vars) any {
			return map[string]any{"channel_parameters": map[string]any{"type": "email", "to": []any{"release@example.com"}},
				"notification_template": map[string]any{"subject": "{{.Action}} {{.Event}}", "body": "{{.Reason}}"}, "timezone": "Asia/Tokyo",
				"events": []any{"paused", "completed"}}
		}, 201, "Location"},
		{"PUT /api/v1/rollout-notification-rules/{id}", rolloutRule, "/api/v1/rollout-notification-rules/{rrule}", func(v vars) any {
			return map[string]any{"events": []any{"aborted"}, "timezone": "UTC", "notification_template": map[string]any{"subject": "s", "body": "b"}}
		}, 204, "/api/v1/rollout-notification-rules/{rrule}"},
		{"POST /api/v1/devices/action/status (S10)", dispatched, "/api/v1/devices/action/status", func(v vars) any {
			return map[string]any{"device_id": v["dev"], "action_id": v["action"], "state": "Downloading", "progress": 40,
				"errors": []any{"slow link"}, "timestamp": 1763719200000, "sequence": 3}
		}, 204, "/api/v1/devices/{dev}/actions"},
		{"POST /api/v1/devices/{id}/streams/{stream}", device("str-{m}"), "/api/v1/devices/{dev}/streams/temp", func(v vars) any {
			return []any{map[string]any{"timestamp": 1763719200000, "sequence": 1, "temperature": 21.5, "ok": true, "label": "hall"}}
		}, 200, "/api/v1/devices/{dev}/streams/temp/latest"},
		{"POST /api/v1/firmware-bundles (pending)", nil, "/api/v1/firmware-bundles", func(v vars) any {
			v["ver"] = "1.0." + v["n"]
			return map[string]any{"version": v["ver"], "file_name": "fw-" + v["m"] + ".tar.gz"}
		}, 201, ""},
		{"PUT /api/v1/firmware-bundles/id/{id} (S5)", pending, "/api/v1/firmware-bundles/id/{bundle}", func(v vars) any {
			return map[string]any{"uncompressed_size": 1000, "content_length": 500, "checksum": strings.Repeat("ab", 32)}
		}, 204, "/api/v1/firmware-bundles/id/{bundle}"},
		{"PUT /api/v1/firmwares/component/{c}/{v} (S8)", component, "/api/v1/firmwares/component/{comp}/1.0.0", func(v vars) any {
			return map[string]any{"is_deactivated": true, "uncompressed_size": 123,
				"dependencies": []any{map[string]any{"component_name": "boot", "min_version": "1.2.0"}}}
		}, 204, "/api/v1/firmwares/component/{comp}"},
		{"POST /api/v1/alert-rules (S2)", nil, "/api/v1/alert-rules", func(v vars) any {
			return map[string]any{"name": "rule-" + v["m"], "stream": "temp", "group": "plant",
				"condition": map[string]any{"all": []any{
					map[string]any{"field": "temperature", "operator": ">", "value": 80},
					map[string]any{"not": map[string]any{"field": "ok", "operator": "==", "value": true}},
					map[string]any{"any": []any{map[string]any{"no_data_seconds": 300}, map[string]any{"field": "label", "operator": "!=", "value": "x"}}}}},
				"metadata_filters": map[string]any{"site": []any{"a", "b"}, "model": "x1"}, "activation_threshold_seconds": 30, "deactivation_threshold_seconds": 2.5}
		}, 201, "Location"},
		{"POST /api/v1/alert-rules/{id}/alert-notification-rules (S3)", rule, "/api/v1/alert-rules/{rule}/alert-notification-rules", func(v vars) any {
			return map[string]any{"channel_parameters": map[string]any{"type": "email", "to": []any{"ops@example.com", "oncall@example.com"}},
				"interval_seconds": 60, "notification_template": map[string]any{"subject": "{{.Rule.Name}} on {{.Alert.DeviceID}}", "body": "hot"}, "timezone": "Europe/Berlin"}
		}, 201, "/api/v1/alert-rules/{rule}/alert-notification-rules"},
		{"PUT /api/v1/alert-rules/{id}/alert-notification-rules/{id} (S4)", notification, "/api/v1/alert-rules/{rule}/alert-notification-rules/{notification}", func(v vars) any {
			return map[string]any{"interval_seconds": 120, "timezone": "Asia/Tokyo", "notification_template": map[string]any{"subject": "s", "body": "b"}}
		}, 204, "/api/v1/alert-rules/{rule}/alert-notification-rules"},
	}

	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		// Every case writes once per encoding, faster than a key's default
		// rate on a quiet machine: this test is not about rate limits.
		s := fleetdtest.Start(t, b, "--rate-limit", "-1", "--smtp-addr", "127.0.0.1:1", "--smtp-from", "fleetd@example.com")
		encs := encoders(t)
		for i, c := range cases {
			t.Run(c.route, func(t *testing.T) {
				var twin string
				for n, enc := range encs {
					v := vars{"m": fmt.Sprintf("enc%d", n), "n": fmt.Sprint(n), "c": fmt.Sprintf("case%d", i)}
					if c.setup != nil {
						c.setup(t, s, v)
					}
					r := s.Send(t, fleetdtest.Req{Method: strings.Fields(c.route)[0], Path: v.fill(c.path), Creds: s.Admin(),
						Raw: enc.encode(t, c.body(v)), ContentType: enc.contentType})
					if r.Status != c.status {
						t.Fatalf("%s: status %d, want %d: %s", enc.name, r.Status, c.status, r.Body)
					}
					stored := r.Body
					switch c.read {
					case "":
					case "Location":
						loc := r.Header.Get("Location")
						stored = s.Do(t, s.Admin(), "GET", loc[strings.Index(loc, "/api/"):], nil).Want(t, 200).Body
					default:
						stored = s.Do(t, s.Admin(), "GET", v.fill(c.read), nil).Want(t, 200).Body
					}
					got := v.normalize(t, stored)
					if n == 0 {
						twin = got
					} else if got != twin {
						t.Fatalf("%s stored something else than its JSON twin:\n%s: %s\njson: %s", enc.name, enc.name, got, twin)
					}
				}
			})
		}
	})
}
