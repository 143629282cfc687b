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
		if err := db.BeatRemoteRelay(ctx, "http://a:8080", silent, nil); err != nil {
			t.Fatal(err)
		}
		if err := db.BeatRemoteRelay(ctx, "http://c:8080", silent, nil); err != nil {
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
		if err := db.BeatRemoteRelay(ctx, "http://a:8080", silent, nil); err != nil {
			t.Fatal(err)
		}
		if n := relays(); n != 2 {
			t.Fatalf("%d relays, want A and C (whose session is open)", n)
		}
		end(lost, "replica lost")
		if err := db.BeatRemoteRelay(ctx, "http://a:8080", silent, nil); err != nil {
			t.Fatal(err)
		}
		if n := relays(); n != 1 {
			t.Fatalf("%d relays, want A alone", n)
		}
	})
}

// TestRemoteBytesWithHeartbeat stores open sessions' byte counts with a
// replica's heartbeat, as many as it names in one write (more than one
// SQLite statement's batch), on both databases: a session is found lost
// with them, so that its end records them; a session another replica
// relays, or one that ended, keeps its own.
func TestRemoteBytesWithHeartbeat(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		ctx := context.Background()
		db, _ := openWithRaw(t, b)
		mustTenant(t, db, "acme")
		const silent = 30 * time.Second
		start := func(relay string) *fleet.RemoteSession {
			t.Helper()
			s := &fleet.RemoteSession{Tenant: "acme", DeviceID: "d1", Kind: fleet.RemoteForward, UserName: "ops", RelayURL: relay}
			if err := db.CreateRemoteSession(ctx, s, time.Time{}, silent, func(fleet.RemoteOpen) error { return nil }); err != nil {
				t.Fatal(err)
			}
			return s
		}
		const n = 600 // two of SQLite's batches
		var counts []fleet.RemoteBytes
		for i := range n {
			s := start("http://a:8080")
			counts = append(counts, fleet.RemoteBytes{ID: s.ID, ToDevice: int64(i), FromDevice: int64(3*i + 1)})
		}
		theirs, ended := start("http://b:8080"), start("http://a:8080")
		ended.BytesToDevice, ended.BytesFromDevice, ended.EndReason = 7, 8, "closed by the operator"
		if err := db.EndRemoteSession(ctx, ended); err != nil {
			t.Fatal(err)
		}
		counts = append(counts, fleet.RemoteBytes{ID: theirs.ID, ToDevice: 99, FromDevice: 99},
			fleet.RemoteBytes{ID: ended.ID, ToDevice: 99, FromDevice: 99})
		if err := db.BeatRemoteRelay(ctx, "http://a:8080", silent, counts); err != nil {
			t.Fatal(err)
		}
		// Found lost (A started again), with what A stored.
		lost, err := db.FindLostRemoteSessions(ctx, fleet.RemoteLost{RelayURL: "http://a:8080", Before: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]fleet.RemoteBytes{}
		for _, c := range counts[:n] {
			want[c.ID] = c
		}
		got := 0
		for _, s := range lost {
			if s.ID == theirs.ID && b.Name == "sqlite" {
				continue // one process: every replica's is lost
			}
			c, ok := want[s.ID]
			if !ok || s.BytesToDevice != c.ToDevice || s.BytesFromDevice != c.FromDevice {
				t.Fatalf("lost session %s with %d and %d bytes, want %+v", s.ID, s.BytesToDevice, s.BytesFromDevice, c)
			}
			got++
		}
		if got != n {
			t.Fatalf("%d lost sessions, want %d", got, n)
		}
		check := func(s *fleet.RemoteSession, to, from int64) {
			t.Helper()
			r, err := db.FindRemoteSession(ctx, "acme", "d1", s.ID)
			if err != nil {
				t.Fatal(err)
			}
			if r.BytesToDevice != to || r.BytesFromDevice != from {
				t.Fatalf("session %s: %d and %d bytes, want %d and %d", s.ID, r.BytesToDevice, r.BytesFromDevice, to, from)
			}
		}
		check(theirs, 0, 0)
		check(ended, 7, 8)
		// A later beat stores newer counts; one without counts keeps them.
		if err := db.BeatRemoteRelay(ctx, "http://a:8080", silent, []fleet.RemoteBytes{{ID: counts[0].ID, ToDevice: 1000, FromDevice: 2000}}); err != nil {
			t.Fatal(err)
		}
		if err := db.BeatRemoteRelay(ctx, "http://a:8080", silent, nil); err != nil {
			t.Fatal(err)
		}
		check(&fleet.RemoteSession{ID: counts[0].ID}, 1000, 2000)
	})
}
