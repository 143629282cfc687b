// Package fleetdtest starts fleetd in process for tests: fleetd serve on
// 127.0.0.1:0 ports and a fresh database of one backend (SQLite, and
// PostgreSQL when FLEETD_TEST_POSTGRES is set: run it under
// sqlstoretest.Run), the credentials to call it with, requests whose
// answers are checked against the OpenAPI document the server serves, and
// fixtures. A package's tests import it; end-to-end tests that need the
// built binary (crash, replicas) stay in cmd/fleetd.
package fleetdtest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet/blob/s3test"
	"github.com/fleetd/fleet/internal/cli"
	"github.com/fleetd/fleet/internal/server"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
)

// Server is fleetd started through server.Serve, as `fleetd serve` would
// be, on free ports and a database of one backend.
type Server struct {
	URL       string // http://127.0.0.1:port
	MQTTAddr  string // 127.0.0.1:port, once the broker exists
	MQTTSAddr string // the MQTT TLS listener, with --mqtts-addr
	Key       string // the admin key of tenant "default"
	DSN       string
	DataDir   string
	// Output is what fleetd printed and logged, for failure messages.
	Output *LockedBuffer

	cancel context.CancelFunc
	done   chan error

	mu        sync.Mutex
	router    routers.Router
	routerURL string // the URL router was made for

	// Observe, when set, sees every answer send received (the secrets and
	// isolation suites grep them all).
	Observe func(method, path string, r *Response)
	// Now, when set, is the server's rollout clock.
	Now func() time.Time
	// S3, when set, is the server's blob store (startServerOn); getenv
	// gives its credentials.
	S3     *s3test.Server
	Getenv func(string) string
}

// LockedBuffer collects a command's output for failure messages.
type LockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *LockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Start runs `fleetd serve` on b with extra flags and waits until it
// listens. It stops, and must stop cleanly, when the test ends.
func Start(t *testing.T, b sqlstoretest.Backend, extra ...string) *Server {
	t.Helper()
	return StartOn(t, b, "file", extra...)
}

// New is a server on the database dsn with its files in dataDir, not
// started yet: Start starts it.
func New(dsn, dataDir string) *Server {
	return &Server{DSN: dsn, DataDir: dataDir, Output: &LockedBuffer{}}
}

// StartOn is Start with firmware in store: "file" (the data
// directory), "s3" (a bucket of a private VersityGW) or "s3+presign" (the
// same, downloads redirected to presigned URLs).
func StartOn(t *testing.T, b sqlstoretest.Backend, store string, extra ...string) *Server {
	t.Helper()
	s := New(b.DSN(t), t.TempDir())
	if strings.HasPrefix(store, "s3") {
		s.S3 = s3test.Start(t)
		s.Getenv = s.S3.Getenv
		loc := s.S3.URL("fleetd")
		if store == "s3+presign" {
			loc += "&presign=10m"
		}
		extra = append([]string{"--blob-store", loc}, extra...)
	}
	s.Start(t, extra...)
	t.Cleanup(func() { s.Stop(t) })
	return s
}

// Start starts fleetd serve with extra flags and waits until it listens.
func (s *Server) Start(t *testing.T, extra ...string) {
	t.Helper()
	args := append([]string{
		"--database", s.DSN, "--data-dir", s.DataDir,
		"--http-addr", "127.0.0.1:0", "--mqtt-addr", "127.0.0.1:0",
		"--log-level", "warn",
		"--outbound-allow", "127.0.0.0/8", // the tests' receivers and identity providers
	}, extra...)
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.done = make(chan error, 1)
	getenv := s.Getenv
	if getenv == nil {
		getenv = NoEnv
	}
	ready := make(chan server.Listening, 1)
	e := server.Env{
		Env: cli.Env{Getenv: getenv, Stdin: strings.NewReader(""), Stdout: s.Output, Stderr: s.Output},
		Now: s.Now, Ready: func(l server.Listening) { ready <- l },
	}
	go func() { s.done <- server.Serve(ctx, args, e) }()
	select {
	case l := <-ready:
		s.URL, s.MQTTAddr, s.MQTTSAddr = "http://"+l.HTTP, l.MQTT, l.MQTTS
		if l.AdminKey != "" {
			s.Key = l.AdminKey
		}
	case err := <-s.done:
		s.cancel = nil
		t.Fatalf("fleetd stopped before listening: %v; output:\n%s", err, s.Output)
	case <-time.After(60 * time.Second):
		t.Fatalf("fleetd did not start in 60s; output:\n%s", s.Output)
	}
}

