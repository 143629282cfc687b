package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"
)

// consoleActions is how many actions the console's fleet has: each to all of
// the 100,000-device fleet, 1,000,000 device actions in all, the fleet
// BENCHMARKS.md's console row is measured on.
const consoleActions = 10

// consoleAlerts is how many of the fleet's devices open an alert of the
// console's rule, each notified to a webhook that fleetd's egress policy
// refuses (a loopback address), so that the rule's and its notification
// rule's pages list alerts and deliveries with their attempts, and no
// request leaves fleetd.
const consoleAlerts = 100

// consolePage is a page the console scenario times.
type consolePage struct {
	name, path string
	event      bool // an event stream: timed to its first event
}

// console measures every page of the web console, signed in with an API
// key, on the dispatch scenario's 100,000-device fleet given consoleActions
// actions to all of it: 1,000,000 device actions. Pages are requested one
// at a time, so each figure is the page's own time, from request to the
// last byte.
func (r *runner) console(ctx context.Context) error {
	if err := r.dispatchOne(ctx, 0); err != nil {
		return err
	}
	a, body, _ := r.dispatchFleet(0)
	n := r.sz.dispatch[0]
	if err := r.consoleFleet(ctx, a, body, n); err != nil {
		return err
	}
	act, err := newestAction(ctx, a)
	if err != nil {
		return err
	}
	var devs struct {
		Devices []struct {
			ID string `json:"id"`
		} `json:"devices"`
	}
	if err := a.call(ctx, "GET", "/api/v1/devices?limit=1", nil, http.StatusOK, &devs); err != nil || len(devs.Devices) == 0 {
		return fmt.Errorf("console: a device of the fleet: %v", err)
	}
	dev := devs.Devices[0].ID
	rule, notification, err := r.consoleAlerts(ctx, a)
	if err != nil {
		return fmt.Errorf("console: alerts: %w", err)
	}
	chartStream, err := r.consoleHistory(ctx, a, dev)
	if err != nil {
		return fmt.Errorf("console: history: %w", err)
	}
	var alerts struct {
		Alerts []struct {
			ID string `json:"id"`
		} `json:"alerts"`
	}
	if err := a.call(ctx, "GET", "/api/v1/alerts?limit=1&rule_id="+rule, nil, http.StatusOK, &alerts); err != nil || len(alerts.Alerts) == 0 {
		return fmt.Errorf("console: an alert of the rule: %v", err)
	}
	note := ""
	if r.t.dialect == "postgres" && r.t.dsn != "" {
		r.p.say("console: VACUUM (ANALYZE) devices, device_actions and actions, as autovacuum would")
		if err := vacuumAnalyze(ctx, r.t.dsn, "devices", "device_actions", "actions"); err != nil {
			return err
		}
		note = "; after VACUUM (ANALYZE)"
	}
	fleet := fmt.Sprintf("%s devices, %s device actions", thousands(float64(n)), thousands(float64(n*consoleActions)))
	pages := []consolePage{
		{"overview", "/console/", false},
		{"overview's live event", "/console/events", true},
		{"devices", "/console/devices", false},
		{"devices, page 2", "/console/devices?page=2", false},
		{"devices, search", "/console/devices?search=" + url.QueryEscape(dev[len(dev)-4:]), false},
		{"devices, metadata filter", "/console/devices?metadata=" + url.QueryEscape("site=nowhere"), false},
		{"a device (" + thousands(consoleActions) + " actions)", "/console/devices/" + url.PathEscape(dev), false},
		{"its charts, last hour (" + consoleChartsNote + ")", "/console/devices/" + url.PathEscape(dev) + "?chart=hour", false},
		{"its charts, last day", "/console/devices/" + url.PathEscape(dev) + "?chart=day", false},
		{"its charts, last week", "/console/devices/" + url.PathEscape(dev) + "?chart=week", false},
		{"its charts' live event, last day", "/console/devices/" + url.PathEscape(dev) + "/charts/events?chart=day", true},
		{"its Logs tab (" + thousands(consoleLogLines) + " lines in the hour)", "/console/devices/" + url.PathEscape(dev) + "/logs", false},
		{"its Logs tab, level error", "/console/devices/" + url.PathEscape(dev) + "/logs?level=error", false},
		{"overview's fleet chart, last day", "/console/?chart=day&field=f0&stream=" + url.QueryEscape(chartStream), false},
		{"an alert, its chart", "/console/alerts/" + alerts.Alerts[0].ID, false},
		{"actions", "/console/actions", false},
		{"actions in flight", "/console/actions?incomplete=true", false},
		{"an action of " + thousands(float64(n)) + " devices", fmt.Sprintf("/console/actions/%d", act), false},
		{"its Queued devices, page 2", fmt.Sprintf("/console/actions/%d?status=Queued&page=2", act), false},
		{"its live event", fmt.Sprintf("/console/actions/%d/events", act), true},
		{"dispatch form", "/console/actions/new", false},
		{"firmware", "/console/firmware", false},
		{"alerts", "/console/alerts", false},
		{"alert rules", "/console/alerts/rules", false},
		{"an alert rule (" + thousands(consoleAlerts) + " alerts)", "/console/alerts/rules/" + rule, false},
		{"its notification rule and deliveries", "/console/alerts/rules/" + rule + "/notifications/" + notification, false},
		{"API keys", "/console/settings/keys", false},
		{"sign-in settings", "/console/settings/auth", false},
		{"audit log", "/console/settings/audit", false},
		{"audit log, action filter (action)", "/console/settings/audit?action=action", false},
	}
	note += r.settle(ctx, "console")
	wait := r.profile("console", 10*time.Second)
	defer wait()
	b, err := signInConsole(ctx, r.t.url, a.tenant, a.key)
	if err != nil {
		return err
	}
	for _, pg := range pages {
		lat, err := b.time(ctx, pg, r.sz.consoleRequests)
		if err != nil {
			return fmt.Errorf("console: %s: %w", pg.name, err)
		}
		judge(r.rep.add(&figure{Scenario: "console", Name: fmt.Sprintf("console p99, %s: %s", fleet, pg.name),
			Value: ms(lat.percentile(99)), Unit: millis,
			Note: fmt.Sprintf("GET %s; p50 %.1f ms, max %.1f ms over %d requests%s", pg.path, ms(lat.percentile(50)), ms(lat[len(lat)-1]), len(lat), note)}),
			r.t.dialect, goalConsolePage, "")
	}
	return nil
}

