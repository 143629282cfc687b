package main

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/remote"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// openTerminal opens a terminal session with device as c and joins it,
// on s; it returns the session and the operator's leg, with the shell
// answering.
func (s *testServer) openTerminal(t *testing.T, c fleetdtest.Creds, device string) (fleet.RemoteSession, *remote.Conn) {
	t.Helper()
	var sess fleet.RemoteSession
	s.Do(t, c, "POST", "/api/v1/devices/"+device+"/remote-sessions", map[string]any{"kind": "shell"}).Want(t, 201).Decode(t, &sess)
	conn := s.joinTerminal(t, c, sess.ID)
	return sess, conn
}

// joinTerminal joins session id's operator leg on s and waits for the
// shell to answer.
func (s *testServer) joinTerminal(t *testing.T, c fleetdtest.Creds, id string) *remote.Conn {
	t.Helper()
	conn, err := remote.Dial(context.Background(), s.URL+"/api/v1/remote-sessions/"+id+"/operator",
		http.Header{"X-Service-Tenant": {c.Tenant}, "X-Service-Api-Key": {c.Key}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.Write([]byte("echo rea''dy\n"))
	var out strings.Builder
	for !strings.Contains(out.String(), "ready") {
		b, ctl, err := conn.Read()
		if err != nil || ctl != nil {
			t.Fatalf("before the shell answered: %v, %+v; output %q", err, ctl, out.String())
		}
		out.Write(b)
	}
	return conn
}

// sessionEnd reads the operator's leg until fleetd ends it, and returns
// the message of its error.
func sessionEnd(t *testing.T, conn *remote.Conn) string {
	t.Helper()
	for {
		_, ctl, err := conn.Read()
		if err != nil {
			t.Fatalf("the session ended without saying why: %v", err)
		}
		if ctl != nil && ctl.Type == remote.TypeError {
			return ctl.Message
		}
	}
}

// endReason waits until session id of device has ended and returns why.
func (s *testServer) endReason(t *testing.T, c fleetdtest.Creds, device, id string) string {
	t.Helper()
	var reason string
	fleetdtest.Eventually(t, "session "+id+" to have ended", func() bool {
		var list struct {
			RemoteSessions []fleet.RemoteSession `json:"remote_sessions"`
		}
		s.Do(t, c, "GET", "/api/v1/devices/"+device+"/remote-sessions?limit=100", nil).Want(t, 200).Decode(t, &list)
		for _, rs := range list.RemoteSessions {
			if rs.ID == id && rs.EndedAt != nil {
				reason = rs.EndReason
				return true
			}
		}
		return false
	})
	return reason
}

// TestRemoteRevoked checks that revoking what a session stands on ends
// it at once, with the reason recorded: the API key that opened it
// (joined or still waiting), the device's token, the device itself.
func TestRemoteRevoked(t *testing.T) {
	bin := fleetdtest.BuildAgent(t)
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := startServer(t, b, "--remote-connect-timeout", "1m")
		admin := s.Admin()
		dev := s.MustDevice(t, admin, "revoke-1", nil)
		s.StartAgent(t, bin, "revoke-1", dev.Token, "--remote")
		dev2 := s.MustDevice(t, admin, "revoke-2", nil)
		s.StartAgent(t, bin, "revoke-2", dev2.Token, "--remote")
		s.MustDevice(t, admin, "revoke-none", nil) // no agent: its sessions wait

		t.Run("APIKeyDeleted", func(t *testing.T) {
			k := s.NewKey(t, admin, "revoked-op", "operator")
			other := s.NewKey(t, admin, "other-op", "operator")
			sess, conn := s.openTerminal(t, k, "revoke-1")
			kept, keptConn := s.openTerminal(t, other, "revoke-2")
			var waiting fleet.RemoteSession
			s.Do(t, k, "POST", "/api/v1/devices/revoke-none/remote-sessions", map[string]any{"kind": "shell"}).Want(t, 201).Decode(t, &waiting)
			s.Do(t, admin, "DELETE", "/api/v1/apikeys/revoked-op", nil).Want(t, 204)
			want := `API key "revoked-op", which opened it, was deleted`
			fleetdtest.WantContains(t, "operator's end", sessionEnd(t, conn), want)
			fleetdtest.WantContains(t, "recorded", s.endReason(t, admin, "revoke-1", sess.ID), want)
			fleetdtest.WantContains(t, "waiting session", s.endReason(t, admin, "revoke-none", waiting.ID), want)
			// Another key's session goes on.
			keptConn.Write([]byte("echo st''ill\n"))
			var out strings.Builder
			for !strings.Contains(out.String(), "still") {
				b, ctl, err := keptConn.Read()
				if err != nil || ctl != nil {
					t.Fatalf("another key's session ended: %v, %+v", err, ctl)
				}
				out.Write(b)
			}
			keptConn.Close()
			s.endReason(t, admin, "revoke-2", kept.ID)
		})
		t.Run("DeviceDeleted", func(t *testing.T) {
			_, conn := s.openTerminal(t, admin, "revoke-2")
			s.Do(t, admin, "DELETE", "/api/v1/devices/revoke-2", nil).Want(t, 204)
			fleetdtest.WantContains(t, "operator's end", sessionEnd(t, conn), "the device was deleted")
			// The device's sessions are listed no more with it; the audit
			// log keeps the end.
			var audit struct {
				AuditLogs []struct {
					Action  string         `json:"action"`
					Details map[string]any `json:"details"`
				} `json:"audit_logs"`
			}
			fleetdtest.Eventually(t, "the session's end to be audited", func() bool {
				s.Do(t, admin, "GET", "/api/v1/audit-logs?action=remote.session.end&limit=100", nil).Want(t, 200).Decode(t, &audit)
				for _, e := range audit.AuditLogs {
					if e.Action == "remote.session.end" && e.Details["end_reason"] == "the device was deleted" {
						return true
					}
				}
				return false
			})
		})
		t.Run("ConsoleIsolation", func(t *testing.T) {
			// Another tenant's operator, and a viewer of this one, in the
			// console: neither sees, joins nor ends the session.
			sess, conn := s.openTerminal(t, admin, "revoke-1")
			other := s.NewTenant(t, "revoke-elsewhere")
			ob := fleetdtest.NewBrowser(t, s.URL)
			tok := ob.SignIn(other.Tenant, other.Key).CSRF(t)
			if body := string(ob.Get("/console/remote-sessions").Want(t, 200).Body); strings.Contains(body, sess.ID) || strings.Contains(body, "revoke-1") {
				t.Fatal("another tenant's console lists the session")
			}
			ob.Get("/console/remote-sessions/"+sess.ID+"/terminal").Want(t, 404)
			ob.Get("/console/devices/revoke-1/remote-sessions").Want(t, 404)
			ob.Do("POST", "/console/remote-sessions/"+sess.ID+"/end", url.Values{"csrf": {tok}}).Want(t, 404)
			viewer := s.NewKey(t, admin, "revoke-viewer", "viewer")
			vb := fleetdtest.NewBrowser(t, s.URL)
			vtok := vb.SignIn(viewer.Tenant, viewer.Key).CSRF(t)
			vb.Get("/console/devices/revoke-1/remote-sessions").Want(t, 200)
			vb.Do("POST", "/console/remote-sessions/"+sess.ID+"/end", url.Values{"csrf": {vtok}}).Want(t, 403)
			vb.Do("POST", "/console/devices/revoke-1/terminal", url.Values{"csrf": {vtok}}).Want(t, 403)
			// The session went on through all of it.
			conn.Write([]byte("echo st''ill\n"))
			var out strings.Builder
			for !strings.Contains(out.String(), "still") {
				b, ctl, err := conn.Read()
				if err != nil || ctl != nil {
					t.Fatalf("the session ended: %v, %+v", err, ctl)
				}
				out.Write(b)
			}
			conn.Close()
			s.endReason(t, admin, "revoke-1", sess.ID)
		})
		t.Run("DeviceTokenRotated", func(t *testing.T) {
			sess, conn := s.openTerminal(t, admin, "revoke-1")
			s.Do(t, admin, "POST", "/api/v1/devices/revoke-1/token", nil).Want(t, 201)
			want := "the device's credentials were replaced"
			fleetdtest.WantContains(t, "operator's end", sessionEnd(t, conn), want)
			fleetdtest.WantContains(t, "recorded", s.endReason(t, admin, "revoke-1", sess.ID), want)
		})
	})
}
