package fleethttp_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/remote"
)

// The isolation matrix and the bad-input corpus share this description of
// every endpoint: what it needs (prepare makes fresh resources when a
// request would consume them) and who may call it. Both suites read the
// endpoint list from the served OpenAPI document and fail on an endpoint
// missing here, so a new endpoint cannot go untested.

// world is one tenant's seeded fleet: a resource of every kind, each
// carrying the tenant's marker where a string may carry one, so that a
// leak to another tenant shows in any answer.
type world struct {
	name   string // the tenant
	admin  fleetdtest.Creds
	mark   string // in metadata, names, params, data, file names: never in a path
	device string // ids: may be echoed in another tenant's 404s for its own requests
	stream string

	action           int64
	bundleID         string
	bundleVersion    string
	component        string
	componentVersion string
	ruleID           string
	notificationID   string
	alertID          string
	rolloutRuleID    string
	s9               map[string]any // its end users' configuration
}

var uniq atomic.Int64

// fresh returns a name not used before in this test process.
func fresh(prefix string) string { return fmt.Sprintf("%s-%d", prefix, uniq.Add(1)) }

// seed fills a tenant with one of everything.
//
// Action ids count per tenant, and bundle versions are per tenant too: a
// tenant seeded with skip earlier actions and version major has ids the
// other tenant's seed does not, so that a 404 is what isolation answers
// rather than the other tenant's own resource of the same id.
func seed(t *testing.T, s *fleetdtest.Server, admin fleetdtest.Creds, mark, hookURL string, idp *fleetdtest.IdentityProvider, skip, major int) *world {
	t.Helper()
	w := &world{name: admin.Tenant, admin: admin, mark: mark, stream: "env"}
	w.device = admin.Tenant + "-dev-1"
	s.MustDevice(t, admin, w.device, map[string]string{"owner": mark})
	s.MustDevice(t, admin, admin.Tenant+"-dev-2", map[string]string{"owner": mark})
	for range skip {
		s.Dispatch(t, admin, map[string]any{"action": "skip", "params": map[string]any{}, "search_type": "default", "device_ids": []string{w.device}})
	}
	w.action = s.Dispatch(t, admin, map[string]any{"action": "reboot-" + mark, "params": map[string]any{"note": mark},
		"metadata": map[string]any{"why": mark}, "search_type": "default", "device_ids": []string{w.device}})
	s.Do(t, admin, "POST", "/api/v1/devices/action/status", map[string]any{"device_id": w.device, "action_id": w.action,
		"state": "Running", "progress": 5, "errors": []string{"err-" + mark}}).Want(t, 204)

	w.bundleVersion = fmt.Sprintf("%d.2.3", major)
	w.component, w.componentVersion = "app-"+strings.ToLower(admin.Tenant), w.bundleVersion
	b := s.MustUpload(t, admin, fleetdtest.MakeBundle(t, w.bundleVersion, fleetdtest.Part{Name: w.component, Version: w.componentVersion, Body: "firmware of " + mark}))
	w.bundleID = b.ID

	rule := s.MustAlertRule(t, admin, map[string]any{"name": "hot-" + mark, "group": mark, "stream": w.stream,
		"condition": map[string]any{"field": "temp", "operator": ">", "value": 80}, "metadata_filters": map[string]any{"owner": mark}})
	w.ruleID = rule.ID
	var nr struct{ ID string }
	s.Send(t, fleetdtest.Req{Method: "POST", Path: "/api/v1/alert-rules/" + rule.ID + "/alert-notification-rules", Creds: admin,
		Header: http.Header{"Prefer": {"return=representation"}},
		Body: map[string]any{"channel_parameters": map[string]any{"type": "webhook", "url": hookURL + "/" + mark, "secret": "s-" + mark},
			"notification_template": map[string]any{"subject": "subject " + mark}}}).Want(t, 201).Decode(t, &nr)
	w.notificationID = nr.ID
	s.Do(t, admin, "POST", "/api/v1/devices/"+w.device+"/streams/"+w.stream,
		[]map[string]any{{"timestamp": time.Now().UnixMilli(), "temp": 90, "label": mark}}).Want(t, 200)
	fleetdtest.Eventually(t, admin.Tenant+"'s alert", func() bool {
		if as := s.Alerts(t, admin, "?rule_id="+rule.ID); len(as) > 0 {
			w.alertID = as[0].ID
		}
		return w.alertID != ""
	})
	var rr struct{ ID string }
	s.Do(t, admin, "POST", "/api/v1/rollout-notification-rules", map[string]any{
		"channel_parameters":    map[string]any{"type": "webhook", "url": hookURL + "/rollouts-" + mark, "secret": "s-" + mark},
		"notification_template": map[string]any{"subject": "rollout " + mark}}).Want(t, 201).Decode(t, &rr)
	w.rolloutRuleID = rr.ID
	s.Do(t, admin, "POST", "/api/v1/apikeys", map[string]any{"name": "k-" + mark, "role": "viewer", "user_email": "ops@" + strings.ToLower(mark) + ".example.com"}).Want(t, 201)
	w.s9 = map[string]any{"method": "jwks", "jwks_url": idp.Server.URL, "issuer": "https://id.example.com", "audience": "fleetd", "default_role": "viewer"}
	s.Do(t, admin, "PUT", "/api/v1/tenants/"+admin.Tenant+"/auth", w.s9).Want(t, 204)
	return w
}

