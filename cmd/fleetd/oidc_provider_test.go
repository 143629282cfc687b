package main

import (
	"encoding/json"
	"net"
	"net/http"
	"testing"

	"github.com/zitadel/oidc/v3/example/server/exampleop"
	"github.com/zitadel/oidc/v3/example/server/storage"
)

// oidcProvider is a real OpenID provider in the test process: zitadel/oidc's
// op package (a certified implementation) with its example storage and
// login page, on 127.0.0.1. It knows one web client (code flow, secret
// sent with HTTP Basic, PKCE S256) and signs people in with a username and
// password form.
type oidcProvider struct {
	Issuer, JWKSURL    string
	Username, Password string
	Email              string
}

func startOIDCProvider(t *testing.T, clientID, secret, redirectURI string) *oidcProvider {
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
	return &oidcProvider{Issuer: issuer, JWKSURL: doc.JWKSURI, Username: u.Username, Password: u.Password, Email: u.Email}
}

// tenantOIDC is an S9 body that lets the tenant's people sign in to the
// console with p, as role.
func (p *oidcProvider) tenantOIDC(clientID, secret, role string) map[string]any {
	return map[string]any{"method": "jwks", "jwks_url": p.JWKSURL, "issuer": p.Issuer, "audience": "fleetd-api", "default_role": role,
		"oidc": map[string]any{"client_id": clientID, "client_secret": secret}}
}
