package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/fleetd/fleet"
)

var _ fleet.TenantAuthService = (*DB)(nil)

// SetTenantAuth replaces a tenant's end-user authentication.
func (db *DB) SetTenantAuth(ctx context.Context, tenant string, a *fleet.TenantAuth) error {
	return db.update(ctx, func(ctx context.Context, tx *Tx) error {
		a.UpdatedAt = tx.now.Truncate(time.Millisecond)
		var clientID, secret string
		if a.OIDC != nil {
			clientID, secret = a.OIDC.ClientID, a.OIDC.ClientSecret
		}
		if _, err := tx.exec(ctx, `INSERT INTO tenant_auth (tenant, method, jwks_url, issuer, audience, webhook_url, default_role, updated_at, oidc_client_id, oidc_client_secret)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (tenant) DO UPDATE SET method = excluded.method, jwks_url = excluded.jwks_url, issuer = excluded.issuer,
				audience = excluded.audience, webhook_url = excluded.webhook_url, default_role = excluded.default_role, updated_at = excluded.updated_at,
				oidc_client_id = excluded.oidc_client_id, oidc_client_secret = excluded.oidc_client_secret`,
			tenant, a.Method, a.JWKSURL, a.Issuer, a.Audience, a.WebhookURL, string(a.DefaultRole), millis(a.UpdatedAt), clientID, secret); err != nil {
			return err
		}
		if err := tx.changed(ctx, fleet.Change{Kind: fleet.ChangeTenantAuth, Tenant: tenant}); err != nil {
			return err
		}
		return tx.audit(ctx, tenant, "tenant.auth.update", "tenants/"+tenant+"/auth", map[string]any{
			"method": a.Method, "jwks_url": a.JWKSURL, "issuer": a.Issuer, "audience": a.Audience,
			"webhook_url": a.WebhookURL, "default_role": a.DefaultRole, "oidc_client_id": clientID,
		})
	})
}

// FindTenantAuth returns a tenant's end-user authentication.
func (db *DB) FindTenantAuth(ctx context.Context, tenant string) (*fleet.TenantAuth, error) {
	var a fleet.TenantAuth
	var updated int64
	var clientID, secret string
	err := db.queryRow(ctx, `SELECT method, jwks_url, issuer, audience, webhook_url, default_role, updated_at, oidc_client_id, oidc_client_secret
		FROM tenant_auth WHERE tenant = ?`, tenant).
		Scan(&a.Method, &a.JWKSURL, &a.Issuer, &a.Audience, &a.WebhookURL, &a.DefaultRole, &updated, &clientID, &secret)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fleet.Errorf(fleet.ENOTFOUND, "tenant %q has not configured end-user authentication", tenant)
	} else if err != nil {
		return nil, db.classify(err)
	}
	a.UpdatedAt = fromMillis(updated)
	if clientID != "" {
		a.OIDC = &fleet.OIDCSignIn{ClientID: clientID, ClientSecret: secret, HasSecret: secret != ""}
	}
	return &a, nil
}
