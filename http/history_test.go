package fleethttp_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet"
)

// historyAPI is the API with 120 points of stream env on d1, a second
// apart, ending a minute ago, rolled up.
func historyAPI(t testing.TB) (*api, time.Time) {
	t.Helper()
	a := newAPI(t)
	start := time.Now().Add(-3 * time.Minute).Truncate(time.Second)
	var pts []string
	for i := range 120 {
		pts = append(pts, fmt.Sprintf(`{"timestamp": %d, "sequence": %d, "temp": %d, "state": "ok"}`, start.Add(time.Duration(i)*time.Second).UnixMilli(), i, 20+i%7))
	}
	w, _ := a.serve("POST", "/api/v1/devices/d1/streams/env", "Content-Type: application/json", []byte("["+strings.Join(pts, ",")+"]"), 2)
	if w.Code != 200 {
		t.Fatalf("ingest: %d %s", w.Code, w.Body)
	}
	if _, err := a.db.RollUp(context.Background()); err != nil {
		t.Fatal(err)
	}
	return a, start
}

func getJSON(t *testing.T, a *api, target string, who byte, want int, v any) {
	t.Helper()
	w, _ := a.serve("GET", target, "", nil, who)
	if w.Code != want {
		t.Fatalf("GET %s: %d %s, want %d", target, w.Code, w.Body, want)
	}
	if v != nil {
		if err := json.Unmarshal(w.Body.Bytes(), v); err != nil {
			t.Fatalf("GET %s: %v in %s", target, err, w.Body)
		}
	}
}

// nextLinkURL returns the URL of a response's Link header, which must be
// one link, rel="next" (RFC 8288).
func nextLinkURL(t *testing.T, link []string) *url.URL {
	t.Helper()
	if len(link) != 1 || !strings.HasPrefix(link[0], "<") || !strings.HasSuffix(link[0], `>; rel="next"`) {
		t.Fatalf("Link = %q, want one <URL>; rel=\"next\"", link)
	}
	u, err := url.Parse(strings.TrimSuffix(strings.TrimPrefix(link[0], "<"), `>; rel="next"`))
	if err != nil {
		t.Fatalf("Link = %q: %v", link, err)
	}
	return u
}

