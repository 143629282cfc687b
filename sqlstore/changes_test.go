package sqlstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestListen checks that what one replica changes reaches another's
// listener, and that the listener drops the store's own API-key cache.
func TestListen(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		if b.Name != "postgres" {
			t.Skip("one process on SQLite: nothing to hear")
		}
		ctx := context.Background()
		dsn := b.DSN(t)
		open := func() *sqlstore.DB {
			db, err := sqlstore.Open(ctx, dsn, sqlstore.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			return db
		}
		a, other := open(), open()
		if _, err := a.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		// A second installation in another schema of the same database
		// must not be heard.
		stranger := sqlstoretest.MustOpen(t, b, sqlstoretest.Options{})

		heard := make(chan fleet.Change, 100)
		lctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { other.Listen(lctx, func(c fleet.Change) { heard <- c }); close(done) }()
		t.Cleanup(func() { stop(); <-done })
		next := func() fleet.Change {
			t.Helper()
			select {
			case c := <-heard:
				return c
			case <-time.After(10 * time.Second):
				t.Fatal("no change heard")
			}
			panic("unreachable")
		}
		if c := next(); c.Kind != fleet.ChangeAll {
			t.Fatalf("first change %+v, want all (listening started)", c)
		}

		if _, _, err := stranger.CreateTenant(ctx, "acme"); err != nil {
			t.Fatal(err)
		}
		if _, _, err := a.CreateTenant(ctx, "acme"); err != nil {
			t.Fatal(err)
		}
		key := &fleet.APIKey{Name: "ops", Role: fleet.RoleOperator}
		if err := a.CreateAPIKey(ctx, "acme", key); err != nil {
			t.Fatal(err)
		}
		if _, err := other.AuthenticateAPIKey(ctx, "acme", key.Key); err != nil {
			t.Fatal(err) // now cached on the other replica
		}
		if _, err := stranger.CreateDevices(ctx, "acme", []fleet.NewDevice{{ID: "s1"}}); err != nil {
			t.Fatal(err)
		}
		sv := "y"
		if _, err := stranger.UpdateDeviceMetadata(ctx, "acme", "s1", map[string]*string{"k": &sv}); err != nil {
			t.Fatal(err)
		}
		if err := a.DeleteAPIKey(ctx, "acme", "ops"); err != nil {
			t.Fatal(err)
		}
		if c := next(); c.Kind != fleet.ChangeAPIKey || c.Tenant != "acme" || c.Key != fleet.HashSecret(key.Key) {
			t.Fatalf("heard %+v, want the deleted key", c)
		}
		if _, err := other.AuthenticateAPIKey(ctx, "acme", key.Key); fleet.ErrorCode(err) != fleet.EUNAUTHENTICATED {
			t.Fatalf("deleted key still accepted on the other replica: %v", err)
		}

		if err := a.SetTenantAuth(ctx, "acme", &fleet.TenantAuth{Method: fleet.AuthWebhook, WebhookURL: "https://example.com", DefaultRole: fleet.RoleViewer}); err != nil {
			t.Fatal(err)
		}
		if c := next(); c.Kind != fleet.ChangeTenantAuth || c.Tenant != "acme" {
			t.Fatalf("heard %+v", c)
		}
		if _, err := a.CreateDevices(ctx, "acme", []fleet.NewDevice{{ID: "d1"}}); err != nil {
			t.Fatal(err)
		}
		v := "x"
		if _, err := a.UpdateDeviceMetadata(ctx, "acme", "d1", map[string]*string{"k": &v}); err != nil {
			t.Fatal(err)
		}
		if c := next(); c.Kind != fleet.ChangeDevice || c.Key != "d1" {
			t.Fatalf("heard %+v", c)
		}
		r := &fleet.AlertRule{Name: "hot", Stream: "t", Condition: map[string]any{"field": "x", "operator": ">", "value": 1.0}}
		if err := a.CreateAlertRule(ctx, "acme", r); err != nil {
			t.Fatal(err)
		}
		if c := next(); c.Kind != fleet.ChangeAlertRule || c.Key != r.ID {
			t.Fatalf("heard %+v", c)
		}
		if err := a.DeleteDevice(ctx, "acme", "d1"); err != nil {
			t.Fatal(err)
		}
		if c := next(); c.Kind != fleet.ChangeDeviceDelete || c.Key != "d1" {
			t.Fatalf("heard %+v", c)
		}
		// Ending a person's console sessions announces each, so that what
		// they opened (remote sessions) ends on every replica.
		var ids []string
		for range 2 {
			cs := &fleet.ConsoleSession{Tenant: "acme", UserName: "ada", Role: fleet.RoleOperator, ExpiresAt: time.Now().Add(time.Hour)}
			if _, err := a.CreateConsoleSession(ctx, cs); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, cs.ID)
		}
		if n, err := a.EndConsoleSession(ctx, "acme", ids[0], true); err != nil || n != 2 {
			t.Fatalf("ended %d console sessions, err %v", n, err)
		}
		heardIDs := map[string]bool{}
		for range 2 {
			if c := next(); c.Kind != fleet.ChangeConsoleSession || c.Tenant != "acme" {
				t.Fatalf("heard %+v", c)
			} else {
				heardIDs[c.Key] = true
			}
		}
		if !heardIDs[ids[0]] || !heardIDs[ids[1]] {
			t.Fatalf("heard the end of %v, want %v", heardIDs, ids)
		}
		select {
		case c := <-heard:
			t.Fatalf("heard %+v more", c)
		case <-time.After(100 * time.Millisecond):
		}
	})
}
