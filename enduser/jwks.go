package enduser

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"sync"
	"time"

	"github.com/fleetd/fleet"
	"github.com/golang-jwt/jwt/v5"
)

// algorithms are the only ones accepted: asymmetric, so a public key can
// never sign; "none" and the HMAC family are refused by omission.
var algorithms = []string{"RS256", "ES256", "EdDSA"}

// RSA keys fleetd accepts from a JWKS. Verifying with a modulus of 2^18
// bits took 11 s of CPU per token at 10129e9, in the request's goroutine;
// 8192 bits is the most any issuer uses, and costs under a millisecond.
const (
	MinRSABits     = 2048
	MaxRSABits     = 8192
	MaxRSAExponent = 1<<31 - 1
)

// keySet is one JWKS URL's keys.
type keySet struct {
	url string

	mu          sync.Mutex
	keys        map[string]jwk // by kid
	fetchedAt   time.Time      // last successful fetch
	attemptedAt time.Time      // last fetch, successful or not
	failure     error          // of the last fetch, while keys is nil
	fetching    chan struct{}  // closed when the fetch under way ends; nil when none is
}

type jwk struct {
	alg string // the key's own "alg", if it names one
	key crypto.PublicKey
}

func (a *Authenticator) keySet(url string) *keySet {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.keySets == nil {
		a.keySets = map[string]*keySet{}
	}
	ks, ok := a.keySets[url]
	if !ok {
		ks = &keySet{url: url}
		a.keySets[url] = ks
	}
	return ks
}

func (a *Authenticator) verifyJWT(ctx context.Context, tenant string, cfg *fleet.TenantAuth, token string) (*fleet.Actor, error) {
	claims, err := a.parseJWT(ctx, tenant, cfg, cfg.Audience, token)
	if err != nil {
		return nil, err
	}
	act, ok := actor(tenant, cfg, claims.str("name"), claims.str("email"), claims.str("sub"), claims.str("role"))
	if !ok {
		return nil, a.refused(tenant, "the role claim is not a fleetd role")
	}
	return act, nil
}

// claims are a verified token's.
type claims jwt.MapClaims

func (c claims) str(name string) string { s, _ := c[name].(string); return s }

// parseJWT verifies a token against the tenant's JWKS, issuer and the
// audience given (the API's audience for bearer tokens, the console's
// client id for ID tokens), and returns its claims.
func (a *Authenticator) parseJWT(ctx context.Context, tenant string, cfg *fleet.TenantAuth, audience, token string) (claims, error) {
	ks := a.keySet(cfg.JWKSURL)
	parser := jwt.NewParser(
		jwt.WithValidMethods(algorithms),
		jwt.WithLeeway(Leeway),
		jwt.WithIssuer(cfg.Issuer),
		jwt.WithAudience(audience),
		jwt.WithExpirationRequired(),
		jwt.WithTimeFunc(a.now),
	)
	var unavailable error
	mc := jwt.MapClaims{}
	_, err := parser.ParseWithClaims(token, mc, func(t *jwt.Token) (any, error) {
		kid, _ := t.Header["kid"].(string)
		k, err := ks.find(ctx, a, kid)
		if err != nil {
			unavailable = err
			return nil, err
		}
		if k.alg != "" && k.alg != t.Method.Alg() {
			return nil, fmt.Errorf("key %q is for %s, the token says %s", kid, k.alg, t.Method.Alg())
		}
		if want := signatureSize(k.key); len(t.Signature) != want {
			return nil, fmt.Errorf("a signature of %d bytes for a key that makes %d", len(t.Signature), want)
		}
		if err := ctx.Err(); err != nil {
			return nil, err // the client left: verify nothing for no one
		}
		// The library refuses a key of the wrong type for the algorithm
		// (an RSA key for ES256, say), so key-type confusion fails here.
		return k.key, nil
	})
	if unavailable != nil && fleet.ErrorCode(unavailable) == fleet.EUNAVAILABLE {
		return nil, unavailable
	}
	if err != nil {
		return nil, a.refused(tenant, err.Error())
	}
	return claims(mc), nil
}

// signatureSize is the length of every signature key makes.
func signatureSize(key crypto.PublicKey) int {
	switch k := key.(type) {
	case *rsa.PublicKey:
		return k.Size()
	case *ecdsa.PublicKey:
		return 64
	case ed25519.PublicKey:
		return ed25519.SignatureSize
	}
	return -1
}

