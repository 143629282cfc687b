package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet/blob/s3test"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
)

// testServer is fleetd started through run, as `fleetd serve` would be,
// on free ports and a fresh database of one backend.
type testServer struct {
	URL      string // http://127.0.0.1:port
	MQTTAddr string // 127.0.0.1:port, once the broker exists
	Key      string // the admin key of tenant "default"
	DSN      string
	DataDir  string

	cancel context.CancelFunc
	done   chan error
	output *lockedBuffer

	mu     sync.Mutex
	router routers.Router

	// observe, when set, sees every answer send received (the secrets and
	// isolation suites grep them all).
	observe func(method, path string, r *response)
	// now, when set, is the server's rollout clock.
	now func() time.Time
	// S3, when set, is the server's blob store (startServerOn); getenv
	// gives its credentials.
	S3     *s3test.Server
	getenv func(string) string
}

// lockedBuffer collects a command's output for failure messages.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startServer runs `fleetd serve` on b with extra flags and waits until it
// listens. It stops, and must stop cleanly, when the test ends.
func startServer(t *testing.T, b sqlstoretest.Backend, extra ...string) *testServer {
	t.Helper()
	return startServerOn(t, b, "file", extra...)
}

// startServerOn is startServer with firmware in store: "file" (the data
// directory), "s3" (a bucket of a private VersityGW) or "s3+presign" (the
// same, downloads redirected to presigned URLs).
func startServerOn(t *testing.T, b sqlstoretest.Backend, store string, extra ...string) *testServer {
	t.Helper()
	s := &testServer{DSN: b.DSN(t), DataDir: t.TempDir(), done: make(chan error, 1), output: &lockedBuffer{}}
	if strings.HasPrefix(store, "s3") {
		s.S3 = s3test.Start(t)
		s.getenv = s.S3.Getenv
		loc := s.S3.URL("fleetd")
		if store == "s3+presign" {
			loc += "&presign=10m"
		}
		extra = append([]string{"--blob-store", loc}, extra...)
	}
	s.start(t, extra...)
	t.Cleanup(func() { s.stop(t) })
	return s
}

func (s *testServer) start(t *testing.T, extra ...string) {
	t.Helper()
	args := append([]string{"serve",
		"--database", s.DSN, "--data-dir", s.DataDir,
		"--http-addr", "127.0.0.1:0", "--mqtt-addr", "127.0.0.1:0",
		"--log-level", "warn",
		"--outbound-allow", "127.0.0.0/8", // the tests' receivers and identity providers
	}, extra...)
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	pr, pw := io.Pipe()
	s.done = make(chan error, 1)
	go func() {
		getenv := s.getenv
		if getenv == nil {
			getenv = noEnv
		}
		err := runEnv(ctx, args, env{getenv: getenv, stdin: strings.NewReader(""), stdout: pw, stderr: s.output, now: s.now})
		pw.CloseWithError(errors.New("fleetd exited"))
		s.done <- err
	}()
	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		sent := false
		for sc.Scan() {
			line := sc.Text()
			s.output.Write([]byte(line + "\n"))
			switch {
			case strings.HasPrefix(line, "fk_"):
				s.Key = line
			case strings.HasPrefix(line, "fleetd: listening"):
				for _, f := range strings.Fields(line) {
					if v, ok := strings.CutPrefix(f, "http="); ok {
						s.URL = "http://" + v
					} else if v, ok := strings.CutPrefix(f, "mqtt="); ok {
						s.MQTTAddr = v
					}
				}
				if !sent {
					ready <- nil
					sent = true
				}
			}
		}
		if !sent {
			ready <- fmt.Errorf("fleetd stopped before listening")
		}
	}()
	select {
	case err := <-ready:
		if err != nil {
			// run has returned; its error says why.
			t.Fatalf("%v: %v; output:\n%s", err, <-s.done, s.output)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("fleetd did not start in 60s; output:\n%s", s.output)
	}
}

// stop sends the equivalent of SIGTERM and waits for a clean exit.
func (s *testServer) stop(t *testing.T) {
	t.Helper()
	if s.cancel == nil {
		return
	}
	s.cancel()
	s.cancel = nil
	select {
	case err := <-s.done:
		if err != nil {
			t.Errorf("fleetd serve returned %v; output:\n%s", err, s.output)
		}
	case <-time.After(60 * time.Second):
		t.Errorf("fleetd did not stop in 60s")
	}
}

// restart stops the server and starts it again on the same database.
func (s *testServer) restart(t *testing.T, extra ...string) {
	t.Helper()
	s.stop(t)
	key := s.Key
	s.start(t, extra...)
	s.Key = key
	s.router = nil
}

func noEnv(string) string { return "" }

