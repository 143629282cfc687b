package sqlstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/internal/testclock"
	"github.com/fleetd/fleet/sqlstore"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestLostRemoteSessions finds the sessions a replica left open: when it
// starts again, on PostgreSQL those relayed at its URL and started before
// it did, on SQLite (one process) every one started before; and on
// PostgreSQL, while it is gone, those of a replica whose heartbeat is
// older than the timeout, which count under no cap meanwhile. Ended, they
// are audited as any end.
func TestLostRemoteSessions(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		ctx := context.Background()
		dsn := b.DSN(t)
		clock := testclock.New(time.Date(2026, 11, 21, 10, 0, 0, 123e6, time.UTC))
		db, err := sqlstore.Open(ctx, dsn, sqlstore.Options{Now: clock.Now})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		if _, err := db.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		raw := openRaw(t, b, dsn)
		mustTenant(t, db, "acme")
		var open fleet.RemoteOpen
		admit := func(o fleet.RemoteOpen) error { open = o; return nil }
		const silent = 30 * time.Second
		start := func(relay string) *fleet.RemoteSession {
			t.Helper()
			s := &fleet.RemoteSession{Tenant: "acme", DeviceID: "d1", Kind: fleet.RemoteShell, UserName: "ops", RelayURL: relay}
			if err := db.CreateRemoteSession(ctx, s, time.Time{}, silent, admit); err != nil {
				t.Fatal(err)
			}
			return s
		}
		ids := func(list []*fleet.RemoteSession) map[string]bool {
			m := map[string]bool{}
			for _, s := range list {
				if s.Tenant != "acme" || s.RelayURL == "" {
					t.Fatalf("lost session %+v", s)
				}
				m[s.ID] = true
			}
			return m
		}
		end := func(list []*fleet.RemoteSession, reason string) {
			t.Helper()
			for _, s := range list {
				s.EndReason = reason
				if err := db.EndRemoteSession(ctx, s); err != nil {
					t.Fatal(err)
				}
			}
		}

		// Restarted: A's sessions from before.
		mine, theirs := start("http://a:8080"), start("http://b:8080")
		clock.Add(time.Second)
		restarted := clock.Now()
		late := start("http://a:8080") // opened by the replica's new run
		lost, err := db.FindLostRemoteSessions(ctx, fleet.RemoteLost{RelayURL: "http://a:8080", Before: restarted})
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]bool{mine.ID: true}
		if b.Name == "sqlite" {
			want[theirs.ID] = true
		}
		if got := ids(lost); len(got) != len(want) || !got[mine.ID] || got[theirs.ID] != want[theirs.ID] || got[late.ID] {
			t.Fatalf("lost at restart %v, want %v", got, want)
		}
		end(lost, "the replica relaying it stopped without ending it")
		start("http://a:8080")
		if n := 3 - len(want); open.Device != n {
			t.Fatalf("the cap counted %d open sessions of the device, want %d", open.Device, n)
		}
		logs, _, err := db.FindAuditLogs(ctx, "acme", fleet.AuditFilter{Action: "remote.session.end", Page: fleet.Page{Page: 1, Limit: 10}})
		if err != nil {
			t.Fatal(err)
		}
		if len(logs) != len(want) {
			t.Fatalf("%d audited ends, want %d", len(logs), len(want))
		}

		// Silent: C beat once, then nothing for longer than the timeout.
		if err := db.BeatRemoteRelay(ctx, "http://a:8080", silent); err != nil {
			t.Fatal(err)
		}
		if err := db.BeatRemoteRelay(ctx, "http://c:8080", silent); err != nil {
			t.Fatal(err)
		}
		gone := start("http://c:8080")
		before := open.Device + 1 // with gone
		lost, err = db.FindLostRemoteSessions(ctx, fleet.RemoteLost{Silent: silent})
		if err != nil || len(lost) != 0 {
			t.Fatalf("lost while C beats: %v, %v", lost, err)
		}
		if b.Name == "sqlite" {
			return // one process: nobody else to be lost
		}
		if _, err := raw.Exec("UPDATE remote_relays SET seen_at = seen_at - 60000 WHERE relay_url = 'http://c:8080'"); err != nil {
			t.Fatal(err)
		}
		start("http://a:8080")
		if open.Device != before-1 {
			t.Fatalf("the cap counted %d open sessions of the device, want %d: the lost one counts", open.Device, before-1)
		}
		for _, q := range []fleet.RemoteLost{{Silent: silent}, {Silent: silent, Tenant: "acme", ID: gone.ID}} {
			lost, err = db.FindLostRemoteSessions(ctx, q)
			if got := ids(lost); err != nil || len(got) != 1 || !got[gone.ID] {
				t.Fatalf("lost %+v: %v, %v", q, got, err)
			}
		}
		if lost, err := db.FindLostRemoteSessions(ctx, fleet.RemoteLost{Silent: silent, Tenant: "acme", ID: late.ID}); err != nil || len(lost) != 0 {
			t.Fatalf("lost %v, %v; A beats", lost, err)
		}
		// A silent replica is forgotten once its sessions have ended.
		relays := func() int {
			var n int
			if err := raw.QueryRow("SELECT count(*) FROM remote_relays").Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		if err := db.BeatRemoteRelay(ctx, "http://a:8080", silent); err != nil {
			t.Fatal(err)
		}
		if n := relays(); n != 2 {
			t.Fatalf("%d relays, want A and C (whose session is open)", n)
		}
		end(lost, "replica lost")
		if err := db.BeatRemoteRelay(ctx, "http://a:8080", silent); err != nil {
			t.Fatal(err)
		}
		if n := relays(); n != 1 {
			t.Fatalf("%d relays, want A alone", n)
		}
	})
}
