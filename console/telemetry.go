package console

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/fleetd/fleet"
	fleethttp "github.com/fleetd/fleet/http"
)

// chartsData is a page's charts section.
type chartsData struct {
	Heading string // "" when the page has its own
	Charts  []chart
	// Links choose the span; Current is the one shown.
	Links []chartLink
	// More is how many numeric fields were left out past maxCharts.
	More int
	// Live is the event stream that moves the charts, "" when they stay.
	Live string
	// EmptyText is what the section says when there is nothing to chart.
	EmptyText string
	// Blank is the chart the script copies for a field that appears.
	Blank chart
}

// chartLink is a choice of span.
type chartLink struct {
	Label, URL string
	Current    bool
}

// chartLinks are the span choices of a page at path with query q.
func chartLinks(path string, q url.Values, current string) []chartLink {
	links := make([]chartLink, len(chartWindows))
	for i, w := range chartWindows {
		q.Set("chart", w.Name)
		links[i] = chartLink{Label: w.Label, URL: path + "?" + q.Encode(), Current: w.Name == current}
	}
	return links
}

// blankChart is a chart with no data, whose elements the script fills.
func blankChart() chart {
	return drawChart(chartSpec{From: time.Unix(0, 0), To: time.Unix(1, 0), Interval: time.Second, Ticks: "15:04"}, series{})
}

// deviceChartSpecs are the charts of a device's streams over w up to now:
// each numeric field of each stream's latest point (the logs stream has
// none), at most maxCharts, and how many were left out.
func deviceChartSpecs(latest []*fleet.DataPoint, w chartWindow, now time.Time) ([]chartSpec, int) {
	var specs []chartSpec
	more := 0
	for _, p := range latest {
		if p.Stream == fleet.LogStream {
			continue
		}
		for _, f := range numericFields(p.Data) {
			if len(specs) == maxCharts {
				more++
				continue
			}
			specs = append(specs, chartSpec{Stream: p.Stream, Field: f, From: now.Add(-w.Span), To: now, Interval: w.Interval, Ticks: w.Ticks})
		}
	}
	return specs, more
}

// deviceCharts reads the charts of a device over w.
func (c *Console) deviceCharts(ctx context.Context, tenant, device string, latest []*fleet.DataPoint, w chartWindow) ([]chart, int, error) {
	specs, more := deviceChartSpecs(latest, w, c.Now())
	charts, err := drawCharts(ctx, c.History, tenant, device, specs)
	return charts, more, err
}

// deviceChartsSection is the charts section of a device's page.
func (c *Console) deviceChartsSection(r *http.Request, tenant, device string, latest []*fleet.DataPoint) (*chartsData, error) {
	w, err := readChartWindow(r.URL.Query().Get("chart"))
	if err != nil {
		return nil, err
	}
	charts, more, err := c.deviceCharts(r.Context(), tenant, device, latest, w)
	if err != nil {
		return nil, err
	}
	return &chartsData{Heading: "Charts", Charts: charts, More: more, Blank: blankChart(),
		Links:     chartLinks("/console/devices/"+url.PathEscape(device), url.Values{}, w.Name),
		Live:      "/console/devices/" + url.PathEscape(device) + "/charts/events?chart=" + w.Name,
		EmptyText: "The device has sent no numeric stream data: a chart of each numeric field appears when it does."}, nil
}

// chartsLive is what a device's chart stream sends.
type chartsLive struct {
	Charts []chart `json:"charts"`
}

// handleDeviceChartEvents streams a device's charts, read again every
// chartLiveInterval (one feed for every page open on the same device and
// span) and sent when they changed.
func (c *Console) handleDeviceChartEvents(w http.ResponseWriter, r *http.Request, v *view) error {
	tenant, id := v.Actor.Tenant, r.PathValue("id")
	win, err := readChartWindow(r.URL.Query().Get("chart"))
	if err != nil {
		return err
	}
	// An unknown device is a 404 before the stream starts.
	if _, err := c.Devices.FindDevice(r.Context(), tenant, id); err != nil {
		return err
	}
	return c.stream(w, r, "charts", "charts/"+tenant+"/"+id+"/"+win.Name, chartLiveInterval, func(ctx context.Context) (any, error) {
		latest, _, err := c.Streams.FindDeviceStreams(ctx, tenant, id, fleet.Page{Page: 1, Limit: deviceStreams})
		if err != nil {
			return nil, err
		}
		charts, _, err := c.deviceCharts(ctx, tenant, id, latest, win)
		return chartsLive{Charts: charts}, err
	})
}

// Logs tab (docs/console.md): the newest lines, then those that arrive.
const (
	logLinesShown = 100
	logWindow     = time.Hour
)

// logsData is a device's Logs tab.
type logsData struct {
	Device   *fleet.Device
	Level    string
	Search   string
	Levels   []string
	Lines    []fleet.LogLine
	Follow   string // the event stream of the lines that arrive
	Window   string
	LinesMax int
}

// readLogQuery reads the Logs tab's filters.
func readLogQuery(r *http.Request) fleet.LogQuery {
	q := r.URL.Query()
	return fleet.LogQuery{MinLevel: q.Get("level"), Contains: q.Get("q")}
}

