package fleetdtest

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/zitadel/oidc/v3/example/server/exampleop"
	"github.com/zitadel/oidc/v3/example/server/storage"
)

// OIDCProvider is a real OpenID provider in the test process: zitadel/oidc's
// op package (a certified implementation) with its example storage and
// login page, on 127.0.0.1. It knows one web client (code flow, secret
// sent with HTTP Basic, PKCE S256) and signs people in with a username and
// password form.
type OIDCProvider struct {
	Issuer, JWKSURL    string
	Username, Password string
	Email              string
}

// StartOIDCProvider starts an OpenID provider with one client and one
// person, for the test's life.
func StartOIDCProvider(t *testing.T, clientID, secret, redirectURI string) *OIDCProvider {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	issuer := "http://" + ln.Addr().String()
	users := storage.NewUserStore(issuer)
	st := storage.NewStorageWithClients(users, map[string]*storage.Client{clientID: storage.WebClient(clientID, secret, redirectURI)})
	srv := &http.Server{Handler: exampleop.SetupServer(issuer, st, nil, false)}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	res, err := http.Get(issuer + "/.well-known/openid-configuration")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var doc struct {
		JWKSURI string `json:"jwks_uri"`
	}
	if err := json.NewDecoder(res.Body).Decode(&doc); err != nil || doc.JWKSURI == "" {
		t.Fatalf("the provider's discovery document: %v %+v", err, doc)
	}
	u := users.GetUserByID("id1")
	return &OIDCProvider{Issuer: issuer, JWKSURL: doc.JWKSURI, Username: u.Username, Password: u.Password, Email: u.Email}
}

// TenantOIDC is an S9 body that lets the tenant's people sign in to the
// console with p, as role.
func (p *OIDCProvider) TenantOIDC(clientID, secret, role string) map[string]any {
	return map[string]any{"method": "jwks", "jwks_url": p.JWKSURL, "issuer": p.Issuer, "audience": "fleetd-api", "default_role": role,
		"oidc": map[string]any{"client_id": clientID, "client_secret": secret}}
}

// IdentityProvider serves a JWKS with one RSA key and signs tokens with it.
type IdentityProvider struct {
	key    *rsa.PrivateKey
	Server *httptest.Server
}

// NewIdentityProvider starts an IdentityProvider for the test's life.
func NewIdentityProvider(t *testing.T) *IdentityProvider {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	p := &IdentityProvider{key: key}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		enc := base64.RawURLEncoding
		json.NewEncoder(w).Encode(map[string]any{"keys": []any{map[string]string{
			"kty": "RSA", "kid": "k1", "alg": "RS256",
			"n": enc.EncodeToString(key.N.Bytes()), "e": enc.EncodeToString(big.NewInt(int64(key.E)).Bytes()),
		}}})
	}))
	t.Cleanup(p.Server.Close)
	return p
}

// Token is a JWT with claims, signed with the provider's key.
func (p *IdentityProvider) Token(t *testing.T, claims jwt.MapClaims) string {
	t.Helper()
	c := jwt.MapClaims{"iss": "https://id.example.com", "aud": "fleetd", "exp": time.Now().Add(time.Hour).Unix(),
		"name": "Ada Lovelace", "email": "ada@example.com"}
	for k, v := range claims {
		c[k] = v
	}
	tok := jwt.NewWithClaims(jwt.SigningMethodRS256, c)
	tok.Header["kid"] = "k1"
	s, err := tok.SignedString(p.key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