// Stop sends the equivalent of SIGTERM and waits for a clean exit.
func (s *Server) Stop(t *testing.T) {
	t.Helper()
	if s.cancel == nil {
		return
	}
	s.cancel()
	s.cancel = nil
	select {
	case err := <-s.done:
		if err != nil {
			t.Errorf("fleetd serve returned %v; output:\n%s", err, s.Output)
		}
	case <-time.After(60 * time.Second):
		t.Errorf("fleetd did not stop in 60s")
	}
}

// Restart stops the server and starts it again on the same database.
func (s *Server) Restart(t *testing.T, extra ...string) {
	t.Helper()
	s.Stop(t)
	s.Start(t, extra...)
}

// NoEnv is an empty environment.
func NoEnv(string) string { return "" }

// Command runs an administrative command (server.TenantCreate, say) on the
// server's database and returns the last line of its output.
func (s *Server) Command(t *testing.T, cmd func(context.Context, []string, cli.Env) error, args ...string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	args = append(args, "--database", s.DSN, "--log-level", "warn")
	if err := cmd(context.Background(), args, cli.Env{Getenv: NoEnv, Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errOut}); err != nil {
		t.Fatalf("fleetd %s: %v\n%s", strings.Join(args, " "), err, errOut.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	return lines[len(lines)-1]
}

// Creds is who a request is made as.
type Creds struct{ Tenant, Key string }

// Admin is the admin of tenant "default".
func (s *Server) Admin() Creds { return Creds{"default", s.Key} }

// NewTenant creates a tenant from the command line and returns its admin.
func (s *Server) NewTenant(t *testing.T, name string) Creds {
	t.Helper()
	return Creds{name, s.Command(t, server.TenantCreate, name)}
}

// NewKey creates an API key of role in c's tenant through the API.
func (s *Server) NewKey(t *testing.T, c Creds, name, role string) Creds {
	t.Helper()
	var k struct{ Key string }
	s.Do(t, c, "POST", "/api/v1/apikeys", map[string]any{"name": name, "role": role}).Want(t, 201).Decode(t, &k)
	return Creds{c.Tenant, k.Key}
}

// Req is one request; body is JSON-encoded unless raw is set.
type Req struct {
	Method, Path string
	Creds        Creds
	Body         any
	Raw          []byte
	ContentType  string
	Header       http.Header
}

// Response is an answer, already validated against the OpenAPI document.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
	Req    string
}

func (r *Response) Want(t *testing.T, status int) *Response {
	t.Helper()
	if r.Status != status {
		t.Fatalf("%s: status %d, want %d; body: %s", r.Req, r.Status, status, r.Body)
	}
	return r
}

func (r *Response) Decode(t *testing.T, v any) *Response {
	t.Helper()
	if err := json.Unmarshal(r.Body, v); err != nil {
		t.Fatalf("%s: decode %s: %v", r.Req, r.Body, err)
	}
	return r
}

// ErrorCode returns the "error" member of an error body.
func (r *Response) ErrorCode(t *testing.T) string {
	t.Helper()
	var e struct{ Error string }
	r.Decode(t, &e)
	return e.Error
}

// Do sends a JSON request as c.
func (s *Server) Do(t *testing.T, c Creds, method, path string, body any) *Response {
	t.Helper()
	return s.Send(t, Req{Method: method, Path: path, Creds: c, Body: body})
}

func (s *Server) Send(t *testing.T, rq Req) *Response {
	t.Helper()
	var body io.Reader
	ct := rq.ContentType
	switch {
	case rq.Raw != nil:
		body = bytes.NewReader(rq.Raw)
	case rq.Body != nil:
		b, err := json.Marshal(rq.Body)
		if err != nil {
			t.Fatal(err)
		}
		body = bytes.NewReader(b)
		if ct == "" {
			ct = "application/json"
		}
	}
	hr, err := http.NewRequest(rq.Method, s.URL+rq.Path, body)
	if err != nil {
		t.Fatal(err)
	}
	if ct != "" {
		hr.Header.Set("Content-Type", ct)
	}
	if rq.Creds.Tenant != "" {
		hr.Header.Set("x-service-tenant", rq.Creds.Tenant)
	}
	if rq.Creds.Key != "" {
		hr.Header.Set("x-service-api-key", rq.Creds.Key)
	}
	for k, vs := range rq.Header {
		hr.Header[k] = vs
	}
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatalf("%s %s: %v", rq.Method, rq.Path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", rq.Method, rq.Path, err)
	}
	r := &Response{Status: resp.StatusCode, Header: resp.Header, Body: b, Req: rq.Method + " " + rq.Path}
	s.validate(t, hr, r)
	if s.Observe != nil {
		s.Observe(rq.Method, rq.Path, r)
	}
	return r
}

// validate checks a response against the OpenAPI document the server
// serves: every JSON answer must be what the document says.
func (s *Server) validate(t *testing.T, hr *http.Request, r *Response) {
	t.Helper()
	ct := r.Header.Get("Content-Type")
	if len(r.Body) > 0 && !strings.HasPrefix(ct, "application/json") {
		return // Transit and EDN carry the same shapes; the codec tests cover them.
	}
	router := s.openAPIRouter(t)
	u, _ := url.Parse(hr.URL.String())
	vr := hr.Clone(context.Background())
	vr.URL = u
	route, params, err := router.FindRoute(vr)
	if err != nil {
		if r.Status == 404 || r.Status == 405 {
			return // no such route: the error body is checked by the test
		}
		t.Fatalf("%s: not in the OpenAPI document: %v", r.Req, err)
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{
			Request: vr, PathParams: params, Route: route,
			Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, IncludeResponseStatus: true},
		},
		Status:  r.Status,
		Header:  r.Header,
		Body:    io.NopCloser(bytes.NewReader(r.Body)),
		Options: &openapi3filter.Options{IncludeResponseStatus: true},
	}
	if err := openapi3filter.ValidateResponse(context.Background(), in); err != nil {
		t.Fatalf("%s: response %d does not match the OpenAPI document: %v\nbody: %s", r.Req, r.Status, err, r.Body)
	}
}

