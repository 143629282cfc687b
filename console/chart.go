package console

import (
	"context"
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fleetd/fleet"
)

// Charts (docs/console.md, "Charts") are drawn on the server as SVG: a
// line of each bucket's average and a band from its minimum to its
// maximum, read in one aggregate of stream history (rollups, so a
// week reads 168 hour rollups, never raw points). A chart's geometry is
// computed here; the template draws it, and a live page's script moves
// the same elements to the geometry an event brings.

// chartWindow is a span a chart shows and the buckets it reads.
type chartWindow struct {
	Name     string // the chart parameter
	Label    string
	Span     time.Duration
	Interval time.Duration // whole minutes or hours: read from rollups
	Ticks    string        // time layout of the x axis' labels
}

// chartWindows are the spans a chart offers; the first is the default.
var chartWindows = []chartWindow{
	{"hour", "Last hour", time.Hour, time.Minute, "15:04"},
	{"day", "Last day", 24 * time.Hour, 10 * time.Minute, "15:04"},
	{"week", "Last week", 7 * 24 * time.Hour, time.Hour, "Mon 15:04"},
}

// readChartWindow reads the chart parameter: absent is the last hour.
func readChartWindow(s string) (chartWindow, error) {
	if s == "" {
		return chartWindows[0], nil
	}
	for _, w := range chartWindows {
		if w.Name == s {
			return w, nil
		}
	}
	return chartWindow{}, fleet.FieldErrors(map[string]string{"chart": "must be one of hour, day, week"})
}

// The SVG's coordinates: a viewBox of chartW × chartH, the plot inside the
// margins, the y axis' labels left of it and the x axis' below.
const (
	chartW, chartH           = 640, 180
	plotLeft, plotRight      = 64, 632
	plotTop, plotBottom      = 10, 154
	chartYTicks, chartXTicks = 3, 5
	// chartGapShare: a gap longer than this share of the span (a tenth)
	// breaks the line.
	chartGapShare = 10
	// maxCharts bounds the charts of a page: each is a read.
	maxCharts = 24
	// chartLiveInterval is how often a live chart is read again: rollups
	// are merged about once a second.
	chartLiveInterval = time.Second
)

// chart is one chart's geometry and text, as the template draws it and a
// live event carries it.
type chart struct {
	Key   string `json:"key"`   // stream and field: which chart an event moves
	Title string `json:"title"` // stream · field
	Line  string `json:"line"`  // the path of the averages
	Band  string `json:"band"`  // the path of the minimum-to-maximum band
	Y     []tick `json:"y"`     // chartYTicks labels of the y axis, bottom to top
	X     []tick `json:"x"`     // chartXTicks labels of the x axis
	// Markers are moments drawn across the plot (an alert's start and end).
	Markers []tick `json:"markers,omitempty"`
	// Summary says in words what the chart shows, for screen readers and
	// the empty state.
	Summary string `json:"summary"`
	Empty   bool   `json:"empty"`
}

// tick is a label at a coordinate of its axis.
type tick struct {
	Pos   float64 `json:"pos"`
	Label string  `json:"label"`
}

// series is one chart's buckets: the average, minimum and maximum of a
// field in each.
type series struct {
	Start         []time.Time
	Avg, Min, Max []float64
}

// chartSpec says what to chart: a stream's field over [From, To) in
// buckets of Interval.
type chartSpec struct {
	Stream, Field string
	Group         string // fleet-wide only: the devices of this group
	From, To      time.Time
	Interval      time.Duration
	Ticks         string // layout of the x axis' labels
	Markers       []chartMarker
}

// chartMarker is a moment to mark on a chart.
type chartMarker struct {
	At    time.Time
	Label string
}

// chartKey names a chart of a stream's field.
func chartKey(stream, field string) string { return stream + "/" + field }