// consoleAlerts gives the tenant an alert rule of its own, with a webhook
// notification rule, and has consoleAlerts of its devices open an alert
// of it; it returns the two rules' ids once the alerts are open.
func (r *runner) consoleAlerts(ctx context.Context, a *api) (rule, notification string, err error) {
	var devs struct {
		Devices []struct {
			ID string `json:"id"`
		} `json:"devices"`
	}
	if err := a.call(ctx, "GET", fmt.Sprintf("/api/v1/devices?limit=%d", consoleAlerts), nil, http.StatusOK, &devs); err != nil {
		return "", "", err
	}
	if len(devs.Devices) < consoleAlerts {
		return "", "", fmt.Errorf("the fleet has %d devices, want %d", len(devs.Devices), consoleAlerts)
	}
	stream := "console" + r.runID
	var made struct {
		ID string `json:"id"`
	}
	if err := a.representing().call(ctx, "POST", "/api/v1/alert-rules", map[string]any{"name": "fleetbench-console-" + r.runID, "stream": stream,
		"condition": map[string]any{"field": "temperature", "operator": ">", "value": 80}}, http.StatusCreated, &made); err != nil {
		return "", "", err
	}
	rule = made.ID
	if err := a.representing().call(ctx, "POST", "/api/v1/alert-rules/"+rule+"/alert-notification-rules", map[string]any{
		"channel_parameters": map[string]any{"type": "webhook", "url": "http://127.0.0.1:9/fleetbench"}}, http.StatusCreated, &made); err != nil {
		return "", "", err
	}
	notification = made.ID
	at := time.Now().UnixMilli()
	if err := parallel(ctx, consoleAlerts, 8, func(ctx context.Context, i int) error {
		return a.call(ctx, "POST", "/api/v1/devices/"+url.PathEscape(devs.Devices[i].ID)+"/streams/"+stream,
			[]map[string]any{{"timestamp": at, "sequence": 1, "temperature": 91.5}}, http.StatusOK, nil)
	}); err != nil {
		return "", "", err
	}
	// Alerts open as the readings are evaluated, in the background.
	var open struct {
		Count int `json:"count"`
	}
	for deadline := time.Now().Add(30 * time.Second); open.Count < consoleAlerts; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			return "", "", fmt.Errorf("%d of %d alerts opened within 30 s", open.Count, consoleAlerts)
		}
		if err := a.call(ctx, "GET", "/api/v1/alerts?state=active&limit=1&rule_id="+rule, nil, http.StatusOK, &open); err != nil {
			return "", "", err
		}
	}
	return rule, notification, nil
}