func TestHistoryEndpoints(t *testing.T) {
	a, start := historyAPI(t)
	t.Run("Streams", func(t *testing.T) {
		var got struct {
			Streams []struct {
				Name           string
				Points         int
				FirstTimestamp time.Time `json:"first_timestamp"`
			}
		}
		getJSON(t, a, "/api/v1/devices/d1/streams", 1, 200, &got)
		if len(got.Streams) != 1 || got.Streams[0].Name != "env" || got.Streams[0].Points != 120 || !got.Streams[0].FirstTimestamp.Equal(start) {
			t.Fatalf("streams = %+v", got)
		}
	})
	t.Run("PagesWithCursor", func(t *testing.T) {
		target := "/api/v1/devices/d1/streams/env/points?limit=50&from=" + url.QueryEscape(start.Add(10*time.Second).Format(time.RFC3339))
		var n int
		var last float64
		for pages := 0; pages < 10; pages++ {
			var page struct {
				Points []struct {
					Sequence float64
					Data     map[string]any
				}
				Next *string
			}
			getJSON(t, a, target, 1, 200, &page)
			for _, p := range page.Points {
				if n > 0 && p.Sequence <= last {
					t.Fatalf("sequence %v after %v", p.Sequence, last)
				}
				last = p.Sequence
				n++
			}
			if page.Next == nil {
				break
			}
			target = "/api/v1/devices/d1/streams/env/points?limit=50&cursor=" + *page.Next + "&from=" + url.QueryEscape(start.Add(10*time.Second).Format(time.RFC3339))
		}
		if n != 110 || last != 119 {
			t.Fatalf("read %d points, the last %v; want 110, the last 119", n, last)
		}
	})
	t.Run("PagesByLinkHeader", func(t *testing.T) {
		// Each page's Link is the request's URL with cursor set to the
		// body's next; the last page has none. Other encodings have it too.
		from := url.QueryEscape(start.Add(10 * time.Second).Format(time.RFC3339))
		for _, accept := range []string{"", "Accept: application/transit+json"} {
			target := "/api/v1/devices/d1/streams/env/points?limit=50&order=desc&from=" + from
			var pages []int
			for len(pages) < 10 {
				w, _ := a.serve("GET", target, accept, nil, 1)
				if w.Code != 200 {
					t.Fatalf("GET %s (%s): %d %s", target, accept, w.Code, w.Body)
				}
				pages = append(pages, strings.Count(w.Body.String(), `"sequence"`)) // transit's keys are cached: once a page
				link := w.Header().Values("Link")
				if len(link) == 0 {
					break
				}
				u := nextLinkURL(t, link)
				if u.Scheme != "http" || u.Host != "fleet.example.com" || u.Path != "/api/v1/devices/d1/streams/env/points" {
					t.Fatalf("Link = %q: not this endpoint's URL", link)
				}
				q := u.Query()
				if q.Get("limit") != "50" || q.Get("order") != "desc" || q.Get("from") != start.Add(10*time.Second).Format(time.RFC3339) || len(q) != 4 {
					t.Fatalf("Link = %q: the parameters are not the request's", link)
				}
				if accept == "" {
					var page struct{ Next *string }
					if err := json.Unmarshal(w.Body.Bytes(), &page); err != nil || page.Next == nil || *page.Next != q.Get("cursor") {
						t.Fatalf("Link = %q, the body's next %v (%v)", link, page.Next, err)
					}
				}
				target = u.RequestURI()
			}
			if want := map[string]string{"": "[50 50 10]"}[accept]; len(pages) != 3 || want != "" && fmt.Sprint(pages) != want {
				t.Fatalf("Accept %q: pages by Link of %v points, want 3 pages (of 50, 50, 10)", accept, pages)
			}
		}
	})
	t.Run("Aggregates", func(t *testing.T) {
		var got struct {
			Buckets []struct {
				Start time.Time
				Value float64
				Count int
			}
		}
		q := fmt.Sprintf("?field=temp&fn=count&interval=1h&from=%d", start.Add(-time.Hour).UnixMilli())
		getJSON(t, a, "/api/v1/devices/d1/streams/env/aggregate"+q, 1, 200, &got)
		total := 0
		for _, b := range got.Buckets {
			total += b.Count
		}
		if total != 120 {
			t.Fatalf("device aggregate = %+v", got)
		}
		getJSON(t, a, "/api/v1/streams/env/aggregate"+q+"&metadata.site=x", 1, 200, &got)
		if total = 0; len(got.Buckets) > 0 {
			for _, b := range got.Buckets {
				total += b.Count
			}
		}
		if total != 120 {
			t.Fatalf("fleet aggregate of site x = %+v", got)
		}
		getJSON(t, a, "/api/v1/streams/env/aggregate"+q+"&metadata.site=y", 1, 200, &got)
		if len(got.Buckets) != 0 {
			t.Fatalf("fleet aggregate of site y = %+v", got)
		}
		var by struct {
			Series []struct {
				DeviceID string `json:"device_id"`
			}
		}
		getJSON(t, a, "/api/v1/streams/env/aggregate"+q+"&by=device", 1, 200, &by)
		if len(by.Series) != 1 || by.Series[0].DeviceID != "d1" {
			t.Fatalf("by device = %+v", by)
		}
		// A group: of the tenant's, beside metadata; another tenant's
		// group of the same name is its own, and a name only the other
		// tenant has is unknown here.
		ct := "Content-Type: application/json"
		for who, g := range map[byte]string{4: `{"name": "site-x", "selector": "site=x"}`, 5: `{"name": "elsewhere", "selector": "site=x"}`} {
			if w, _ := a.serve("POST", "/api/v1/groups", ct, []byte(g), who); w.Code != 201 {
				t.Fatalf("group %s: %d %s", g, w.Code, w.Body)
			}
		}
		if w, _ := a.serve("POST", "/api/v1/groups", ct, []byte(`{"name": "site-x", "selector": "site"}`), 5); w.Code != 201 {
			t.Fatalf("other's site-x: %d %s", w.Code, w.Body)
		}
		getJSON(t, a, "/api/v1/streams/env/aggregate"+q+"&group=site-x&by=device", 1, 200, &by)
		if len(by.Series) != 1 || by.Series[0].DeviceID != "d1" {
			t.Fatalf("group site-x by device = %+v", by)
		}
		getJSON(t, a, "/api/v1/streams/env/aggregate"+q+"&group=site-x&metadata.site=y", 1, 200, &got)
		if len(got.Buckets) != 0 {
			t.Fatalf("group site-x and site y = %+v", got)
		}
		getJSON(t, a, "/api/v1/streams/env/aggregate"+q+"&group=site-x", 5, 200, &got)
		if len(got.Buckets) != 0 {
			t.Fatalf("the other tenant's group site-x = %+v", got)
		}
		var e struct {
			Fields map[string]string
		}
		getJSON(t, a, "/api/v1/streams/env/aggregate"+q+"&group=elsewhere", 1, 400, &e)
		if !strings.Contains(e.Fields["group"], `no group of the tenant: "elsewhere"`) {
			t.Fatalf("another tenant's group: %+v", e)
		}
	})
	t.Run("TenantsApart", func(t *testing.T) {
		getJSON(t, a, "/api/v1/devices/d1/streams", 5, 404, nil)
		getJSON(t, a, "/api/v1/devices/d1/streams/env/points", 5, 404, nil)
		getJSON(t, a, "/api/v1/devices/d1/streams/env/aggregate?field=temp", 5, 404, nil)
		var got struct{ Buckets []any }
		getJSON(t, a, "/api/v1/streams/env/aggregate?field=temp&fn=count&interval=1m", 5, 200, &got)
		if len(got.Buckets) != 0 {
			t.Fatalf("another tenant sees %v", got)
		}
		getJSON(t, a, "/api/v1/tenants/acme/stream-retention", 5, 404, nil)
	})
	t.Run("BadParameters", func(t *testing.T) {
		for target, param := range map[string]string{
			"/api/v1/devices/d1/streams/env/points?limit=0":                          "limit",
			"/api/v1/devices/d1/streams/env/points?order=up":                         "order",
			"/api/v1/devices/d1/streams/env/points?from=yesterday":                   "from",
			"/api/v1/devices/d1/streams/env/points?cursor=zzz":                       "cursor",
			"/api/v1/devices/d1/streams/env/points?from=2&to=1":                      "to",
			"/api/v1/devices/d1/streams/env/points?colour=red":                       "colour",
			"/api/v1/devices/d1/streams/env/aggregate":                               "field",
			"/api/v1/devices/d1/streams/env/aggregate?field=temp&fn=median":          "fn",
			"/api/v1/devices/d1/streams/env/aggregate?field=temp&interval=abc":       "interval",
			"/api/v1/devices/d1/streams/env/aggregate?field=temp&interval=90s":       "interval",
			"/api/v1/devices/d1/streams/env/aggregate?field=temp&interval=1s":        "interval",
			"/api/v1/devices/d1/streams/env/aggregate?field=temp&interval=1m&from=0": "interval",
			"/api/v1/streams/env/aggregate?field=temp&by=site":                       "by",
			"/api/v1/streams/env/aggregate?field=temp&metadata.=x":                   "metadata.",
			"/api/v1/streams/env/aggregate?field=temp&group=a/b":                     "group",
			"/api/v1/streams/env/aggregate?field=temp&group=ghost":                   "group",
		} {
			var e struct {
				Error  string
				Fields map[string]string
			}
			getJSON(t, a, target, 1, 400, &e)
			if _, ok := e.Fields[param]; !ok || e.Error != "invalid" {
				t.Errorf("GET %s: %+v, want a problem with %s", target, e, param)
			}
		}
	})
	t.Run("Retention", func(t *testing.T) {
		var got struct {
			RetentionSeconds int64 `json:"retention_seconds"`
			ServerDefault    bool  `json:"server_default"`
		}
		getJSON(t, a, "/api/v1/tenants/acme/stream-retention", 1, 200, &got)
		if got.RetentionSeconds != 30*86400 || !got.ServerDefault {
			t.Fatalf("retention = %+v", got)
		}
		ct := "Content-Type: application/json"
		if w, _ := a.serve("PUT", "/api/v1/tenants/acme/stream-retention", ct, []byte(`{"retention_seconds": 604800}`), 3); w.Code != 403 {
			t.Fatalf("an operator set the retention: %d", w.Code)
		}
		if w, _ := a.serve("PUT", "/api/v1/tenants/acme/stream-retention", ct, []byte(`{"retention_seconds": 60}`), 4); w.Code != 400 {
			t.Fatalf("a minute's retention: %d %s", w.Code, w.Body)
		}
		if w, _ := a.serve("PUT", "/api/v1/tenants/acme/stream-retention", ct, []byte(`{"retention_seconds": 604800}`), 4); w.Code != 204 {
			t.Fatalf("a week's retention: %d %s", w.Code, w.Body)
		}
		getJSON(t, a, "/api/v1/tenants/acme/stream-retention", 1, 200, &got)
		if got.RetentionSeconds != 604800 || got.ServerDefault {
			t.Fatalf("retention = %+v", got)
		}
	})
}

