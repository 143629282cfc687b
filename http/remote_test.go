package fleethttp_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestTenantRemoteSessions: GET /api/v1/remote-sessions lists the
// tenant's sessions of every device, newest first, narrowed to a device
// with device_id, to the open ones with open=true, paged, and by
// fleetctl sessions list; another
// tenant's sessions never show.
func TestTenantRemoteSessions(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		admin := s.Admin()
		other := s.NewTenant(t, "others")
		open := func(c fleetdtest.Creds, device, target string) string {
			s.MustDevice(t, c, device, nil)
			var sess fleet.RemoteSession
			s.Do(t, c, "POST", "/api/v1/devices/"+device+"/remote-sessions", map[string]any{"kind": "get", "target": target}).Want(t, 201).Decode(t, &sess)
			return sess.ID
		}
		a1 := open(admin, "rs-a", "/etc/a")
		a2 := open(admin, "rs-b", "/etc/b")
		open(other, "rs-c", "/etc/other")
		list := func(c fleetdtest.Creds, query string) string {
			var l struct {
				RemoteSessions []fleet.RemoteSession `json:"remote_sessions"`
				Count          int
			}
			s.Do(t, c, "GET", "/api/v1/remote-sessions"+query, nil).Want(t, 200).Decode(t, &l)
			var got []string
			for _, rs := range l.RemoteSessions {
				got = append(got, rs.DeviceID+":"+rs.ID)
			}
			return fmt.Sprintf("%d %s", l.Count, strings.Join(got, " "))
		}
		if got, want := list(admin, ""), "2 rs-b:"+a2+" rs-a:"+a1; got != want {
			t.Fatalf("tenant's sessions = %s, want %s", got, want)
		}
		if got, want := list(admin, "?limit=1&page=2"), "2 rs-a:"+a1; got != want {
			t.Fatalf("second page = %s, want %s", got, want)
		}
		if got, want := list(admin, "?device_id=rs-a"), "1 rs-a:"+a1; got != want {
			t.Fatalf("rs-a's sessions = %s, want %s", got, want)
		}
		if got := list(admin, "?device_id=rs-c"); got != "0 " {
			t.Fatalf("another tenant's device's sessions = %s, want none", got)
		}
		if got := list(other, ""); strings.Contains(got, "rs-a") || !strings.HasPrefix(got, "1 rs-c:") {
			t.Fatalf("the other tenant's sessions = %s", got)
		}
		// Ended, rs-a's session leaves the open ones.
		s.Do(t, admin, "POST", "/api/v1/devices/rs-a/remote-sessions/"+a1+"/end", nil).Want(t, 202)
		fleetdtest.Eventually(t, "rs-a's session to end", func() bool { return list(admin, "?open=true") == "1 rs-b:"+a2 })
		if got, want := list(admin, "?open=true&device_id=rs-a"), "0 "; got != want {
			t.Fatalf("rs-a's open sessions = %s, want %s", got, want)
		}
		if got, want := list(admin, ""), "2 rs-b:"+a2+" rs-a:"+a1; got != want {
			t.Fatalf("tenant's sessions after an end = %s, want %s", got, want)
		}
		viewer := s.NewKey(t, admin, "rs-viewer", "viewer")
		if got := list(viewer, ""); !strings.HasPrefix(got, "2 ") {
			t.Fatalf("a viewer's list = %s", got)
		}
		// fleetctl sessions list without a device lists the tenant's,
		// naming each one's device.
		fleetctl := s.NewFleetctl(t, admin)
		out := fleetctl.OK(t, "sessions", "list")
		if !strings.HasPrefix(out, "DEVICE") || !strings.Contains(out, a1) || !strings.Contains(out, a2) || strings.Contains(out, "rs-c") {
			t.Fatalf("fleetctl sessions list:\n%s", out)
		}
		if out := fleetctl.OK(t, "sessions", "list", "--open"); strings.Contains(out, a1) || !strings.Contains(out, a2) {
			t.Fatalf("fleetctl sessions list --open:\n%s", out)
		}
		for q, name := range map[string]string{"device_id=no%20such": "device_id", "open=yes": "open"} {
			if r := s.Do(t, admin, "GET", "/api/v1/remote-sessions?"+q, nil).Want(t, 400); !strings.Contains(string(r.Body), name) {
				t.Fatalf("%s: %s", q, r.Body)
			}
		}
	})
}
