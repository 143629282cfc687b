package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
	"github.com/golang-jwt/jwt/v5"
)

// bearer sends a request as an end user of tenant.
func (s *testServer) bearer(t *testing.T, tenant, token, method, path string, body any) *fleetdtest.Response {
	t.Helper()
	return s.Send(t, fleetdtest.Req{Method: method, Path: path, Creds: fleetdtest.Creds{Tenant: tenant}, Body: body,
		Header: http.Header{"Authorization": {"Bearer " + token}}})
}

func TestTenantAuthEndToEnd(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := startServer(t, b)
		admin := s.Admin()
		beta := s.NewTenant(t, "beta")
		idp := fleetdtest.NewIdentityProvider(t)
		jwks := map[string]any{"method": "jwks", "jwks_url": idp.Server.URL, "issuer": "https://id.example.com", "audience": "fleetd", "default_role": "viewer"}

		t.Run("Validation", func(t *testing.T) {
			s.Do(t, admin, "GET", "/api/v1/tenants/default/auth", nil).Want(t, 404)
			for _, tc := range []struct {
				name  string
				body  map[string]any
				field string
			}{
				{"UnknownMethod", map[string]any{"method": "saml"}, "method"},
				{"NoMethod", map[string]any{"webhook_url": "https://x.example.com"}, "method"},
				{"RelativeURL", map[string]any{"method": "webhook", "webhook_url": "/check"}, "webhook_url"},
				{"FTPURL", map[string]any{"method": "webhook", "webhook_url": "ftp://x.example.com/check"}, "webhook_url"},
				{"JWKSWithoutIssuer", map[string]any{"method": "jwks", "jwks_url": "https://x.example.com/jwks", "audience": "a"}, "issuer"},
				{"OtherMethodsField", map[string]any{"method": "webhook", "webhook_url": "https://x.example.com", "jwks_url": "https://x.example.com"}, "jwks_url"},
				{"BadRole", map[string]any{"method": "webhook", "webhook_url": "https://x.example.com", "default_role": "root"}, "default_role"},
			} {
				t.Run(tc.name, func(t *testing.T) {
					var e struct{ Fields map[string]string }
					s.Do(t, admin, "PUT", "/api/v1/tenants/default/auth", tc.body).Want(t, 400).Decode(t, &e)
					if e.Fields[tc.field] == "" {
						t.Fatalf("fields = %v, want %s", e.Fields, tc.field)
					}
				})
			}
			// Another tenant's configuration does not exist for the caller.
			s.Do(t, admin, "PUT", "/api/v1/tenants/beta/auth", jwks).Want(t, 404)
			s.Do(t, admin, "GET", "/api/v1/tenants/beta/auth", nil).Want(t, 404)
			s.Do(t, s.NewKey(t, admin, "ops", "operator"), "PUT", "/api/v1/tenants/default/auth", jwks).Want(t, 403)
		})

		s.Do(t, admin, "PUT", "/api/v1/tenants/default/auth", jwks).Want(t, 204)
		var got map[string]any
		s.Do(t, admin, "GET", "/api/v1/tenants/default/auth", nil).Want(t, 200).Decode(t, &got)
		if got["method"] != "jwks" || got["jwks_url"] != idp.Server.URL || got["default_role"] != "viewer" {
			t.Fatalf("configuration = %v", got)
		}

		t.Run("JWKSUsers", func(t *testing.T) {
			viewer := idp.Token(t, nil)
			s.bearer(t, "default", viewer, "GET", "/api/v1/devices", nil).Want(t, 200)
			s.bearer(t, "default", viewer, "POST", "/api/v1/devices", map[string]any{"id": "by-viewer"}).Want(t, 403)

			operator := idp.Token(t, jwt.MapClaims{"role": "operator"})
			s.bearer(t, "default", operator, "POST", "/api/v1/devices", map[string]any{"id": "by-ada"}).Want(t, 201)
			var logs struct {
				AuditLogs []struct {
					Actor     string
					UserEmail string `json:"user_email"`
					Target    string
				} `json:"audit_logs"`
			}
			s.Do(t, admin, "GET", "/api/v1/audit-logs?actor=Ada%20Lovelace", nil).Want(t, 200).Decode(t, &logs)
			if len(logs.AuditLogs) != 1 || logs.AuditLogs[0].UserEmail != "ada@example.com" || logs.AuditLogs[0].Target != "devices/by-ada" {
				t.Fatalf("audit logs of Ada = %+v", logs.AuditLogs)
			}
			// An end user with the admin role may administer, like a key.
			s.bearer(t, "default", idp.Token(t, jwt.MapClaims{"role": "admin"}), "GET", "/api/v1/apikeys", nil).Want(t, 200)

			for name, tok := range map[string]string{
				"Expired":       idp.Token(t, jwt.MapClaims{"exp": time.Now().Add(-time.Hour).Unix()}),
				"WrongAudience": idp.Token(t, jwt.MapClaims{"aud": "someone-else"}),
				"Garbage":       "not-a-token",
			} {
				r := s.bearer(t, "default", tok, "GET", "/api/v1/devices", nil).Want(t, 401)
				if r.ErrorCode(t) != "unauthenticated" {
					t.Fatalf("%s: %s", name, r.Body)
				}
			}
			// A token of default's users means nothing in beta.
			s.bearer(t, "beta", viewer, "GET", "/api/v1/devices", nil).Want(t, 401)
			// An API key still wins when both are sent.
			s.Send(t, fleetdtest.Req{Method: "GET", Path: "/api/v1/apikeys", Creds: admin, Header: http.Header{"Authorization": {"Bearer " + viewer}}}).Want(t, 200)
		})

		t.Run("WebhookUsers", func(t *testing.T) {
			hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				var body struct{ Tenant, Token string }
				json.NewDecoder(r.Body).Decode(&body)
				if body.Tenant == "beta" && body.Token == "grace-token" {
					json.NewEncoder(w).Encode(map[string]string{"user_name": "Grace", "user_email": "grace@example.com", "role": "operator"})
					return
				}
				w.WriteHeader(http.StatusForbidden)
			}))
			defer hook.Close()
			s.Do(t, beta, "PUT", "/api/v1/tenants/beta/auth", map[string]any{"method": "webhook", "webhook_url": hook.URL}).Want(t, 204)
			s.bearer(t, "beta", "grace-token", "POST", "/api/v1/devices", map[string]any{"id": "by-grace"}).Want(t, 201)
			s.bearer(t, "beta", "mallory-token", "GET", "/api/v1/devices", nil).Want(t, 401)
			s.bearer(t, "default", "grace-token", "GET", "/api/v1/devices", nil).Want(t, 401)
			// An unreachable webhook is 503, never 500.
			s.Do(t, beta, "PUT", "/api/v1/tenants/beta/auth", map[string]any{"method": "webhook", "webhook_url": "http://127.0.0.1:1/check"}).Want(t, 204)
			r := s.bearer(t, "beta", "other-token", "GET", "/api/v1/devices", nil).Want(t, 503)
			if r.ErrorCode(t) != "unavailable" || strings.Contains(string(r.Body), "127.0.0.1") {
				t.Fatalf("unreachable webhook: %s", r.Body)
			}
		})
	})
}

