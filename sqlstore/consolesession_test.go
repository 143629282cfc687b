package sqlstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestConsoleSessions: a session is valid until it expires or is ended,
// only in its tenant; "all" ends the person's sessions and no one else's;
// deleting a key ends its sessions.
func TestConsoleSessions(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, be sqlstoretest.Backend) {
		db, clock := mustOpen(t, be)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustTenant(t, db, "beta")
		k := &fleet.APIKey{Name: "ops", Role: fleet.RoleOperator}
		if err := db.CreateAPIKey(ctx, "acme", k); err != nil {
			t.Fatal(err)
		}
		start := func(tenant, key, user string) (*fleet.ConsoleSession, string) {
			t.Helper()
			s := &fleet.ConsoleSession{Tenant: tenant, KeyName: key, UserName: user, Role: fleet.RoleOperator, ExpiresAt: clock.Now().Add(time.Hour)}
			tok, err := db.CreateConsoleSession(ctx, s)
			if err != nil {
				t.Fatal(err)
			}
			return s, tok
		}
		valid := func(tenant, tok string) bool {
			t.Helper()
			ok, err := db.ConsoleSessionValid(ctx, tenant, tok)
			if err != nil {
				t.Fatal(err)
			}
			return ok
		}

		s1, t1 := start("acme", "ops", "ops")
		_, t2 := start("acme", "ops", "ops")
		s3, t3 := start("acme", "", "ada@example.com")
		_, t4 := start("beta", "", "ada@example.com")
		if !valid("acme", t1) || valid("beta", t1) || valid("acme", "not-a-token") {
			t.Fatal("a session is valid outside its tenant, or not in it")
		}
		if ss, n, err := db.FindConsoleSessions(ctx, "acme", fleet.Page{Page: 1, Limit: 50}); err != nil || n != 3 || len(ss) != 3 {
			t.Fatalf("acme lists %d sessions (%d), err %v", len(ss), n, err)
		}

		// Another tenant cannot end acme's session.
		_, err := db.EndConsoleSession(ctx, "beta", s3.ID, true)
		wantCode(t, err, fleet.ENOTFOUND)
		if n, err := db.EndConsoleSession(ctx, "acme", s3.ID, true); err != nil || n != 1 {
			t.Fatalf("ending ada's sessions ended %d, err %v", n, err)
		}
		if valid("acme", t3) || !valid("beta", t4) || !valid("acme", t1) {
			t.Fatal("ending ada's acme sessions ended the wrong ones")
		}

		if n, err := db.EndConsoleSession(ctx, "acme", s1.ID, false); err != nil || n != 1 {
			t.Fatalf("ending one session ended %d, err %v", n, err)
		}
		if valid("acme", t1) || !valid("acme", t2) {
			t.Fatal("ending one session of ops did not end that one alone")
		}
		if err := db.DeleteAPIKey(ctx, "acme", "ops"); err != nil {
			t.Fatal(err)
		}
		if valid("acme", t2) {
			t.Fatal("deleting the key left its session open")
		}

		clock.Add(time.Hour)
		if valid("beta", t4) {
			t.Fatal("an expired session is valid")
		}
		start("beta", "", "bob")
		if ss, n, err := db.FindConsoleSessions(ctx, "beta", fleet.Page{Page: 1, Limit: 50}); err != nil || n != 1 || ss[0].UserName != "bob" {
			t.Fatalf("beta lists %d sessions after one expired, err %v", n, err)
		}
	})
}

// BenchmarkConsoleSessionValid is the check every console request makes:
// one read of the session's row by its key, among 1,000 sessions.
//
//	go test ./sqlstore -run '^$' -bench ConsoleSessionValid
func BenchmarkConsoleSessionValid(b *testing.B) {
	for _, be := range sqlstoretest.Backends() {
		b.Run(be.Name, func(b *testing.B) {
			db := sqlstoretest.MustOpen(b, be, sqlstoretest.Options{})
			mustTenant(b, db, "acme")
			ctx := context.Background()
			var tok string
			for i := range 1_000 {
				var err error
				s := &fleet.ConsoleSession{Tenant: "acme", UserName: "ada", Role: fleet.RoleViewer, ExpiresAt: time.Now().Add(time.Hour)}
				if tok, err = db.CreateConsoleSession(ctx, s); err != nil {
					b.Fatal(i, err)
				}
			}
			for b.Loop() {
				if ok, err := db.ConsoleSessionValid(ctx, "acme", tok); !ok || err != nil {
					b.Fatal(ok, err)
				}
			}
		})
	}
}