// endpoint is what the suites know of one operation.
type endpoint struct {
	// perm: public, read, device (device data), operate, remote, admin,
	// artifact (public route, any reading key or a signed URL), or ddi
	// (public route, a device token or a key that reports device data).
	perm string
	// prepare returns a request target of w (path and query) and a valid
	// body, nil for none; it may make fresh resources with w.admin.
	prepare func(t *testing.T, s *fleetdtest.Server, w *world) (target string, body any)
	// other is the answer to another tenant's admin key: 0 means 404 (the
	// target is w's resource); collections answer in the caller's tenant.
	other int
	// lenient names body fields that take more than one type (the corpus
	// does not send them "the wrong type").
	lenient []string
	// rawBody marks endpoints whose body is a file, not an encoded value.
	rawBody bool
	// quiet marks the seed's creates (S1-S3): their 201 has an empty body
	// unless the client sends Prefer: return=representation. Every other
	// create answers with the resource (docs/api.md#responses).
	quiet bool
}

// recordings are the recorded sessions' paths, by server and tenant.
var recordings sync.Map

// recordingOf returns the path of a recording of w's tenant, made once: a
// real fleetd-agent runs a command in a session the tenant records.
func recordingOf(t *testing.T, s *fleetdtest.Server, w *world) (string, any) {
	key := s.URL + " " + w.name
	if p, ok := recordings.Load(key); ok {
		return p.(string), nil
	}
	s.Do(t, w.admin, "PUT", "/api/v1/tenants/"+w.name+"/remote-settings", map[string]any{"recording": true}).Want(t, 204)
	d := s.MustDevice(t, w.admin, fresh(w.name+"-rec"), nil)
	a := s.StartAgent(t, fleetdtest.BuildAgent(t), d.ID, d.Token, "--remote", "--tenant", w.name)
	fleetdtest.Eventually(t, "the agent to connect", func() bool { return strings.Contains(a.Output.String(), "level=INFO msg=connected") })
	var sess fleet.RemoteSession
	s.Do(t, w.admin, "POST", "/api/v1/devices/"+d.ID+"/remote-sessions", map[string]any{"kind": "shell", "target": "echo " + w.mark}).Want(t, 201).Decode(t, &sess)
	conn, err := remote.Dial(context.Background(), s.URL+"/api/v1/remote-sessions/"+sess.ID+"/operator",
		http.Header{"X-Service-Tenant": {w.admin.Tenant}, "X-Service-Api-Key": {w.admin.Key}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for {
		_, ctl, err := conn.Read()
		if err != nil {
			t.Fatalf("the recorded command's session ended without its exit: %v", err)
		}
		if ctl != nil && ctl.Type == remote.TypeExit {
			break
		}
	}
	p := "/api/v1/devices/" + d.ID + "/remote-sessions/" + sess.ID + "/recording"
	fleetdtest.Eventually(t, "the recording to be stored", func() bool {
		return s.Do(t, w.admin, "GET", p, nil).Status == http.StatusOK
	})
	recordings.Store(key, p)
	return p, nil
}

// groupOf makes a fresh group of w's tenant and returns its path.
func groupOf(t *testing.T, s *fleetdtest.Server, w *world) (string, any) {
	name := fresh(w.name + "-g")
	s.Do(t, w.admin, "POST", "/api/v1/groups", map[string]any{"name": name, "selector": "k=v"}).Want(t, 201)
	return "/api/v1/groups/" + name, nil
}

func static(target string) func(*testing.T, *fleetdtest.Server, *world) (string, any) {
	return func(*testing.T, *fleetdtest.Server, *world) (string, any) { return target, nil }
}

// endpoints, by "METHOD /pattern" as the OpenAPI document names them.
var endpoints = map[string]endpoint{
	"GET /healthz":             {perm: "public", prepare: static("/healthz")},
	"GET /readyz":              {perm: "public", prepare: static("/readyz")},
	"GET /metrics":             {perm: "public", prepare: static("/metrics")},
	"GET /api/v1/openapi.json": {perm: "public", prepare: static("/api/v1/openapi.json")},
	"GET /api/v1/devices":      {perm: "read", other: 200, prepare: static("/api/v1/devices?search=dev&limit=100")},
	"GET /api/v1/devices/{id}": {perm: "read", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/devices/" + w.device, nil
	}},
	"POST /api/v1/devices": {perm: "operate", other: 201, prepare: func(*testing.T, *fleetdtest.Server, *world) (string, any) {
		return "/api/v1/devices", map[string]any{"id": fresh("d"), "metadata": map[string]any{"k": "v"}}
	}},
	"POST /api/v1/devices/bulk": {perm: "operate", other: 201, prepare: func(*testing.T, *fleetdtest.Server, *world) (string, any) {
		return "/api/v1/devices/bulk", map[string]any{"devices": []any{map[string]any{"id": fresh("b")}}}
	}},
	"PATCH /api/v1/devices/{id}": {perm: "operate", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/devices/" + w.device, map[string]any{"metadata": map[string]any{"patched": "yes"}}
	}},
	"DELETE /api/v1/devices/{id}": {perm: "operate", prepare: func(t *testing.T, s *fleetdtest.Server, w *world) (string, any) {
		id := fresh(w.name + "-gone")
		s.MustDevice(t, w.admin, id, nil)
		return "/api/v1/devices/" + id, nil
	}},
	"POST /api/v1/devices/{id}/token": {perm: "operate", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/devices/" + w.name + "-dev-2/token", nil
	}},
	"GET /api/v1/devices/{id}/shadow": {perm: "read", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/devices/" + w.device + "/shadow", nil
	}},
	"PATCH /api/v1/devices/{id}/shadow": {perm: "operate", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/devices/" + w.device + "/shadow", map[string]any{"desired": map[string]any{"mode": fresh("m")}}
	}},
	"POST /api/v1/groups": {perm: "operate", other: 201, prepare: func(*testing.T, *fleetdtest.Server, *world) (string, any) {
		return "/api/v1/groups", map[string]any{"name": fresh("g"), "selector": "k=v,reported.fw!=1", "description": "d"}
	}},
	"GET /api/v1/groups":        {perm: "read", other: 200, prepare: static("/api/v1/groups?limit=100")},
	"GET /api/v1/groups/{name}": {perm: "read", prepare: groupOf},
	"GET /api/v1/groups/{name}/devices": {perm: "read", prepare: func(t *testing.T, s *fleetdtest.Server, w *world) (string, any) {
		target, _ := groupOf(t, s, w)
		return target + "/devices", nil
	}},
	"PUT /api/v1/groups/{name}": {perm: "operate", prepare: func(t *testing.T, s *fleetdtest.Server, w *world) (string, any) {
		target, _ := groupOf(t, s, w)
		return target, map[string]any{"selector": "k in (v, w)", "description": "updated"}
	}},
	"DELETE /api/v1/groups/{name}": {perm: "operate", prepare: groupOf},
	"POST /api/v1/devices/{id}/certificate": {perm: "operate", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/devices/" + w.name + "-dev-2/certificate", nil
	}},
	"POST /api/v1/devices/{id}/uplink-config": {perm: "operate", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/devices/" + w.name + "-dev-2/uplink-config", nil
	}},

	"POST /mock/api/v1/actions": {perm: "operate", quiet: true, other: 400, prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/mock/api/v1/actions", map[string]any{"action": "ping", "params": map[string]any{"n": 1}, "search_type": "default", "device_ids": []string{w.device}, "search_key": "string", "search_query": "string"}
	}},
	"POST /api/v1/actions": {perm: "operate", other: 400, prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/actions", map[string]any{"action": "ping", "params": map[string]any{"n": 1}, "search_type": "default", "device_ids": []string{w.device}, "timeout": 60}
	}},
	"GET /api/v1/actions": {perm: "read", other: 200, prepare: static("/api/v1/actions?limit=100")},
	"GET /api/v1/actions/{id}": {perm: "read", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return fmt.Sprintf("/api/v1/actions/%d", w.action), nil
	}},
	"GET /api/v1/actions/{id}/devices": {perm: "read", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return fmt.Sprintf("/api/v1/actions/%d/devices", w.action), nil
	}},
	"POST /api/v1/actions/{id}/cancel": {perm: "operate", prepare: func(t *testing.T, s *fleetdtest.Server, w *world) (string, any) {
		return fmt.Sprintf("/api/v1/actions/%d/cancel", s.Dispatch(t, w.admin, map[string]any{"action": "c", "params": map[string]any{}, "search_type": "default", "device_ids": []string{w.device}})), nil
	}},
	"POST /api/v1/actions/{id}/retry": {perm: "operate", other: 404, prepare: func(t *testing.T, s *fleetdtest.Server, w *world) (string, any) {
		id := s.Dispatch(t, w.admin, map[string]any{"action": "r", "params": map[string]any{}, "search_type": "default", "device_ids": []string{w.device}})
		s.Do(t, w.admin, "POST", "/api/v1/devices/action/status", map[string]any{"device_id": w.device, "action_id": id, "state": "Failed"}).Want(t, 204)
		return fmt.Sprintf("/api/v1/actions/%d/retry", id), map[string]any{"statuses": []string{"Failed"}}
	}},
	"POST /api/v1/actions/{id}/pause": {perm: "operate", prepare: func(t *testing.T, s *fleetdtest.Server, w *world) (string, any) {
		return fmt.Sprintf("/api/v1/actions/%d/pause", rolloutOf(t, s, w)), nil
	}},
	"POST /api/v1/actions/{id}/resume": {perm: "operate", prepare: func(t *testing.T, s *fleetdtest.Server, w *world) (string, any) {
		id := rolloutOf(t, s, w)
		s.Do(t, w.admin, "POST", fmt.Sprintf("/api/v1/actions/%d/pause", id), nil).Want(t, 204)
		return fmt.Sprintf("/api/v1/actions/%d/resume", id), nil
	}},
	"POST /api/v1/actions/{id}/abort": {perm: "operate", prepare: func(t *testing.T, s *fleetdtest.Server, w *world) (string, any) {
		return fmt.Sprintf("/api/v1/actions/%d/abort", rolloutOf(t, s, w)), nil
	}},
	"POST /api/v1/actions/{id}/trigger_next_phase": {perm: "operate", prepare: func(t *testing.T, s *fleetdtest.Server, w *world) (string, any) {
		return fmt.Sprintf("/api/v1/actions/%d/trigger_next_phase", rolloutOf(t, s, w)), nil
	}},
	"POST /api/v1/actions/{id}/append_phase": {perm: "operate", prepare: func(t *testing.T, s *fleetdtest.Server, w *world) (string, any) {
		return fmt.Sprintf("/api/v1/actions/%d/append_phase", rolloutOf(t, s, w)), map[string]any{"name": "more-" + w.mark,
			"trigger_on": map[string]any{"type": "manual"}, "info": map[string]any{"type": "fixed_list", "device_ids": []string{w.name + "-dev-2"}}}
	}},
	"POST /api/v1/rollout-notification-rules": {perm: "operate", other: 201, prepare: func(*testing.T, *fleetdtest.Server, *world) (string, any) {
		return "/api/v1/rollout-notification-rules", map[string]any{"channel_parameters": map[string]any{"type": "webhook", "url": "https://hooks.example.com/r"},
			"notification_template": map[string]any{"subject": "s", "body": "b"}, "timezone": "Europe/Berlin", "events": []string{"paused", "completed"}}
	}},
	"GET /api/v1/rollout-notification-rules": {perm: "read", other: 200, prepare: static("/api/v1/rollout-notification-rules")},
	"GET /api/v1/rollout-notification-rules/{id}": {perm: "read", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/rollout-notification-rules/" + w.rolloutRuleID, nil
	}},
	"PUT /api/v1/rollout-notification-rules/{id}": {perm: "operate", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/rollout-notification-rules/" + w.rolloutRuleID, map[string]any{"timezone": "UTC", "events": []string{"paused"}}
	}},
	"DELETE /api/v1/rollout-notification-rules/{id}": {perm: "operate", prepare: func(t *testing.T, s *fleetdtest.Server, w *world) (string, any) {
		var rr struct{ ID string }
		s.Do(t, w.admin, "POST", "/api/v1/rollout-notification-rules", map[string]any{
			"channel_parameters": map[string]any{"type": "webhook", "url": "https://hooks.example.com/gone"}}).Want(t, 201).Decode(t, &rr)
		return "/api/v1/rollout-notification-rules/" + rr.ID, nil
	}},
	"GET /api/v1/devices/{device_id}/actions": {perm: "read", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/devices/" + w.device + "/actions?sort_by=updated_at&sort_order=asc", nil
	}},
	"POST /api/v1/devices/action/status": {perm: "device", lenient: []string{"action_id", "id", "progress"}, prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/devices/action/status", map[string]any{"device_id": w.device, "action_id": w.action, "state": "Running", "progress": 50, "errors": []string{}, "timestamp": time.Now().UnixMilli(), "sequence": 1}
	}},

	"POST /api/v1/firmware-bundles": {perm: "operate", other: 201, prepare: func(*testing.T, *fleetdtest.Server, *world) (string, any) {
		return "/api/v1/firmware-bundles", map[string]any{"version": fmt.Sprintf("7.0.%d", uniq.Add(1)), "file_name": "fw.tar.gz"}
	}},
	"GET /api/v1/firmware-bundles": {perm: "read", other: 200, prepare: static("/api/v1/firmware-bundles?upload_status=completed")},
	"GET /api/v1/firmware-bundles/id/{id}": {perm: "read", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/firmware-bundles/id/" + w.bundleID, nil
	}},
	"PUT /api/v1/firmware-bundles/id/{id}": {perm: "operate", prepare: func(t *testing.T, s *fleetdtest.Server, w *world) (string, any) {
		id, archive := pendingBundle(t, s, w, true)
		return "/api/v1/firmware-bundles/id/" + id, map[string]any{"checksum": fleetdtest.SHA256Hex(archive), "content_length": len(archive), "uncompressed_size": tarSize(t, archive)}
	}},
	"DELETE /api/v1/firmware-bundles/id/{id}": {perm: "operate", prepare: func(t *testing.T, s *fleetdtest.Server, w *world) (string, any) {
		id, _ := pendingBundle(t, s, w, false)
		return "/api/v1/firmware-bundles/id/" + id, nil
	}},
	"PUT /api/v1/firmware-bundles/id/{id}/file": {perm: "operate", rawBody: true, prepare: func(t *testing.T, s *fleetdtest.Server, w *world) (string, any) {
		id, archive := pendingBundle(t, s, w, false)
		return "/api/v1/firmware-bundles/id/" + id + "/file", archive
	}},
	"GET /api/v1/firmware-bundles/id/{id}/artifact": {perm: "artifact", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/firmware-bundles/id/" + w.bundleID + "/artifact", nil
	}},
	"GET /api/v1/firmware-bundles/version/{version}": {perm: "read", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/firmware-bundles/version/" + w.bundleVersion, nil
	}},
	"PUT /api/v1/firmwares/component/{component_name}/{version_number}": {perm: "operate", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/firmwares/component/" + w.component + "/" + w.componentVersion, map[string]any{"is_deactivated": false}
	}},
	"GET /api/v1/firmwares/component/{component_name}": {perm: "read", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/firmwares/component/" + w.component, nil
	}},

	"POST /api/v1/devices/{id}/streams/{stream}": {perm: "device", rawBody: false, prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/devices/" + w.device + "/streams/" + w.stream, []any{map[string]any{"timestamp": time.Now().UnixMilli(), "sequence": 0, "temp": 20}}
	}},
	"POST /api/v1/devices/{id}/remote-sessions": {perm: "remote", prepare: func(t *testing.T, s *fleetdtest.Server, w *world) (string, any) {
		// A device of its own each time: a device has two sessions at most.
		d := s.MustDevice(t, w.admin, fresh("remote"), nil)
		return "/api/v1/devices/" + d.ID + "/remote-sessions", map[string]any{"kind": "get", "target": "/var/log/" + w.mark}
	}},
	"GET /api/v1/devices/{id}/remote-sessions": {perm: "read", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/devices/" + w.device + "/remote-sessions", nil
	}},
	"GET /api/v1/remote-sessions": {perm: "read", other: 200, prepare: static("/api/v1/remote-sessions?limit=100")},
	"POST /api/v1/devices/{id}/remote-sessions/{sid}/end": {perm: "remote", prepare: func(t *testing.T, s *fleetdtest.Server, w *world) (string, any) {
		// A session of its own each time, opened by a key of its own: the
		// caps count a person's open sessions and a device's.
		d := s.MustDevice(t, w.admin, fresh("remote"), nil)
		k := s.NewKey(t, w.admin, fresh("remote-op"), "operator")
		var sess fleet.RemoteSession
		s.Do(t, k, "POST", "/api/v1/devices/"+d.ID+"/remote-sessions", map[string]any{"kind": "shell", "target": "echo " + w.mark}).Want(t, 201).Decode(t, &sess)
		return "/api/v1/devices/" + d.ID + "/remote-sessions/" + sess.ID + "/end", nil
	}},
	"GET /api/v1/devices/{id}/remote-sessions/{sid}/recording": {perm: "remote", prepare: recordingOf},
	"PUT /api/v1/tenants/{tenant_id}/remote-settings": {perm: "admin", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/tenants/" + w.name + "/remote-settings", map[string]any{"recording": true}
	}},
	"GET /api/v1/tenants/{tenant_id}/remote-settings": {perm: "read", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/tenants/" + w.name + "/remote-settings", nil
	}},
	"GET /api/v1/devices/{id}/streams/{stream}/latest": {perm: "read", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/devices/" + w.device + "/streams/" + w.stream + "/latest", nil
	}},
	"GET /api/v1/devices/{id}/streams": {perm: "read", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/devices/" + w.device + "/streams", nil
	}},
	"GET /api/v1/devices/{id}/streams/{stream}/points": {perm: "read", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/devices/" + w.device + "/streams/" + w.stream + "/points?order=desc&limit=10", nil
	}},
	"GET /api/v1/devices/{id}/streams/{stream}/aggregate": {perm: "read", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/devices/" + w.device + "/streams/" + w.stream + "/aggregate?field=temp&fn=max&interval=30s&from=" + strconv.FormatInt(time.Now().Add(-time.Hour).UnixMilli(), 10), nil
	}},
	"GET /api/v1/devices/{id}/logs": {perm: "read", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/devices/" + w.device + "/logs?level=info&q=x&limit=5", nil
	}},
	"GET /api/v1/streams/{stream}/aggregate": {perm: "read", other: 200, prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/streams/" + w.stream + "/aggregate?field=temp&fn=count&interval=1m&by=device&from=" + time.Now().Add(-time.Hour).UTC().Format(time.RFC3339), nil
	}},

	"POST /api/v1/alert-rules": {perm: "operate", quiet: true, other: 201, prepare: func(*testing.T, *fleetdtest.Server, *world) (string, any) {
		return "/api/v1/alert-rules", map[string]any{"name": fresh("rule"), "stream": "env", "group": "g",
			"condition": map[string]any{"field": "temp", "operator": ">", "value": 100}, "activation_threshold_seconds": 1, "deactivation_threshold_seconds": 1}
	}},
	"GET /api/v1/alert-rules": {perm: "read", other: 200, prepare: static("/api/v1/alert-rules")},
	"GET /api/v1/alert-rules/{id}": {perm: "read", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/alert-rules/" + w.ruleID, nil
	}},
	"PUT /api/v1/alert-rules/{id}": {perm: "operate", prepare: func(t *testing.T, s *fleetdtest.Server, w *world) (string, any) {
		r := s.MustAlertRule(t, w.admin, map[string]any{"name": fresh("edited"), "stream": "x", "condition": map[string]any{"no_data_seconds": 60}})
		return "/api/v1/alert-rules/" + r.ID, map[string]any{"name": fresh("edited"), "stream": "x", "group": "g",
			"condition": map[string]any{"no_data_seconds": 120}, "activation_threshold_seconds": 1}
	}},
	"DELETE /api/v1/alert-rules/{id}": {perm: "operate", prepare: func(t *testing.T, s *fleetdtest.Server, w *world) (string, any) {
		r := s.MustAlertRule(t, w.admin, map[string]any{"name": fresh("doomed"), "stream": "x", "condition": map[string]any{"no_data_seconds": 60}})
		return "/api/v1/alert-rules/" + r.ID, nil
	}},
	"POST /api/v1/alert-rules/{id}/alert-notification-rules": {perm: "operate", quiet: true, prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/alert-rules/" + w.ruleID + "/alert-notification-rules", map[string]any{
			"channel_parameters": map[string]any{"type": "webhook", "url": "https://hooks.example.com/x"}, "interval_seconds": 0,
			"notification_template": map[string]any{"subject": "s", "body": "b"}, "timezone": "Europe/Berlin"}
	}},
	"GET /api/v1/alert-rules/{id}/alert-notification-rules": {perm: "read", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/alert-rules/" + w.ruleID + "/alert-notification-rules", nil
	}},
	"PUT /api/v1/alert-rules/{alert_id}/alert-notification-rules/{notification_id}": {perm: "operate", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/alert-rules/" + w.ruleID + "/alert-notification-rules/" + w.notificationID, map[string]any{"interval_seconds": 0, "timezone": "UTC"}
	}},
	"DELETE /api/v1/alert-rules/{alert_id}/alert-notification-rules/{notification_id}": {perm: "operate", prepare: func(t *testing.T, s *fleetdtest.Server, w *world) (string, any) {
		var nr struct{ ID string }
		s.Send(t, fleetdtest.Req{Method: "POST", Path: "/api/v1/alert-rules/" + w.ruleID + "/alert-notification-rules", Creds: w.admin,
			Header: http.Header{"Prefer": {"return=representation"}},
			Body:   map[string]any{"channel_parameters": map[string]any{"type": "webhook", "url": "https://hooks.example.com/y"}}}).Want(t, 201).Decode(t, &nr)
		return "/api/v1/alert-rules/" + w.ruleID + "/alert-notification-rules/" + nr.ID, nil
	}},
	"GET /api/v1/alerts": {perm: "read", other: 200, prepare: static("/api/v1/alerts?state=active")},
	"GET /api/v1/alerts/{id}": {perm: "read", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/alerts/" + w.alertID, nil
	}},
	"GET /api/v1/alerts/{id}/notifications": {perm: "read", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/alerts/" + w.alertID + "/notifications", nil
	}},

	"POST /api/v1/apikeys": {perm: "admin", other: 201, prepare: func(*testing.T, *fleetdtest.Server, *world) (string, any) {
		return "/api/v1/apikeys", map[string]any{"name": fresh("key"), "role": "viewer", "user_email": "a@example.com"}
	}},
	"GET /api/v1/apikeys": {perm: "admin", other: 200, prepare: static("/api/v1/apikeys")},
	"DELETE /api/v1/apikeys/{name}": {perm: "admin", prepare: func(t *testing.T, s *fleetdtest.Server, w *world) (string, any) {
		name := fresh("gone-" + w.name)
		s.Do(t, w.admin, "POST", "/api/v1/apikeys", map[string]any{"name": name, "role": "viewer"}).Want(t, 201)
		return "/api/v1/apikeys/" + name, nil
	}},
	"PUT /api/v1/tenants/{tenant_id}/auth": {perm: "admin", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/tenants/" + w.name + "/auth", w.s9
	}},
	"GET /api/v1/tenants/{tenant_id}/auth": {perm: "admin", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/tenants/" + w.name + "/auth", nil
	}},
	"PUT /api/v1/tenants/{tenant_id}/stream-retention": {perm: "admin", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/tenants/" + w.name + "/stream-retention", map[string]any{"retention_seconds": 0}
	}},
	"GET /api/v1/tenants/{tenant_id}/stream-retention": {perm: "read", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/tenants/" + w.name + "/stream-retention", nil
	}},
	"PATCH /api/v1/shadows": {perm: "operate", other: 400, prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/shadows", map[string]any{"search_type": "default", "device_ids": []string{w.device}, "desired": map[string]any{"k": 1}}
	}},
	"PUT /api/v1/tenants/{tenant_id}/shadow-settings": {perm: "admin", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/tenants/" + w.name + "/shadow-settings", map[string]any{"update_config": false}
	}},
	"GET /api/v1/tenants/{tenant_id}/shadow-settings": {perm: "read", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/tenants/" + w.name + "/shadow-settings", nil
	}},
	"PUT /api/v1/tenants/{tenant_id}/ddi": {perm: "admin", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/tenants/" + w.name + "/ddi", map[string]any{"require_confirmation": false, "gateway_registration": false}
	}},
	"GET /api/v1/tenants/{tenant_id}/ddi": {perm: "read", prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return "/api/v1/tenants/" + w.name + "/ddi", nil
	}},
	"GET /api/v1/audit-logs": {perm: "admin", other: 200, prepare: static("/api/v1/audit-logs?limit=1000")},

	// hawkBit DDI: the suites send the key as a GatewayToken (ddiHeader);
	// another tenant's key is not valid for the tenant in the path (401).
	"GET /{tenant}/controller/v1/{controllerId}": {perm: "ddi", other: 401, prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return ddiRoot(w), nil
	}},
	"GET /{tenant}/controller/v1/{controllerId}/deploymentBase/{actionId}": {perm: "ddi", other: 401, prepare: func(t *testing.T, s *fleetdtest.Server, w *world) (string, any) {
		return fmt.Sprintf("%s/deploymentBase/%d", ddiRoot(w), ddiUpdate(t, s, w)), nil
	}},
	"POST /{tenant}/controller/v1/{controllerId}/deploymentBase/{actionId}/feedback": {perm: "ddi", other: 401, prepare: func(t *testing.T, s *fleetdtest.Server, w *world) (string, any) {
		return fmt.Sprintf("%s/deploymentBase/%d/feedback", ddiRoot(w), ddiUpdate(t, s, w)), map[string]any{"status": map[string]any{
			"execution": "proceeding", "result": map[string]any{"finished": "none", "progress": map[string]any{"cnt": 1, "of": 2}}, "details": []string{"downloading"}}}
	}},
	"GET /{tenant}/controller/v1/{controllerId}/cancelAction/{actionId}": {perm: "ddi", other: 401, prepare: func(t *testing.T, s *fleetdtest.Server, w *world) (string, any) {
		return fmt.Sprintf("%s/cancelAction/%d", ddiRoot(w), ddiCancelOf(t, s, w)), nil
	}},
	"POST /{tenant}/controller/v1/{controllerId}/cancelAction/{actionId}/feedback": {perm: "ddi", other: 401, prepare: func(t *testing.T, s *fleetdtest.Server, w *world) (string, any) {
		return fmt.Sprintf("%s/cancelAction/%d/feedback", ddiRoot(w), ddiCancelOf(t, s, w)), map[string]any{"status": map[string]any{
			"execution": "closed", "result": map[string]any{"finished": "success"}}}
	}},
	"GET /{tenant}/controller/v1/{controllerId}/confirmationBase": {perm: "ddi", other: 401, prepare: func(t *testing.T, s *fleetdtest.Server, w *world) (string, any) {
		ddiAwaiting(t, s, w)
		return ddiRoot(w) + "/confirmationBase", nil
	}},
	"GET /{tenant}/controller/v1/{controllerId}/confirmationBase/{actionId}": {perm: "ddi", other: 401, prepare: func(t *testing.T, s *fleetdtest.Server, w *world) (string, any) {
		return fmt.Sprintf("%s/confirmationBase/%d", ddiRoot(w), ddiAwaiting(t, s, w)), nil
	}},
	"POST /{tenant}/controller/v1/{controllerId}/confirmationBase/{actionId}/feedback": {perm: "ddi", other: 401, prepare: func(t *testing.T, s *fleetdtest.Server, w *world) (string, any) {
		return fmt.Sprintf("%s/confirmationBase/%d/feedback", ddiRoot(w), ddiAwaiting(t, s, w)), map[string]any{"confirmation": "denied", "code": 3, "details": []string{"not now"}}
	}},
	"POST /{tenant}/controller/v1/{controllerId}/confirmationBase/activateAutoConfirm": {perm: "ddi", other: 401, prepare: func(t *testing.T, s *fleetdtest.Server, w *world) (string, any) {
		ddiAutoConfirmOff(t, s, w)
		return ddiRoot(w) + "/confirmationBase/activateAutoConfirm", map[string]any{"initiator": "ops", "remark": "night shift"}
	}},
	"POST /{tenant}/controller/v1/{controllerId}/confirmationBase/deactivateAutoConfirm": {perm: "ddi", other: 401, prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return ddiRoot(w) + "/confirmationBase/deactivateAutoConfirm", nil
	}},
	"PUT /{tenant}/controller/v1/{controllerId}/configData": {perm: "ddi", other: 401, prepare: func(_ *testing.T, _ *fleetdtest.Server, w *world) (string, any) {
		return ddiRoot(w) + "/configData", map[string]any{"mode": "merge", "data": map[string]any{"hwRevision": "2"}}
	}},
	"GET /{tenant}/controller/v1/{controllerId}/installedBase/{actionId}": {perm: "ddi", other: 401, prepare: func(t *testing.T, s *fleetdtest.Server, w *world) (string, any) {
		return fmt.Sprintf("%s/installedBase/%d", ddiRoot(w), ddiInstalled(t, s, w)), nil
	}},
	"GET /{tenant}/controller/v1/{controllerId}/softwaremodules/{moduleId}/artifacts": {perm: "ddi", other: 401, prepare: func(t *testing.T, s *fleetdtest.Server, w *world) (string, any) {
		var b fleetdtest.Bundle
		s.Do(t, w.admin, "GET", "/api/v1/firmware-bundles/id/"+w.bundleID, nil).Want(t, 200).Decode(t, &b)
		return ddiRoot(w) + "/softwaremodules/" + b.Firmwares[0].ID + "/artifacts", nil
	}},
	"GET /{tenant}/controller/v1/{controllerId}/softwaremodules/{moduleId}/artifacts/{fileName}": {perm: "ddi", other: 401, prepare: func(t *testing.T, s *fleetdtest.Server, w *world) (string, any) {
		var b fleetdtest.Bundle
		s.Do(t, w.admin, "GET", "/api/v1/firmware-bundles/id/"+w.bundleID, nil).Want(t, 200).Decode(t, &b)
		return ddiRoot(w) + "/softwaremodules/" + b.Firmwares[0].ID + "/artifacts/" + b.Firmwares[0].FileName, nil
	}},
}