// TestWebhookFloodFromOneAddress: made-up bearer tokens sent as fast as
// possible from one address (127.0.0.1) are limited (429) by that
// address's allowance, and a new good token from another (127.0.0.2) is
// admitted meanwhile. At f94a7fc the tenant's allowance was the only one,
// and the flood locked the good token out too.
func TestWebhookFloodFromOneAddress(t *testing.T) {
	s := startServer(t, sqlstoretest.Backends()[0])
	admin := s.Admin()
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct{ Token string }
		json.NewDecoder(r.Body).Decode(&body)
		if body.Token != "grace-token" {
			w.WriteHeader(http.StatusForbidden)
			return
		}
		json.NewEncoder(w).Encode(map[string]string{"user_name": "Grace", "role": "viewer"})
	}))
	defer hook.Close()
	s.Do(t, admin, "PUT", "/api/v1/tenants/default/auth", map[string]any{"method": "webhook", "webhook_url": hook.URL}).Want(t, 204)
	limited := 0
	for i := range 100 {
		switch st := s.bearer(t, "default", fmt.Sprint("made-up-", i), "GET", "/api/v1/devices", nil).Status; st {
		case 429:
			limited++
		case 401:
		default:
			t.Fatalf("made-up token %d answered %d", i, st)
		}
	}
	if limited == 0 {
		t.Fatal("100 made-up tokens from one address at once: none limited")
	}
	other := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}).DialContext}}
	hr, _ := http.NewRequest("GET", s.URL+"/api/v1/devices", nil)
	hr.Header.Set("x-service-tenant", "default")
	hr.Header.Set("Authorization", "Bearer grace-token")
	res, err := other.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("a good token from another address during the flood answered %d", res.StatusCode)
	}
}
