package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/internal/fleetdtest"
)

// TestReplicasRemoteSession runs remote sessions across two replicas on
// PostgreSQL with a real fleetd-agent whose --server is replica B: a
// session opened on A is relayed by A (recorded on the session), the
// device's leg landing on B and the operator's landing on B are each
// proxied to A in one hop, and revoking on B what a session on A stands
// on ends it.
func TestReplicasRemoteSession(t *testing.T) {
	bin := fleetdtest.BuildAgent(t)
	c := newCluster(t, "--remote-connect-timeout", "30s")
	a := c.start("replica-a")
	b := c.start("replica-b")
	admin := a.Admin()
	dev := a.MustDevice(t, admin, "edge-1", nil)
	agent := b.StartAgent(t, bin, "edge-1", dev.Token, "--remote")
	fleetdtest.Eventually(t, "the agent to connect", func() bool { return fleetdtest.AgentSays(agent, "level=INFO msg=connected") })
	db := c.db()
	relayOf := func(id string) string {
		var u string
		if err := db.QueryRow("SELECT relay_url FROM remote_sessions WHERE id = $1", id).Scan(&u); err != nil {
			t.Fatal(err)
		}
		return u
	}

	t.Run("DeviceLegProxied", func(t *testing.T) {
		// Opened and joined on A; the device dials B.
		sess, conn := a.OpenTerminal(t, admin, "edge-1")
		if u := relayOf(sess.ID); u != a.URL {
			t.Fatalf("the session's relay is %q, want A's %q", u, a.URL)
		}
		conn.Close()
		a.EndReason(t, admin, "edge-1", sess.ID)
	})
	t.Run("OperatorLegProxied", func(t *testing.T) {
		// Opened on A, joined on B: both legs come through B to A.
		var sess fleet.RemoteSession
		a.Do(t, admin, "POST", "/api/v1/devices/edge-1/remote-sessions", map[string]any{"kind": "shell"}).Want(t, 201).Decode(t, &sess)
		conn := b.JoinTerminal(t, admin, sess.ID)
		conn.Write([]byte("exit 4\n"))
		for {
			_, ctl, err := conn.Read()
			if err != nil {
				t.Fatalf("the session ended without the shell's exit: %v", err)
			}
			if ctl != nil {
				if ctl.Type != "exit" || ctl.Code != 4 {
					t.Fatalf("control %+v", ctl)
				}
				break
			}
		}
		fleetdtest.WantContains(t, "end", a.EndReason(t, admin, "edge-1", sess.ID), "closed by the device")
	})
	t.Run("RevokedOnTheOtherReplica", func(t *testing.T) {
		k := a.NewKey(t, admin, "edge-op", "operator")
		sess, conn := a.OpenTerminal(t, k, "edge-1")
		b.Do(t, admin, "DELETE", "/api/v1/apikeys/edge-op", nil).Want(t, 204)
		want := `API key "edge-op", which opened it, was deleted`
		fleetdtest.WantContains(t, "operator's end", fleetdtest.SessionEnd(t, conn), want)
		fleetdtest.WantContains(t, "recorded", b.EndReason(t, admin, "edge-1", sess.ID), want)
	})
}

// TestReplicaLostRemoteSession kills the replica that relays a recorded
// session: the other ends it once the dead one has been silent for
// --remote-replica-timeout, whether asked to (an end request) or by its
// own sweep, recording why and auditing it; the device's place under the
// cap is free again; the bytes relayed before the kill are recorded, as
// A's last heartbeat stored them; and the recording keeps what was output
// before the kill, from the parts stored while the session was open.
func TestReplicaLostRemoteSession(t *testing.T) {
	bin := fleetdtest.BuildAgent(t)
	blobs := t.TempDir()
	c := newCluster(t, "--remote-connect-timeout", "30s", "--remote-replica-timeout", "3s",
		"--remote-recording-flush", "200ms", "--remote-max-per-device", "1", "--blob-store", "file://"+blobs)
	a := c.start("replica-a")
	b := c.start("replica-b")
	admin := a.Admin()
	a.Do(t, admin, "PUT", "/api/v1/tenants/default/remote-settings", map[string]any{"recording": true}).Want(t, 204)
	dev := a.MustDevice(t, admin, "edge-1", nil)
	agent := b.StartAgent(t, bin, "edge-1", dev.Token, "--remote")
	fleetdtest.Eventually(t, "the agent to connect", func() bool { return fleetdtest.AgentSays(agent, "level=INFO msg=connected") })

	sess := outputRecorded(t, a.Server, admin, "edge-1", blobs)
	counted := bytesStored(t, a.Server, admin, "edge-1", sess.ID)
	a.kill()

	// Asked to end it on B: 202 until it has ended (the stop told to A,
	// which nobody hears, while A may still be alive), then 409.
	fleetdtest.Eventually(t, "the session to end", func() bool {
		st := b.Do(t, admin, "POST", "/api/v1/devices/edge-1/remote-sessions/"+sess.ID+"/end", nil).Status
		if st != 202 && st != 409 {
			t.Fatalf("end: %d", st)
		}
		return st == 409
	})
	rs := b.EndedSession(t, admin, "edge-1", sess.ID)
	fleetdtest.WantContains(t, "end", rs.EndReason, "replica lost: "+a.URL)
	wantBytes(t, rs, counted)
	var logs struct {
		AuditLogs []struct {
			Target  string         `json:"target"`
			Details map[string]any `json:"details"`
		} `json:"audit_logs"`
	}
	b.Do(t, admin, "GET", "/api/v1/audit-logs?action=remote.session.end", nil).Want(t, 200).Decode(t, &logs)
	if len(logs.AuditLogs) != 1 || !strings.Contains(fmt.Sprint(logs.AuditLogs[0].Details["end_reason"]), "replica lost") {
		t.Fatalf("audit: %+v", logs)
	}

	// What reached the blob store is the recording, on any replica.
	wantRecorded(t, b.Server, admin, rs)

	// The device's one place is free: a session through B works.
	_, conn2 := b.OpenTerminal(t, admin, "edge-1")
	conn2.Close()
}
