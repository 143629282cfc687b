package enduser

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleet"
	"golang.org/x/oauth2"
)

// OIDC sign-in (the console's): a tenant whose S9 method is jwks and that
// gave an oidc client lets its people sign in with the authorization code
// flow and PKCE (RFC 7636, S256) at the provider its issuer names. The ID
// token is verified as bearer tokens are, against the tenant's JWKS and
// issuer, with the client id as its audience and the sign-in's nonce; the
// person gets the role a bearer token with the same claims would.

// DiscoveryTTL is how long a provider's discovery document is kept.
const DiscoveryTTL = time.Hour

// provider is the part of a discovery document the console uses.
type provider struct {
	Issuer                string `json:"issuer"`
	AuthorizationEndpoint string `json:"authorization_endpoint"`
	TokenEndpoint         string `json:"token_endpoint"`
	UserinfoEndpoint      string `json:"userinfo_endpoint"`
	fetched               time.Time
}

// discoveries caches discovery documents by issuer.
type discoveries struct {
	mu sync.Mutex
	m  map[string]*provider
}

// oidcConfig returns the tenant's configuration if it allows OIDC sign-in.
func (a *Authenticator) oidcConfig(ctx context.Context, tenant string) (*fleet.TenantAuth, error) {
	cfg, err := a.Store.FindTenantAuth(ctx, tenant)
	if fleet.ErrorCode(err) == fleet.ENOTFOUND || err == nil && (cfg.Method != fleet.AuthJWKS || cfg.OIDC == nil) {
		return nil, fleet.Errorf(fleet.ENOTFOUND, "tenant %q has no OpenID Connect sign-in; an admin sets it up with S9 (method jwks, oidc.client_id)", tenant)
	}
	return cfg, err
}

// discover returns the provider at issuer, from its discovery document
// (OpenID Connect Discovery 1.0), whose issuer must be issuer exactly.
func (a *Authenticator) discover(ctx context.Context, issuer string) (*provider, error) {
	a.discovered.mu.Lock()
	p, ok := a.discovered.m[issuer]
	a.discovered.mu.Unlock()
	if ok && a.now().Sub(p.fetched) < DiscoveryTTL {
		return p, nil
	}
	unavailable := fleet.Errorf(fleet.EUNAVAILABLE, "the tenant's identity provider cannot be reached or answered wrongly; try again later")
	var doc provider
	if err := a.getJSON(ctx, strings.TrimSuffix(issuer, "/")+"/.well-known/openid-configuration", "", &doc); err != nil {
		a.logger().Warn("OIDC discovery", "issuer", issuer, "err", err)
		return nil, unavailable
	}
	if doc.Issuer != issuer || !httpURL(doc.AuthorizationEndpoint) || !httpURL(doc.TokenEndpoint) {
		a.logger().Warn("OIDC discovery: the document's issuer or endpoints are wrong", "issuer", issuer, "says", doc.Issuer)
		return nil, unavailable
	}
	doc.fetched = a.now()
	a.discovered.mu.Lock()
	if a.discovered.m == nil || len(a.discovered.m) > 10_000 {
		a.discovered.m = map[string]*provider{}
	}
	a.discovered.m[issuer] = &doc
	a.discovered.mu.Unlock()
	return &doc, nil
}

func httpURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "https" || u.Scheme == "http") && u.Host != ""
}

// AuthorizationURL is where a person of tenant goes to sign in: the
// provider's authorization endpoint with the client, redirect URI, state,
// nonce and PKCE challenge of this sign-in.
func (a *Authenticator) AuthorizationURL(ctx context.Context, tenant, redirectURI, state, nonce, verifier string) (string, error) {
	cfg, err := a.oidcConfig(ctx, tenant)
	if err != nil {
		return "", err
	}
	p, err := a.discover(ctx, cfg.Issuer)
	if err != nil {
		return "", err
	}
	return oauthClient(cfg, p, redirectURI).AuthCodeURL(state,
		oauth2.S256ChallengeOption(verifier), oauth2.SetAuthURLParam("nonce", nonce)), nil
}

