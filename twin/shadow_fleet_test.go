package twin_test

import (
	"strings"
	"testing"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestFleetDesired: one request merges a patch into the desired state of
// the devices a selection chooses, each change audited with its previous
// state; another tenant's devices and groups are out of reach, and a
// selection that fails changes nothing.
func TestFleetDesired(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		admin := s.Admin()
		other := s.NewTenant(t, "other")
		for _, d := range []string{"f1", "f2", "f3"} {
			site := "berlin"
			if d == "f3" {
				site = "paris"
			}
			s.MustDevice(t, admin, d, map[string]string{"site": site})
		}
		s.MustDevice(t, other, "f1", map[string]string{"site": "berlin"})
		s.Do(t, admin, "POST", "/api/v1/groups", map[string]any{"name": "berlin", "selector": "site=berlin"}).Want(t, 201)
		s.Do(t, admin, "PATCH", "/api/v1/devices/f1/shadow", map[string]any{"desired": map[string]any{"interval": 10}}).Want(t, 200)

		var fd fleet.FleetDesired
		s.Do(t, admin, "PATCH", "/api/v1/shadows", map[string]any{"search_type": "group", "group": "berlin",
			"desired": map[string]any{"interval": 30}}).Want(t, 200).Decode(t, &fd)
		if fd.Matched != 2 || fd.Changed != 2 {
			t.Fatalf("answered %+v", fd)
		}
		for d, want := range map[string]any{"f1": float64(30), "f2": float64(30), "f3": nil} {
			var sh fleet.Shadow
			s.Do(t, admin, "GET", "/api/v1/devices/"+d+"/shadow", nil).Want(t, 200).Decode(t, &sh)
			if sh.Desired["interval"] != want {
				t.Fatalf("%s desired %v, want interval %v", d, sh.Desired, want)
			}
		}
		var sh fleet.Shadow
		s.Do(t, other, "GET", "/api/v1/devices/f1/shadow", nil).Want(t, 200).Decode(t, &sh)
		if len(sh.Desired) != 0 {
			t.Fatalf("another tenant's f1 changed: %+v", sh)
		}
		var logs struct {
			AuditLogs []struct {
				Target  string         `json:"target"`
				Details map[string]any `json:"details"`
			} `json:"audit_logs"`
		}
		s.Do(t, admin, "GET", "/api/v1/audit-logs?action=device.shadow.update&limit=100", nil).Want(t, 200).Decode(t, &logs)
		var f1 []string
		for _, l := range logs.AuditLogs {
			if l.Target == "devices/f1" {
				f1 = append(f1, mustJSON(t, l.Details["previous"]))
			}
		}
		if strings.Join(f1, " ") != `{"interval":10} {}` {
			t.Fatalf("f1's audited previous states, newest first: %v", f1)
		}
		// The same patch again changes nothing.
		s.Do(t, admin, "PATCH", "/api/v1/shadows", map[string]any{"search_type": "metadata", "search_key": "site", "search_query": "berlin",
			"desired": map[string]any{"interval": 30}}).Want(t, 200).Decode(t, &fd)
		if fd.Matched != 2 || fd.Changed != 0 {
			t.Fatalf("again: %+v", fd)
		}
		fleetdtest.WantCode(t, s.Do(t, other, "PATCH", "/api/v1/shadows", map[string]any{"search_type": "group", "group": "berlin", "desired": map[string]any{"x": 1}}), 400, "invalid")
		r := s.Do(t, admin, "PATCH", "/api/v1/shadows", map[string]any{"search_type": "default", "device_ids": []string{"f3", "ghost"}, "desired": map[string]any{"x": 1}})
		fleetdtest.WantCode(t, r, 400, "invalid")
		s.Do(t, admin, "GET", "/api/v1/devices/f3/shadow", nil).Want(t, 200).Decode(t, &sh)
		if len(sh.Desired) != 0 {
			t.Fatalf("a refused change changed f3: %+v", sh)
		}
		fleetdtest.WantCode(t, s.Do(t, admin, "PATCH", "/api/v1/shadows", map[string]any{"search_type": "all", "desired": map[string]any{"x": 1}, "version": 3}), 400, "invalid")
		viewer := s.NewKey(t, admin, "v", "viewer")
		s.Do(t, viewer, "PATCH", "/api/v1/shadows", map[string]any{"search_type": "all", "desired": map[string]any{"x": 1}}).Want(t, 403)
	})
}
