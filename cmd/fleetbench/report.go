package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
)

// unit says how a figure's value reads and which way is better.
type unit string

const (
	perSecond unit = "/s"
	millis    unit = "ms"
	seconds   unit = "s"
	megabytes unit = "MB"
	kilobytes unit = "KB"
	bytesUnit unit = "B"
	kibibytes unit = "KiB"
	// mibPerSecond is a throughput of bytes.
	mibPerSecond unit = "MiB/s"
	sessionsUnit unit = "sessions"
)

// figure is one row of the table.
type figure struct {
	Scenario string  `json:"scenario"`
	Name     string  `json:"name"`
	Value    float64 `json:"value"`
	Unit     unit    `json:"unit"`
	// Baseline names the baseline figure compared with; Ratio is
	// Value / that baseline's value.
	Baseline string  `json:"baseline,omitempty"`
	Ratio    float64 `json:"ratio,omitempty"`
	// Goal is the target, set by judge: at least (AtLeast) or at most
	// Goal, of the ratio (GoalOf "ratio") or of the value itself. Zero
	// Goal: no target, the figure is information.
	Goal    float64 `json:"goal,omitempty"`
	GoalOf  string  `json:"goal_of,omitempty"`
	AtLeast bool    `json:"at_least,omitempty"`
	Met     *bool   `json:"met,omitempty"`
	// Unmeasured says why a figure with a target has no verdict (its
	// baseline could not be taken).
	Unmeasured string `json:"unmeasured,omitempty"`
	Note       string `json:"note,omitempty"`
	// Label is a baseline's short name, for the baseline column.
	Label string `json:"label,omitempty"`
}

// goal is a target (BENCHMARKS.md's table) for each database.
type goal struct {
	sqlite, postgres float64
	atLeast          bool
	// ofRatio: the target is of the figure's ratio to its baseline,
	// measured in the same run, not of its value.
	ofRatio bool
}

// report collects the figures of a run.
type report struct {
	Quick     bool      `json:"quick"`
	Database  string    `json:"database"`
	Started   time.Time `json:"started"`
	CPUs      int       `json:"cpus"`
	Figures   []*figure `json:"figures"`
	baselines map[string]*figure
}

func (r *report) add(f *figure) *figure {
	r.Figures = append(r.Figures, f)
	return f
}

// addBaseline records a baseline figure under name; its label is what the
// baseline column shows of it.
func (r *report) addBaseline(name, label string, f *figure) {
	f.Label = label
	if r.baselines == nil {
		r.baselines = map[string]*figure{}
	}
	f.Scenario = "baseline"
	r.baselines[name] = f
	r.add(f)
}

// compare sets f's ratio to the named baseline, if it was measured, and
// returns f.
func (r *report) compare(f *figure, name string) *figure {
	b, ok := r.baselines[name]
	if !ok || b.Value == 0 {
		return f
	}
	f.Baseline = b.Label
	f.Ratio = f.Value / b.Value
	return f
}

// judge sets f's target for the database of dialect ("postgres" or
// "sqlite") and whether it is met. A target of the ratio needs f compared
// with its baseline first; without the baseline the figure is marked
// unmeasured, why being unmeasured's text (or a generic one).
func judge(f *figure, dialect string, g goal, unmeasured string) {
	f.Goal, f.AtLeast, f.GoalOf = g.sqlite, g.atLeast, "value"
	if dialect == "postgres" {
		f.Goal = g.postgres
	}
	v := f.Value
	if g.ofRatio {
		f.GoalOf, v = "ratio", f.Ratio
		if f.Baseline == "" {
			if unmeasured == "" {
				unmeasured = "its baseline was not measured"
			}
			f.Unmeasured = unmeasured
			return
		}
	}
	met := v <= f.Goal
	if g.atLeast {
		met = v >= f.Goal
	}
	f.Met = &met
}