// handleDeviceLogs shows the newest lines of a device's logs of the last
// hour that the filters keep, newest first; the page's script adds those
// that arrive from the moment the page was read.
func (c *Console) handleDeviceLogs(w http.ResponseWriter, r *http.Request, v *view) error {
	ctx, tenant, id := r.Context(), v.Actor.Tenant, r.PathValue("id")
	dev, err := c.Devices.FindDevice(ctx, tenant, id)
	if err != nil {
		return err
	}
	now := c.Now()
	lq := readLogQuery(r)
	lq.From, lq.To, lq.Limit = now.Add(-logWindow), now, logLinesShown
	lines, err := fleet.ReadRecentLogs(ctx, c.History, tenant, id, lq)
	if err != nil {
		return err
	}
	follow := url.Values{"from": {strconv.FormatInt(now.UnixMilli(), 10)}}
	if lq.MinLevel != "" {
		follow.Set("level", lq.MinLevel)
	}
	if lq.Contains != "" {
		follow.Set("q", lq.Contains)
	}
	v.Title, v.Nav = "Logs of device "+id, "devices"
	v.Data = logsData{Device: dev, Level: lq.MinLevel, Search: lq.Contains, Levels: fleet.LogLevels, Lines: lines,
		Follow: "/console/devices/" + url.PathEscape(id) + "/logs/events?" + follow.Encode(), LinesMax: logLinesShown}
	c.render(w, r, http.StatusOK, "devicelogs", v)
	return nil
}

// handleDeviceLogEvents follows a device's log lines from the time the
// Logs tab was read, as the API's logs?follow=true does; the stream ends
// after liveMaxAge and EventSource resumes it from its last event's id.
func (c *Console) handleDeviceLogEvents(w http.ResponseWriter, r *http.Request, v *view) error {
	tenant, id := v.Actor.Tenant, r.PathValue("id")
	lq := readLogQuery(r)
	lq.Limit = logLinesShown
	ms, err := strconv.ParseInt(r.URL.Query().Get("from"), 10, 64)
	if err != nil {
		return fleet.FieldErrors(map[string]string{"from": "must be epoch milliseconds"})
	}
	lq.From = time.UnixMilli(ms)
	lq.Cursor = r.Header.Get("Last-Event-ID")
	page, err := fleet.ReadLogs(r.Context(), c.History, tenant, id, lq)
	if err != nil {
		return err
	}
	return fleethttp.FollowLogs(w, r, c.Follows, c.History, tenant, id, lq, page, liveMaxAge, c.Logger)
}

// Around an alert: the span its page charts, before and after it opened.
const alertChartBefore, alertChartAfter = 30 * time.Minute, 30 * time.Minute

// alertData is an alert's page.
type alertData struct {
	Alert  *fleet.Alert
	Charts chartsData
}

// handleAlert shows an alert and its stream's numeric fields (those of the
// point that opened it) from half an hour before it opened to half an hour
// after, in minutes.
func (c *Console) handleAlert(w http.ResponseWriter, r *http.Request, v *view) error {
	ctx, tenant := r.Context(), v.Actor.Tenant
	a, err := c.Alerts.FindAlert(ctx, tenant, r.PathValue("id"))
	if err != nil {
		return err
	}
	d := alertData{Alert: a, Charts: chartsData{Heading: "Around the moment it opened", EmptyText: "The point that opened this alert has no numeric field to chart."}}
	if a.Value != nil {
		from, to := a.StartedAt.Add(-alertChartBefore), a.StartedAt.Add(alertChartAfter)
		markers := []chartMarker{{At: a.StartedAt, Label: "opened"}}
		if a.EndedAt != nil {
			markers = append(markers, chartMarker{At: *a.EndedAt, Label: "ended"})
		}
		var specs []chartSpec
		for _, f := range numericFields(a.Value.Data) {
			if len(specs) == maxCharts {
				d.Charts.More++
				continue
			}
			specs = append(specs, chartSpec{Stream: a.Stream, Field: f, From: from, To: to, Interval: time.Minute, Ticks: "15:04", Markers: markers})
		}
		charts, err := drawCharts(ctx, c.History, tenant, a.DeviceID, specs)
		if err != nil && fleet.ErrorCode(err) != fleet.ENOTFOUND { // a device gone leaves its alert, without charts
			return err
		}
		d.Charts.Charts = charts
	}
	v.Title, v.Nav, v.Data = "Alert of "+a.RuleName+" on "+a.DeviceID, "alerts", d
	c.render(w, r, http.StatusOK, "alert", v)
	return nil
}

// fleetChartData is the overview's fleet-wide chart and its form.
type fleetChartData struct {
	Stream, Field, Group string
	Charts               chartsData
}

// fleetChart reads the overview's chart of a stream's field over the
// tenant's devices, or a group of them, when the form chose one.
func (c *Console) fleetChart(r *http.Request, tenant string) (*fleetChartData, error) {
	q := r.URL.Query()
	d := &fleetChartData{Stream: q.Get("stream"), Field: q.Get("field"), Group: q.Get("group")}
	win, err := readChartWindow(q.Get("chart"))
	if err != nil {
		return nil, err
	}
	d.Charts.EmptyText = "Choose a stream and one of its numeric fields to chart it over every device."
	if d.Stream == "" && d.Field == "" {
		return d, nil
	}
	problems := map[string]string{}
	if !fleet.ValidStreamName(d.Stream) {
		problems["stream"] = fleet.StreamNameRule
	}
	if d.Field == "" || len(d.Field) > fleet.MaxFieldNameLen {
		problems["field"] = "must be a field name of 1 to 256 characters"
	}
	if len(problems) > 0 {
		return nil, fleet.FieldErrors(problems)
	}
	now := c.Now()
	spec := chartSpec{Stream: d.Stream, Field: d.Field, Group: d.Group, From: now.Add(-win.Span), To: now, Interval: win.Interval, Ticks: win.Ticks}
	charts, err := drawCharts(r.Context(), c.History, tenant, "", []chartSpec{spec})
	if err != nil {
		return nil, err
	}
	d.Charts.Charts = charts
	links := url.Values{"stream": {d.Stream}, "field": {d.Field}}
	if d.Group != "" {
		links.Set("group", d.Group)
	}
	d.Charts.Links = chartLinks("/console/", links, win.Name)
	return d, nil
}