// oauthClient is the tenant's console client at the provider p. A client
// with a secret authenticates with client_secret_basic (RFC 6749 §2.3.1,
// both parts form-encoded); one without, a public client, sends its
// client_id in the form.
func oauthClient(cfg *fleet.TenantAuth, p *provider, redirectURI string) *oauth2.Config {
	style := oauth2.AuthStyleInParams
	if cfg.OIDC.ClientSecret != "" {
		style = oauth2.AuthStyleInHeader
	}
	return &oauth2.Config{
		ClientID:     cfg.OIDC.ClientID,
		ClientSecret: cfg.OIDC.ClientSecret,
		Endpoint:     oauth2.Endpoint{AuthURL: p.AuthorizationEndpoint, TokenURL: p.TokenEndpoint, AuthStyle: style},
		RedirectURL:  redirectURI,
		Scopes:       []string{"openid", "email", "profile"},
	}
}

// SignIn ends a sign-in: it exchanges the code for tokens, verifies the ID
// token (JWKS, issuer, the client id as audience, the nonce) and returns
// the person with the role their claims give. Missing email and name are
// read from the userinfo endpoint, as providers that keep ID tokens small
// expect. It also returns the configuration's time, which a session keeps:
// a later change of the settings ends it.
func (a *Authenticator) SignIn(ctx context.Context, tenant, code, redirectURI, verifier, nonce string) (*fleet.Actor, time.Time, error) {
	cfg, err := a.oidcConfig(ctx, tenant)
	if err != nil {
		return nil, time.Time{}, err
	}
	p, err := a.discover(ctx, cfg.Issuer)
	if err != nil {
		return nil, time.Time{}, err
	}
	// The exchange goes through the Authenticator's client, so the egress
	// policy holds for the token endpoint as for every other request.
	xctx, cancel := context.WithTimeout(context.WithValue(ctx, oauth2.HTTPClient, a.client()), a.timeout())
	defer cancel()
	tok, err := oauthClient(cfg, p, redirectURI).Exchange(xctx, code, oauth2.VerifierOption(verifier))
	var idToken string
	if err == nil {
		idToken, _ = tok.Extra("id_token").(string)
	}
	if err != nil || idToken == "" {
		a.logger().Warn("OIDC token exchange", "tenant", tenant, "err", err)
		return nil, time.Time{}, fleet.Errorf(fleet.EUNAUTHENTICATED, "the identity provider did not accept this sign-in; try again")
	}
	c, err := a.parseJWT(ctx, tenant, cfg, cfg.OIDC.ClientID, idToken)
	if err != nil {
		return nil, time.Time{}, err
	}
	if n := c.str("nonce"); n == "" || n != nonce {
		return nil, time.Time{}, a.refused(tenant, "the ID token's nonce is not this sign-in's")
	}
	name, email := c.str("name"), c.str("email")
	if (name == "" || email == "") && p.UserinfoEndpoint != "" && tok.AccessToken != "" {
		var info struct{ Sub, Name, Email, PreferredUsername string }
		if err := a.getJSON(ctx, p.UserinfoEndpoint, tok.AccessToken, &info); err == nil && info.Sub == c.str("sub") {
			name, email = first(name, info.Name, info.PreferredUsername), first(email, info.Email)
		}
	}
	act, ok := actor(tenant, cfg, name, email, c.str("sub"), c.str("role"))
	if !ok {
		return nil, time.Time{}, a.refused(tenant, "the role claim is not a fleetd role")
	}
	return act, cfg.UpdatedAt, nil
}

// SignInValid reports whether an OIDC session made under the settings of
// time at is still allowed: the tenant still has OIDC sign-in, unchanged.
func (a *Authenticator) SignInValid(ctx context.Context, tenant string, at time.Time) (bool, error) {
	cfg, err := a.config(ctx, tenant)
	if err != nil {
		return false, err
	}
	return cfg != nil && cfg.Method == fleet.AuthJWKS && cfg.OIDC != nil && cfg.UpdatedAt.Equal(at), nil
}

func first(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// getJSON GETs url (with a bearer token when given) into v.
func (a *Authenticator) getJSON(ctx context.Context, url, bearer string, v any) error {
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	return a.doJSON(req, v)
}

// doJSON sends req within the fetch timeout and decodes a 200's JSON, at
// most 1 MiB of it.
func (a *Authenticator) doJSON(req *http.Request, v any) error {
	ctx, cancel := context.WithTimeout(req.Context(), a.timeout())
	defer cancel()
	resp, err := a.client().Do(req.WithContext(ctx))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(v)
}