// cli runs a fleetd command on the server's database and returns the last
// line of its output.
func (s *testServer) cli(t *testing.T, args ...string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	args = append(args, "--database", s.DSN, "--log-level", "warn")
	if err := run(context.Background(), args, noEnv, strings.NewReader(""), &out, &errOut); err != nil {
		t.Fatalf("fleetd %s: %v\n%s", strings.Join(args, " "), err, errOut.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	return lines[len(lines)-1]
}

// creds is who a request is made as.
type creds struct{ Tenant, Key string }

func (s *testServer) admin() creds { return creds{"default", s.Key} }

// newTenant creates a tenant from the command line and returns its admin.
func (s *testServer) newTenant(t *testing.T, name string) creds {
	t.Helper()
	return creds{name, s.cli(t, "tenant", "create", name)}
}

// newKey creates an API key of role in c's tenant through the API.
func (s *testServer) newKey(t *testing.T, c creds, name, role string) creds {
	t.Helper()
	var k struct{ Key string }
	s.do(t, c, "POST", "/api/v1/apikeys", map[string]any{"name": name, "role": role}).want(t, 201).decode(t, &k)
	return creds{c.Tenant, k.Key}
}

// req is one request; body is JSON-encoded unless raw is set.
type req struct {
	method, path string
	creds        creds
	body         any
	raw          []byte
	contentType  string
	header       http.Header
}

// response is an answer, already validated against the OpenAPI document.
type response struct {
	Status int
	Header http.Header
	Body   []byte
	req    string
}

func (r *response) want(t *testing.T, status int) *response {
	t.Helper()
	if r.Status != status {
		t.Fatalf("%s: status %d, want %d; body: %s", r.req, r.Status, status, r.Body)
	}
	return r
}

func (r *response) decode(t *testing.T, v any) *response {
	t.Helper()
	if err := json.Unmarshal(r.Body, v); err != nil {
		t.Fatalf("%s: decode %s: %v", r.req, r.Body, err)
	}
	return r
}

// errorCode returns the "error" member of an error body.
func (r *response) errorCode(t *testing.T) string {
	t.Helper()
	var e struct{ Error string }
	r.decode(t, &e)
	return e.Error
}

// do sends a JSON request as c.
func (s *testServer) do(t *testing.T, c creds, method, path string, body any) *response {
	t.Helper()
	return s.send(t, req{method: method, path: path, creds: c, body: body})
}

func (s *testServer) send(t *testing.T, rq req) *response {
	t.Helper()
	var body io.Reader
	ct := rq.contentType
	switch {
	case rq.raw != nil:
		body = bytes.NewReader(rq.raw)
	case rq.body != nil:
		b, err := json.Marshal(rq.body)
		if err != nil {
			t.Fatal(err)
		}
		body = bytes.NewReader(b)
		if ct == "" {
			ct = "application/json"
		}
	}
	hr, err := http.NewRequest(rq.method, s.URL+rq.path, body)
	if err != nil {
		t.Fatal(err)
	}
	if ct != "" {
		hr.Header.Set("Content-Type", ct)
	}
	if rq.creds.Tenant != "" {
		hr.Header.Set("x-service-tenant", rq.creds.Tenant)
	}
	if rq.creds.Key != "" {
		hr.Header.Set("x-service-api-key", rq.creds.Key)
	}
	for k, vs := range rq.header {
		hr.Header[k] = vs
	}
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatalf("%s %s: %v", rq.method, rq.path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", rq.method, rq.path, err)
	}
	r := &response{Status: resp.StatusCode, Header: resp.Header, Body: b, req: rq.method + " " + rq.path}
	s.validate(t, hr, r)
	if s.observe != nil {
		s.observe(rq.method, rq.path, r)
	}
	return r
}

// validate checks a response against the OpenAPI document the server
// serves: every JSON answer must be what the document says.
func (s *testServer) validate(t *testing.T, hr *http.Request, r *response) {
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
		t.Fatalf("%s: not in the OpenAPI document: %v", r.req, err)
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
		t.Fatalf("%s: response %d does not match the OpenAPI document: %v\nbody: %s", r.req, r.Status, err, r.Body)
	}
}

// openAPIDocument is the OpenAPI document the server serves.
func (s *testServer) openAPIDocument(t *testing.T) *openapi3.T {
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

func (s *testServer) openAPIRouter(t *testing.T) routers.Router {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.router != nil {
		return s.router
	}
	doc := s.openAPIDocument(t)
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("the OpenAPI document is invalid: %v", err)
	}
	doc.Servers = openapi3.Servers{{URL: s.URL}}
	router, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatalf("OpenAPI router: %v", err)
	}
	s.router = router
	return router
}
