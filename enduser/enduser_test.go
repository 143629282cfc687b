package enduser_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/egress"
	"github.com/fleetd/fleet/enduser"
	"github.com/fleetd/fleet/internal/poll"
	"github.com/fleetd/fleet/internal/testclock"
	"github.com/golang-jwt/jwt/v5"
)

// loopback is a client under an egress policy that lets the tests reach
// their identity providers on 127.0.0.1.
var loopback = func() *http.Client {
	p, _ := egress.Parse("127.0.0.0/8")
	return p.Client(enduser.FetchTimeout, egress.FollowRedirects)
}()

// memStore is the configuration store, in memory: the store has its own
// tests, and this isolates the verifier.
type memStore struct {
	mu sync.Mutex
	m  map[string]*fleet.TenantAuth
}

func (s *memStore) SetTenantAuth(_ context.Context, tenant string, a *fleet.TenantAuth) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[tenant] = a
	return nil
}

func (s *memStore) FindTenantAuth(_ context.Context, tenant string) (*fleet.TenantAuth, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.m[tenant]
	if !ok {
		return nil, fleet.Errorf(fleet.ENOTFOUND, "no auth")
	}
	return a, nil
}

// idp is an identity provider: signing keys and the JWKS that publishes them.
type idp struct {
	mu      sync.Mutex
	keys    map[string]crypto.Signer // published keys by kid
	fetches atomic.Int32
	srv     *httptest.Server
}

