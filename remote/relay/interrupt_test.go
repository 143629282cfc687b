package relay_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestInterruptAwaitingDevice interrupts fleetctl while fleetd awaits a
// device that does not dial back (no agent runs), as Ctrl-C does: the
// relay watches the operator's leg meanwhile, so the session ends at once,
// closed by the operator, and fleetctl returns well within its patience
// and far before the minute the device has, with the session ended.
func TestInterruptAwaitingDevice(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b, "--remote-connect-timeout", "1m")
		admin := s.Admin()
		s.MustDevice(t, admin, "edge-off", nil)
		local := filepath.Join(t.TempDir(), "f")
		if err := os.WriteFile(local, []byte("put\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		fc := s.NewFleetctl(t, admin)
		list := func(query string) []fleet.RemoteSession {
			var list struct {
				RemoteSessions []fleet.RemoteSession `json:"remote_sessions"`
			}
			s.Do(t, admin, "GET", "/api/v1/devices/edge-off/remote-sessions?"+query, nil).Want(t, 200).Decode(t, &list)
			return list.RemoteSessions
		}
		open := func() []fleet.RemoteSession { return list("open=true") }
		cmds := [][]string{
			{"ssh", "edge-off", "--", "cat"},
			{"cp", "edge-off:f", filepath.Join(t.TempDir(), "g")},
			{"cp", local, "edge-off:f"},
		}
		for _, leg := range []string{"", "1"} {
			fc.Env["FLEETCTL_REMOTE_WEBSOCKET"] = leg
			for _, args := range cmds {
				joined := fleetdtest.MetricSum(t, s.URL, "fleetd_remote_legs_total", `side="operator"`)
				ctx, cancel := context.WithCancel(context.Background())
				_, done := fc.Start(ctx, args...)
				var id string
				fleetdtest.Eventually(t, "the session to open", func() bool {
					if o := open(); len(o) == 1 {
						id = o[0].ID
						return true
					}
					return false
				})
				fleetdtest.Eventually(t, "the operator's leg to join", func() bool {
					return fleetdtest.MetricSum(t, s.URL, "fleetd_remote_legs_total", `side="operator"`) > joined
				})
				cancel()
				var r fleetdtest.CtlResult
				select {
				case r = <-done:
				case <-time.After(20 * time.Second):
					t.Fatalf("%v (websocket %q): fleetctl still runs 20s after the interrupt", args, leg)
				}
				// Without the watch fleetctl gives up after its patience
				// and says fleetd did not close the session.
				if strings.Contains(r.Stderr, "did not close") {
					t.Fatalf("%v (websocket %q): %v", args, leg, r)
				}
				if o := open(); len(o) != 0 {
					t.Fatalf("%v (websocket %q): %d sessions still open", args, leg, len(o))
				}
				var got fleet.RemoteSession
				for _, rs := range list("limit=100") {
					if rs.ID == id {
						got = rs
					}
				}
				if !strings.HasPrefix(got.EndReason, "closed by the operator") {
					t.Fatalf("%v (websocket %q): ended %q", args, leg, got.EndReason)
				}
			}
		}
	})
}
