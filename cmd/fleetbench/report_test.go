package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	var l latencies
	for i := 1; i <= 100; i++ {
		l = append(l, time.Duration(i)*time.Millisecond)
	}
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{
		{50, 50 * time.Millisecond},
		{99, 99 * time.Millisecond},
		{100, 100 * time.Millisecond},
		{0.1, 1 * time.Millisecond},
	} {
		if got := l.percentile(tc.p); got != tc.want {
			t.Errorf("p%v = %v, want %v", tc.p, got, tc.want)
		}
	}
	if got := (latencies{}).percentile(99); got != 0 {
		t.Errorf("p99 of nothing = %v, want 0", got)
	}
}

func TestThousands(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 999: "999", 1000: "1,000", 31245.6: "31,246", 1000000: "1,000,000", -1234: "-1,234"} {
		if got := thousands(v); got != want {
			t.Errorf("thousands(%v) = %q, want %q", v, got, want)
		}
	}
}

// TestJudge checks verdicts: of the ratio to a baseline where the target is
// a ratio, with the target of the database under test, of the value where
// it is not, and none without the baseline or without a target.
func TestJudge(t *testing.T) {
	var r report
	r.addBaseline("mosquitto", "Mosquitto", &figure{Name: "Mosquitto", Value: 50_000, Unit: perSecond})
	r.addBaseline("hello-p99", "hello p99", &figure{Name: "its p99", Value: 4, Unit: millis})
	for _, tc := range []struct {
		name     string
		f        *figure
		baseline string
		dialect  string
		g        goal
		target   string
		met      string
		ratio    string
	}{
		{"throughput, SQLite", &figure{Value: 28_000, Unit: perSecond}, "mosquitto", "sqlite", goalMQTT, "≥ 60%", "NOT MET", "56%"},
		{"throughput, PostgreSQL", &figure{Value: 20_000, Unit: perSecond}, "mosquitto", "postgres", goalMQTT, "≥ 30%", "met", "40%"},
		{"latency, SQLite", &figure{Value: 9, Unit: millis}, "hello-p99", "sqlite", goalS10P99, "≤ 2.00×", "NOT MET", "2.25×"},
		{"latency, PostgreSQL", &figure{Value: 9, Unit: millis}, "hello-p99", "postgres", goalS10P99, "≤ 3.00×", "met", "2.25×"},
		{"no baseline", &figure{Value: 20_000, Unit: perSecond}, "absent", "sqlite", goalMQTT, "≥ 60%", "not measured", ""},
		{"a value", &figure{Value: 301, Unit: megabytes}, "", "sqlite", goalMemory, "≤ 300 MB", "NOT MET", ""},
		{"information", &figure{Value: 9, Unit: millis}, "hello-p99", "sqlite", goal{}, "", "", "2.25×"},
	} {
		f := r.add(tc.f)
		if tc.baseline != "" {
			r.compare(f, tc.baseline)
		}
		if tc.g != (goal{}) {
			judge(f, tc.dialect, tc.g, "")
		}
		if f.target() != tc.target || f.met() != tc.met || f.ratio() != tc.ratio {
			t.Errorf("%s: target %q, %q, ratio %q; want %q, %q, %q", tc.name, f.target(), f.met(), f.ratio(), tc.target, tc.met, tc.ratio)
		}
	}
	var out strings.Builder
	r.print(&out)
	for _, want := range []string{"targets: 2 met, 3 NOT MET, 1 not measured, of 6", "not measured: its baseline was not measured"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the table lacks %q:\n%s", want, out.String())
		}
	}
}

// TestCommitMeter reads the group commit from a /metrics that moves
// between two scrapes, and says nothing when /metrics lacks a counter.
func TestCommitMeter(t *testing.T) {
	var scrapes atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		n := float64(scrapes.Add(1) - 1) // 0, then 1
		fmt.Fprintf(w, "# HELP fleetd_db_commits_total x\nfleetd_db_commits_total %g\n", 100*n)
		fmt.Fprintf(w, "fleetd_db_write_jobs_total %g\nfleetd_db_commit_seconds_total %g\n", 150*n, 0.2*n)
		fmt.Fprintf(w, "fleetd_status_reports_total %g\nfleetd_db_commits_total_other 7\n", 2500*n)
	}))
	defer srv.Close()
	ctx := context.Background()
	m := startCommits(ctx, srv.URL)
	got := m.Note(ctx)
	for _, want := range []string{"1.5 store writes per commit", "(25.0 status reports)", "2.00 ms each"} {
		if !strings.Contains(got, want) {
			t.Errorf("%q lacks %q", got, want)
		}
	}

	bare := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "fleetd_db_commits_total 3")
	}))
	defer bare.Close()
	if got := startCommits(ctx, bare.URL).Note(ctx); got != "" {
		t.Errorf("without all the counters: %q, want nothing", got)
	}
	if got, err := scrape(ctx, "http://127.0.0.1:1", commitCounters); err == nil {
		t.Errorf("scrape of nothing listening = %v, want an error", got)
	}
	if _, err := scrape(ctx, bare.URL, commitCounters); err == nil || !strings.Contains(err.Error(), "fleetd_db_write_jobs_total") {
		t.Errorf("scrape without a counter: %v, want it named", err)
	}
}

// TestSettle follows the machine's CPU through settle's three endings.
func TestSettle(t *testing.T) {
	ctx := context.Background()
	samples := func(busyPerSample ...float64) func() (float64, float64) {
		var busy, total float64
		i := 0
		return func() (float64, float64) {
			if i < len(busyPerSample) {
				busy += busyPerSample[i]
				total += 100
				i++
			}
			return busy, total
		}
	}
	if _, quiet := settle(ctx, time.Minute, samples(0, 5)); !quiet {
		t.Error("a machine 5% busy is not quiet")
	}
	if waited, quiet := settle(ctx, 1500*time.Millisecond, samples(0, 90, 90, 90, 90)); quiet || waited < time.Second {
		t.Errorf("a busy machine: waited %v, quiet %v; want the limit and not quiet", waited, quiet)
	}
	if waited, quiet := settle(ctx, time.Minute, func() (float64, float64) { return 0, 0 }); quiet || waited != 0 {
		t.Errorf("no /proc/stat: waited %v, quiet %v; want no wait", waited, quiet)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, quiet := settle(cancelled, time.Minute, samples(0, 0)); quiet {
		t.Error("a cancelled wait said quiet")
	}
}