func newIDP(t *testing.T) *idp {
	p := &idp{keys: map[string]crypto.Signer{}}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.fetches.Add(1)
		p.mu.Lock()
		defer p.mu.Unlock()
		var keys []map[string]string
		for kid, k := range p.keys {
			keys = append(keys, jwkOf(kid, k.Public()))
		}
		json.NewEncoder(w).Encode(map[string]any{"keys": keys})
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *idp) publish(kid string, k crypto.Signer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.keys[kid] = k
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

func jwkOf(kid string, pub crypto.PublicKey) map[string]string {
	switch k := pub.(type) {
	case *rsa.PublicKey:
		return map[string]string{"kty": "RSA", "kid": kid, "use": "sig", "n": b64(k.N.Bytes()), "e": b64(big.NewInt(int64(k.E)).Bytes())}
	case *ecdsa.PublicKey:
		point, err := k.Bytes() // 0x04, then x and y, 32 bytes each
		if err != nil {
			panic(err)
		}
		return map[string]string{"kty": "EC", "kid": kid, "crv": "P-256", "x": b64(point[1:33]), "y": b64(point[33:])}
	case ed25519.PublicKey:
		return map[string]string{"kty": "OKP", "kid": kid, "crv": "Ed25519", "x": b64(k)}
	}
	panic("unknown key")
}

var (
	rsaKey, _   = rsa.GenerateKey(rand.Reader, 2048)
	ecKey, _    = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	_, edKey, _ = ed25519.GenerateKey(rand.Reader)
	now         = time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
)

func claims(over map[string]any) jwt.MapClaims {
	c := jwt.MapClaims{
		"iss": "https://id.example.com", "aud": "fleetd", "sub": "u-1",
		"email": "ada@example.com", "name": "Ada", "exp": now.Add(time.Hour).Unix(), "iat": now.Unix(),
	}
	for k, v := range over {
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
	}
	return c
}

func sign(t *testing.T, method jwt.SigningMethod, kid string, key any, c jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(method, c)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func setup(t *testing.T) (*enduser.Authenticator, *idp, *testclock.Clock) {
	p := newIDP(t)
	p.publish("rsa-1", rsaKey)
	p.publish("ec-1", ecKey)
	p.publish("ed-1", edKey)
	clk := testclock.New(now)
	store := &memStore{m: map[string]*fleet.TenantAuth{}}
	a := &enduser.Authenticator{Store: store, Now: clk.Now, Client: loopback}
	err := a.SetTenantAuth(context.Background(), "acme", &fleet.TenantAuth{
		Method: fleet.AuthJWKS, JWKSURL: p.srv.URL, Issuer: "https://id.example.com", Audience: "fleetd", DefaultRole: fleet.RoleViewer,
	})
	if err != nil {
		t.Fatal(err)
	}
	return a, p, clk
}

func TestJWKS(t *testing.T) {
	a, _, _ := setup(t)
	ctx := context.Background()
	valid := func(t *testing.T, token string) *fleet.Actor {
		t.Helper()
		act, err := a.AuthenticateToken(ctx, "acme", token)
		if err != nil {
			t.Fatalf("valid token refused: %v", err)
		}
		return act
	}
	refused := func(t *testing.T, token string) {
		t.Helper()
		_, err := a.AuthenticateToken(ctx, "acme", token)
		if code := fleet.ErrorCode(err); code != fleet.EUNAUTHENTICATED {
			t.Fatalf("error code = %q (%v), want unauthenticated", code, err)
		}
	}

	t.Run("RS256", func(t *testing.T) {
		act := valid(t, sign(t, jwt.SigningMethodRS256, "rsa-1", rsaKey, claims(nil)))
		if act.Tenant != "acme" || act.UserName != "Ada" || act.UserEmail != "ada@example.com" || act.Role != fleet.RoleViewer || act.KeyName != "" {
			t.Fatalf("actor = %+v", act)
		}
	})
	t.Run("ES256", func(t *testing.T) { valid(t, sign(t, jwt.SigningMethodES256, "ec-1", ecKey, claims(nil))) })
	t.Run("EdDSA", func(t *testing.T) { valid(t, sign(t, jwt.SigningMethodEdDSA, "ed-1", edKey, claims(nil))) })
	t.Run("RoleClaim", func(t *testing.T) {
		act := valid(t, sign(t, jwt.SigningMethodRS256, "rsa-1", rsaKey, claims(map[string]any{"role": "operator"})))
		if act.Role != fleet.RoleOperator {
			t.Fatalf("role = %s", act.Role)
		}
	})
	t.Run("UnknownRoleClaim", func(t *testing.T) {
		refused(t, sign(t, jwt.SigningMethodRS256, "rsa-1", rsaKey, claims(map[string]any{"role": "root"})))
	})
	t.Run("NameFallsBackToEmail", func(t *testing.T) {
		act := valid(t, sign(t, jwt.SigningMethodRS256, "rsa-1", rsaKey, claims(map[string]any{"name": nil})))
		if act.UserName != "ada@example.com" {
			t.Fatalf("user name = %q", act.UserName)
		}
	})
	t.Run("WithinLeeway", func(t *testing.T) {
		valid(t, sign(t, jwt.SigningMethodRS256, "rsa-1", rsaKey, claims(map[string]any{"exp": now.Add(-10 * time.Second).Unix()})))
	})
	for _, tc := range []struct {
		name  string
		token func(t *testing.T) string
	}{
		{"Expired", func(t *testing.T) string {
			return sign(t, jwt.SigningMethodRS256, "rsa-1", rsaKey, claims(map[string]any{"exp": now.Add(-time.Minute).Unix()}))
		}},
		{"NoExpiry", func(t *testing.T) string {
			return sign(t, jwt.SigningMethodRS256, "rsa-1", rsaKey, claims(map[string]any{"exp": nil}))
		}},
		{"NotYetValid", func(t *testing.T) string {
			return sign(t, jwt.SigningMethodRS256, "rsa-1", rsaKey, claims(map[string]any{"nbf": now.Add(time.Minute).Unix()}))
		}},
		{"WrongIssuer", func(t *testing.T) string {
			return sign(t, jwt.SigningMethodRS256, "rsa-1", rsaKey, claims(map[string]any{"iss": "https://evil.example.com"}))
		}},
		{"WrongAudience", func(t *testing.T) string {
			return sign(t, jwt.SigningMethodRS256, "rsa-1", rsaKey, claims(map[string]any{"aud": "other"}))
		}},
		{"AlgNone", func(t *testing.T) string {
			return sign(t, jwt.SigningMethodNone, "rsa-1", jwt.UnsafeAllowNoneSignatureType, claims(nil))
		}},
		{"HS256WithPublicKey", func(t *testing.T) string {
			der, _ := x509.MarshalPKIXPublicKey(&rsaKey.PublicKey)
			return sign(t, jwt.SigningMethodHS256, "rsa-1", der, claims(nil))
		}},
		{"KeyTypeConfusion", func(t *testing.T) string {
			// An ES256 token naming the RSA key's id.
			return sign(t, jwt.SigningMethodES256, "rsa-1", ecKey, claims(nil))
		}},
		{"TamperedPayload", func(t *testing.T) string {
			tok := sign(t, jwt.SigningMethodRS256, "rsa-1", rsaKey, claims(nil))
			parts := strings.Split(tok, ".")
			forged, _ := json.Marshal(claims(map[string]any{"role": "admin"}))
			return parts[0] + "." + b64(forged) + "." + parts[2]
		}},
		{"SignedByAnotherKey", func(t *testing.T) string {
			other, _ := rsa.GenerateKey(rand.Reader, 2048)
			return sign(t, jwt.SigningMethodRS256, "rsa-1", other, claims(nil))
		}},
		{"Garbage", func(t *testing.T) string { return "not.a.jwt" }},
	} {
		t.Run(tc.name, func(t *testing.T) { refused(t, tc.token(t)) })
	}
	t.Run("OtherTenant", func(t *testing.T) {
		_, err := a.AuthenticateToken(ctx, "beta", sign(t, jwt.SigningMethodRS256, "rsa-1", rsaKey, claims(nil)))
		if fleet.ErrorCode(err) != fleet.EUNAUTHENTICATED {
			t.Fatalf("a tenant without S9 accepted a token: %v", err)
		}
	})
}

// TestJWKSRotation: a new key is picked up on its first unknown kid, but
// unknown kids do not make fleetd fetch more often than RefreshInterval.
func TestJWKSRotation(t *testing.T) {
	a, p, clk := setup(t)
	ctx := context.Background()
	if _, err := a.AuthenticateToken(ctx, "acme", sign(t, jwt.SigningMethodRS256, "rsa-1", rsaKey, claims(nil))); err != nil {
		t.Fatal(err)
	}
	if n := p.fetches.Load(); n != 1 {
		t.Fatalf("fetches = %d, want 1", n)
	}
	for range 50 {
		a.AuthenticateToken(ctx, "acme", sign(t, jwt.SigningMethodRS256, "rsa-1", rsaKey, claims(nil)))
	}
	if n := p.fetches.Load(); n != 1 {
		t.Fatalf("fetches = %d after 50 requests, want 1: keys are cached", n)
	}

	rotated, _ := rsa.GenerateKey(rand.Reader, 2048)
	p.publish("rsa-2", rotated)
	clk.Add(enduser.RefreshInterval)
	if _, err := a.AuthenticateToken(ctx, "acme", sign(t, jwt.SigningMethodRS256, "rsa-2", rotated, claims(nil))); err != nil {
		t.Fatalf("rotated key not picked up: %v", err)
	}
	if n := p.fetches.Load(); n != 2 {
		t.Fatalf("fetches = %d, want 2", n)
	}
	// A flood of unknown kids fetches at most once per interval.
	for i := range 20 {
		a.AuthenticateToken(ctx, "acme", sign(t, jwt.SigningMethodRS256, "unknown-"+string(rune('a'+i)), rotated, claims(nil)))
	}
	if n := p.fetches.Load(); n != 2 {
		t.Fatalf("fetches = %d after unknown kids within the interval, want 2", n)
	}
	clk.Add(enduser.RefreshInterval)
	a.AuthenticateToken(ctx, "acme", sign(t, jwt.SigningMethodRS256, "unknown-z", rotated, claims(nil)))
	if n := p.fetches.Load(); n != 3 {
		t.Fatalf("fetches = %d, want 3", n)
	}
}

func TestJWKSUnreachable(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	url := "http://" + ln.Addr().String() + "/jwks"
	ln.Close()
	store := &memStore{m: map[string]*fleet.TenantAuth{"acme": {Method: fleet.AuthJWKS, JWKSURL: url, Issuer: "i", Audience: "a", DefaultRole: fleet.RoleViewer}}}
	a := &enduser.Authenticator{Store: store, Now: func() time.Time { return now }, Client: loopback}
	_, err := a.AuthenticateToken(context.Background(), "acme", sign(t, jwt.SigningMethodRS256, "rsa-1", rsaKey, claims(nil)))
	if code := fleet.ErrorCode(err); code != fleet.EUNAVAILABLE {
		t.Fatalf("error code = %q, want unavailable", code)
	}
}

func TestWebhook(t *testing.T) {
	var calls atomic.Int32
	block := make(chan struct{})
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		var body struct{ Tenant, Token string }
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.Tenant != "acme" {
			w.WriteHeader(400)
			return
		}
		switch body.Token {
		case "good":
			json.NewEncoder(w).Encode(map[string]string{"user_name": "Grace", "user_email": "grace@example.com", "role": "operator"})
		case "no-role":
			json.NewEncoder(w).Encode(map[string]string{"user_name": "Lin"})
		case "bad-role":
			json.NewEncoder(w).Encode(map[string]string{"user_name": "Lin", "role": "root"})
		case "broken":
			w.WriteHeader(500)
		case "slow":
			<-block
		default:
			w.WriteHeader(403)
		}
	}))
	// Cleanups run last first: release the slow handler, then close.
	t.Cleanup(hook.Close)
	t.Cleanup(func() { close(block) })
	clk := testclock.New(now)
	store := &memStore{m: map[string]*fleet.TenantAuth{}}
	a := &enduser.Authenticator{Store: store, Now: clk.Now, Timeout: 200 * time.Millisecond, Client: loopback}
	ctx := context.Background()
	a.SetTenantAuth(ctx, "acme", &fleet.TenantAuth{Method: fleet.AuthWebhook, WebhookURL: hook.URL, DefaultRole: fleet.RoleViewer})

	act, err := a.AuthenticateToken(ctx, "acme", "good")
	if err != nil || act.UserName != "Grace" || act.UserEmail != "grace@example.com" || act.Role != fleet.RoleOperator {
		t.Fatalf("good: %+v, %v", act, err)
	}
	a.AuthenticateToken(ctx, "acme", "good")
	if n := calls.Load(); n != 1 {
		t.Fatalf("webhook called %d times, want 1: a yes is cached", n)
	}
	clk.Add(enduser.WebhookTTL + time.Second)
	a.AuthenticateToken(ctx, "acme", "good")
	if n := calls.Load(); n != 2 {
		t.Fatalf("webhook called %d times after the cache expired, want 2", n)
	}
	if act, err := a.AuthenticateToken(ctx, "acme", "no-role"); err != nil || act.Role != fleet.RoleViewer {
		t.Fatalf("no-role: %+v, %v; want the default role", act, err)
	}
	for _, tok := range []string{"refused", "broken", "bad-role"} {
		if _, err := a.AuthenticateToken(ctx, "acme", tok); fleet.ErrorCode(err) != fleet.EUNAUTHENTICATED {
			t.Errorf("%s: %v, want unauthenticated", tok, err)
		}
	}
	if _, err := a.AuthenticateToken(ctx, "acme", "slow"); fleet.ErrorCode(err) != fleet.EUNAVAILABLE {
		t.Errorf("slow: %v, want unavailable", err)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	down := "http://" + ln.Addr().String()
	ln.Close()
	a.SetTenantAuth(ctx, "acme", &fleet.TenantAuth{Method: fleet.AuthWebhook, WebhookURL: down, DefaultRole: fleet.RoleViewer})
	if _, err := a.AuthenticateToken(ctx, "acme", "good"); fleet.ErrorCode(err) != fleet.EUNAVAILABLE {
		t.Errorf("down: %v, want unavailable (and the cached yes forgotten with the old configuration)", err)
	}
}