// The console's history: a week of one device's points, a point a minute
// with consoleChartFields numeric fields (the charts' worst case for a
// device that reports every minute), and consoleLogLines log lines in the
// last hour.
const (
	consoleChartFields = 3
	consoleLogLines    = 5_000
	consoleChartsNote  = "a week of a point a minute, 3 numeric fields, and 1 field of another stream"
)

// consoleHistory gives dev a week of points on a stream of its own and
// its logs, and waits until their rollups are merged; it returns the
// stream's name.
func (r *runner) consoleHistory(ctx context.Context, a *api, dev string) (string, error) {
	stream := "chart" + r.runID
	end := time.Now().Truncate(time.Minute)
	start := end.Add(-7 * 24 * time.Hour)
	total := int(end.Sub(start) / time.Minute)
	const batch = 5_000
	for i := 0; i < total; i += batch {
		var pts []map[string]any
		for j := i; j < min(i+batch, total); j++ {
			p := map[string]any{"timestamp": start.Add(time.Duration(j) * time.Minute).UnixMilli(), "sequence": j}
			for f := range consoleChartFields {
				p[fmt.Sprintf("f%d", f)] = float64(f*10) + float64(j%60)/6
			}
			pts = append(pts, p)
		}
		if err := a.call(ctx, "POST", "/api/v1/devices/"+url.PathEscape(dev)+"/streams/"+stream, pts, http.StatusOK, nil); err != nil {
			return "", err
		}
	}
	// Logs come as a device sends them: a batch of 50 lines every 36 s.
	levels := []string{"debug", "info", "info", "warn", "error"}
	const logBatch = 50
	for i := 0; i < consoleLogLines; i += logBatch {
		var lines []map[string]any
		for j := i; j < min(i+logBatch, consoleLogLines); j++ {
			lines = append(lines, map[string]any{"timestamp": end.Add(-time.Hour + time.Duration(j)*time.Hour/consoleLogLines).UnixMilli(),
				"sequence": j, "level": levels[j%len(levels)], "tag": "app", "message": fmt.Sprintf("line %d of the bench", j)})
		}
		if err := a.call(ctx, "POST", "/api/v1/devices/"+url.PathEscape(dev)+"/streams/logs", lines, http.StatusOK, nil); err != nil {
			return "", err
		}
	}
	// Rollups are merged in the background, about once a second.
	var agg struct {
		Buckets []struct {
			Count int `json:"count"`
		} `json:"buckets"`
	}
	q := url.Values{"field": {"f0"}, "fn": {"count"}, "interval": {"7d"}, "from": {fmt.Sprint(start.UnixMilli())}, "to": {fmt.Sprint(end.UnixMilli())}}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if err := a.call(ctx, "GET", "/api/v1/devices/"+url.PathEscape(dev)+"/streams/"+stream+"/aggregate?"+q.Encode(), nil, http.StatusOK, &agg); err != nil {
			return "", err
		}
		n := 0
		for _, b := range agg.Buckets {
			n += b.Count
		}
		if n == total {
			return stream, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("%d of %d points rolled up within 2 minutes", n, total)
		}
	}
}

