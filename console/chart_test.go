package console

import (
	"math"
	"strings"
	"testing"
	"time"
)

var chartT0 = time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)

// hourSpec is an hour of minute buckets from chartT0.
func hourSpec() chartSpec {
	return chartSpec{Stream: "env", Field: "temp", From: chartT0, To: chartT0.Add(time.Hour), Interval: time.Minute, Ticks: "15:04"}
}

// minutes is a series with a bucket at each of the minutes given, value
// v[i] at minute m[i], its band v±1.
func minutes(m []int, v []float64) series {
	var s series
	for i := range m {
		s.Start = append(s.Start, chartT0.Add(time.Duration(m[i])*time.Minute))
		s.Avg = append(s.Avg, v[i])
		s.Min = append(s.Min, v[i]-1)
		s.Max = append(s.Max, v[i]+1)
	}
	return s
}

// TestDrawChartCoordinates: a bucket's time maps to x across the plot
// (its middle), its value to y from the lowest (the plot's bottom) to the
// highest (its top), over the band's extent.
func TestDrawChartCoordinates(t *testing.T) {
	c := drawChart(hourSpec(), minutes([]int{0, 1, 2}, []float64{10, 20, 30}))
	if c.Empty || c.Key != "env/temp" || c.Title != "env · temp" {
		t.Fatalf("chart = %+v", c)
	}
	// The y range is the band's: 9 to 31. Minute 0's middle is 30 s in:
	// 64 + 568 × 30/3600 = 68.7; its average 10 is at 154 - 144 × 1/22.
	x0, x1, x2 := 64+568*30.0/3600, 64+568*90.0/3600, 64+568*150.0/3600
	y := func(v float64) float64 { return 154 - 144*(v-9)/22 }
	want := "M" + coord(x0) + " " + coord(y(10)) + " L" + coord(x1) + " " + coord(y(20)) + " L" + coord(x2) + " " + coord(y(30))
	if c.Line != want {
		t.Errorf("line = %q\nwant   %q", c.Line, want)
	}
	wantBand := "M" + coord(x0) + " " + coord(y(11)) + " L" + coord(x1) + " " + coord(y(21)) + " L" + coord(x2) + " " + coord(y(31)) +
		" L" + coord(x2) + " " + coord(y(29)) + " L" + coord(x1) + " " + coord(y(19)) + " L" + coord(x0) + " " + coord(y(9)) + " Z"
	if c.Band != wantBand {
		t.Errorf("band = %q\nwant   %q", c.Band, wantBand)
	}
	if len(c.Y) != 3 || c.Y[0].Label != "9" || c.Y[1].Label != "20" || c.Y[2].Label != "31" || c.Y[0].Pos != 154 || c.Y[2].Pos != 10 {
		t.Errorf("y ticks = %+v", c.Y)
	}
	if len(c.X) != 5 || c.X[0].Label != "12:00" || c.X[0].Pos != 64 || c.X[2].Label != "12:30" || c.X[4].Label != "13:00" || c.X[4].Pos != 632 {
		t.Errorf("x ticks = %+v", c.X)
	}
	if c.Summary != "Last average 30; lowest 9, highest 31." {
		t.Errorf("summary = %q", c.Summary)
	}
}