// jwksServer serves a fixed JWKS document, counting fetches; hold, when
// not nil, keeps each fetch waiting until it is closed.
func jwksServer(t *testing.T, status int, keys []map[string]string, hold chan struct{}) (*httptest.Server, *atomic.Int32) {
	var fetches atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fetches.Add(1)
		if hold != nil {
			<-hold
		}
		w.WriteHeader(status)
		json.NewEncoder(w).Encode(map[string]any{"keys": keys})
	}))
	t.Cleanup(srv.Close)
	return srv, &fetches
}

func jwksAuthenticator(t *testing.T, url string) (*enduser.Authenticator, *testclock.Clock) {
	clk := testclock.New(now)
	store := &memStore{m: map[string]*fleet.TenantAuth{"acme": {Method: fleet.AuthJWKS, JWKSURL: url, Issuer: "https://id.example.com", Audience: "fleetd", DefaultRole: fleet.RoleViewer}}}
	return &enduser.Authenticator{Store: store, Now: clk.Now, Timeout: 5 * time.Second, Client: loopback}, clk
}

// TestJWKSKeyBounds: a JWKS with an RSA key too large (each verification
// took 11 s of CPU at 10129e9) or with an odd exponent is refused when read:
// every token is then 503 with a message naming the key, and no signature
// is verified with it.
func TestJWKSKeyBounds(t *testing.T) {
	huge := make([]byte, 1<<15) // a 262,144-bit modulus
	rand.Read(huge)
	huge[0] |= 0x80
	for _, tc := range []struct {
		name string
		key  map[string]string
		sig  int
		want string
	}{
		{"huge modulus", map[string]string{"kty": "RSA", "kid": "huge", "n": b64(huge), "e": "AQAB"}, len(huge), `key "huge" has a 262144-bit RSA modulus`},
		{"even exponent", map[string]string{"kty": "RSA", "kid": "even", "n": b64(rsaKey.N.Bytes()), "e": b64(big.NewInt(65536).Bytes())}, 256, `key "even" has an RSA exponent`},
		{"huge exponent", map[string]string{"kty": "RSA", "kid": "big-e", "n": b64(rsaKey.N.Bytes()), "e": b64(new(big.Int).Lsh(big.NewInt(1), 40).Bytes())}, 256, `key "big-e" has an RSA exponent`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, _ := jwksServer(t, 200, []map[string]string{tc.key, jwkOf("rsa-1", rsaKey.Public())}, nil)
			a, _ := jwksAuthenticator(t, srv.URL)
			tok := sign(t, jwt.SigningMethodRS256, tc.key["kid"], rsaKey, claims(nil))
			parts := strings.Split(tok, ".")
			forged := make([]byte, tc.sig)
			rand.Read(forged)
			for _, tok := range []string{parts[0] + "." + parts[1] + "." + b64(forged), sign(t, jwt.SigningMethodRS256, "rsa-1", rsaKey, claims(nil))} {
				_, err := a.AuthenticateToken(context.Background(), "acme", tok)
				if fleet.ErrorCode(err) != fleet.EUNAVAILABLE || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("err %v, want unavailable saying %q", err, tc.want)
				}
			}
		})
	}
	t.Run("point off the curve", func(t *testing.T) {
		// ecKey's point with y one greater: no P-256 key has it, and a
		// signature must not be checked against it.
		off := jwkOf("ec-off", ecKey.Public())
		y, _ := base64.RawURLEncoding.DecodeString(off["y"])
		off["y"] = b64(new(big.Int).Add(new(big.Int).SetBytes(y), big.NewInt(1)).FillBytes(make([]byte, 32)))
		srv, _ := jwksServer(t, 200, []map[string]string{off, jwkOf("rsa-1", rsaKey.Public())}, nil)
		a, _ := jwksAuthenticator(t, srv.URL)
		if _, err := a.AuthenticateToken(context.Background(), "acme", sign(t, jwt.SigningMethodES256, "ec-off", ecKey, claims(nil))); fleet.ErrorCode(err) != fleet.EUNAUTHENTICATED {
			t.Fatalf("a token for the key off the curve: err %v, want unauthenticated", err)
		}
		// Skipped, it leaves rsa-1 the set's only key, which a token
		// without a key id is checked against.
		if _, err := a.AuthenticateToken(context.Background(), "acme", sign(t, jwt.SigningMethodRS256, "", rsaKey, claims(nil))); err != nil {
			t.Fatalf("a token without a key id, for the set's only good key: %v", err)
		}
	})
	t.Run("signature of the wrong length", func(t *testing.T) {
		srv, _ := jwksServer(t, 200, []map[string]string{jwkOf("rsa-1", rsaKey.Public())}, nil)
		a, _ := jwksAuthenticator(t, srv.URL)
		parts := strings.Split(sign(t, jwt.SigningMethodRS256, "rsa-1", rsaKey, claims(nil)), ".")
		long := make([]byte, 4096)
		if _, err := a.AuthenticateToken(context.Background(), "acme", parts[0]+"."+parts[1]+"."+b64(long)); fleet.ErrorCode(err) != fleet.EUNAUTHENTICATED {
			t.Fatalf("err %v, want unauthenticated", err)
		}
	})
	t.Run("client gone", func(t *testing.T) {
		srv, _ := jwksServer(t, 200, []map[string]string{jwkOf("rsa-1", rsaKey.Public())}, nil)
		a, _ := jwksAuthenticator(t, srv.URL)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := a.AuthenticateToken(ctx, "acme", sign(t, jwt.SigningMethodRS256, "rsa-1", rsaKey, claims(nil))); err == nil {
			t.Fatal("a token was verified for a request that had ended")
		}
	})
}

