package console

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/fleetd/fleet"
)

// OIDC signs a tenant's people in with the tenant's OpenID provider
// (enduser.Authenticator): the authorization code flow with PKCE.
type OIDC interface {
	// AuthorizationURL is where the browser goes to sign in.
	AuthorizationURL(ctx context.Context, tenant, redirectURI, state, nonce, verifier string) (string, error)
	// SignIn exchanges the code and verifies the ID token; it returns the
	// person and the time of the tenant's settings they signed in under.
	SignIn(ctx context.Context, tenant, code, redirectURI, verifier, nonce string) (*fleet.Actor, time.Time, error)
	// SignInValid reports whether the settings are still those of at.
	SignInValid(ctx context.Context, tenant string, at time.Time) (bool, error)
}

// callbackPath is the redirect URI's path: register
// <public URL>/console/oidc/callback with the provider.
const callbackPath = "/console/oidc/callback"

// redirectURI is the callback's absolute URL: on the public URL when one
// is configured, else on the URL the browser used.
func (c *Console) redirectURI(r *http.Request) string {
	base := c.PublicURL
	if base == "" {
		base = fleet.BaseURLFromContext(r.Context())
	}
	return strings.TrimSuffix(base, "/") + callbackPath
}

// handleOIDCStart sends the browser to the tenant's provider. The state,
// nonce and PKCE verifier of this sign-in stay in the sealed sign-in
// cookie, so only this browser can finish it.
func (c *Console) handleOIDCStart(w http.ResponseWriter, r *http.Request) error {
	tenant := strings.TrimSpace(r.URL.Query().Get("tenant"))
	if c.OIDC == nil || !fleet.ValidTenantName(tenant) {
		return c.signinAgain(w, r, http.StatusBadRequest, tenant, "Type your tenant's name to sign in with its identity provider.")
	}
	st := signin{CSRF: randomToken(), Tenant: tenant, State: randomToken(), Nonce: randomToken(), Verifier: randomToken(),
		Expires: c.Now().Add(signinTTL).Unix()}
	to, err := c.OIDC.AuthorizationURL(r.Context(), tenant, c.redirectURI(r), st.State, st.Nonce, st.Verifier)
	if fleet.ErrorCode(err) == fleet.ENOTFOUND {
		return c.signinAgain(w, r, http.StatusNotFound, tenant, "Tenant "+tenant+" has no single sign-on; sign in with an API key, or ask an admin to set it up.")
	} else if err != nil {
		return err
	}
	val, err := c.seal.seal(r.Context(), signinCookie, st)
	if err != nil {
		return err
	}
	c.setCookie(w, r, signinCookie, val, signinTTL)
	http.Redirect(w, r, to, http.StatusSeeOther)
	return nil
}

// handleOIDCCallback ends the sign-in the provider sent back.
func (c *Console) handleOIDCCallback(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	st, err := c.readSignin(r)
	if err != nil || st.State == "" || !tokensEqual(q.Get("state"), st.State) {
		return c.signinAgain(w, r, http.StatusForbidden, "", "This sign-in was not started in this browser, or took too long. Start again.")
	}
	if e := q.Get("error"); e != "" || q.Get("code") == "" || c.OIDC == nil {
		return c.signinAgain(w, r, http.StatusUnauthorized, st.Tenant, "The identity provider did not sign you in ("+first(e, "no code")+"): "+q.Get("error_description"))
	}
	a, at, err := c.OIDC.SignIn(r.Context(), st.Tenant, q.Get("code"), c.redirectURI(r), st.Verifier, st.Nonce)
	if fleet.ErrorCode(err) == fleet.EUNAUTHENTICATED {
		return c.signinAgain(w, r, http.StatusUnauthorized, st.Tenant, "The identity provider's answer could not be verified; try again or ask an admin.")
	} else if err != nil {
		return err
	}
	if !a.Role.Can(fleet.PermRead) {
		return c.signinAgain(w, r, http.StatusForbidden, st.Tenant, "Your role, "+string(a.Role)+", cannot sign in to the console.")
	}
	s := &session{Tenant: st.Tenant, User: &oidcActor{Name: a.UserName, Email: a.UserEmail, Role: a.Role}, AuthAt: at.UnixMilli()}
	if err := c.startSession(w, r, s, a); err != nil {
		return err
	}
	http.Redirect(w, r, Prefix, http.StatusSeeOther)
	return nil
}

// checkOIDCSession refuses an OIDC session once the tenant changed or
// removed its sign-in settings.
func (c *Console) checkOIDCSession(ctx context.Context, s *session) error {
	if c.OIDC == nil {
		return fleet.Errorf(fleet.EUNAUTHENTICATED, "single sign-on is off")
	}
	ok, err := c.OIDC.SignInValid(ctx, s.Tenant, time.UnixMilli(s.AuthAt))
	if err != nil {
		return err
	}
	if !ok {
		return fleet.Errorf(fleet.EUNAUTHENTICATED, "the tenant's sign-in settings changed; sign in again")
	}
	return nil
}

func first(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}