// TestDrawChartGapsAndEdges: a silence longer than a tenth of the span
// breaks the line, a lone bucket is a dot, a bucket that starts before
// the span is drawn at its left edge, a constant value gets a range
// around it, and values that are not finite are gaps.
func TestDrawChartGapsAndEdges(t *testing.T) {
	c := drawChart(hourSpec(), minutes([]int{0, 5, 30}, []float64{1, 2, 3}))
	if strings.Count(c.Line, "M") != 2 || !strings.HasSuffix(c.Line, "h0") {
		t.Errorf("a 25-minute gap does not break the line, or the lone bucket is no dot: %q", c.Line)
	}
	if strings.Count(c.Band, "Z") != 2 {
		t.Errorf("band = %q, want two shapes", c.Band)
	}

	s := minutes([]int{-5, 10}, []float64{7, 7})
	s.Min, s.Max = []float64{7, 7}, []float64{7, 7}
	c = drawChart(hourSpec(), s)
	if !strings.HasPrefix(c.Line, "M64.0 ") {
		t.Errorf("a bucket before the span is not at the left edge: %q", c.Line)
	}
	if c.Y[0].Label != "6" || c.Y[2].Label != "8" || strings.Contains(c.Line, "NaN") {
		t.Errorf("a constant 7: y ticks %+v, line %q", c.Y, c.Line)
	}

	s = minutes([]int{0, 1, 2, 3}, []float64{1, math.NaN(), math.Inf(1), 4})
	s.Min[3], s.Max[3] = math.Inf(-1), math.NaN()
	c = drawChart(hourSpec(), s)
	for _, text := range []string{c.Line, c.Band, c.Summary, c.Y[0].Label, c.Y[2].Label} {
		if strings.Contains(text, "NaN") || strings.Contains(text, "Inf") {
			t.Fatalf("a value that is not finite reached the chart: %+v", c)
		}
	}
	if strings.Count(c.Line, "M") != 2 || c.Summary != "Last average 4; lowest 0, highest 4." {
		t.Errorf("not-finite buckets: line %q, summary %q", c.Line, c.Summary)
	}

	c = drawChart(hourSpec(), series{})
	if !c.Empty || c.Line != "" || c.Band != "" || len(c.Y) != 3 || len(c.X) != 5 || !strings.Contains(c.Summary, "No numeric value of temp") {
		t.Errorf("empty chart = %+v", c)
	}
}

// TestChartMarkers: a moment in the span is marked at its x; one outside
// is not.
func TestChartMarkers(t *testing.T) {
	spec := hourSpec()
	spec.Markers = []chartMarker{{chartT0.Add(30 * time.Minute), "opened"}, {chartT0.Add(2 * time.Hour), "ended"}}
	c := drawChart(spec, minutes([]int{1}, []float64{1}))
	if len(c.Markers) != 1 || c.Markers[0].Pos != 348 || c.Markers[0].Label != "opened" {
		t.Errorf("markers = %+v", c.Markers)
	}
}

func TestFormatValue(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 1: "1", 21.456: "21.46", -0.5: "-0.5", 1234.5678: "1235", 0.000012: "1.2e-05",
		2.5e10: "2.5e+10", 999999: "999999", -0.00001: "-1e-05", 1e-3: "0.001"} {
		if got := formatValue(v); got != want {
			t.Errorf("formatValue(%v) = %q, want %q", v, got, want)
		}
	}
}

// TestChartTemplateEscapes: a field named with markup is text in the
// chart's caption, label and data attribute, never markup.
func TestChartTemplateEscapes(t *testing.T) {
	pages := parsePages()
	spec := hourSpec()
	spec.Field = `<script>alert(1)</script>"x`
	c := drawChart(spec, minutes([]int{0, 1}, []float64{1, 2}))
	var b strings.Builder
	err := pages["device"].ExecuteTemplate(&b, "charts", &chartsData{Heading: "Charts", Charts: []chart{c}, Live: "/x?chart=hour", Blank: blankChart()})
	if err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if strings.Contains(out, "<script>") || !strings.Contains(out, "&lt;script&gt;alert(1)&lt;/script&gt;&#34;x") {
		t.Errorf("the field's markup is not escaped:\n%s", out)
	}
	if !strings.Contains(out, `<path class="line" d="`+c.Line+`"/>`) {
		t.Errorf("the line's path is not drawn as computed:\n%s", out)
	}
	if !strings.Contains(out, "<template data-chart-template>") {
		t.Errorf("a live section has no blank chart:\n%s", out)
	}
}

// TestNumericFields: integers and doubles are charted; text, booleans and
// objects are not.
func TestNumericFields(t *testing.T) {
	got := numericFields(map[string]any{"b": 1.5, "a": int64(2), "s": "x", "t": true, "o": map[string]any{"x": 1.0}, "n": nil})
	if strings.Join(got, ",") != "a,b" {
		t.Errorf("numericFields = %v", got)
	}
}