// TestJWKSSingleFlight: with no copy of the keys, concurrent requests make
// one fetch and share its answer; a failure is the answer for
// RefreshInterval, with no fetch meanwhile (at 10129e9, 200 requests made
// 200 fetches, and a hanging JWKS held each request of the tenant in turn).
func TestJWKSSingleFlight(t *testing.T) {
	t.Run("one fetch for many requests", func(t *testing.T) {
		hold := make(chan struct{})
		srv, fetches := jwksServer(t, 200, []map[string]string{jwkOf("rsa-1", rsaKey.Public())}, hold)
		a, _ := jwksAuthenticator(t, srv.URL)
		tok := sign(t, jwt.SigningMethodRS256, "rsa-1", rsaKey, claims(nil))
		errs := make(chan error, 50)
		for range 50 {
			go func() { _, err := a.AuthenticateToken(context.Background(), "acme", tok); errs <- err }()
		}
		poll.Until(t, 15*time.Second, "the JWKS fetch to begin", func() bool { return fetches.Load() > 0 })
		close(hold)
		for range 50 {
			select {
			case err := <-errs:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(15 * time.Second):
				t.Fatal("waited 15s for the requests to be answered once the one fetch returned")
			}
		}
		if n := fetches.Load(); n != 1 {
			t.Fatalf("%d fetches, want 1", n)
		}
	})
	t.Run("failures cached", func(t *testing.T) {
		srv, fetches := jwksServer(t, 500, nil, nil)
		a, clk := jwksAuthenticator(t, srv.URL)
		tok := sign(t, jwt.SigningMethodRS256, "rsa-1", rsaKey, claims(nil))
		for range 200 {
			if _, err := a.AuthenticateToken(context.Background(), "acme", tok); fleet.ErrorCode(err) != fleet.EUNAVAILABLE {
				t.Fatalf("err %v, want unavailable", err)
			}
		}
		if n := fetches.Load(); n != 1 {
			t.Fatalf("%d fetches for 200 requests within the interval, want 1", n)
		}
		clk.Add(enduser.RefreshInterval)
		a.AuthenticateToken(context.Background(), "acme", tok)
		if n := fetches.Load(); n != 2 {
			t.Fatalf("%d fetches once the interval passed, want 2", n)
		}
	})
	t.Run("waiters leave with their request", func(t *testing.T) {
		hold := make(chan struct{})
		defer close(hold)
		srv, fetches := jwksServer(t, 200, []map[string]string{jwkOf("rsa-1", rsaKey.Public())}, hold)
		a, _ := jwksAuthenticator(t, srv.URL)
		go a.AuthenticateToken(context.Background(), "acme", sign(t, jwt.SigningMethodRS256, "rsa-1", rsaKey, claims(nil)))
		poll.Until(t, 15*time.Second, "the JWKS fetch to begin", func() bool { return fetches.Load() > 0 })
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := a.AuthenticateToken(ctx, "acme", sign(t, jwt.SigningMethodRS256, "rsa-1", rsaKey, claims(nil))); err == nil {
			t.Fatal("a request that ended was answered yes")
		}
		if n := fetches.Load(); n != 1 {
			t.Fatalf("%d fetches, want 1", n)
		}
	})
}