// newestAction is the id of the tenant's newest action.
func newestAction(ctx context.Context, a *api) (int64, error) {
	var newest struct {
		Actions []struct {
			ID int64 `json:"id"`
		} `json:"actions"`
	}
	if err := a.call(ctx, "GET", "/api/v1/actions?limit=1", nil, http.StatusOK, &newest); err != nil {
		return 0, err
	}
	if len(newest.Actions) == 0 {
		return 0, fmt.Errorf("tenant %s has no action", a.tenant)
	}
	return newest.Actions[0].ID, nil
}

// consoleFleet gives the fleet of n devices consoleActions actions to all
// of it, counting those it has.
func (r *runner) consoleFleet(ctx context.Context, a *api, body map[string]any, n int) error {
	var list struct {
		Count int `json:"count"`
	}
	if err := a.call(ctx, "GET", "/api/v1/actions?limit=1", nil, http.StatusOK, &list); err != nil {
		return err
	}
	body["action"] = "console-bench"
	for i := list.Count; i < consoleActions; i++ {
		d, err := a.dispatch(ctx, body)
		if err != nil {
			return err
		}
		if d.Targeted != n {
			return fmt.Errorf("console: a dispatch targeted %d devices, want %d", d.Targeted, n)
		}
		r.p.count(fmt.Sprintf("console: actions to the %s fleet", thousands(float64(n))), i+1, consoleActions)
	}
	return nil
}

// consoleBrowser is a signed-in console session.
type consoleBrowser struct {
	base   string
	client *http.Client
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// signInConsole signs in to the console with an API key, as its form does.
func signInConsole(ctx context.Context, base, tenant, key string) (*consoleBrowser, error) {
	jar, _ := cookiejar.New(nil)
	c := newClient(1)
	c.Jar = jar
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	b := &consoleBrowser{base: strings.TrimRight(base, "/"), client: c}
	form, err := b.get(ctx, "/console/signin")
	if err != nil {
		return nil, err
	}
	m := csrfField.FindStringSubmatch(form)
	if m == nil {
		return nil, fmt.Errorf("console: the sign-in form has no csrf field")
	}
	req, _ := http.NewRequestWithContext(ctx, "POST", b.base+"/console/signin",
		strings.NewReader(url.Values{"csrf": {m[1]}, "tenant": {tenant}, "key": {key}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		return nil, fmt.Errorf("console: signing in answered %d", resp.StatusCode)
	}
	return b, nil
}

func (b *consoleBrowser) get(ctx context.Context, path string) (string, error) {
	req, _ := http.NewRequestWithContext(ctx, "GET", b.base+path, nil)
	resp, err := b.client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: status %d", path, resp.StatusCode)
	}
	return string(body), nil
}

// firstEvent opens an event stream and reads until its first event ends.
func (b *consoleBrowser) firstEvent(ctx context.Context, path string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", b.base+path, nil)
	resp, err := b.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: status %d", path, resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	data := false
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: ") {
			data = true
		} else if data && sc.Text() == "" {
			return nil
		}
	}
	return fmt.Errorf("GET %s: the stream ended before its first event: %v", path, sc.Err())
}

// consolePageBudget bounds the time spent on one page: a page far over its
// goal is measured fewer times (at least consoleMinRequests).
const (
	consolePageBudget  = 30 * time.Second
	consoleMinRequests = 20
)

// time requests a page n times, after 5 unmeasured, or fewer once
// consolePageBudget is spent, and returns the sorted latencies.
func (b *consoleBrowser) time(ctx context.Context, pg consolePage, n int) (latencies, error) {
	lat := make(latencies, 0, n)
	start := time.Now()
	for i := -5; i < n && (len(lat) < consoleMinRequests || time.Since(start) < consolePageBudget); i++ {
		t0 := time.Now()
		var err error
		if pg.event {
			err = b.firstEvent(ctx, pg.path)
		} else {
			_, err = b.get(ctx, pg.path)
		}
		if err != nil {
			return nil, err
		}
		if i >= 0 {
			lat = append(lat, time.Since(t0))
		}
	}
	slices.Sort(lat)
	return lat, nil
}
