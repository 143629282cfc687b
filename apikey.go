package fleet

import (
	"context"
	"strings"
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

// APIKeyNameRule is what ValidAPIKeyName checks, said for a person.
const APIKeyNameRule = "must be 1 to 64 characters from A-Z a-z 0-9 . _ -"

// ValidAPIKeyName reports whether s may name an API key.
func ValidAPIKeyName(s string) bool { return validName(s, 64, "._-") }

// ReadAPIKey is the typed decode of a new key: name, role and the
// optional user_email of the person who holds it. The API and the console
// both read keys with it.
func ReadAPIKey(f *Fields) *APIKey {
	k := &APIKey{
		Name:      f.String("name", true),
		Role:      Role(f.String("role", true)),
		UserEmail: f.String("user_email", false),
	}
	if f.Has("name") && !ValidAPIKeyName(k.Name) {
		f.Fail("name", APIKeyNameRule)
	}
	if f.Has("role") && !k.Role.Valid() {
		f.Fail("role", "must be one of viewer, device, operator, admin")
	}
	if f.Has("user_email") && (len(k.UserEmail) > 254 || !strings.Contains(k.UserEmail, "@")) {
		f.Fail("user_email", "must be an email address of at most 254 characters")
	}
	return k
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