// TestOutboundPolicy: by default neither a JWKS nor an S9 webhook on an
// internal address is reached, and an S9 webhook's redirect is not
// followed, so a token is never sent on to where the answer points (issue
// 15, item 4).
func TestOutboundPolicy(t *testing.T) {
	var hits, forwarded atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if r.URL.Path == "/elsewhere" {
			forwarded.Add(1)
			json.NewEncoder(w).Encode(map[string]string{"user_name": "Mallory", "role": "admin"})
			return
		}
		http.Redirect(w, r, "/elsewhere", http.StatusTemporaryRedirect)
	}))
	defer srv.Close()
	ctx := context.Background()
	t.Run("internal addresses refused by default", func(t *testing.T) {
		store := &memStore{m: map[string]*fleet.TenantAuth{
			"acme": {Method: fleet.AuthJWKS, JWKSURL: srv.URL, Issuer: "i", Audience: "a", DefaultRole: fleet.RoleViewer},
			"beta": {Method: fleet.AuthWebhook, WebhookURL: srv.URL, DefaultRole: fleet.RoleViewer},
		}}
		a := &enduser.Authenticator{Store: store, Now: func() time.Time { return now }}
		for _, tenant := range []string{"acme", "beta"} {
			if _, err := a.AuthenticateToken(ctx, tenant, sign(t, jwt.SigningMethodRS256, "rsa-1", rsaKey, claims(nil))); fleet.ErrorCode(err) != fleet.EUNAVAILABLE {
				t.Fatalf("%s: %v, want unavailable", tenant, err)
			}
		}
		if n := hits.Load(); n != 0 {
			t.Fatalf("%d requests reached 127.0.0.1", n)
		}
	})
	t.Run("webhook redirect not followed", func(t *testing.T) {
		store := &memStore{m: map[string]*fleet.TenantAuth{"beta": {Method: fleet.AuthWebhook, WebhookURL: srv.URL + "/hook", DefaultRole: fleet.RoleViewer}}}
		a := &enduser.Authenticator{Store: store, Now: func() time.Time { return now }, Client: loopback}
		if _, err := a.AuthenticateToken(ctx, "beta", "token"); fleet.ErrorCode(err) != fleet.EUNAUTHENTICATED {
			t.Fatalf("%v, want unauthenticated", err)
		}
		if n := forwarded.Load(); n != 0 {
			t.Fatalf("the token was re-posted to the redirect's target %d times", n)
		}
	})
}

