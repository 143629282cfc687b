package enduser

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"time"

	"github.com/fleetd/fleet"
)

type webhookEntry struct {
	actor   *fleet.Actor
	expires time.Time
}

// askWebhook POSTs {"tenant", "token"} to the tenant's webhook: a 200 with
// {"user_name", "user_email", "role"} admits, anything else refuses, and a
// webhook that cannot be reached is EUNAVAILABLE.
func (a *Authenticator) askWebhook(ctx context.Context, tenant string, cfg *fleet.TenantAuth, token string) (*fleet.Actor, error) {
	key := tokenKey(tenant, token)
	now := a.now()
	a.mu.Lock()
	e, ok := a.webhooks[key]
	a.mu.Unlock()
	if ok && now.Before(e.expires) {
		return e.actor, nil
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
		return nil, a.refused(tenant, "webhook answered "+resp.Status)
	}
	var user struct {
		UserName  string `json:"user_name"`
		UserEmail string `json:"user_email"`
		Role      string `json:"role"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&user); err != nil {
		return nil, a.refused(tenant, "webhook answer is not the expected JSON: "+err.Error())
	}
	act, ok := actor(tenant, cfg, user.UserName, user.UserEmail, "", user.Role)
	if !ok {
		return nil, a.refused(tenant, "webhook named a role fleetd does not have: "+user.Role)
	}
	a.mu.Lock()
	if a.webhooks == nil || len(a.webhooks) > 100_000 {
		a.webhooks = map[[32]byte]webhookEntry{}
	}
	a.webhooks[key] = webhookEntry{actor: act, expires: now.Add(WebhookTTL)}
	a.mu.Unlock()
	return act, nil
}
