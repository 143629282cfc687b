package console

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleet"
)

// A session is a row of the store (fleet.ConsoleSessionService) and a
// cookie, sealed with AES-256-GCM under a server secret every replica
// shares (table server_secrets), that carries its token. Every request
// reads the row: signing out, an admin's "end" and deleting the key end
// the session on every replica from its next request. A key session also
// carries the API key and authenticates it again on every request; an OIDC
// session carries who signed in and their role, and ends too when the
// tenant's sign-in settings change.

// Cookie names. The session cookie is HttpOnly; the sign-in cookie holds
// the token the sign-in form must echo (double submit) and, during an OIDC
// sign-in, the state, nonce and PKCE verifier.
const (
	sessionCookie = "fleetd_console"
	signinCookie  = "fleetd_console_signin"
)

// sessionKeyName is the server secret that seals console cookies.
const sessionKeyName = "console_session_aes256_gcm"

// session is what the session cookie holds.
type session struct {
	ID      string     `json:"i"` // the store's token
	Tenant  string     `json:"t"`
	Key     string     `json:"k,omitempty"` // a key session's API key
	User    *oidcActor `json:"u,omitempty"` // an OIDC session's user
	CSRF    string     `json:"c"`
	Expires int64      `json:"e"` // Unix seconds
	// AuthAt is the tenant's S9 updated_at (Unix ms) when an OIDC user
	// signed in: a later change of the settings ends the session.
	AuthAt int64 `json:"a,omitempty"`
}

// oidcActor is an OIDC user as a session keeps it.
type oidcActor struct {
	Name  string     `json:"n"`
	Email string     `json:"m,omitempty"`
	Role  fleet.Role `json:"r"`
}

// signin is what the sign-in cookie holds.
type signin struct {
	CSRF     string `json:"c"`
	Tenant   string `json:"t,omitempty"`
	State    string `json:"s,omitempty"`
	Nonce    string `json:"n,omitempty"`
	Verifier string `json:"v,omitempty"`
	Expires  int64  `json:"e"`
}

// SecretStore hands out the server secrets every replica shares.
type SecretStore interface {
	ServerSecret(ctx context.Context, name string) ([]byte, error)
}

// sealer seals and opens cookie values.
type sealer struct {
	store SecretStore

	mu   sync.Mutex
	aead cipher.AEAD
}

func (s *sealer) cipher(ctx context.Context) (cipher.AEAD, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.aead != nil {
		return s.aead, nil
	}
	key, err := s.store.ServerSecret(ctx, sessionKeyName)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	if s.aead, err = cipher.NewGCM(block); err != nil {
		return nil, err
	}
	return s.aead, nil
}

// seal encrypts v for a cookie; purpose is bound into the ciphertext, so a
// sign-in cookie can never be presented as a session.
func (s *sealer) seal(ctx context.Context, purpose string, v any) (string, error) {
	aead, err := s.cipher(ctx)
	if err != nil {
		return "", err
	}
	plain, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	nonce := make([]byte, aead.NonceSize())
	rand.Read(nonce) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(aead.Seal(nonce, nonce, plain, []byte(purpose))), nil
}

var errBadCookie = errors.New("console: cookie not sealed by this installation")

// open decrypts a cookie value sealed for purpose into v.
func (s *sealer) open(ctx context.Context, purpose, value string, v any) error {
	aead, err := s.cipher(ctx)
	if err != nil {
		return err
	}
	raw, err := base64.RawURLEncoding.DecodeString(value)
	if err != nil || len(raw) < aead.NonceSize() {
		return errBadCookie
	}
	plain, err := aead.Open(nil, raw[:aead.NonceSize()], raw[aead.NonceSize():], []byte(purpose))
	if err != nil {
		return errBadCookie
	}
	if json.Unmarshal(plain, v) != nil {
		return errBadCookie
	}
	return nil
}

// randomToken returns 256 random bits, URL-safe.
func randomToken() string {
	b := make([]byte, 32)
	rand.Read(b) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b)
}

// tokensEqual compares two tokens in constant time; empty never matches.
func tokensEqual(a, b string) bool {
	return a != "" && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// setCookie writes a console cookie: HttpOnly, SameSite=Lax, scoped to
// the console's paths, and Secure when the request came over TLS or the
// public URL is https: behind a proxy that ends TLS, fleetd sees plain
// HTTP, but browsers reach it over HTTPS only. maxAge 0 deletes it.
func (c *Console) setCookie(w http.ResponseWriter, r *http.Request, name, value string, maxAge time.Duration) {
	ck := &http.Cookie{
		Name: name, Value: value, Path: Prefix,
		HttpOnly: true, Secure: r.TLS != nil || strings.HasPrefix(strings.ToLower(c.PublicURL), "https://"), SameSite: http.SameSiteLaxMode,
	}
	if maxAge > 0 {
		ck.MaxAge = int(maxAge.Seconds())
		ck.Expires = time.Now().Add(maxAge)
	} else {
		ck.MaxAge = -1
	}
	http.SetCookie(w, ck)
}
