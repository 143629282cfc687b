package fleethttp

import (
	"net/http"

	"github.com/fleetd/fleet"
)

// tenantAuthBody documents S9's body; fleet.ReadTenantAuth decodes it.
type tenantAuthBody struct {
	Method      string     `json:"method" openapi:"required" doc:"jwks or webhook"`
	JWKSURL     string     `json:"jwks_url,omitempty" doc:"jwks: absolute http(s) URL of the JWK Set"`
	Issuer      string     `json:"issuer,omitempty" doc:"jwks: the iss every token must carry"`
	Audience    string     `json:"audience,omitempty" doc:"jwks: a value the aud of every token must contain"`
	WebhookURL  string     `json:"webhook_url,omitempty" doc:"webhook: absolute http(s) URL fleetd POSTs {tenant, token} to"`
	DefaultRole fleet.Role `json:"default_role,omitempty" doc:"role of users whose token names none; default viewer"`
	OIDC        *oidcBody  `json:"oidc,omitempty" doc:"jwks: lets the tenant's people sign in to the web console with the OpenID provider at issuer (discovered at issuer/.well-known/openid-configuration; authorization code flow with PKCE)"`
}

// oidcBody documents S9's oidc member.
type oidcBody struct {
	ClientID     string `json:"client_id" openapi:"required" doc:"the console's client id at the provider, 1-256 characters"`
	ClientSecret string `json:"client_secret,omitempty" doc:"the client's secret, if the provider gave one (a confidential client); stored, never shown"`
}

// pathTenant checks that {tenant_id} is the caller's own tenant; another
// tenant is 404, as for any resource of another tenant.
func pathTenant(r *http.Request) (string, error) {
	t := r.PathValue("tenant_id")
	if t != tenantOf(r) {
		return "", fleet.Errorf(fleet.ENOTFOUND, "tenant %q not found", t)
	}
	return t, nil
}

func (s *Server) handleSetTenantAuth(w http.ResponseWriter, r *http.Request) error {
	tenant, err := pathTenant(r)
	if err != nil {
		return err
	}
	body, err := s.decode(w, r, s.Limits.Body, ordinaryElements)
	if err != nil {
		return err
	}
	f := fleet.NewFields(body)
	a := fleet.ReadTenantAuth(f)
	if err := f.Err(); err != nil {
		return err
	}
	if err := s.TenantAuth.SetTenantAuth(r.Context(), tenant, a); err != nil {
		return err
	}
	return s.quiet(w, r, http.StatusNoContent, func() (any, error) { return a, nil })
}

func (s *Server) handleGetTenantAuth(w http.ResponseWriter, r *http.Request) error {
	tenant, err := pathTenant(r)
	if err != nil {
		return err
	}
	a, err := s.TenantAuth.FindTenantAuth(r.Context(), tenant)
	if err != nil {
		return err
	}
	s.respond(w, r, http.StatusOK, a)
	return nil
}
