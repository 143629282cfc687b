package fleetdtest

import (
	"context"
	"io"
	"net"
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

// TerminalCols and TerminalRows are the size JoinTerminal's terminal
// says it has, as the console's and fleetctl's do before anything else.
const TerminalCols, TerminalRows = 100, 30

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
	conn.Send(remote.Control{Type: remote.TypeResize, Cols: TerminalCols, Rows: TerminalRows})
	conn.Write([]byte("echo rea''dy\n"))
	ReadUntil(t, conn, "ready")
	return conn
}

// ReadUntil reads the session's bytes until they hold text, and returns
// them.
func ReadUntil(t *testing.T, conn *remote.Conn, text string) string {
	t.Helper()
	var out strings.Builder
	for !strings.Contains(out.String(), text) {
		b, ctl, err := conn.Read()
		if err != nil || ctl != nil {
			t.Fatalf("before %q came: %v, %+v; output %q", text, err, ctl, out.String())
		}
		out.Write(b)
	}
	return out.String()
}

// SessionEnd reads the operator's leg until fleetd ends it, and returns
// the message of its error, or "exit" when the shell exited.
func SessionEnd(t *testing.T, conn *remote.Conn) string {
	t.Helper()
	for {
		_, ctl, err := conn.Read()
		if err != nil {
			t.Fatalf("the session ended without saying why: %v", err)
		}
		switch {
		case ctl == nil:
		case ctl.Type == remote.TypeError:
			return ctl.Message
		case ctl.Type == remote.TypeExit:
			return "exit"
		}
	}
}

// EndReason waits until session id of device has ended and returns why.
func (s *Server) EndReason(t *testing.T, c Creds, device, id string) string {
	t.Helper()
	return s.EndedSession(t, c, device, id).EndReason
}

// EndedSession waits until session id of device has ended and returns it.
func (s *Server) EndedSession(t *testing.T, c Creds, device, id string) fleet.RemoteSession {
	t.Helper()
	var found fleet.RemoteSession
	Eventually(t, "session "+id+" to have ended", func() bool {
		var list struct {
			RemoteSessions []fleet.RemoteSession `json:"remote_sessions"`
		}
		s.Do(t, c, "GET", "/api/v1/devices/"+device+"/remote-sessions?limit=100", nil).Want(t, 200).Decode(t, &list)
		for _, rs := range list.RemoteSessions {
			if rs.ID == id && rs.EndedAt != nil {
				found = rs
				return true
			}
		}
		return false
	})
	return found
}

// DeviceService is a TCP service for a test: it listens on a loopback
// port until the test ends and serves each connection it accepts with
// serve, on a goroutine of its own, closing the connection after. It
// returns the address it listens on. Most tests make it the service on the
// device's side of a forward, whence its name; serve may be anything a
// test needs listening, a proxy in front of fleetd say.
func DeviceService(t testing.TB, serve func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				serve(c)
			}()
		}
	}()
	return ln.Addr().String()
}

// Echo serves a connection by writing back what it reads, until the
// other end half-closes.
func Echo(c net.Conn) { io.Copy(c, c) }
