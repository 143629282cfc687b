package ctl

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"time"
)

// client makes requests to one fleetd as one tenant and key.
type client struct {
	base   string // without a trailing slash
	tenant string
	key    string
	http   *http.Client
}

func newClient(t target) (*client, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, usagef("CA file: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, usagef("CA file %s holds no PEM certificate", t.CAFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	// No overall timeout: downloads, uploads and watches last as long as
	// they must; the context ends them. Connecting does not hang, though.
	return &client{base: strings.TrimRight(t.URL, "/"), tenant: t.Tenant, key: t.APIKey,
		http: &http.Client{Transport: tr, CheckRedirect: keepCredentialsHome}}, nil
}

// keepCredentialsHome follows a redirect, but not with the tenant and key
// to another host: fleetd redirects downloads to presigned URLs of an S3
// bucket, and Go forwards every header but Authorization and Cookie.
func keepCredentialsHome(req *http.Request, via []*http.Request) error {
	if len(via) >= 10 {
		return errors.New("stopped after 10 redirects")
	}
	if req.URL.Host != via[0].URL.Host || req.URL.Scheme != via[0].URL.Scheme {
		req.Header.Del("x-service-api-key")
		req.Header.Del("x-service-tenant")
	}
	return nil
}

// apiError is the server's refusal, in fleetd's one error shape.
type apiError struct {
	Status  int
	Code    string            `json:"error"`
	Message string            `json:"message"`
	Fields  map[string]string `json:"fields"`
}

func (e *apiError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s (%d %s)", e.Message, e.Status, e.Code)
	keys := make([]string, 0, len(e.Fields))
	for k := range e.Fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "\n  %s: %s", k, e.Fields[k])
	}
	return b.String()
}

// request is one call of the API.
type request struct {
	method string
	path   string // /api/v1/…, with path segments escaped
	query  url.Values
	body   any       // JSON-encoded, unless raw is set
	raw    io.Reader // sent as is, with contentType
	// contentType of raw; length of raw when known (-1 otherwise).
	contentType string
	length      int64
	accept      string // application/json when empty
	header      http.Header
}

// send makes the request and returns the response when its status is
// 2xx (or 304, 206); any other answer is an *apiError. The caller closes
// the body.
func (c *client) send(ctx context.Context, r request) (*http.Response, error) {
	u := c.base + r.path
	if len(r.query) > 0 {
		u += "?" + r.query.Encode()
	}
	var body io.Reader
	ctype := r.contentType
	length := int64(-1)
	switch {
	case r.raw != nil:
		body, length = r.raw, r.length
	case r.body != nil:
		b, err := json.Marshal(r.body)
		if err != nil {
			return nil, err
		}
		body, ctype, length = bytes.NewReader(b), "application/json", int64(len(b))
	}
	req, err := http.NewRequestWithContext(ctx, r.method, u, body)
	if err != nil {
		return nil, err
	}
	if length >= 0 && body != nil {
		req.ContentLength = length
	}
	for k, v := range r.header {
		req.Header[k] = v
	}
	req.Header.Set("x-service-tenant", c.tenant)
	req.Header.Set("x-service-api-key", c.key)
	req.Header.Set("User-Agent", "fleetctl")
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	accept := r.accept
	if accept == "" {
		accept = "application/json"
	}
	req.Header.Set("Accept", accept)
	if r.method != http.MethodGet {
		// The seed endpoints answer with an empty body unless asked (RFC
		// 7240); a CLI shows what it made.
		req.Header.Set("Prefer", "return=representation")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, unreachable(err)
	}
	if resp.StatusCode/100 == 2 || resp.StatusCode == http.StatusNotModified {
		return resp, nil
	}
	defer resp.Body.Close()
	return nil, readAPIError(resp)
}

// unreachable says in a sentence that the server did not answer.
func unreachable(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		if errors.Is(ue.Err, context.Canceled) {
			return ue.Err
		}
		return fmt.Errorf("cannot reach %s: %v", ue.URL, ue.Err)
	}
	return err
}

func readAPIError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	e := &apiError{Status: resp.StatusCode}
	if json.Unmarshal(b, e) != nil || e.Message == "" {
		e.Code = http.StatusText(resp.StatusCode)
		e.Message = "the server answered " + resp.Status
	}
	if ra := resp.Header.Get("Retry-After"); ra != "" {
		e.Message += " (retry after " + ra + " s)"
	}
	return e
}

// call makes the request and returns the whole body, at most 256 MiB.
func (c *client) call(ctx context.Context, r request) ([]byte, error) {
	resp, err := c.send(ctx, r)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return readAllLimited(resp.Body, 256<<20)
}

// getJSON reads a resource into v, always as JSON whatever -o says.
func (c *client) getJSON(ctx context.Context, path string, q url.Values, v any) error {
	b, err := c.call(ctx, request{method: http.MethodGet, path: path, query: q})
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// check makes a request that any valid key may make: a key of role
// device lacks read permission (403) but is still a key of the tenant.
func (c *client) check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err := c.call(ctx, request{method: http.MethodGet, path: "/api/v1/actions", query: url.Values{"limit": {"1"}}})
	var ae *apiError
	if errors.As(err, &ae) && ae.Status == http.StatusForbidden {
		return nil
	}
	return err
}

func readAllLimited(r io.Reader, max int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("more than %d bytes to read", max)
	}
	return b, nil
}

// esc escapes one path segment.
func esc(s string) string { return url.PathEscape(s) }
