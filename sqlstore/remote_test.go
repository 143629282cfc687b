package sqlstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestEndStaleRemoteSessions ends the sessions a replica left open when it
// stopped without ending them: on PostgreSQL those relayed at its URL and
// started before it started again, on SQLite (one process) every one
// started before; they no longer count under the caps, and the ends are
// audited.
func TestEndStaleRemoteSessions(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		ctx := context.Background()
		db, clock := mustOpen(t, b)
		mustTenant(t, db, "acme")
		var open fleet.RemoteOpen
		admit := func(o fleet.RemoteOpen) error { open = o; return nil }
		start := func(relay string) *fleet.RemoteSession {
			t.Helper()
			s := &fleet.RemoteSession{Tenant: "acme", DeviceID: "d1", Kind: fleet.RemoteShell, UserName: "ops", RelayURL: relay}
			if err := db.CreateRemoteSession(ctx, s, time.Time{}, admit); err != nil {
				t.Fatal(err)
			}
			return s
		}
		mine, theirs := start("http://a:8080"), start("http://b:8080")
		clock.Add(time.Second)
		restarted := clock.Now()
		late := start("http://a:8080") // opened by the replica's new run
		n, err := db.EndStaleRemoteSessions(ctx, "http://a:8080", restarted, "the replica relaying it stopped without ending it")
		if err != nil {
			t.Fatal(err)
		}
		wantEnded := map[string]bool{mine.ID: true, theirs.ID: b.Name == "sqlite", late.ID: false}
		want := 1
		if b.Name == "sqlite" {
			want = 2
		}
		if n != want {
			t.Fatalf("ended %d, want %d", n, want)
		}
		list, _, err := db.FindRemoteSessions(ctx, "acme", fleet.RemoteSessionFilter{DeviceID: "d1", Page: fleet.Page{Page: 1, Limit: 10}})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range list {
			if ended := s.EndedAt != nil; ended != wantEnded[s.ID] || ended && s.EndReason != "the replica relaying it stopped without ending it" {
				t.Errorf("session %s: ended %v (%q), want ended %v", s.ID, s.EndedAt, s.EndReason, wantEnded[s.ID])
			}
		}
		start("http://a:8080")
		if open.Device != 3-want {
			t.Fatalf("the cap counted %d open sessions of the device, want %d", open.Device, 3-want)
		}
		logs, _, err := db.FindAuditLogs(ctx, "acme", fleet.AuditFilter{Action: "remote.session.end", Page: fleet.Page{Page: 1, Limit: 10}})
		if err != nil {
			t.Fatal(err)
		}
		if len(logs) != want {
			t.Fatalf("%d audited ends, want %d", len(logs), want)
		}
	})
}
