package enduser

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/ratelimit"
)

type webhookEntry struct {
	actor   *fleet.Actor // nil: the webhook said no
	expires time.Time
}

// webhookLimiters bound the calls to the webhooks, which an anonymous
// client could otherwise make once per request with a new token: per
// source address, and per tenant.
func (a *Authenticator) webhookLimiters() (byAddr, byTenant *ratelimit.Limiter) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.webhookCalls == nil {
		a.webhookCalls = &ratelimit.Limiter{Rate: WebhookRate, Burst: WebhookBurst, Now: a.now}
		a.webhookAddrCalls = &ratelimit.Limiter{Rate: WebhookAddrRate, Burst: WebhookAddrBurst, Now: a.now}
	}
	return a.webhookAddrCalls, a.webhookCalls
}

// remember caches the webhook's answer on a token: a yes for WebhookTTL,
// a no for WebhookRefusalTTL.
func (a *Authenticator) remember(key [32]byte, act *fleet.Actor, now time.Time) {
	ttl := WebhookTTL
	if act == nil {
		ttl = WebhookRefusalTTL
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.webhooks == nil || len(a.webhooks) > 100_000 {
		a.webhooks = map[[32]byte]webhookEntry{}
	}
	a.webhooks[key] = webhookEntry{actor: act, expires: now.Add(ttl)}
}

// askWebhook POSTs {"tenant", "token"} to the tenant's webhook: a 200 with
// {"user_name", "user_email", "role"} admits, anything else refuses, and a
// webhook that cannot be reached is EUNAVAILABLE. Answers are cached per
// token; beyond WebhookAddrRate calls a second from one address, or
// WebhookRate for a tenant, tokens the cache does not know are
// ERATELIMITED.
func (a *Authenticator) askWebhook(ctx context.Context, tenant string, cfg *fleet.TenantAuth, token string) (*fleet.Actor, error) {
	key := tokenKey(tenant, token)
	now := a.now()
	a.mu.Lock()
	e, ok := a.webhooks[key]
	a.mu.Unlock()
	if ok && now.Before(e.expires) {
		if e.actor == nil {
			return nil, a.refused(tenant, "the webhook refused this token lately")
		}
		return e.actor, nil
	}
	byAddr, byTenant := a.webhookLimiters()
	// The address first, so that its refusals cost the tenant nothing. A
	// caller that gives no address (not a request) has the tenant's limit
	// alone.
	if src := fleet.SourceFromContext(ctx); src != "" {
		if ok, _ := byAddr.Allow(src); !ok {
			return nil, fleet.Errorf(fleet.ERATELIMITED, "too many sign-ins with new bearer tokens from this address (more than %d a second); retry in a second", WebhookAddrRate)
		}
	}
	if ok, _ := byTenant.Allow(tenant); !ok {
		return nil, fleet.Errorf(fleet.ERATELIMITED, "too many sign-ins with new bearer tokens for this tenant (more than %d a second); retry in a second", WebhookRate)
	}

	body, _ := json.Marshal(map[string]string{"tenant": tenant, "token": token})
	ctx, cancel := context.WithTimeout(ctx, a.timeout())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", cfg.WebhookURL, bytes.NewReader(body))
	if err != nil {
		return nil, a.refused(tenant, err.Error())
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.webhookClient().Do(req)
	if err != nil {
		a.logger().Warn("auth webhook unreachable", "tenant", tenant, "err", err)
		return nil, fleet.Errorf(fleet.EUNAVAILABLE, "the tenant's authentication webhook cannot be reached; try again")
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		a.remember(key, nil, now)
		return nil, a.refused(tenant, "webhook answered "+resp.Status)
	}
	var user struct {
		UserName  string `json:"user_name"`
		UserEmail string `json:"user_email"`
		Role      string `json:"role"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&user); err != nil {
		a.remember(key, nil, now)
		return nil, a.refused(tenant, "webhook answer is not the expected JSON: "+err.Error())
	}
	act, ok := actor(tenant, cfg, user.UserName, user.UserEmail, "", user.Role)
	if !ok {
		a.remember(key, nil, now)
		return nil, a.refused(tenant, "webhook named a role fleetd does not have: "+user.Role)
	}
	a.remember(key, act, now)
	return act, nil
}