func (f *figure) value() string {
	switch f.Unit {
	case perSecond:
		return thousands(f.Value) + "/s"
	case millis:
		return fmt.Sprintf("%.2f ms", f.Value)
	case seconds:
		return fmt.Sprintf("%.2f s", f.Value)
	case megabytes:
		return fmt.Sprintf("%.0f MB", f.Value)
	case kilobytes:
		return fmt.Sprintf("%.2f KB", f.Value)
	case bytesUnit:
		return fmt.Sprintf("%.1f B", f.Value)
	case kibibytes:
		return fmt.Sprintf("%.1f KiB", f.Value)
	case mibPerSecond:
		return fmt.Sprintf("%.0f MiB/s", f.Value)
	case sessionsUnit:
		return thousands(f.Value) + " sessions"
	}
	return fmt.Sprint(f.Value)
}

// target shows the goal as the column it applies to shows it.
func (f *figure) target() string {
	if f.Goal == 0 {
		return ""
	}
	g := *f
	var s string
	if f.GoalOf == "ratio" {
		g.Ratio = f.Goal
		s = g.ratio()
	} else {
		g.Value = f.Goal
		s = g.value()
	}
	if f.AtLeast {
		return "≥ " + s
	}
	return "≤ " + s
}

func (f *figure) met() string {
	switch {
	case f.Unmeasured != "":
		return "not measured"
	case f.Met == nil:
		return ""
	case *f.Met:
		return "met"
	}
	return "NOT MET"
}

// ratio shows a throughput below its baseline's as a percentage, any other
// ratio as a multiple.
func (f *figure) ratio() string {
	if f.Ratio == 0 {
		return ""
	}
	if (f.Unit == perSecond || f.Unit == mibPerSecond) && f.Ratio < 1 {
		return fmt.Sprintf("%.0f%%", 100*f.Ratio)
	}
	return fmt.Sprintf("%.2f×", f.Ratio)
}

