package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// api calls fleetd's HTTP API as one tenant with one key.
type api struct {
	base, tenant, key string
	client            *http.Client
	// represent asks the endpoints that answer with no body unless asked
	// (RFC 7240) for what they made.
	represent bool
}

func newAPI(base, tenant, key string) *api {
	return &api{base: strings.TrimRight(base, "/"), tenant: tenant, key: key, client: newClient(64)}
}

// as returns the same API with another key.
func (a *api) as(key string) *api {
	c := *a
	c.key = key
	return &c
}

// representing returns the same API asking for what each request makes.
func (a *api) representing() *api {
	c := *a
	c.represent = true
	return &c
}

// call sends body (JSON-encoded unless nil) and decodes the answer into out
// (unless nil) with encoding/json; an answer other than want is an error
// that quotes it.
func (a *api) call(ctx context.Context, method, path string, body any, want int, out any) error {
	b, err := a.send(ctx, method, path, body, want)
	if err != nil || out == nil {
		return err
	}
	return json.Unmarshal(b, out)
}

// send is call without the decoding: the answer's body as it came.
func (a *api) send(ctx context.Context, method, path string, body any, want int) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-Service-Tenant", a.tenant)
	req.Header.Set("X-Service-Api-Key", a.key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if a.represent {
		req.Header.Set("Prefer", "return=representation")
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != want {
		if len(b) > 300 {
			b = append(b[:300], "…"...)
		}
		return nil, fmt.Errorf("%s %s: status %d, want %d: %s", method, path, resp.StatusCode, want, b)
	}
	return b, nil
}

// getURLInto is send for a GET of an absolute URL whose answer's body is
// read into buf (reset first, grown once to the Content-Length): a client
// reading many pages reuses its buffers rather than a new one grown a page
// at a time. It returns the URL of the answer's Link header with
// rel="next", "" without one.
func (a *api) getURLInto(ctx context.Context, u string, want int, buf *bytes.Buffer) (next string, err error) {
	req, err := http.NewRequestWithContext(ctx, "GET", u, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("X-Service-Tenant", a.tenant)
	req.Header.Set("X-Service-Api-Key", a.key)
	resp, err := a.client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	buf.Reset()
	if resp.ContentLength > 0 {
		buf.Grow(int(resp.ContentLength))
	}
	if _, err := buf.ReadFrom(resp.Body); err != nil {
		return "", err
	}
	if resp.StatusCode != want {
		b := buf.Bytes()
		if len(b) > 300 {
			b = append(b[:300:300], "…"...)
		}
		return "", fmt.Errorf("GET %s: status %d, want %d: %s", u, resp.StatusCode, want, b)
	}
	if l := resp.Header.Get("Link"); strings.HasPrefix(l, "<") && strings.HasSuffix(l, `>; rel="next"`) {
		next = l[1 : len(l)-len(`>; rel="next"`)]
	}
	return next, nil
}

// deviceToken is a provisioned device and its token.
type deviceToken struct {
	ID    string `json:"id"`
	Token string `json:"token"`
}

// provision creates the devices ids (with metadata, when not nil) through
// the bulk endpoint, in chunks, and returns their tokens in order.
func (a *api) provision(ctx context.Context, ids []string, metadata map[string]string, p *progress, what string) ([]deviceToken, error) {
	const chunk = 50_000
	type item struct {
		ID       string            `json:"id"`
		Metadata map[string]string `json:"metadata,omitempty"`
	}
	out := make([]deviceToken, 0, len(ids))
	for start := 0; start < len(ids); start += chunk {
		end := min(start+chunk, len(ids))
		items := make([]item, 0, end-start)
		for _, id := range ids[start:end] {
			items = append(items, item{ID: id, Metadata: metadata})
		}
		var resp struct{ Devices []deviceToken }
		if err := a.call(ctx, "POST", "/api/v1/devices/bulk", map[string]any{"devices": items}, http.StatusCreated, &resp); err != nil {
			return nil, err
		}
		out = append(out, resp.Devices...)
		p.count(what, len(out), len(ids))
	}
	return out, nil
}

// dispatched is the answer to POST /api/v1/actions.
type dispatched struct {
	ID       int64 `json:"id"`
	Targeted int   `json:"targeted"`
}

// dispatch sends body to POST /api/v1/actions.
func (a *api) dispatch(ctx context.Context, body map[string]any) (dispatched, error) {
	var d dispatched
	err := a.call(ctx, "POST", "/api/v1/actions", body, http.StatusCreated, &d)
	return d, err
}

// createKey makes an API key with a role and returns its secret.
func (a *api) createKey(ctx context.Context, name, role, email string) (string, error) {
	body := map[string]any{"name": name, "role": role}
	if email != "" {
		body["user_email"] = email
	}
	var resp struct{ Key string }
	err := a.call(ctx, "POST", "/api/v1/apikeys", body, http.StatusCreated, &resp)
	return resp.Key, err
}

// ids returns n device ids: prefix followed by a zero-padded number.
func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%07d", prefix, i)
	}
	return out
}

// parallel runs f(i) for i in [0, n) on workers goroutines and returns the
// first error.
func parallel(ctx context.Context, n, workers int, f func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		next  = make(chan int)
	)
	for range min(workers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(ctx, i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
						cancel()
					}
					mu.Unlock()
				}
			}
		}()
	}
	for i := 0; i < n && ctx.Err() == nil; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}

// progress prints a line now and then while long work goes on, on stderr.
type progress struct {
	w     io.Writer
	mu    sync.Mutex
	last  time.Time
	start time.Time
}

func (p *progress) say(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "fleetbench: %6.1fs  %s\n", time.Since(p.start).Seconds(), fmt.Sprintf(format, args...))
	p.last = time.Now()
}

// count reports done of total, at most every two seconds, and at the end.
func (p *progress) count(what string, done, total int) {
	p.mu.Lock()
	quiet := time.Since(p.last) < 2*time.Second && done < total
	p.mu.Unlock()
	if !quiet {
		p.say("%s: %d of %d", what, done, total)
	}
}
