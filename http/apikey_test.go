package fleethttp_test

import (
	"strings"
	"testing"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

func TestAPIKeysEndToEnd(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		admin := s.Admin()
		beta := s.NewTenant(t, "beta")

		var k struct {
			Name, Role, Key string
			UserEmail       string `json:"user_email"`
		}
		r := s.Do(t, admin, "POST", "/api/v1/apikeys", map[string]any{"name": "ci", "role": "operator", "user_email": "ci@example.com"}).Want(t, 201)
		r.Decode(t, &k)
		if k.Name != "ci" || k.Role != "operator" || !strings.HasPrefix(k.Key, "fk_") || k.UserEmail != "ci@example.com" {
			t.Fatalf("created %+v", k)
		}
		if !strings.HasSuffix(r.Header.Get("Location"), "/api/v1/apikeys/ci") {
			t.Fatalf("Location = %q", r.Header.Get("Location"))
		}
		ci := fleetdtest.Creds{Tenant: "default", Key: k.Key}
		s.Do(t, ci, "POST", "/api/v1/devices", map[string]any{"id": "by-ci"}).Want(t, 201)

		var list struct {
			APIKeys []map[string]any `json:"apikeys"`
			Count   int
		}
		s.Do(t, admin, "GET", "/api/v1/apikeys", nil).Want(t, 200).Decode(t, &list)
		if list.Count != 2 {
			t.Fatalf("count = %d", list.Count)
		}
		for _, k := range list.APIKeys {
			if _, ok := k["key"]; ok {
				t.Fatalf("list shows a secret: %v", k)
			}
		}
		// beta neither sees nor deletes default's keys.
		s.Do(t, beta, "GET", "/api/v1/apikeys", nil).Want(t, 200).Decode(t, &list)
		if list.Count != 1 {
			t.Fatalf("beta sees %d keys", list.Count)
		}
		s.Do(t, beta, "DELETE", "/api/v1/apikeys/ci", nil).Want(t, 404)

		for _, tc := range []struct {
			name  string
			body  map[string]any
			field string
		}{
			{"NoName", map[string]any{"role": "viewer"}, "name"},
			{"BadName", map[string]any{"name": "a b", "role": "viewer"}, "name"},
			{"BadRole", map[string]any{"name": "x", "role": "root"}, "role"},
			{"RoleNotString", map[string]any{"name": "x", "role": 1}, "role"},
			{"BadEmail", map[string]any{"name": "x", "role": "viewer", "user_email": "nobody"}, "user_email"},
			{"Unknown", map[string]any{"name": "x", "role": "viewer", "key": "fk_chosen"}, "key"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				var e struct{ Fields map[string]string }
				s.Do(t, admin, "POST", "/api/v1/apikeys", tc.body).Want(t, 400).Decode(t, &e)
				if e.Fields[tc.field] == "" {
					t.Fatalf("fields = %v, want %s", e.Fields, tc.field)
				}
			})
		}
		s.Do(t, admin, "POST", "/api/v1/apikeys", map[string]any{"name": "ci", "role": "viewer"}).Want(t, 409)

		s.Do(t, admin, "DELETE", "/api/v1/apikeys/ci", nil).Want(t, 204)
		s.Do(t, ci, "GET", "/api/v1/devices", nil).Want(t, 401)
		s.Do(t, admin, "DELETE", "/api/v1/apikeys/ci", nil).Want(t, 404)
		s.Do(t, admin, "DELETE", "/api/v1/apikeys/admin", nil).Want(t, 409)
	})
}

func TestAuditLogsEndToEnd(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		admin := s.Admin()
		beta := s.NewTenant(t, "beta")
		ops := s.NewKey(t, admin, "ops", "operator")
		d := s.MustDevice(t, ops, "audited", map[string]string{"a": "1"})
		s.Do(t, ops, "PATCH", "/api/v1/devices/audited", map[string]any{"metadata": map[string]any{"a": "2"}}).Want(t, 204)
		var tok struct{ Token string }
		s.Do(t, ops, "POST", "/api/v1/devices/audited/token", nil).Want(t, 201).Decode(t, &tok)
		s.Do(t, ops, "POST", "/api/v1/devices", map[string]any{"id": "x", "bogus": 1}).Want(t, 400) // not a change
		s.Do(t, ops, "DELETE", "/api/v1/devices/audited", nil).Want(t, 204)

		var logs struct {
			AuditLogs []struct {
				Actor, Role, Action, Target string
				RequestID                   string `json:"request_id"`
				Details                     map[string]any
			} `json:"audit_logs"`
			Count int
		}
		r := s.Do(t, admin, "GET", "/api/v1/audit-logs?actor=ops", nil).Want(t, 200)
		r.Decode(t, &logs)
		var actions []string
		for _, l := range logs.AuditLogs {
			actions = append(actions, l.Action)
			if l.Actor != "ops" || l.Role != "operator" || l.Target != "devices/audited" {
				t.Errorf("log %+v", l)
			}
		}
		if strings.Join(actions, ",") != "device.delete,device.rotate_token,device.update,device.create" {
			t.Fatalf("actions by ops = %v", actions)
		}
		// No secret appears in the audit log: not the device's tokens, not
		// the keys of the API keys created.
		all := string(s.Do(t, admin, "GET", "/api/v1/audit-logs?limit=1000", nil).Want(t, 200).Body)
		for _, secret := range []string{d.Token, tok.Token, ops.Key, s.Key} {
			if strings.Contains(all, secret) {
				t.Fatal("a secret appears in the audit log")
			}
		}
		// An action, or every action of its kind; _ is no wildcard.
		for query, want := range map[string]int{"device.update": 1, "device": 4, "device.": 0, "devic": 0, "device_update": 0, "apikey": 1} {
			s.Do(t, admin, "GET", "/api/v1/audit-logs?action="+query, nil).Want(t, 200).Decode(t, &logs)
			if logs.Count != want {
				t.Errorf("action=%s: %d logs, want %d", query, logs.Count, want)
			}
		}
		s.Do(t, beta, "GET", "/api/v1/audit-logs", nil).Want(t, 200).Decode(t, &logs)
		if logs.Count != 1 { // beta's own tenant.create
			t.Fatalf("beta sees %d logs", logs.Count)
		}
		s.Do(t, admin, "GET", "/api/v1/audit-logs?since=yesterday", nil).Want(t, 400)
		s.Do(t, admin, "GET", "/api/v1/audit-logs?since=2000-01-01T00:00:00Z&until=2000-01-02T00:00:00Z", nil).Want(t, 200).Decode(t, &logs)
		if logs.Count != 0 {
			t.Fatalf("window in 2000 has %d logs", logs.Count)
		}
	})
}
