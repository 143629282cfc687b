package relay_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/remote/relay"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestConsecutiveSessions runs a script's sessions one after the other
// through fleetctl, with a real fleetd-agent, under caps of one session a
// device and a person: when fleetctl returns, its session has ended and no
// longer counts (docs/agent.md, Caps), so the next one is not refused. Each
// end's record is held back a moment (SetEndPause), as a slow database
// would: fleetctl must wait for it, whichever the kind of session and of
// leg.
func TestConsecutiveSessions(t *testing.T) {
	relay.SetEndPause(t, 300*time.Millisecond)
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b, "--remote-connect-timeout", "1m", "--remote-max-per-device", "1", "--remote-max-per-user", "1")
		admin := s.Admin()
		root, local := t.TempDir(), t.TempDir()
		for _, f := range []string{"a", "b"} {
			if err := os.WriteFile(filepath.Join(root, f), []byte("file "+f+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		a := s.StartAgent(t, fleetdtest.BuildAgent(t), "edge-c", s.MustDevice(t, admin, "edge-c", nil).Token, "--remote", "--remote-root", root)
		fleetdtest.Eventually(t, "the agent to connect", func() bool { return fleetdtest.AgentSays(a, "msg=connected") })
		_, port, _ := net.SplitHostPort(fleetdtest.DeviceService(t, fleetdtest.Echo))
		fc := s.NewFleetctl(t, admin)
		run := func(t *testing.T, stdin string, code int, args ...string) string {
			t.Helper()
			r := fc.Run(stdin, args...)
			if r.Code != code {
				t.Fatalf("%v", r)
			}
			// Nothing open either: the end is recorded, not only the
			// cap's count on the way.
			var list struct{ Count int }
			s.Do(t, admin, "GET", "/api/v1/devices/edge-c/remote-sessions?open=true", nil).Want(t, 200).Decode(t, &list)
			if list.Count != 0 {
				t.Fatalf("after %v\n%d sessions still open", r, list.Count)
			}
			return r.Stdout
		}
		forward := func(t *testing.T, line string) {
			t.Helper()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			out, done := fc.Start(ctx, "forward", "edge-c", "0:"+port)
			var addr string
			fleetdtest.Eventually(t, "fleetctl forward to listen", func() bool {
				addr, _, _ = strings.Cut(out.String(), "\n")
				return strings.HasPrefix(addr, "127.0.0.1:")
			})
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			fmt.Fprintln(c, line)
			c.(*net.TCPConn).CloseWrite()
			got, err := io.ReadAll(bufio.NewReader(c))
			if err != nil || string(got) != line+"\n" {
				t.Fatalf("through the forward: %q, %v", got, err)
			}
			cancel()
			if r := <-done; r.Code != 0 {
				t.Fatalf("%v", r)
			}
		}
		legs := []struct{ name, websocket string }{{"Stream", ""}, {"WebSocket", "1"}}
		for _, leg := range legs {
			t.Run(leg.name, func(t *testing.T) {
				fc.Env["FLEETCTL_REMOTE_WEBSOCKET"] = leg.websocket
				for _, f := range []string{"a", "b"} {
					run(t, "", 0, "cp", "edge-c:"+f, filepath.Join(local, f))
					if got, _ := os.ReadFile(filepath.Join(local, f)); string(got) != "file "+f+"\n" {
						t.Fatalf("got %q", got)
					}
				}
				for _, f := range []string{"a", "b"} {
					run(t, "", 0, "cp", filepath.Join(local, f), "edge-c:c")
					if got, _ := os.ReadFile(filepath.Join(root, "c")); string(got) != "file "+f+"\n" {
						t.Fatalf("put %q", got)
					}
				}
				if out := run(t, "", 0, "ssh", "edge-c", "--", "echo one"); out != "one\n" {
					t.Fatalf("out %q", out)
				}
				run(t, "", 3, "ssh", "edge-c", "--", "exit 3")
				if out := run(t, "in\n", 0, "ssh", "edge-c", "--", "cat"); out != "in\n" {
					t.Fatalf("out %q", out)
				}
				forward(t, "first")
				forward(t, "second")
				run(t, "", 0, "cp", "edge-c:a", filepath.Join(local, "a"))
			})
		}
		var list struct {
			RemoteSessions []fleet.RemoteSession `json:"remote_sessions"`
		}
		s.Do(t, admin, "GET", "/api/v1/devices/edge-c/remote-sessions?limit=100", nil).Want(t, 200).Decode(t, &list)
		if n := len(list.RemoteSessions); n != 2*10 {
			t.Fatalf("%d sessions, want %d", n, 2*10)
		}
	})
}
