package console_test

import (
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// chartLine finds a chart's line of averages in a page.
var chartLine = regexp.MustCompile(`<figure class="chart" data-chart="([^"]*)">[\s\S]*?<path class="line" d="([^"]*)"/>`)

// chartsOf returns the charts of a page: their line's path by key.
func chartsOf(body string) map[string]string {
	out := map[string]string{}
	body, _, _ = strings.Cut(body, "<template data-chart-template>") // the blank chart the script copies
	for _, m := range chartLine.FindAllStringSubmatch(body, -1) {
		out[m[1]] = m[2]
	}
	return out
}

// TestConsoleCharts drives the device page's charts, its Logs tab, the
// overview's fleet chart and an alert's page over HTTP on both databases:
// charts drawn from rollups for each span, moved by their event stream as
// points arrive, an empty state, log lines filtered, escaped and followed,
// and every one of them 404 for another tenant's device or alert.
func TestConsoleCharts(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, be sqlstoretest.Backend) {
		s := fleetdtest.Start(t, be, fleetdtest.AlertFlags...)
		admin := s.Admin()
		viewer := s.NewKey(t, admin, "victor", "viewer")
		s.MustDevice(t, admin, "pump-1", map[string]string{"site": "harbour"})
		s.MustDevice(t, admin, "quiet-1", nil)
		other := s.NewTenant(t, "other")
		s.MustDevice(t, other, "theirs", nil)
		s.Do(t, other, "POST", "/api/v1/devices/theirs/streams/env", []map[string]any{{"timestamp": time.Now().UnixMilli(), "temp": 1}}).Want(t, 200)
		rule := s.MustAlertRule(t, admin, map[string]any{"name": "hot", "stream": "env", "condition": map[string]any{"field": "temp", "operator": ">", "value": 80}})

		// Ten minutes of points, one every 10 s, rising by one a minute.
		start := time.Now().Add(-10 * time.Minute).Truncate(time.Minute)
		var pts []map[string]any
		for i := range 60 {
			pts = append(pts, map[string]any{"timestamp": start.Add(time.Duration(i) * 10 * time.Second).UnixMilli(), "sequence": i,
				"temp": 20 + i/6, "state": "ok"})
		}
		s.Do(t, admin, "POST", "/api/v1/devices/pump-1/streams/env", pts).Want(t, 200)

		b := fleetdtest.NewBrowser(t, s.URL)
		b.SignIn("default", viewer.Key)
		var page string
		fleetdtest.Eventually(t, "the device page's chart of env's temp, from the minute rollups", func() bool {
			page = b.Get("/console/devices/pump-1").Want(t, 200).Body
			line := chartsOf(page)["env/temp"]
			return strings.Count(line, "L") == 9 // ten minutes, ten buckets
		})
		if _, ok := chartsOf(page)["env/state"]; ok {
			t.Errorf("a text field is charted")
		}
		for _, want := range []string{`aria-current="page">Last hour`, `data-chart-source="/console/devices/pump-1/charts/events?chart=hour"`,
			"Last average 29; lowest 20, highest 29.", `href="/console/devices/pump-1/logs"`} {
			if !strings.Contains(page, want) {
				t.Errorf("the device page lacks %s", want)
			}
		}
		for _, span := range []string{"day", "week"} {
			page := b.Get("/console/devices/pump-1?chart="+span).Want(t, 200).Body
			if line := chartsOf(page)["env/temp"]; line == "" || !strings.Contains(page, `aria-current="page">Last `+span) {
				t.Errorf("the %s's chart: %q", span, line)
			}
		}
		fleetdtest.WantContains(t, "a bad span", b.Get("/console/devices/pump-1?chart=year").Want(t, 400).Body, "hour, day, week")

		t.Run("EmptyState", func(t *testing.T) {
			page := b.Get("/console/devices/quiet-1").Want(t, 200).Body
			if len(chartsOf(page)) != 0 || !strings.Contains(page, "The device has sent no numeric stream data") {
				t.Errorf("a device without points:\n%s", page)
			}
		})

		t.Run("Live", func(t *testing.T) {
			next := b.Events(t, "/console/devices/pump-1/charts/events?chart=hour")
			var ev struct {
				Charts []struct{ Key, Line, Summary string }
			}
			if err := json.Unmarshal([]byte(next()), &ev); err != nil || len(ev.Charts) != 1 || ev.Charts[0].Key != "env/temp" {
				t.Fatalf("first chart event: %+v %v", ev, err)
			}
			s.Do(t, admin, "POST", "/api/v1/devices/pump-1/streams/env", []map[string]any{{"timestamp": time.Now().UnixMilli(), "sequence": 100, "temp": 95.5}}).Want(t, 200)
			for !strings.HasPrefix(ev.Charts[0].Summary, "Last average 95.5") {
				if err := json.Unmarshal([]byte(next()), &ev); err != nil {
					t.Fatal(err)
				}
			}
			if !strings.Contains(ev.Charts[0].Summary, "highest 95.5") {
				t.Errorf("the new point's chart: %+v", ev.Charts[0])
			}
		})

		t.Run("Logs", func(t *testing.T) {
			now := time.Now()
			s.Do(t, admin, "POST", "/api/v1/devices/pump-1/streams/logs", []map[string]any{
				{"timestamp": now.Add(-time.Minute).UnixMilli(), "level": "info", "tag": "app", "message": "booted"},
				{"timestamp": now.Add(-time.Minute).UnixMilli() + 1, "level": "error", "tag": "app", "message": "<script>alert(1)</script> sensor lost", "line": "sensor.c:7"},
			}).Want(t, 200)
			page := b.Get("/console/devices/pump-1/logs").Want(t, 200).Body
			fleetdtest.WantContains(t, "the Logs tab", page, "booted", "&lt;script&gt;alert(1)&lt;/script&gt; sensor lost", "sensor.c:7", `aria-current="page">Logs`)
			if strings.Contains(page, "<script>alert") {
				t.Fatal("a log line's markup is in the page")
			}
			if i, j := strings.Index(page, "sensor lost"), strings.Index(page, "booted"); i > j {
				t.Errorf("the lines are not newest first")
			}
			if page := b.Get("/console/devices/pump-1/logs?level=warn").Want(t, 200).Body; strings.Contains(page, "booted") || !strings.Contains(page, "sensor lost") {
				t.Errorf("level=warn kept an info line, or not the error")
			}
			if page := b.Get("/console/devices/pump-1/logs?q=BOOT").Want(t, 200).Body; !strings.Contains(page, "booted") || strings.Contains(page, "sensor lost") {
				t.Errorf("q=BOOT did not keep only booted")
			}
			fleetdtest.WantContains(t, "a bad level", b.Get("/console/devices/pump-1/logs?level=loud").Want(t, 400).Body, "level")
			if page := b.Get("/console/devices/quiet-1/logs").Want(t, 200).Body; !strings.Contains(page, "No log line in the last hour") {
				t.Errorf("no empty state on a device without logs")
			}

			from := fmt.Sprint(time.Now().UnixMilli())
			next := b.Events(t, "/console/devices/pump-1/logs/events?level=warn&from="+from)
			s.Do(t, admin, "POST", "/api/v1/devices/pump-1/streams/logs", []map[string]any{
				{"timestamp": time.Now().UnixMilli() + 5, "level": "debug", "message": "noise"},
				{"timestamp": time.Now().UnixMilli() + 6, "level": "warn", "tag": "net", "message": "link down"},
			}).Want(t, 200)
			var l struct{ Level, Tag, Message string }
			if err := json.Unmarshal([]byte(next()), &l); err != nil || l.Message != "link down" || l.Tag != "net" {
				t.Errorf("the followed line: %+v %v", l, err)
			}
			b.Get("/console/devices/pump-1/logs/events").Want(t, 400)
		})

		t.Run("FleetChart", func(t *testing.T) {
			page := b.Get("/console/").Want(t, 200).Body
			fleetdtest.WantContains(t, "the overview's empty fleet chart", page, "Choose a stream and one of its numeric fields")
			page = b.Get("/console/?stream=env&field=temp&chart=day").Want(t, 200).Body
			if chartsOf(page)["env/temp"] == "" || !strings.Contains(page, `aria-current="page">Last day`) {
				t.Errorf("the fleet chart is not drawn:\n%s", page)
			}
			// Only this tenant's devices: theirs sent 1, pump-1 never below 20.
			if !strings.Contains(page, "lowest 20,") {
				t.Errorf("the fleet chart is not of this tenant's devices only")
			}
			fleetdtest.WantContains(t, "a bad stream", b.Get("/console/?stream=no%20way&field=temp").Want(t, 400).Body, "stream")
			// A group: the devices it selects now.
			s.Do(t, admin, "POST", "/api/v1/groups", map[string]any{"name": "harbour", "selector": "site=harbour"}).Want(t, 201)
			s.Do(t, admin, "POST", "/api/v1/groups", map[string]any{"name": "inland", "selector": "site=inland"}).Want(t, 201)
			page = b.Get("/console/?stream=env&field=temp&group=harbour").Want(t, 200).Body
			if chartsOf(page)["env/temp"] == "" || !strings.Contains(page, "group=harbour") {
				t.Errorf("the harbour group's chart is not drawn, or its span links forget the group")
			}
			if page := b.Get("/console/?stream=env&field=temp&group=inland").Want(t, 200).Body; chartsOf(page)["env/temp"] != "" || !strings.Contains(page, "No numeric value of temp") {
				t.Errorf("a group without pump-1 charts its points")
			}
			fleetdtest.WantContains(t, "an unknown group", b.Get("/console/?stream=env&field=temp&group=nowhere").Want(t, 400).Body, "names no group")
		})

		t.Run("Alert", func(t *testing.T) {
			s.Do(t, admin, "POST", "/api/v1/devices/pump-1/streams/env", []map[string]any{{"timestamp": time.Now().UnixMilli(), "sequence": 200, "temp": 99}}).Want(t, 200)
			var alerts []fleetdtest.AlertSession
			fleetdtest.Eventually(t, "the alert", func() bool { alerts = s.Alerts(t, admin, "?rule_id="+rule.ID); return len(alerts) > 0 })
			page := b.Get("/console/alerts/"+alerts[0].ID).Want(t, 200).Body
			if chartsOf(page)["env/temp"] == "" || !strings.Contains(page, `class="marker-label"`) || !strings.Contains(page, ">opened</text>") {
				t.Errorf("the alert's page has no chart of temp with its opening marked:\n%s", page)
			}
			if !strings.Contains(b.Get("/console/alerts").Want(t, 200).Body, `href="/console/alerts/`+alerts[0].ID+`"`) {
				t.Errorf("the alerts list does not link the alert's page")
			}
		})

		t.Run("TenantIsolation", func(t *testing.T) {
			for _, path := range []string{"/console/devices/theirs", "/console/devices/theirs?chart=week", "/console/devices/theirs/logs",
				"/console/devices/theirs/charts/events?chart=hour", "/console/devices/theirs/logs/events?from=0"} {
				b.Get(path).Want(t, 404)
			}
			theirRule := s.MustAlertRule(t, other, map[string]any{"name": "theirs", "stream": "env", "condition": map[string]any{"field": "temp", "operator": ">", "value": 0}})
			s.Do(t, other, "POST", "/api/v1/devices/theirs/streams/env", []map[string]any{{"timestamp": time.Now().UnixMilli(), "sequence": 9, "temp": 5}}).Want(t, 200)
			var theirs []fleetdtest.AlertSession
			fleetdtest.Eventually(t, "their alert", func() bool { theirs = s.Alerts(t, other, "?rule_id="+theirRule.ID); return len(theirs) > 0 })
			b.Get("/console/alerts/"+url.PathEscape(theirs[0].ID)).Want(t, 404)
		})
	})
}
