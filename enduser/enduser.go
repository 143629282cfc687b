// Package enduser authenticates a tenant's end users by the bearer tokens
// their own identity systems issue, as the tenant configured it (S9): JWTs
// verified against the tenant's JWKS, or tokens vouched for by the tenant's
// webhook.
//
// Nothing is fetched per request: JWKS keys are cached and refetched only
// for an unknown key id (at most every RefreshInterval) or when they are an
// hour old; a webhook's yes is cached for a minute; each tenant's
// configuration for ConfigTTL.
package enduser

import (
	"context"
	"crypto/sha256"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/egress"
	"github.com/fleetd/fleet/ratelimit"
)

// Tunables, exported for documentation and tests.
const (
	ConfigTTL       = 10 * time.Second // another replica's S9 change is seen within this
	RefreshInterval = 10 * time.Second // least time between JWKS fetches for unknown key ids
	KeysTTL         = time.Hour        // JWKS keys are refetched after this
	WebhookTTL      = time.Minute      // a webhook's yes is trusted this long (docs/api.md#end-users-of-a-tenant-s9)
	// A webhook's no is remembered this long. For tokens not remembered,
	// each source address may have the webhooks called WebhookAddrRate
	// times a second (bursts of WebhookAddrBurst), and each tenant's
	// webhook is called at most WebhookRate times a second (bursts of
	// WebhookBurst): one address sending made-up tokens uses up its own
	// allowance, not the tenant's.
	WebhookRefusalTTL = time.Minute
	WebhookRate       = 20
	WebhookBurst      = 40
	WebhookAddrRate   = 5
	WebhookAddrBurst  = 10
	Leeway            = 30 * time.Second // clock skew allowed on exp and nbf
	FetchTimeout      = 5 * time.Second  // for JWKS and webhook requests
)

// Authenticator verifies end users' tokens. It also stands in front of the
// store for S9, so that a change made on this replica applies at once.
type Authenticator struct {
	Store fleet.TenantAuthService
	// Client fetches JWKS documents and asks S9 webhooks (which never
	// follow a redirect, whatever Client does); nil: one that refuses
	// internal addresses (egress).
	Client  *http.Client
	Timeout time.Duration // for each JWKS or webhook request; 0: FetchTimeout
	Now     func() time.Time
	Logger  *slog.Logger

	mu       sync.Mutex
	configs  map[string]configEntry
	keySets  map[string]*keySet // by JWKS URL
	webhooks map[[32]byte]webhookEntry
	// webhookCalls limits each tenant's webhook calls; webhookAddrCalls
	// each source address's.
	webhookCalls, webhookAddrCalls *ratelimit.Limiter

	discovered discoveries // OIDC providers' discovery documents
}

var (
	_ fleet.TokenAuthenticator = (*Authenticator)(nil)
	_ fleet.TenantAuthService  = (*Authenticator)(nil)
)

type configEntry struct {
	auth    *fleet.TenantAuth // nil: not configured
	expires time.Time
}

func (a *Authenticator) now() time.Time {
	if a.Now != nil {
		return a.Now()
	}
	return time.Now()
}

// defaultClient is the client of an Authenticator without one.
var defaultClient = (*egress.Policy)(nil).Client(FetchTimeout, egress.FollowRedirects)

func (a *Authenticator) client() *http.Client {
	if a.Client != nil {
		return a.Client
	}
	return defaultClient
}

// webhookClient is client without redirects: a 307 would send the token
// on to wherever the answer pointed.
func (a *Authenticator) webhookClient() *http.Client {
	c := *a.client()
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &c
}

func (a *Authenticator) timeout() time.Duration {
	if a.Timeout > 0 {
		return a.Timeout
	}
	return FetchTimeout
}

func (a *Authenticator) logger() *slog.Logger {
	if a.Logger != nil {
		return a.Logger
	}
	return slog.New(slog.DiscardHandler)
}

// SetTenantAuth stores the configuration and forgets what was cached under
// the old one.
func (a *Authenticator) SetTenantAuth(ctx context.Context, tenant string, ta *fleet.TenantAuth) error {
	if err := a.Store.SetTenantAuth(ctx, tenant, ta); err != nil {
		return err
	}
	a.mu.Lock()
	delete(a.configs, tenant)
	a.webhooks = nil
	a.mu.Unlock()
	return nil
}

// FindTenantAuth reads the configuration from the store.
func (a *Authenticator) FindTenantAuth(ctx context.Context, tenant string) (*fleet.TenantAuth, error) {
	return a.Store.FindTenantAuth(ctx, tenant)
}

// refused is the one answer for every token fleetd cannot vouch for, so a
// caller learns nothing about why; the reason goes to the debug log.
func (a *Authenticator) refused(tenant, reason string) error {
	a.logger().Debug("bearer token refused", "tenant", tenant, "reason", reason)
	return fleet.Errorf(fleet.EUNAUTHENTICATED, "invalid bearer token or tenant")
}

// AuthenticateToken returns the end user a bearer token stands for.
func (a *Authenticator) AuthenticateToken(ctx context.Context, tenant, token string) (*fleet.Actor, error) {
	if tenant == "" || token == "" {
		return nil, a.refused(tenant, "missing tenant or token")
	}
	cfg, err := a.config(ctx, tenant)
	if err != nil {
		return nil, err
	}
	if cfg == nil {
		return nil, a.refused(tenant, "the tenant has not configured end-user authentication")
	}
	switch cfg.Method {
	case fleet.AuthJWKS:
		return a.verifyJWT(ctx, tenant, cfg, token)
	case fleet.AuthWebhook:
		return a.askWebhook(ctx, tenant, cfg, token)
	}
	return nil, a.refused(tenant, "unknown method "+cfg.Method)
}

// config returns the tenant's configuration, nil if it has none.
func (a *Authenticator) config(ctx context.Context, tenant string) (*fleet.TenantAuth, error) {
	now := a.now()
	a.mu.Lock()
	e, ok := a.configs[tenant]
	a.mu.Unlock()
	if ok && now.Before(e.expires) {
		return e.auth, nil
	}
	cfg, err := a.Store.FindTenantAuth(ctx, tenant)
	if fleet.ErrorCode(err) == fleet.ENOTFOUND {
		cfg, err = nil, nil
	} else if err != nil {
		return nil, err
	}
	a.mu.Lock()
	if a.configs == nil || len(a.configs) > 10_000 {
		a.configs = map[string]configEntry{}
	}
	a.configs[tenant] = configEntry{auth: cfg, expires: now.Add(ConfigTTL)}
	a.mu.Unlock()
	return cfg, nil
}

// actor makes the end user from what its token says.
func actor(tenant string, cfg *fleet.TenantAuth, name, email, subject, role string) (*fleet.Actor, bool) {
	r := cfg.DefaultRole
	if role != "" {
		r = fleet.Role(role)
		if !r.Valid() {
			return nil, false
		}
	}
	userName := name
	for _, alt := range []string{email, subject} {
		if userName == "" {
			userName = alt
		}
	}
	return &fleet.Actor{Tenant: tenant, Role: r, UserName: userName, UserEmail: email}, true
}

func tokenKey(tenant, token string) [32]byte {
	return sha256.Sum256([]byte(tenant + "\x00" + token))
}