// print writes the table, then the verdict's count and the notes.
func (r *report) print(w io.Writer) {
	mode := "full"
	if r.Quick {
		mode = "quick: reduced sizes; targets are for the full run, met/not met is information only"
	}
	fmt.Fprintf(w, "\nfleetbench, %s, %d CPUs, %s (%s)\n\n", r.Database, r.CPUs, r.Started.Format("2006-01-02 15:04"), mode)
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tvalue\tbaseline\tratio\ttarget\tverdict")
	fmt.Fprintln(tw, "------\t-----\t--------\t-----\t------\t-------")
	counts := map[string]int{}
	for _, f := range r.Figures {
		name := f.Name
		if f.Scenario == "baseline" {
			name = "baseline " + f.Label + ": " + name
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", name, f.value(), f.Baseline, f.ratio(), f.target(), f.met())
		counts[f.met()]++
	}
	tw.Flush()
	if n := counts["met"] + counts["NOT MET"] + counts["not measured"]; n > 0 {
		fmt.Fprintf(w, "\ntargets: %d met, %d NOT MET, %d not measured, of %d\n", counts["met"], counts["NOT MET"], counts["not measured"], n)
	}
	var notes []string
	for _, f := range r.Figures {
		if f.Unmeasured != "" {
			notes = append(notes, fmt.Sprintf("  %s: not measured: %s", f.Name, f.Unmeasured))
		}
		if f.Note != "" {
			notes = append(notes, fmt.Sprintf("  %s: %s", f.Name, f.Note))
		}
	}
	if len(notes) > 0 {
		fmt.Fprintf(w, "\nNotes:\n%s\n", strings.Join(notes, "\n"))
	}
}

func (r *report) writeJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// thousands formats v rounded, with commas: 31245.6 -> "31,246".
func thousands(v float64) string {
	s := fmt.Sprintf("%d", int64(math.Round(v)))
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 && s[i-1] != '-' {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// cpuMeter measures, over a run, the CPU time fleetd and fleetbench used
// and how busy the whole machine was: on a small machine the load
// generator and anything else running take cores from fleetd.
type cpuMeter struct {
	pid          int
	start        time.Time
	fleetd, self float64 // CPU seconds at the start
	busy, total  float64 // machine-wide jiffies at the start
	// end holds what seconds reports once stop was called.
	end string
}

func startCPU(pid int) *cpuMeter {
	m := &cpuMeter{pid: pid, start: time.Now()}
	m.fleetd, m.self = procCPU(pid), procCPU(os.Getpid())
	m.busy, m.total = machineCPU()
	return m
}

// String says how many cores each used since the start.
func (m *cpuMeter) String() string {
	el := time.Since(m.start).Seconds()
	busy, total := machineCPU()
	s := fmt.Sprintf("CPU: fleetbench %.2f cores", (procCPU(os.Getpid())-m.self)/el)
	if m.pid != 0 {
		s += fmt.Sprintf(", fleetd %.2f cores", (procCPU(m.pid)-m.fleetd)/el)
	}
	if total > m.total {
		s += fmt.Sprintf(", machine %.0f%% busy", 100*(busy-m.busy)/(total-m.total))
	}
	return s
}

// stop ends the meter's measurement for seconds.
func (m *cpuMeter) stop() { m.end = m.seconds() }

// seconds says how many CPU seconds fleetbench and fleetd each used since
// the start, or until stop (on PostgreSQL the server's own are in
// neither): beside a time on a loaded machine, the work done.
func (m *cpuMeter) seconds() string {
	if m.end != "" {
		return m.end
	}
	s := fmt.Sprintf("CPU: fleetbench %.2f s", procCPU(os.Getpid())-m.self)
	if m.pid != 0 {
		s += fmt.Sprintf(", fleetd %.2f s", procCPU(m.pid)-m.fleetd)
	}
	if busy, total := machineCPU(); total > m.total {
		s += fmt.Sprintf(", machine %.0f%% busy", 100*(busy-m.busy)/(total-m.total))
	}
	return s
}

// procCPU returns a process's user and system CPU seconds, from
// /proc/PID/stat (in clock ticks of 1/100 s); 0 if unknown.
func procCPU(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name may hold spaces; the fields after it do not.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		s = s[i+1:]
	}
	f := strings.Fields(s)
	if len(f) < 13 {
		return 0
	}
	var utime, stime float64
	fmt.Sscan(f[11], &utime)
	fmt.Sscan(f[12], &stime)
	return (utime + stime) / 100
}

// selfCPU returns fleetbench's own CPU seconds (user and system, every
// thread), to the microsecond where procCPU counts in clock ticks.
func selfCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// machineCPU returns the machine's busy and total jiffies from /proc/stat.
func machineCPU() (busy, total float64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	for i, v := range f[1:] {
		var n float64
		fmt.Sscan(v, &n)
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, total
}

// commitMeter measures fleetd's group commit over a run (warm-up
// included, like cpuMeter), from the counters of its /metrics: how many
// transactions committed, how many writes and status reports each carried
// and how long each took from BEGIN to the end of COMMIT. It is how a
// throughput figure shows whether the write path batched.
type commitMeter struct {
	url       string
	start     time.Time
	at        map[string]float64 // nil if /metrics could not be read
	wal       map[string]float64 // nil on PostgreSQL or an older fleetd
	walFrames map[string]float64 // nil on PostgreSQL or an older fleetd
}

var commitCounters = []string{"fleetd_db_commits_total", "fleetd_db_write_jobs_total", "fleetd_db_commit_seconds_total", "fleetd_status_reports_total"}

// walCounters are SQLite's WAL restarts, read when fleetd has them, and
// walFrames the frames they copied or synced (a fleetd since 2026-11-26).
var (
	walCounters = []string{"fleetd_sqlite_wal_restarts_total", "fleetd_sqlite_wal_restart_seconds_total"}
	walFrames   = []string{"fleetd_sqlite_wal_restart_frames_total"}
)

func startCommits(ctx context.Context, url string) *commitMeter {
	at, _ := scrape(ctx, url, commitCounters)
	wal, _ := scrape(ctx, url, walCounters)
	frames, _ := scrape(ctx, url, walFrames)
	return &commitMeter{url: url, start: time.Now(), at: at, wal: wal, walFrames: frames}
}

// Note says the commits per second, writes per commit and mean commit
// time since the start; "" if /metrics could not be read.
func (m *commitMeter) Note(ctx context.Context) string {
	el := time.Since(m.start).Seconds()
	now, err := scrape(ctx, m.url, commitCounters)
	if err != nil || m.at == nil {
		return ""
	}
	commits := now[commitCounters[0]] - m.at[commitCounters[0]]
	if commits <= 0 {
		return "no commits"
	}
	jobs := now[commitCounters[1]] - m.at[commitCounters[1]]
	secs := now[commitCounters[2]] - m.at[commitCounters[2]]
	s := fmt.Sprintf("group commit: %.0f commits/s, %.1f store writes per commit", commits/el, jobs/commits)
	// The action service hands the store the reports of many callers as
	// one write.
	if reports := now[commitCounters[3]] - m.at[commitCounters[3]]; reports > 0 {
		s += fmt.Sprintf(" (%.1f status reports)", reports/commits)
	}
	s += fmt.Sprintf(", %.2f ms each BEGIN to COMMIT", 1000*secs/commits)
	if wal, err := scrape(ctx, m.url, walCounters); err == nil && m.wal != nil {
		if n := wal[walCounters[0]] - m.wal[walCounters[0]]; n > 0 {
			s += fmt.Sprintf("; %.0f WAL restarts, the commit loop waiting %.1f ms each", n, 1000*(wal[walCounters[1]]-m.wal[walCounters[1]])/n)
			if frames, err := scrape(ctx, m.url, walFrames); err == nil && m.walFrames != nil {
				s += fmt.Sprintf(" while %.0f frames were copied or synced", (frames[walFrames[0]]-m.walFrames[walFrames[0]])/n)
			}
		}
	}
	return s
}

// gcMeter counts the garbage collections of fleetd (from its /metrics) and
// of fleetbench over a measurement.
type gcMeter struct {
	url    string
	fleetd map[string]float64 // nil if /metrics could not be read
	here   uint64
}

const gcCounter = "go_gc_duration_seconds_count"

func startGCs(ctx context.Context, url string) *gcMeter {
	at, _ := scrape(ctx, url, []string{gcCounter})
	return &gcMeter{url: url, fleetd: at, here: gcCycles()}
}

// Note says how many collections fleetd and fleetbench ran since the start.
func (m *gcMeter) Note(ctx context.Context) string {
	here := gcCycles() - m.here
	now, err := scrape(ctx, m.url, []string{gcCounter})
	if err != nil || m.fleetd == nil {
		return fmt.Sprintf("fleetbench collected garbage %d times meanwhile", here)
	}
	return fmt.Sprintf("garbage collections meanwhile: fleetd %.0f, fleetbench %d", now[gcCounter]-m.fleetd[gcCounter], here)
}

// gcCycles is how many garbage collections this process has completed.
func gcCycles() uint64 {
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// scrape reads the named samples from fleetd's /metrics.
func scrape(ctx context.Context, url string, names []string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", url+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: status %d", resp.StatusCode)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), " ")
		if ok && slices.Contains(names, name) {
			out[name], _ = strconv.ParseFloat(v, 64)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for _, n := range names {
		if _, ok := out[n]; !ok {
			return nil, fmt.Errorf("/metrics has no %s", n)
		}
	}
	return out, nil
}

// settle waits until the whole machine has been quiet (under 15% busy)
// for a second, or for at most max, and returns how long it waited and
// whether the machine was quiet in the end. A latency figure taken while
// the previous scenario's background work still runs (SQLite copying a
// million-row dispatch's WAL back into the database, PostgreSQL's
// autovacuum) would measure that work as much as the requests. sample
// reads the machine's busy and total CPU time (machineCPU); 0 total means
// settle waits (a minute at most) for the machine to be quiet before a
// latency scenario measures, and says how that went, for its notes.
func (r *runner) settle(ctx context.Context, scenario string) string {
	r.p.say("%s: waiting for the machine to settle", scenario)
	waited, quiet := settle(ctx, time.Minute, machineCPU)
	if quiet {
		return fmt.Sprintf("; measured once the machine was quiet, after %s", waited)
	}
	return fmt.Sprintf("; the machine was still busy after %s", waited)
}

// it cannot be known.
func settle(ctx context.Context, max time.Duration, sample func() (busy, total float64)) (time.Duration, bool) {
	start := time.Now()
	waited := func() time.Duration { return time.Since(start).Round(time.Second) }
	for time.Since(start) < max {
		busy0, total0 := sample()
		if total0 == 0 {
			return waited(), false
		}
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
			return waited(), false
		}
		busy, total := sample()
		if total > total0 && (busy-busy0)/(total-total0) < 0.15 {
			return waited(), true
		}
	}
	return waited(), false
}
