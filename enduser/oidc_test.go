package enduser_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/enduser"
	"github.com/golang-jwt/jwt/v5"
)

// recorder is an http.RoundTripper that notes the path of every request
// before the egress policy's transport sends it.
type recorder struct {
	next  http.RoundTripper
	mu    sync.Mutex
	paths []string
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	r.mu.Lock()
	r.paths = append(r.paths, req.URL.Path)
	r.mu.Unlock()
	return r.next.RoundTrip(req)
}

// TestOIDCCodeExchange: the console's sign-in sends the browser to the
// provider with the client, redirect URI, state, nonce and PKCE challenge,
// and exchanges the code at the token endpoint through the Authenticator's
// own client (the egress policy), with the verifier and the client's
// credentials: client_secret_basic when it has a secret, its client_id in
// the form when it has none.
func TestOIDCCodeExchange(t *testing.T) {
	const code, verifier, nonce, redirect = "the-code", "a-verifier-of-enough-length-for-pkce-0123456789", "n-1", "https://fleetd.example.com/console/oidc/callback"
	for _, tc := range []struct {
		name, clientID, secret string
	}{
		{"ClientSecretBasic", "console id", "s&cret:1"},
		{"PublicClient", "console", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var issuer string
			var form url.Values
			var user, pass string
			var basic bool
			mux := http.NewServeMux()
			mux.HandleFunc("GET /.well-known/openid-configuration", func(w http.ResponseWriter, r *http.Request) {
				json.NewEncoder(w).Encode(map[string]string{"issuer": issuer, "authorization_endpoint": issuer + "/authorize", "token_endpoint": issuer + "/token"})
			})
			mux.HandleFunc("GET /keys", func(w http.ResponseWriter, r *http.Request) {
				json.NewEncoder(w).Encode(map[string]any{"keys": []map[string]string{jwkOf("rsa-1", rsaKey.Public())}})
			})
			mux.HandleFunc("POST /token", func(w http.ResponseWriter, r *http.Request) {
				r.ParseForm()
				form = r.PostForm
				user, pass, basic = r.BasicAuth()
				id := sign(t, jwt.SigningMethodRS256, "rsa-1", rsaKey, claims(map[string]any{"iss": issuer, "aud": tc.clientID, "nonce": nonce}))
				w.Header().Set("Content-Type", "application/json")
				json.NewEncoder(w).Encode(map[string]any{"access_token": "at", "token_type": "Bearer", "expires_in": 60, "id_token": id})
			})
			srv := httptest.NewServer(mux)
			t.Cleanup(srv.Close)
			issuer = srv.URL

			rec := &recorder{next: loopback.Transport}
			client := *loopback
			client.Transport = rec
			store := &memStore{m: map[string]*fleet.TenantAuth{"acme": {Method: fleet.AuthJWKS, JWKSURL: issuer + "/keys", Issuer: issuer,
				Audience: "fleetd", DefaultRole: fleet.RoleViewer, OIDC: &fleet.OIDCSignIn{ClientID: tc.clientID, ClientSecret: tc.secret}}}}
			a := &enduser.Authenticator{Store: store, Now: func() time.Time { return now }, Timeout: 5 * time.Second, Client: &client}
			ctx := context.Background()

			to, err := a.AuthorizationURL(ctx, "acme", redirect, "st-1", nonce, verifier)
			if err != nil {
				t.Fatal(err)
			}
			u, _ := url.Parse(to)
			sum := sha256.Sum256([]byte(verifier))
			want := url.Values{"response_type": {"code"}, "client_id": {tc.clientID}, "redirect_uri": {redirect}, "scope": {"openid email profile"},
				"state": {"st-1"}, "nonce": {nonce}, "code_challenge": {base64.RawURLEncoding.EncodeToString(sum[:])}, "code_challenge_method": {"S256"}}
			if u.Path != "/authorize" || u.Query().Encode() != want.Encode() {
				t.Errorf("authorization URL %s, want /authorize?%s", to, want.Encode())
			}

			act, _, err := a.SignIn(ctx, "acme", code, redirect, verifier, nonce)
			if err != nil {
				t.Fatalf("sign-in: %v", err)
			}
			if act.UserEmail != "ada@example.com" || act.Role != fleet.RoleViewer {
				t.Errorf("signed in %+v", act)
			}
			if form.Get("grant_type") != "authorization_code" || form.Get("code") != code || form.Get("redirect_uri") != redirect || form.Get("code_verifier") != verifier {
				t.Errorf("token request form %v", form)
			}
			if tc.secret != "" {
				// RFC 6749 §2.3.1: each part form-encoded, then Basic.
				if !basic || user != url.QueryEscape(tc.clientID) || pass != url.QueryEscape(tc.secret) || form.Has("client_secret") {
					t.Errorf("client authentication: basic %v %q %q, form %v", basic, user, pass, form)
				}
			} else if basic || form.Get("client_id") != tc.clientID {
				t.Errorf("public client: basic %v, form %v", basic, form)
			}
			rec.mu.Lock()
			defer rec.mu.Unlock()
			if !slices.Contains(rec.paths, "/token") {
				t.Errorf("the token request did not go through the Authenticator's client; it sent %v", rec.paths)
			}
		})
	}
}