// TestWebhookLimits: an anonymous client sending a new token with each
// request calls the tenant's webhook at most WebhookBurst times at once,
// then WebhookRate a second, and a refused token is not asked about again
// for WebhookRefusalTTL (docs/reliability.md#smaller-bounds; at 10129e9, one
// call per request).
func TestWebhookLimits(t *testing.T) {
	var calls atomic.Int32
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusForbidden)
	}))
	defer hook.Close()
	clk := testclock.New(now)
	store := &memStore{m: map[string]*fleet.TenantAuth{
		"acme": {Method: fleet.AuthWebhook, WebhookURL: hook.URL, DefaultRole: fleet.RoleViewer},
		"beta": {Method: fleet.AuthWebhook, WebhookURL: hook.URL, DefaultRole: fleet.RoleViewer},
	}}
	a := &enduser.Authenticator{Store: store, Now: clk.Now, Client: loopback}
	ctx := context.Background()
	limited := madeUpTokens(t, a, 100, func(int) context.Context { return ctx }, "made-up-")
	if n := calls.Load(); n != enduser.WebhookBurst || limited != 100-enduser.WebhookBurst {
		t.Fatalf("%d webhook calls and %d requests limited, want %d and %d", n, limited, enduser.WebhookBurst, 100-enduser.WebhookBurst)
	}
	// Another tenant has its own allowance.
	if _, err := a.AuthenticateToken(ctx, "beta", "made-up-0"); fleet.ErrorCode(err) != fleet.EUNAUTHENTICATED {
		t.Fatalf("beta: %v", err)
	}
	// A refusal is remembered: the same token asks nothing, even once the
	// allowance has refilled.
	clk.Add(10 * time.Second)
	before := calls.Load()
	for range 50 {
		if _, err := a.AuthenticateToken(ctx, "acme", "made-up-0"); fleet.ErrorCode(err) != fleet.EUNAUTHENTICATED {
			t.Fatalf("remembered refusal: %v", err)
		}
	}
	if n := calls.Load() - before; n != 0 {
		t.Fatalf("%d webhook calls for a token refused a moment ago", n)
	}
	clk.Add(enduser.WebhookRefusalTTL)
	a.AuthenticateToken(ctx, "acme", "made-up-0")
	if n := calls.Load() - before; n != 1 {
		t.Fatalf("%d webhook calls once the refusal expired, want 1", n)
	}
}