// drawChart computes the chart of s's buckets.
func drawChart(spec chartSpec, s series) chart {
	c := chart{Key: chartKey(spec.Stream, spec.Field), Title: spec.Stream + " · " + spec.Field}
	from, to := float64(spec.From.UnixMilli()), float64(spec.To.UnixMilli())
	xOf := func(t time.Time) float64 {
		ms := min(max(float64(t.UnixMilli()), from), to)
		return plotLeft + (ms-from)/(to-from)*(plotRight-plotLeft)
	}
	for i := range chartXTicks {
		at := spec.From.Add(time.Duration(int64(spec.To.Sub(spec.From)) * int64(i) / (chartXTicks - 1)))
		c.X = append(c.X, tick{Pos: round(xOf(at)), Label: at.UTC().Format(spec.Ticks)})
	}
	for _, m := range spec.Markers {
		if !m.At.Before(spec.From) && !m.At.After(spec.To) {
			c.Markers = append(c.Markers, tick{Pos: round(xOf(m.At)), Label: m.Label})
		}
	}
	// Buckets whose values are not finite (a sum past the largest
	// double) are left out, as gaps.
	lo, hi, n := math.Inf(1), math.Inf(-1), 0
	var last float64
	for i := range s.Start {
		if !finite(s.Avg[i]) {
			continue
		}
		bmin, bmax := bandOf(s, i)
		lo, hi, n, last = min(lo, bmin), max(hi, bmax), n+1, s.Avg[i]
	}
	if n == 0 {
		c.Empty = true
		c.Summary = "No numeric value of " + spec.Field + " in this time."
		for i := range chartYTicks {
			c.Y = append(c.Y, tick{Pos: yTickPos(i), Label: ""})
		}
		return c
	}
	c.Summary = "Last average " + formatValue(last) + "; lowest " + formatValue(lo) + ", highest " + formatValue(hi) + "."
	if lo == hi {
		pad := math.Max(math.Abs(lo)*0.1, 1)
		lo, hi = lo-pad, hi+pad
	}
	yOf := func(v float64) float64 {
		return plotBottom - (v-lo)/(hi-lo)*(plotBottom-plotTop)
	}
	for i := range chartYTicks {
		v := lo + (hi-lo)*float64(i)/(chartYTicks-1)
		c.Y = append(c.Y, tick{Pos: yTickPos(i), Label: formatValue(v)})
	}
	var line, band strings.Builder
	gap := spec.To.Sub(spec.From) / chartGapShare
	var run []int // the buckets of the line's current stretch
	flush := func() {
		drawRun(&line, &band, s, run, spec, xOf, yOf)
		run = run[:0]
	}
	for i := range s.Start {
		if !finite(s.Avg[i]) {
			flush()
			continue
		}
		if len(run) > 0 && s.Start[i].Sub(s.Start[run[len(run)-1]]) > max(gap, spec.Interval) {
			flush()
		}
		run = append(run, i)
	}
	flush()
	c.Line, c.Band = strings.TrimSpace(line.String()), strings.TrimSpace(band.String())
	return c
}

// drawRun adds a stretch of consecutive buckets to the line and the band.
// A stretch of one bucket is a dot and a bar a few units wide.
func drawRun(line, band *strings.Builder, s series, run []int, spec chartSpec, xOf func(time.Time) float64, yOf func(float64) float64) {
	if len(run) == 0 {
		return
	}
	const barHalf = 1.5
	mid := func(i int) float64 { return xOf(s.Start[i].Add(spec.Interval / 2)) }
	for j, i := range run {
		cmd := "L"
		if j == 0 {
			cmd = "M"
		}
		line.WriteString(cmd + coord(mid(i)) + " " + coord(yOf(s.Avg[i])) + " ")
	}
	if len(run) == 1 {
		i := run[0]
		line.WriteString("h0 ") // drawn as a dot: the line's caps are round
		bmin, bmax := bandOf(s, i)
		x := mid(i)
		band.WriteString("M" + coord(x-barHalf) + " " + coord(yOf(bmax)) + " H" + coord(x+barHalf) +
			" V" + coord(yOf(bmin)) + " H" + coord(x-barHalf) + " Z ")
		return
	}
	for j, i := range run {
		cmd := "L"
		if j == 0 {
			cmd = "M"
		}
		_, bmax := bandOf(s, i)
		band.WriteString(cmd + coord(mid(i)) + " " + coord(yOf(bmax)) + " ")
	}
	for j := len(run) - 1; j >= 0; j-- {
		bmin, _ := bandOf(s, run[j])
		band.WriteString("L" + coord(mid(run[j])) + " " + coord(yOf(bmin)) + " ")
	}
	band.WriteString("Z ")
}

