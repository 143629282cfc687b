package fleet

import (
	"context"
	"net/url"
	"time"
)

// The ways a tenant's end users may authenticate (S9).
const (
	AuthJWKS    = "jwks"    // bearer JWTs verified against the tenant's JWKS
	AuthWebhook = "webhook" // bearer tokens vouched for by the tenant's webhook
)

// TenantAuth is how a tenant's end users authenticate with "Authorization:
// Bearer <token>" (docs/api.md#end-users-of-a-tenant-s9).
type TenantAuth struct {
	Method      string `json:"method"`
	JWKSURL     string `json:"jwks_url,omitempty"`
	Issuer      string `json:"issuer,omitempty"`
	Audience    string `json:"audience,omitempty"`
	WebhookURL  string `json:"webhook_url,omitempty"`
	DefaultRole Role   `json:"default_role"`
	// OIDC, for method jwks, lets the tenant's people sign in to the
	// console with the identity provider at Issuer (authorization code
	// flow with PKCE).
	OIDC      *OIDCSignIn `json:"oidc,omitempty"`
	UpdatedAt time.Time   `json:"updated_at"`
}

// OIDCSignIn is a tenant's client at its OpenID provider, for the console.
// The secret is write-only: never shown, only whether there is one.
type OIDCSignIn struct {
	ClientID     string `json:"client_id" openapi:"required" doc:"the console's client id at the provider; ID tokens must name it in aud"`
	ClientSecret string `json:"-"`
	HasSecret    bool   `json:"client_secret_set" doc:"whether a client_secret was given (it is never shown); without one the console is a public client and relies on PKCE"`
}

// Limits of OIDC sign-in settings.
const (
	MaxOIDCClientIDLen     = 256
	MaxOIDCClientSecretLen = 1024
)

// ReadTenantAuth is the typed decode of an S9 body. Fields that belong to
// the other method are refused, so a mistaken configuration is not
// silently half-applied.
func ReadTenantAuth(f *Fields) *TenantAuth {
	a := &TenantAuth{Method: f.String("method", true)}
	switch a.Method {
	case AuthJWKS:
		a.JWKSURL = readURL(f, "jwks_url", true)
		a.Issuer = f.NonEmptyString("issuer", true, 1024)
		a.Audience = f.NonEmptyString("audience", true, 1024)
		if o := f.Nested("oidc", false); o != nil {
			a.OIDC = &OIDCSignIn{ClientID: o.NonEmptyString("client_id", true, MaxOIDCClientIDLen)}
			if o.Has("client_secret") {
				a.OIDC.ClientSecret = o.NonEmptyString("client_secret", false, MaxOIDCClientSecretLen)
				a.OIDC.HasSecret = true
			}
			o.Unknown()
		}
	case AuthWebhook:
		a.WebhookURL = readURL(f, "webhook_url", true)
	case "":
	default:
		f.Fail("method", "must be jwks or webhook")
	}
	a.DefaultRole = RoleViewer
	if f.Has("default_role") {
		a.DefaultRole = Role(f.String("default_role", false))
		if !a.DefaultRole.Valid() {
			f.Fail("default_role", "must be one of viewer, device, operator, admin")
		}
	}
	return a
}

// readURL reads an absolute http or https URL field.
func readURL(f *Fields, field string, required bool) string {
	s := f.String(field, required)
	if !f.Has(field) {
		return s
	}
	if u, err := url.Parse(s); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || len(s) > 2048 {
		f.Fail(field, "must be an absolute http or https URL of at most 2048 characters")
	}
	return s
}

// TenantAuthService stores each tenant's end-user authentication.
type TenantAuthService interface {
	SetTenantAuth(ctx context.Context, tenant string, a *TenantAuth) error
	// FindTenantAuth is ENOTFOUND while the tenant has not configured S9.
	FindTenantAuth(ctx context.Context, tenant string) (*TenantAuth, error)
}

// TokenAuthenticator verifies the bearer tokens of a tenant's end users.
// Any token it cannot vouch for is EUNAUTHENTICATED; a verifier that
// cannot be reached is EUNAVAILABLE.
type TokenAuthenticator interface {
	AuthenticateToken(ctx context.Context, tenant, token string) (*Actor, error)
}

type sourceKey struct{}

// NewContextWithSource returns ctx carrying the address a request came
// from: what anonymous clients could use up for everyone (the S9
// webhook's calls) is limited per address first.
func NewContextWithSource(ctx context.Context, addr string) context.Context {
	return context.WithValue(ctx, sourceKey{}, addr)
}

// SourceFromContext returns the address a request came from, or "".
func SourceFromContext(ctx context.Context) string {
	addr, _ := ctx.Value(sourceKey{}).(string)
	return addr
}
