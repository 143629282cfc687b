package main

import (
	"strings"
	"testing"

	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

func TestAPIKeysEndToEnd(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := startServer(t, b)
		admin := s.admin()
		beta := s.newTenant(t, "beta")

		var k struct {
			Name, Role, Key string
			UserEmail       string `json:"user_email"`
		}
		r := s.do(t, admin, "POST", "/api/v1/apikeys", map[string]any{"name": "ci", "role": "operator", "user_email": "ci@example.com"}).want(t, 201)
		r.decode(t, &k)
		if k.Name != "ci" || k.Role != "operator" || !strings.HasPrefix(k.Key, "fk_") || k.UserEmail != "ci@example.com" {
			t.Fatalf("created %+v", k)
		}
		if !strings.HasSuffix(r.Header.Get("Location"), "/api/v1/apikeys/ci") {
			t.Fatalf("Location = %q", r.Header.Get("Location"))
		}
		ci := creds{"default", k.Key}
		s.do(t, ci, "POST", "/api/v1/devices", map[string]any{"id": "by-ci"}).want(t, 201)

		var list struct {
			APIKeys []map[string]any `json:"apikeys"`
			Count   int
		}
		s.do(t, admin, "GET", "/api/v1/apikeys", nil).want(t, 200).decode(t, &list)
		if list.Count != 2 {
			t.Fatalf("count = %d", list.Count)
		}
		for _, k := range list.APIKeys {
			if _, ok := k["key"]; ok {
				t.Fatalf("list shows a secret: %v", k)
			}
		}
		// beta neither sees nor deletes default's keys.
		s.do(t, beta, "GET", "/api/v1/apikeys", nil).want(t, 200).decode(t, &list)
		if list.Count != 1 {
			t.Fatalf("beta sees %d keys", list.Count)
		}
		s.do(t, beta, "DELETE", "/api/v1/apikeys/ci", nil).want(t, 404)

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
				s.do(t, admin, "POST", "/api/v1/apikeys", tc.body).want(t, 400).decode(t, &e)
				if e.Fields[tc.field] == "" {
					t.Fatalf("fields = %v, want %s", e.Fields, tc.field)
				}
			})
		}
		s.do(t, admin, "POST", "/api/v1/apikeys", map[string]any{"name": "ci", "role": "viewer"}).want(t, 409)

		s.do(t, admin, "DELETE", "/api/v1/apikeys/ci", nil).want(t, 204)
		s.do(t, ci, "GET", "/api/v1/devices", nil).want(t, 401)
		s.do(t, admin, "DELETE", "/api/v1/apikeys/ci", nil).want(t, 404)
		s.do(t, admin, "DELETE", "/api/v1/apikeys/admin", nil).want(t, 409)
	})
}

func TestAuditLogsEndToEnd(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := startServer(t, b)
		admin := s.admin()
		beta := s.newTenant(t, "beta")
		ops := s.newKey(t, admin, "ops", "operator")
		d := s.mustDevice(t, ops, "audited", map[string]string{"a": "1"})
		s.do(t, ops, "PATCH", "/api/v1/devices/audited", map[string]any{"metadata": map[string]any{"a": "2"}}).want(t, 204)
		var tok struct{ Token string }
		s.do(t, ops, "POST", "/api/v1/devices/audited/token", nil).want(t, 201).decode(t, &tok)
		s.do(t, ops, "POST", "/api/v1/devices", map[string]any{"id": "x", "bogus": 1}).want(t, 400) // not a change
		s.do(t, ops, "DELETE", "/api/v1/devices/audited", nil).want(t, 204)

		var logs struct {
			AuditLogs []struct {
				Actor, Role, Action, Target string
				RequestID                   string `json:"request_id"`
				Details                     map[string]any
			} `json:"audit_logs"`
			Count int
		}
		r := s.do(t, admin, "GET", "/api/v1/audit-logs?actor=ops", nil).want(t, 200)
		r.decode(t, &logs)
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
		all := string(s.do(t, admin, "GET", "/api/v1/audit-logs?limit=1000", nil).want(t, 200).Body)
		for _, secret := range []string{d.Token, tok.Token, ops.Key, s.Key} {
			if strings.Contains(all, secret) {
				t.Fatal("a secret appears in the audit log")
			}
		}
		// An action, or every action of its kind; _ is no wildcard.
		for query, want := range map[string]int{"device.update": 1, "device": 4, "device.": 0, "devic": 0, "device_update": 0, "apikey": 1} {
			s.do(t, admin, "GET", "/api/v1/audit-logs?action="+query, nil).want(t, 200).decode(t, &logs)
			if logs.Count != want {
				t.Errorf("action=%s: %d logs, want %d", query, logs.Count, want)
			}
		}
		s.do(t, beta, "GET", "/api/v1/audit-logs", nil).want(t, 200).decode(t, &logs)
		if logs.Count != 1 { // beta's own tenant.create
			t.Fatalf("beta sees %d logs", logs.Count)
		}
		s.do(t, admin, "GET", "/api/v1/audit-logs?since=yesterday", nil).want(t, 400)
		s.do(t, admin, "GET", "/api/v1/audit-logs?since=2000-01-01T00:00:00Z&until=2000-01-02T00:00:00Z", nil).want(t, 200).decode(t, &logs)
		if logs.Count != 0 {
			t.Fatalf("window in 2000 has %d logs", logs.Count)
		}
	})
}