// TestWebhookLimitsPerAddress: a flood of made-up tokens from one address
// uses up that address's allowance (WebhookAddrBurst), not the tenant's:
// a new good token from another address is still asked about and
// admitted. The tenant's limit stays a ceiling over all addresses. At
// f94a7fc the tenant's bucket was the only one, so the flood locked the
// good token out.
func TestWebhookLimitsPerAddress(t *testing.T) {
	var calls atomic.Int32
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		var body struct{ Token string }
		json.NewDecoder(r.Body).Decode(&body)
		if !strings.HasPrefix(body.Token, "good-") {
			w.WriteHeader(http.StatusForbidden)
			return
		}
		json.NewEncoder(w).Encode(map[string]string{"user_name": "ada", "role": "viewer"})
	}))
	defer hook.Close()
	clk := testclock.New(now)
	store := &memStore{m: map[string]*fleet.TenantAuth{
		"acme": {Method: fleet.AuthWebhook, WebhookURL: hook.URL, DefaultRole: fleet.RoleViewer},
	}}
	a := &enduser.Authenticator{Store: store, Now: clk.Now, Client: loopback}
	from := func(addr string) context.Context { return fleet.NewContextWithSource(context.Background(), addr) }

	limited := madeUpTokens(t, a, 400, func(int) context.Context { return from("203.0.113.7") }, "made-up-")
	if n := calls.Load(); n != enduser.WebhookAddrBurst || limited != 400-enduser.WebhookAddrBurst {
		t.Fatalf("%d webhook calls and %d requests limited, want %d and %d", n, limited, enduser.WebhookAddrBurst, 400-enduser.WebhookAddrBurst)
	}
	if act, err := a.AuthenticateToken(from("198.51.100.1"), "acme", "good-1"); err != nil || act.UserName != "ada" {
		t.Fatalf("a good token from another address during the flood: %v, %v", act, err)
	}

	// Many addresses together meet the tenant's ceiling.
	limited = madeUpTokens(t, a, 100, func(i int) context.Context { return from(fmt.Sprintf("192.0.2.%d", i)) }, "spread-")
	if want := 100 - (enduser.WebhookBurst - enduser.WebhookAddrBurst - 1); limited != want {
		t.Fatalf("%d of 100 tokens from 100 addresses limited, want %d (the tenant's ceiling)", limited, want)
	}
}

// madeUpTokens sends n tokens the webhook refuses to acme, the i-th in
// ctx(i), and returns how many were rate limited rather than refused.
func madeUpTokens(t *testing.T, a *enduser.Authenticator, n int, ctx func(i int) context.Context, prefix string) int {
	t.Helper()
	limited := 0
	for i := range n {
		_, err := a.AuthenticateToken(ctx(i), "acme", fmt.Sprint(prefix, i))
		switch fleet.ErrorCode(err) {
		case fleet.ERATELIMITED:
			limited++
		case fleet.EUNAUTHENTICATED:
		default:
			t.Fatalf("token %d: %v", i, err)
		}
	}
	return limited
}