// FuzzHistoryQuery sends any query string to the history endpoints: the
// answer is 200, or 400 naming a parameter, never a 5xx.
func FuzzHistoryQuery(f *testing.F) {
	for _, q := range []string{
		"limit=5&order=desc", "from=0&to=99999999999999", "from=2026-11-21T10:00:00Z&to=2026-11-22T10:00:00.5%2B01:00",
		"cursor=MS5hLjEuMi4zLjQ", "field=temp&fn=last&interval=2h", "field=temp&interval=7d&from=1", "field=temp&interval=15s",
		"field=temp&metadata.site=x&by=device", "field=temp&group=g", "field=%ff&fn=avg", "interval=-1m&field=x", "limit=1&limit=2", "%zz",
	} {
		f.Add(uint8(0), q)
		f.Add(uint8(1), q)
		f.Add(uint8(2), q)
	}
	a, _ := historyAPI(f)
	paths := []string{"/api/v1/devices/d1/streams/env/points", "/api/v1/devices/d1/streams/env/aggregate", "/api/v1/streams/env/aggregate"}
	f.Fuzz(func(t *testing.T, path uint8, query string) {
		target := paths[int(path)%len(paths)] + "?" + query
		w, ok := a.serve("GET", target, "", nil, 1)
		if !ok {
			return
		}
		switch w.Code {
		case 200:
		case 400:
			var e struct{ Fields map[string]string }
			if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || len(e.Fields) == 0 {
				t.Fatalf("GET %s: 400 without the parameter: %s", target, w.Body)
			}
		default:
			t.Fatalf("GET %s: %d %s", target, w.Code, w.Body)
		}
	})
}