// ddiRoot is the DDI path of w's device.
func ddiRoot(w *world) string { return "/" + w.name + "/controller/v1/" + w.device }

// ddiInstalled dispatches w's bundle to w's device, which reports it
// installed through DDI's feedback, and returns the action id.
func ddiInstalled(t *testing.T, s *fleetdtest.Server, w *world) int64 {
	t.Helper()
	id := ddiUpdate(t, s, w)
	s.Send(t, fleetdtest.Req{Method: "POST", Path: fmt.Sprintf("%s/deploymentBase/%d/feedback", ddiRoot(w), id), Creds: w.admin,
		Header: ddiHeader(endpoint{perm: "ddi"}, w.admin), Body: map[string]any{"status": map[string]any{
			"execution": "closed", "result": map[string]any{"finished": "success"}}}}).Want(t, 200)
	return id
}

// ddiUpdate dispatches w's bundle to w's device and returns the action id,
// with the tenant not requiring confirmations, so that the device may read
// it at once.
func ddiUpdate(t *testing.T, s *fleetdtest.Server, w *world) int64 {
	t.Helper()
	ddiSettings(t, s, w.admin, false, false)
	return s.Dispatch(t, w.admin, map[string]any{"action": "update_firmware", "params": map[string]any{"version": w.bundleVersion},
		"search_type": "default", "device_ids": []string{w.device}})
}