// OpenAPIDocument is the OpenAPI document the server serves.
func (s *Server) OpenAPIDocument(t *testing.T) *openapi3.T {
	t.Helper()
	resp, err := http.Get(s.URL + "/api/v1/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	doc, err := openapi3.NewLoader().LoadFromData(b)
	if err != nil {
		t.Fatalf("load OpenAPI document: %v", err)
	}
	return doc
}

func (s *Server) openAPIRouter(t *testing.T) routers.Router {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.router != nil && s.routerURL == s.URL {
		return s.router
	}
	doc := s.OpenAPIDocument(t)
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("the OpenAPI document is invalid: %v", err)
	}
	doc.Servers = openapi3.Servers{{URL: s.URL}}
	router, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatalf("OpenAPI router: %v", err)
	}
	s.router, s.routerURL = router, s.URL
	return router
}

// Metric reads a gauge or counter without labels from fleetd's /metrics
// at base.
func Metric(t *testing.T, base, name string) float64 {
	t.Helper()
	v, ok := Metrics(t, base)[name]
	if !ok {
		t.Fatalf("no %s in /metrics", name)
	}
	return v
}

// Metrics reads every unlabelled series from one scrape of /metrics.
func Metrics(t *testing.T, base string) map[string]float64 {
	t.Helper()
	m := map[string]float64{}
	for _, s := range scrape(t, base) {
		if s.labels == "" {
			m[s.name] = s.value
		}
	}
	return m
}

// MetricSum reads from fleetd's /metrics at base the sum of the series of
// name whose labels include label (`side="operator"`, say).
func MetricSum(t *testing.T, base, name, label string) float64 {
	t.Helper()
	sum := 0.0
	for _, s := range scrape(t, base) {
		if s.name == name && s.labels != "" && strings.Contains(s.labels, label) {
			sum += s.value
		}
	}
	return sum
}

// series is one sample of a /metrics scrape: the metric's name, its labels
// as written between the braces (empty when it has none) and its value.
type series struct {
	name, labels string
	value        float64
}

// scrape reads every series from one scrape of fleetd's /metrics at base,
// in the Prometheus text format the server writes (comments skipped).
func scrape(t *testing.T, base string) []series {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var all []series
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		var s series
		var v string
		if i := strings.IndexByte(line, '{'); i >= 0 {
			// A label's value may hold spaces: the labels end at the
			// line's last brace.
			j := strings.LastIndexByte(line, '}')
			if j < i {
				t.Fatalf("/metrics: unclosed labels in %q", line)
			}
			s.name, s.labels, v = line[:i], line[i+1:j], strings.TrimSpace(line[j+1:])
		} else {
			s.name, v, _ = strings.Cut(line, " ")
		}
		s.value, _ = strconv.ParseFloat(v, 64)
		all = append(all, s)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return all
}

// WantCode checks an error answer's status and code.
func WantCode(t *testing.T, r *Response, status int, code string) {
	t.Helper()
	r.Want(t, status)
	if got := r.ErrorCode(t); got != code {
		t.Fatalf("%s: error %q, want %q: %s", r.Req, got, code, r.Body)
	}
}