// bandOf is bucket i's minimum and maximum, the average where either is
// not finite.
func bandOf(s series, i int) (float64, float64) {
	lo, hi := s.Min[i], s.Max[i]
	if !finite(lo) {
		lo = s.Avg[i]
	}
	if !finite(hi) {
		hi = s.Avg[i]
	}
	return min(lo, s.Avg[i]), max(hi, s.Avg[i])
}

// yTickPos is the baseline of the y axis' label i, bottom to top.
func yTickPos(i int) float64 {
	return round(plotBottom - float64(i)*(plotBottom-plotTop)/(chartYTicks-1))
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func round(v float64) float64 { return math.Round(v*10) / 10 }

func coord(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

// formatValue is a value for a person: at most four significant digits,
// without an exponent between a thousandth and a billion.
func formatValue(v float64) string {
	a := math.Abs(v)
	if a != 0 && (a < 1e-3 || a >= 1e9) {
		return strconv.FormatFloat(v, 'g', 4, 64)
	}
	decimals := 0
	if a > 0 {
		decimals = max(0, 4-1-int(math.Floor(math.Log10(a))))
	}
	s := strconv.FormatFloat(v, 'f', decimals, 64)
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	if s == "-0" {
		s = "0"
	}
	return s
}

// drawCharts reads and draws the charts of specs over a device's streams,
// or with device "" over the tenant's devices: one read of each stream's
// fields (specs of a stream share their span, interval and group).
func drawCharts(ctx context.Context, h fleet.HistoryService, tenant, device string, specs []chartSpec) ([]chart, error) {
	fields := map[string][]string{}
	var streams []string
	for _, spec := range specs {
		if fields[spec.Stream] == nil {
			streams = append(streams, spec.Stream)
		}
		fields[spec.Stream] = append(fields[spec.Stream], spec.Field)
	}
	read := map[string]map[string][]fleet.BucketStats{}
	for _, stream := range streams {
		spec := specs[slices.IndexFunc(specs, func(s chartSpec) bool { return s.Stream == stream })]
		stats, err := h.AggregateStats(ctx, tenant, device, stream, fields[stream],
			fleet.AggregateQuery{Interval: spec.Interval, From: spec.From, To: spec.To, Group: spec.Group})
		if err != nil {
			return nil, err
		}
		read[stream] = stats
	}
	charts := make([]chart, 0, len(specs))
	for _, spec := range specs {
		var s series
		for _, b := range read[spec.Stream][spec.Field] {
			s.Start = append(s.Start, b.Start)
			s.Avg, s.Min, s.Max = append(s.Avg, b.Avg), append(s.Min, b.Min), append(s.Max, b.Max)
		}
		charts = append(charts, drawChart(spec, s))
	}
	return charts, nil
}

// numericFields are the names of a point's numeric fields, sorted.
func numericFields(data map[string]any) []string {
	var out []string
	for _, k := range sortedKeys(data) {
		switch v := data[k].(type) {
		case float64, float32, int, int32, int64, uint, uint32, uint64:
			out = append(out, k)
		case json.Number:
			if _, err := v.Float64(); err == nil {
				out = append(out, k)
			}
		}
	}
	return out
}