// ddiAwaiting dispatches w's bundle to w's device in a tenant that
// requires confirmations, to a device without automatic confirmation, and
// returns the action id: the update waits for the device's confirmation.
func ddiAwaiting(t *testing.T, s *fleetdtest.Server, w *world) int64 {
	t.Helper()
	ddiAutoConfirmOff(t, s, w)
	id := ddiUpdate(t, s, w)
	ddiSettings(t, s, w.admin, true, false)
	return id
}

// ddiAutoConfirmOff deactivates w's device's automatic confirmation.
func ddiAutoConfirmOff(t *testing.T, s *fleetdtest.Server, w *world) {
	t.Helper()
	s.Send(t, fleetdtest.Req{Method: "POST", Path: ddiRoot(w) + "/confirmationBase/deactivateAutoConfirm", Creds: w.admin,
		Header: ddiHeader(endpoint{perm: "ddi"}, w.admin)}).Want(t, 200)
}

// ddiSettings sets the DDI settings of c's tenant.
func ddiSettings(t *testing.T, s *fleetdtest.Server, c fleetdtest.Creds, requireConfirmation, gatewayRegistration bool) {
	t.Helper()
	s.Do(t, c, "PUT", "/api/v1/tenants/"+c.Tenant+"/ddi", map[string]any{
		"require_confirmation": requireConfirmation, "gateway_registration": gatewayRegistration}).Want(t, 204)
}

