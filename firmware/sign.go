package firmware

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/fleetd/fleet"
	"github.com/google/uuid"
)

// signingKeyName is the server secret (table server_secrets) that signs
// download URLs. Every replica reads the same one, so a URL signed by one
// is honoured by all.
const signingKeyName = "artifact_url_hmac_sha256"

// signingKey loads the key once; a failure is retried on the next call.
func (s *Service) signingKey(ctx context.Context) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.secret != nil {
		return s.secret, nil
	}
	k, err := s.Store.ServerSecret(ctx, signingKeyName)
	if err != nil {
		return nil, err
	}
	s.secret = k
	return k, nil
}

// mac is the signature of a download of tenant's bundle id until expires:
// HMAC-SHA256 over the three, each field ended by a NUL so that no two
// inputs share an encoding (tenant names and UUIDs never hold a NUL).
func mac(key []byte, tenant string, id uuid.UUID, expires int64) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte("fleetd artifact v1\x00" + tenant + "\x00" + id.String() + "\x00" + strconv.FormatInt(expires, 10) + "\x00"))
	return h.Sum(nil)
}

// ArtifactPath is where a bundle's archive is served.
func ArtifactPath(id uuid.UUID) string {
	return "/api/v1/firmware-bundles/id/" + id.String() + "/artifact"
}

// SignArtifactURL returns a URL that downloads tenant's bundle id without
// other credentials until expires. It is made on the public URL when one
// is configured, else on the base URL the context carries (the URL the
// dispatching client used).
func (s *Service) SignArtifactURL(ctx context.Context, tenant string, id uuid.UUID, expires time.Time) (string, error) {
	key, err := s.signingKey(ctx)
	if err != nil {
		return "", err
	}
	exp := expires.Unix()
	q := url.Values{}
	q.Set("tenant", tenant)
	q.Set("expires", strconv.FormatInt(exp, 10))
	q.Set("signature", base64.RawURLEncoding.EncodeToString(mac(key, tenant, id, exp)))
	base := s.PublicURL
	if base == "" {
		base = fleet.BaseURLFromContext(ctx)
	}
	return strings.TrimSuffix(base, "/") + ArtifactPath(id) + "?" + q.Encode(), nil
}

// VerifyArtifactURL checks a signed URL's expires and signature for
// tenant's bundle id. The signature is compared in constant time and
// before the expiry, so a forged URL learns nothing about timing. Both a
// bad signature and a past expiry are EUNAUTHENTICATED (401).
func (s *Service) VerifyArtifactURL(ctx context.Context, tenant string, id uuid.UUID, expires, signature string) error {
	refused := fleet.Errorf(fleet.EUNAUTHENTICATED, "invalid signed URL: its tenant, expires and signature must be exactly as issued")
	exp, err := strconv.ParseInt(expires, 10, 64)
	if err != nil {
		return refused
	}
	sig, err := base64.RawURLEncoding.DecodeString(signature)
	if err != nil {
		return refused
	}
	key, err := s.signingKey(ctx)
	if err != nil {
		return err
	}
	if !hmac.Equal(sig, mac(key, tenant, id, exp)) {
		return refused
	}
	if s.now().Unix() >= exp {
		return fleet.Errorf(fleet.EUNAUTHENTICATED, "the signed URL expired at %s; ask for a new one (dispatch the update again)",
			time.Unix(exp, 0).UTC().Format(time.RFC3339))
	}
	return nil
}

// CheckPublicURL reports what is wrong with a --public-url: it must be an
// http or https URL with a host and nothing after it but an optional path
// prefix, since artifact paths are appended to it.
func CheckPublicURL(s string) error {
	if s == "" {
		return nil
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return fmt.Errorf("--public-url %q: want the scheme and host devices reach the API at, such as https://fleet.example.com", s)
	}
	return nil
}
