package sqlstore_test

import (
	"context"
	"testing"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

func TestTenantAuth(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, _ := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustTenant(t, db, "beta")
		_, err := db.FindTenantAuth(ctx, "acme")
		wantCode(t, err, fleet.ENOTFOUND)

		jwks := &fleet.TenantAuth{Method: fleet.AuthJWKS, JWKSURL: "https://id.example.com/jwks", Issuer: "https://id.example.com", Audience: "fleetd", DefaultRole: fleet.RoleViewer}
		if err := db.SetTenantAuth(ctx, "acme", jwks); err != nil {
			t.Fatal(err)
		}
		got, err := db.FindTenantAuth(ctx, "acme")
		if err != nil || *got != *jwks {
			t.Fatalf("got %+v, %v; want %+v", got, err, jwks)
		}
		hook := &fleet.TenantAuth{Method: fleet.AuthWebhook, WebhookURL: "https://auth.example.com/check", DefaultRole: fleet.RoleOperator}
		if err := db.SetTenantAuth(ctx, "acme", hook); err != nil {
			t.Fatal(err)
		}
		if got, _ := db.FindTenantAuth(ctx, "acme"); *got != *hook {
			t.Fatalf("after replace: %+v", got)
		}
		_, err = db.FindTenantAuth(ctx, "beta")
		wantCode(t, err, fleet.ENOTFOUND)
	})
}