func TestLogs(t *testing.T) {
	a := newAPI(t)
	ct := "Content-Type: application/json"
	now := time.Now()
	post := func(entries ...string) {
		t.Helper()
		var pts []string
		for i, e := range entries {
			pts = append(pts, fmt.Sprintf(`{"timestamp": %d, "sequence": %d, %s}`, now.Add(time.Duration(i)*time.Millisecond).UnixMilli(), i, e))
		}
		if w, _ := a.serve("POST", "/api/v1/devices/d1/streams/logs", ct, []byte("["+strings.Join(pts, ",")+"]"), 2); w.Code != 200 {
			t.Fatalf("ingest: %d %s", w.Code, w.Body)
		}
	}
	post(`"level": "INFO", "tag": "app", "message": "started", "log_timestamp": "Nov 28 10:00:00"`,
		`"level": "debug", "tag": "net", "message": "dhcp lease"`,
		`"level": "warning", "tag": "disk", "message": "80% full", "line": "disk.c:42"`,
		`"level": "E", "tag": "app", "message": "Crashed: out of memory"`)
	type logs struct {
		Logs []struct{ Level, Tag, Message, Line string }
		Next *string
	}
	var got logs
	getJSON(t, a, "/api/v1/devices/d1/logs", 1, 200, &got)
	if len(got.Logs) != 4 || got.Logs[0].Message != "started" || got.Logs[2].Line != "disk.c:42" || got.Next != nil {
		t.Fatalf("logs = %+v", got)
	}
	getJSON(t, a, "/api/v1/devices/d1/logs?level=warn", 1, 200, &got)
	if len(got.Logs) != 2 || got.Logs[0].Tag != "disk" || got.Logs[1].Level != "E" {
		t.Fatalf("warn and above = %+v", got)
	}
	getJSON(t, a, "/api/v1/devices/d1/logs?q=MEMORY", 1, 200, &got)
	if len(got.Logs) != 1 || got.Logs[0].Tag != "app" {
		t.Fatalf("q=MEMORY = %+v", got)
	}
	getJSON(t, a, "/api/v1/devices/d1/logs?limit=1&q=app", 1, 200, &got)
	if len(got.Logs) != 1 || got.Next == nil {
		t.Fatalf("limit 1 = %+v", got)
	}
	getJSON(t, a, "/api/v1/devices/d1/logs?limit=1&q=app&cursor="+*got.Next, 1, 200, &got)
	if len(got.Logs) != 1 || got.Logs[0].Message != "Crashed: out of memory" {
		t.Fatalf("the page after = %+v", got)
	}
	// The same pages by their Link headers: the first has the second's,
	// the last (next null) none.
	w, _ := a.serve("GET", "/api/v1/devices/d1/logs?limit=1&q=app", "", nil, 1)
	u := nextLinkURL(t, w.Header().Values("Link"))
	if q := u.Query(); q.Get("q") != "app" || q.Get("limit") != "1" || q.Get("cursor") == "" {
		t.Fatalf("Link = %q", w.Header().Values("Link"))
	}
	getJSON(t, a, u.RequestURI(), 1, 200, &got)
	if len(got.Logs) != 1 || got.Logs[0].Message != "Crashed: out of memory" {
		t.Fatalf("the page after by its Link = %+v", got)
	}
	if w, _ := a.serve("GET", "/api/v1/devices/d1/logs", "", nil, 1); w.Header().Get("Link") != "" {
		t.Fatalf("the only page has Link %q", w.Header().Get("Link"))
	}
	getJSON(t, a, "/api/v1/devices/d1/logs?level=loud", 1, 400, nil)
	getJSON(t, a, "/api/v1/devices/d1/logs", 5, 404, nil)

	t.Run("Follow", func(t *testing.T) {
		srv := httptest.NewServer(a.h)
		defer srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/api/v1/devices/d1/logs?follow=true&level=error", nil)
		req.Header.Set("X-Service-Tenant", "acme")
		req.Header.Set("X-Service-Api-Key", a.keys["viewer"])
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		if ct := res.Header.Get("Content-Type"); res.StatusCode != 200 || ct != "text/event-stream" {
			t.Fatalf("follow: %d %s", res.StatusCode, ct)
		}
		events := make(chan string)
		go func() {
			sc := bufio.NewScanner(res.Body)
			for sc.Scan() {
				if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
					events <- data
				}
			}
			close(events)
		}()
		if e := <-events; !strings.Contains(e, "Crashed") {
			t.Fatalf("first event %s", e)
		}
		now = now.Add(time.Second)
		post(`"level": "info", "message": "restarted"`, `"level": "error", "tag": "app", "message": "crashed again"`)
		if e := <-events; !strings.Contains(e, "crashed again") {
			t.Fatalf("the line that arrived: %s", e)
		}
	})
}

