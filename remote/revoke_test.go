package remote_test

import (
	"net/url"
	"strings"
	"testing"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestRemoteRevoked checks that revoking what a session stands on ends
// it at once, with the reason recorded: the API key that opened it
// (joined or still waiting), the device's token, the device itself.
func TestRemoteRevoked(t *testing.T) {
	t.Parallel()
	bin := fleetdtest.BuildAgent(t)
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b, "--remote-connect-timeout", "1m")
		admin := s.Admin()
		dev := s.MustDevice(t, admin, "revoke-1", nil)
		s.StartAgent(t, bin, "revoke-1", dev.Token, "--remote")
		dev2 := s.MustDevice(t, admin, "revoke-2", nil)
		s.StartAgent(t, bin, "revoke-2", dev2.Token, "--remote")
		s.MustDevice(t, admin, "revoke-none", nil) // no agent: its sessions wait

		t.Run("APIKeyDeleted", func(t *testing.T) {
			k := s.NewKey(t, admin, "revoked-op", "operator")
			other := s.NewKey(t, admin, "other-op", "operator")
			sess, conn := s.OpenTerminal(t, k, "revoke-1")
			kept, keptConn := s.OpenTerminal(t, other, "revoke-2")
			var waiting fleet.RemoteSession
			s.Do(t, k, "POST", "/api/v1/devices/revoke-none/remote-sessions", map[string]any{"kind": "shell"}).Want(t, 201).Decode(t, &waiting)
			s.Do(t, admin, "DELETE", "/api/v1/apikeys/revoked-op", nil).Want(t, 204)
			want := `API key "revoked-op", which opened it, was deleted`
			fleetdtest.WantContains(t, "operator's end", fleetdtest.SessionEnd(t, conn), want)
			fleetdtest.WantContains(t, "recorded", s.EndReason(t, admin, "revoke-1", sess.ID), want)
			fleetdtest.WantContains(t, "waiting session", s.EndReason(t, admin, "revoke-none", waiting.ID), want)
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
			s.EndReason(t, admin, "revoke-2", kept.ID)
		})
		t.Run("DeviceDeleted", func(t *testing.T) {
			_, conn := s.OpenTerminal(t, admin, "revoke-2")
			s.Do(t, admin, "DELETE", "/api/v1/devices/revoke-2", nil).Want(t, 204)
			fleetdtest.WantContains(t, "operator's end", fleetdtest.SessionEnd(t, conn), "the device was deleted")
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
			sess, conn := s.OpenTerminal(t, admin, "revoke-1")
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
			s.EndReason(t, admin, "revoke-1", sess.ID)
		})
		t.Run("DeviceTokenRotated", func(t *testing.T) {
			sess, conn := s.OpenTerminal(t, admin, "revoke-1")
			s.Do(t, admin, "POST", "/api/v1/devices/revoke-1/token", nil).Want(t, 201)
			want := "the device's credentials were replaced"
			fleetdtest.WantContains(t, "operator's end", fleetdtest.SessionEnd(t, conn), want)
			fleetdtest.WantContains(t, "recorded", s.EndReason(t, admin, "revoke-1", sess.ID), want)
		})
	})
}