// ddiCancelOf dispatches a cancel_action of a fresh update to w's device
// and returns its id.
func ddiCancelOf(t *testing.T, s *fleetdtest.Server, w *world) int64 {
	t.Helper()
	update := ddiUpdate(t, s, w)
	// The device has the update (it read its deployment), so the cancel
	// waits for the device's answer on the cancelAction resource.
	s.Send(t, fleetdtest.Req{Method: "GET", Path: fmt.Sprintf("%s/deploymentBase/%d", ddiRoot(w), update), Creds: w.admin,
		Header: ddiHeader(endpoint{perm: "ddi"}, w.admin)}).Want(t, 200)
	fleetdtest.Eventually(t, "the update's receipt", func() bool { // receipts are written in batches
		var das struct {
			DeviceActions []struct {
				ActionStatus string `json:"action_status"`
			} `json:"device_actions"`
		}
		s.Do(t, w.admin, "GET", fmt.Sprintf("/api/v1/actions/%d/devices", update), nil).Want(t, 200).Decode(t, &das)
		return len(das.DeviceActions) == 1 && das.DeviceActions[0].ActionStatus == "Initiated"
	})
	s.Dispatch(t, w.admin, map[string]any{"action": "cancel_action", "params": map[string]any{"action_id": update},
		"search_type": "default", "device_ids": []string{w.device}})
	return update
}