// find returns the key with the id kid (or the only key, for tokens without
// one), fetching the set when it is unknown, old, or the id is new. Whatever
// the state, the set is fetched at most once every RefreshInterval: one
// request fetches while the others wait for it (or their own end), and a
// failed fetch is the answer until the interval has passed.
func (ks *keySet) find(ctx context.Context, a *Authenticator, kid string) (jwk, error) {
	for {
		ks.mu.Lock()
		now := a.now()
		k, ok := ks.lookup(kid)
		stale := ks.keys == nil || now.Sub(ks.fetchedAt) > KeysTTL
		if ok && (!stale || ks.fetching != nil) {
			ks.mu.Unlock()
			return k, nil // old keys serve while new ones are on their way
		}
		if wait := ks.fetching; wait != nil {
			ks.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return jwk{}, ctx.Err()
			}
		}
		if (stale || !ok) && (ks.attemptedAt.IsZero() || now.Sub(ks.attemptedAt) >= RefreshInterval) {
			ks.attemptedAt = now
			ks.fetching = make(chan struct{})
			go ks.fetch(a)
			ks.mu.Unlock()
			continue
		}
		failure := ks.failure
		ks.mu.Unlock()
		switch {
		case ok:
			return k, nil
		case failure != nil:
			return jwk{}, failure
		}
		return jwk{}, fmt.Errorf("no key %q in the JWKS", kid)
	}
}

// fetch reads the set for every request waiting on it. It is not tied to
// any one request, which could leave; FetchTimeout bounds it.
func (ks *keySet) fetch(a *Authenticator) {
	ctx, cancel := context.WithTimeout(context.Background(), a.timeout())
	defer cancel()
	keys, err := fetchJWKS(ctx, a.client(), ks.url)
	ks.mu.Lock()
	defer ks.mu.Unlock()
	switch {
	case err == nil:
		ks.keys, ks.fetchedAt, ks.failure = keys, a.now(), nil
	case fleet.ErrorCode(err) == fleet.EUNAVAILABLE:
		// A set fleetd refuses is refused whole, old keys with it: an
		// issuer that publishes it means to use it.
		a.logger().Warn("JWKS refused", "url", ks.url, "err", err)
		ks.keys, ks.failure = nil, err
	default:
		a.logger().Warn("fetch JWKS", "url", ks.url, "err", err)
		if ks.keys == nil {
			ks.failure = fleet.Errorf(fleet.EUNAVAILABLE, "the tenant's JWKS cannot be fetched")
		}
	}
	close(ks.fetching)
	ks.fetching = nil
}

func (ks *keySet) lookup(kid string) (jwk, bool) {
	if kid == "" && len(ks.keys) == 1 {
		for _, k := range ks.keys {
			return k, true
		}
	}
	k, ok := ks.keys[kid]
	return k, ok && kid != ""
}

// fetchJWKS reads a JWK Set (RFC 7517); keys of kinds fleetd does not use
// are skipped.
func fetchJWKS(ctx context.Context, client *http.Client, url string) (map[string]jwk, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %d", resp.StatusCode)
	}
	var set struct {
		Keys []struct {
			Kty, Kid, Alg, Use, Crv string
			N, E, X, Y              string
		} `json:"keys"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&set); err != nil {
		return nil, fmt.Errorf("decode JWKS: %w", err)
	}
	keys := map[string]jwk{}
	for _, k := range set.Keys {
		if k.Use != "" && k.Use != "sig" {
			continue
		}
		var pub crypto.PublicKey
		switch k.Kty {
		case "RSA":
			n, e1 := b64int(k.N)
			e, e2 := b64int(k.E)
			if e1 != nil || e2 != nil || n.BitLen() < MinRSABits {
				continue
			}
			if n.BitLen() > MaxRSABits {
				return nil, fleet.Errorf(fleet.EUNAVAILABLE, "the tenant's JWKS is unusable: key %q has a %d-bit RSA modulus; fleetd accepts at most %d bits", k.Kid, n.BitLen(), MaxRSABits)
			}
			if !e.IsInt64() || e.Int64() < 3 || e.Int64() > MaxRSAExponent || e.Bit(0) == 0 {
				return nil, fleet.Errorf(fleet.EUNAVAILABLE, "the tenant's JWKS is unusable: key %q has an RSA exponent outside 3 to 2^31-1 or even", k.Kid)
			}
			pub = &rsa.PublicKey{N: n, E: int(e.Int64())}
		case "EC":
			if k.Crv != "P-256" {
				continue
			}
			x, e1 := b64int(k.X)
			y, e2 := b64int(k.Y)
			if e1 != nil || e2 != nil || x.BitLen() > 256 || y.BitLen() > 256 {
				continue
			}
			// ParseUncompressedPublicKey refuses points that are not on the
			// curve.
			point := append([]byte{4}, append(x.FillBytes(make([]byte, 32)), y.FillBytes(make([]byte, 32))...)...)
			key, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), point)
			if err != nil {
				continue
			}
			pub = key
		case "OKP":
			x, err := base64.RawURLEncoding.DecodeString(k.X)
			if k.Crv != "Ed25519" || err != nil || len(x) != ed25519.PublicKeySize {
				continue
			}
			pub = ed25519.PublicKey(x)
		default:
			continue
		}
		keys[k.Kid] = jwk{alg: k.Alg, key: pub}
	}
	if len(keys) == 0 {
		return nil, errors.New("the JWKS has no usable signing key")
	}
	return keys, nil
}

func b64int(s string) (*big.Int, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) == 0 {
		return nil, errors.New("bad base64url integer")
	}
	return new(big.Int).SetBytes(b), nil
}
