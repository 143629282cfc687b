package fleetdtest

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/remote"
)

// OpenTerminal opens a terminal session with device as c and joins it,
// on s; it returns the session and the operator's leg, with the shell
// answering.
func (s *Server) OpenTerminal(t *testing.T, c Creds, device string) (fleet.RemoteSession, *remote.Conn) {
	t.Helper()
	var sess fleet.RemoteSession
	s.Do(t, c, "POST", "/api/v1/devices/"+device+"/remote-sessions", map[string]any{"kind": "shell"}).Want(t, 201).Decode(t, &sess)
	conn := s.JoinTerminal(t, c, sess.ID)
	return sess, conn
}

// JoinTerminal joins session id's operator leg on s and waits for the
// shell to answer.
func (s *Server) JoinTerminal(t *testing.T, c Creds, id string) *remote.Conn {
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

// SessionEnd reads the operator's leg until fleetd ends it, and returns
// the message of its error.
func SessionEnd(t *testing.T, conn *remote.Conn) string {
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

// EndReason waits until session id of device has ended and returns why.
func (s *Server) EndReason(t *testing.T, c Creds, device, id string) string {
	t.Helper()
	var reason string
	Eventually(t, "session "+id+" to have ended", func() bool {
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