// ddiHeader is how the suites authenticate to DDI endpoints: the caller's
// API key as a gateway token.
func ddiHeader(e endpoint, c fleetdtest.Creds) http.Header {
	if e.perm != "ddi" || c.Key == "" {
		return nil
	}
	return http.Header{"Authorization": {"GatewayToken " + c.Key}}
}

// rolloutOf dispatches a fresh rollout to w's device whose one phase an
// operator triggers, and returns its id.
func rolloutOf(t *testing.T, s *fleetdtest.Server, w *world) int64 {
	t.Helper()
	return s.Dispatch(t, w.admin, map[string]any{"action": "roll-" + w.mark, "params": map[string]any{"note": w.mark}, "search_type": "default",
		"device_ids": []string{w.device}, "schedule": map[string]any{"release_notes": "notes " + w.mark, "phases": []any{
			map[string]any{"name": "only-" + w.mark, "trigger_on": map[string]any{"type": "manual"},
				"info": map[string]any{"type": "fixed_list", "device_ids": []string{w.device}}}}}})
}

// pendingBundle makes a pending bundle record of w, with its archive
// uploaded when upload is set, and returns its id and archive.
func pendingBundle(t *testing.T, s *fleetdtest.Server, w *world, upload bool) (string, []byte) {
	t.Helper()
	version := fmt.Sprintf("5.%d.0", uniq.Add(1))
	archive := fleetdtest.MakeBundle(t, version, fleetdtest.Part{Name: "p-" + w.name, Version: version, Body: "x"})
	var b struct{ ID string }
	s.Do(t, w.admin, "POST", "/api/v1/firmware-bundles", map[string]any{"version": version, "file_name": "p.tar.gz"}).Want(t, 201).Decode(t, &b)
	if upload {
		s.PutFile(t, w.admin, b.ID, archive).Want(t, 200)
	}
	return b.ID, archive
}

// operations lists the served document's operations as "METHOD /path",
// sorted, with each one's success status.
func operations(t *testing.T, s *fleetdtest.Server) ([]string, map[string]int, *openapi3.T) {
	t.Helper()
	doc := s.OpenAPIDocument(t)
	var ops []string
	ok := map[string]int{}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			key := method + " " + path
			ops = append(ops, key)
			for _, code := range []int{201, 202, 204, 200} {
				if op.Responses.Status(code) != nil {
					ok[key] = code
					break
				}
			}
		}
	}
	sort.Strings(ops)
	return ops, ok, doc
}

// covered fails the test for every operation the table lacks.
func covered(t *testing.T, ops []string) {
	t.Helper()
	for _, op := range ops {
		if _, ok := endpoints[op]; !ok {
			t.Errorf("%s is in the OpenAPI document but not in endpoints_test.go: add it, so that the isolation matrix and the bad-input corpus cover it", op)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

// tarSize is the uncompressed size of a gzipped archive.
func tarSize(t *testing.T, gz []byte) int64 {
	t.Helper()
	r, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, r)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
