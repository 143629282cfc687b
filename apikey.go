package fleet

import (
	"context"
	"time"
)

// APIKey lets a program act in one tenant with one role. Key holds the secret
// only in the answer that creates it.
type APIKey struct {
	Name      string    `json:"name"`
	Role      Role      `json:"role"`
	UserEmail string    `json:"user_email,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	Key       string    `json:"key,omitempty"`
}

// TenantService manages tenants and their API keys, and authenticates keys.
type TenantService interface {
	// CreateTenant makes a tenant with an admin key named "admin" and returns
	// the key's secret.
	CreateTenant(ctx context.Context, name string) (*Tenant, string, error)
	FindTenants(ctx context.Context) ([]*Tenant, error)

	// CreateAPIKey stores k (hashed) and fills in k.Key and k.CreatedAt.
	CreateAPIKey(ctx context.Context, tenant string, k *APIKey) error
	FindAPIKeys(ctx context.Context, tenant string, p Page) ([]*APIKey, int, error)
	// DeleteAPIKey refuses (ECONFLICT) to delete the tenant's last admin key,
	// which would lock the tenant out of its own administration.
	DeleteAPIKey(ctx context.Context, tenant, name string) error
	// AuthenticateAPIKey returns the actor a key stands for. An unknown
	// tenant and a key not valid for it are the same EUNAUTHENTICATED.
	AuthenticateAPIKey(ctx context.Context, tenant, key string) (*Actor, error)
}
