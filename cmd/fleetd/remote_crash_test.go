package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestRemoteRecordingCrash kills fleetd while it relays a recorded shell
// session: started again, it ends the session ("stopped without ending
// it"), with the bytes relayed before the kill as its last heartbeat
// stored them, and the recording holds what was output before the kill,
// from the parts stored while the session was open (docs/agent.md,
// Recording).
func TestRemoteRecordingCrash(t *testing.T) {
	bin := fleetdtest.BuildAgent(t)
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := newServer(t, b)
		// A --replica-url of its own, the same at each start (the port is
		// not): on PostgreSQL it names the sessions the next start ends.
		flags := []string{"--remote-recording-flush", "200ms", "--remote-replica-timeout", "3s", "--replica-url", "http://crashing-replica.test"}
		p := startProcess(t, s, flags...)
		admin := s.Admin()
		s.Do(t, admin, "PUT", "/api/v1/tenants/default/remote-settings", map[string]any{"recording": true}).Want(t, 204)
		dev := s.MustDevice(t, admin, "edge-1", nil)
		agent := s.StartAgent(t, bin, "edge-1", dev.Token, "--remote")
		fleetdtest.Eventually(t, "the agent to connect", func() bool { return fleetdtest.AgentSays(agent, "level=INFO msg=connected") })

		sess := outputRecorded(t, s.Server, admin, "edge-1", filepath.Join(s.DataDir, "blobs"))
		counted := bytesStored(t, s.Server, admin, "edge-1", sess.ID)
		p.kill()

		startProcess(t, s, flags...)
		rs := s.EndedSession(t, admin, "edge-1", sess.ID)
		if rs.EndReason != "the replica relaying it stopped without ending it" {
			t.Fatalf("session %+v", rs)
		}
		wantBytes(t, rs, counted)
		wantRecorded(t, s.Server, admin, rs)
	})
}

// outputRecorded opens a terminal on device through s, as c, in a tenant
// that records them, has it output "before-the-kill", and waits until
// that reached the parts of its recording in the blob store at blobs (a
// file:// store).
func outputRecorded(t *testing.T, s *fleetdtest.Server, c fleetdtest.Creds, device, blobs string) fleet.RemoteSession {
	t.Helper()
	sess, conn := s.OpenTerminal(t, c, device)
	t.Cleanup(func() { conn.Close() })
	conn.Write([]byte("echo before-''the-kill\n"))
	fleetdtest.ReadUntil(t, conn, "before-the-kill")
	parts := filepath.Join(blobs, "remote-recording-parts", c.Tenant, sess.ID)
	fleetdtest.Eventually(t, "the output to reach the blob store", func() bool {
		files, _ := os.ReadDir(parts)
		var all []byte
		for _, f := range files {
			b, _ := os.ReadFile(filepath.Join(parts, f.Name()))
			all = append(all, b...)
		}
		return strings.Contains(string(all), "before-the-kill")
	})
	return sess
}

// wantRecorded checks that the ended session rs has a recording, read
// through s, that holds what outputRecorded had its terminal output.
func wantRecorded(t *testing.T, s *fleetdtest.Server, c fleetdtest.Creds, rs fleet.RemoteSession) {
	t.Helper()
	if rs.Recording == "" || rs.RecordingSize == 0 {
		t.Fatalf("no recording: %+v", rs)
	}
	cast := s.Do(t, c, "GET", rs.Recording, nil).Want(t, 200).Body
	if int64(len(cast)) != rs.RecordingSize || !strings.HasPrefix(string(cast), `{"height":`) || !strings.Contains(string(cast), "before-the-kill") {
		t.Fatalf("recording of %d bytes (%d said): %q", len(cast), rs.RecordingSize, cast)
	}
}

// bytesStored waits until the open session id of device, as s lists it,
// shows bytes both ways, which its replica's heartbeat stores, and
// returns it.
func bytesStored(t *testing.T, s *fleetdtest.Server, c fleetdtest.Creds, device, id string) fleet.RemoteSession {
	t.Helper()
	var found fleet.RemoteSession
	fleetdtest.Eventually(t, "a heartbeat to store the session's bytes", func() bool {
		var list struct {
			RemoteSessions []fleet.RemoteSession `json:"remote_sessions"`
		}
		s.Do(t, c, "GET", "/api/v1/devices/"+device+"/remote-sessions?open=true", nil).Want(t, 200).Decode(t, &list)
		for _, rs := range list.RemoteSessions {
			if rs.ID == id && rs.BytesToDevice > 0 && rs.BytesFromDevice > 0 {
				found = rs
				return true
			}
		}
		return false
	})
	return found
}

// wantBytes checks that the session rs, ended without its replica, records
// at least the bytes the open session had stored (the shell's prompt may
// have been stored after them).
func wantBytes(t *testing.T, rs, stored fleet.RemoteSession) {
	t.Helper()
	if rs.BytesToDevice < stored.BytesToDevice || rs.BytesFromDevice < stored.BytesFromDevice {
		t.Fatalf("ended with %d bytes to the device and %d from it; its replica had stored %d and %d",
			rs.BytesToDevice, rs.BytesFromDevice, stored.BytesToDevice, stored.BytesFromDevice)
	}
}