// apiFollows is the log follows newAPI's tenants may hold at once.
const apiFollows = 2

// TestLogFollowsPerTenant: a tenant holds at most its cap of log follows
// at once, whatever addresses they come from; one more is 429 with
// Retry-After, another tenant's follow is not counted against it, and a
// follow closed gives its place back.
func TestLogFollowsPerTenant(t *testing.T) {
	a := newAPI(t)
	ctx := context.Background()
	if _, err := a.db.CreateDevices(ctx, "other", []fleet.NewDevice{{ID: "d1"}}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.h)
	t.Cleanup(srv.Close) // after the follows' cancels, which run first
	follow := func(tenant, key string) (*http.Response, context.CancelFunc) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/api/v1/devices/d1/logs?follow=true", nil)
		req.Header.Set("X-Service-Tenant", tenant)
		req.Header.Set("X-Service-Api-Key", key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cancel(); res.Body.Close() })
		return res, cancel
	}
	var first context.CancelFunc
	for i := range apiFollows {
		res, cancel := follow("acme", a.keys["viewer"])
		if res.StatusCode != 200 {
			t.Fatalf("follow %d: %d", i+1, res.StatusCode)
		}
		if i == 0 {
			first = cancel
		}
	}
	res, _ := follow("acme", a.keys["viewer"])
	if res.StatusCode != 429 || res.Header.Get("Retry-After") == "" {
		t.Fatalf("a follow beyond the cap: %d, Retry-After %q", res.StatusCode, res.Header.Get("Retry-After"))
	}
	if res, _ := follow("other", a.keys["other"]); res.StatusCode != 200 {
		t.Fatalf("another tenant's follow: %d", res.StatusCode)
	}
	first()
	// The handler of the follow closed gives its place back once it has
	// seen the client go: until then, 429.
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, _ := follow("acme", a.keys["viewer"])
		if res.StatusCode == 200 {
			break
		}
		if res.StatusCode != 429 || time.Now().After(deadline) {
			t.Fatalf("a follow after one closed: %d", res.StatusCode)
		}
		res.Body.Close()
	}
}
