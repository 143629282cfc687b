package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Stream history (docs/telemetry.md): every point a device sends is kept
// for a retention, in partitions of a day that expire whole, with
// 1-minute, 10-minute and 1-hour rollups of its numeric fields kept
// longer.

// Retention defaults and bounds (docs/telemetry.md).
const (
	DefaultStreamRetention = 30 * 24 * time.Hour
	MinStreamRetention     = 24 * time.Hour
	MaxStreamRetention     = 10 * 365 * 24 * time.Hour
	// FutureHorizon is how far past the clock a point's timestamp may be
	// and still be kept in history.
	FutureHorizon = 24 * time.Hour
	// MinuteRollupRetention, TenMinuteRollupRetention and
	// HourRollupRetention are how long rollups are kept at least; never
	// less than the raw retention.
	MinuteRollupRetention    = 90 * 24 * time.Hour
	TenMinuteRollupRetention = 180 * 24 * time.Hour
	HourRollupRetention      = 400 * 24 * time.Hour
)

// Reasons a point is not kept in history, as metrics label them.
const (
	RejectExpired = "expired" // older than the retention when it arrived
	RejectFuture  = "future"  // more than FutureHorizon past the clock
)

// StreamInfo describes one stream of a device's history.
type StreamInfo struct {
	Name           string    `json:"name"`
	Points         int64     `json:"points" doc:"points kept"`
	FirstTimestamp time.Time `json:"first_timestamp"`
	LastTimestamp  time.Time `json:"last_timestamp"`
}

// HistoryPoint is a point as history keeps it. Data is the canonical JSON
// text of the point's data as it was kept: a page of points is answered
// without decoding each point's data into values and encoding it again.
type HistoryPoint struct {
	Timestamp  time.Time       `json:"timestamp"`
	Sequence   int64           `json:"sequence"`
	Data       json.RawMessage `json:"data" doc:"the point's data, a JSON object"`
	ReceivedAt time.Time       `json:"received_at"`
}

// Values returns the point's data as canonical values.
func (p HistoryPoint) Values() (map[string]any, error) {
	v, err := ParseCanonical(p.Data)
	if err != nil {
		return nil, err
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("fleet: a point's data is %T, not an object", v)
	}
	return m, nil
}

// PointQuery selects a range of a stream's points, a page at a time.
type PointQuery struct {
	From, To time.Time // [From, To); zero: unbounded
	Desc     bool      // newest first
	Limit    int
	Cursor   string // from PointPage.Next; "" for the first page
}

// PointPage is a page of points and the cursor of the next, "" after the
// last; End is the cursor after its last point, to read on from as more
// arrive ("" for an empty page).
type PointPage struct {
	Points    []HistoryPoint
	Next, End string
}

// pagePoints are the Points of released pages, to reuse: a page of 1000
// points is 80 KB, and a day's read of 87 such pages allocated 7 MB,
// about 40% of what fleetd allocated for it (docs/benchmarks-notebook.md,
// "A day's read: fleetd's CPU a page").
var pagePoints sync.Pool

// NewPointPage returns an empty page whose Points have room for n points,
// from a page released before when one is at hand.
func NewPointPage(n int) *PointPage {
	if b, _ := pagePoints.Get().(*[]HistoryPoint); b != nil {
		if cap(*b) >= n {
			return &PointPage{Points: (*b)[:0]}
		}
		pagePoints.Put(b)
	}
	return &PointPage{Points: make([]HistoryPoint, 0, n)}
}

// Release gives the page's Points to a later NewPointPage: whoever got
// the page is done with them and with their Data, and keeps neither. A
// page that is not released is collected as any other value.
func (p *PointPage) Release() {
	if p == nil || cap(p.Points) == 0 || cap(p.Points) > MaxLimit {
		return
	}
	b := p.Points[:cap(p.Points)]
	clear(b) // the pool holds no point's Data
	b, p.Points = b[:0], nil
	pagePoints.Put(&b)
}

// Aggregate functions.
const (
	AggAvg   = "avg"
	AggMin   = "min"
	AggMax   = "max"
	AggSum   = "sum"
	AggCount = "count"
	AggLast  = "last"
)

// AggregateFuncs lists the aggregate functions.
var AggregateFuncs = []string{AggAvg, AggMin, AggMax, AggSum, AggCount, AggLast}

// Limits of an aggregate (docs/telemetry.md).
const (
	MaxBuckets = 10_000
	// MaxSeriesBuckets bounds the buckets of all the series of one
	// fleet-wide aggregate by device (devices × buckets), which are held
	// in memory until the answer is written.
	MaxSeriesBuckets = 100_000
	// MaxRawRange is the longest range an interval under a minute may
	// cover: only those read raw points.
	MaxRawRange = 6 * time.Hour
)

// AggregateQuery asks for one numeric field of a stream aggregated by fn in
// buckets of Interval aligned to the Unix epoch (so to UTC midnight when
// Interval divides a day), over the buckets [From, To) touches.
type AggregateQuery struct {
	Field    string
	Fn       string
	Interval time.Duration
	From, To time.Time
	// Fleet-wide only: the devices whose metadata has these values and
	// that are in Group (a group's name, docs/twin.md) when it is set, and
	// one series per device.
	Metadata map[string]string
	Group    string
	ByDevice bool
}

// Bucket is one interval's aggregate; buckets without points are left out.
type Bucket struct {
	Start time.Time `json:"start"`
	Value float64   `json:"value"`
	Count int64     `json:"count" doc:"numeric values of the field in the bucket"`
}

// BucketStats is one interval's count, average, minimum and maximum of a
// field: what a chart draws (its line and band) from one read.
type BucketStats struct {
	Start         time.Time
	Count         int64
	Avg, Min, Max float64
}

// DeviceSeries is one device's buckets in a fleet-wide aggregate by device.
type DeviceSeries struct {
	DeviceID string   `json:"device_id"`
	Buckets  []Bucket `json:"buckets"`
}

// HistoryService reads stream history. Every method is scoped by tenant; an
// unknown device is ENOTFOUND.
type HistoryService interface {
	// FindStreams lists the streams a device has points of, by name.
	FindStreams(ctx context.Context, tenant, device string) ([]StreamInfo, error)
	// FindPoints returns a page of a stream's points in (timestamp,
	// sequence) order. A cursor stays valid while points arrive: the next
	// page starts after the last point returned.
	FindPoints(ctx context.Context, tenant, device, stream string, q PointQuery) (*PointPage, error)
	// Aggregate aggregates a device's stream.
	Aggregate(ctx context.Context, tenant, device, stream string, q AggregateQuery) ([]Bucket, error)
	// AggregateFleet aggregates a stream over the tenant's devices
	// matching q.Metadata: one series, or one per device with q.ByDevice.
	AggregateFleet(ctx context.Context, tenant, stream string, q AggregateQuery) ([]Bucket, []DeviceSeries, error)
	// AggregateStats returns, by field, each bucket's count, average,
	// minimum and maximum of each of fields over a device's stream, or with
	// device "" over the tenant's devices q.Metadata and q.Group select
	// (q.Field, q.Fn and q.ByDevice are not used), in one read.
	AggregateStats(ctx context.Context, tenant, device, stream string, fields []string, q AggregateQuery) (map[string][]BucketStats, error)
	// StreamRetention returns the tenant's retention and whether it is the
	// tenant's own; SetStreamRetention sets it (0: the server's default).
	StreamRetention(ctx context.Context, tenant string) (time.Duration, bool, error)
	SetStreamRetention(ctx context.Context, tenant string, d time.Duration) error
}

// LogStream is the stream the uplink agent sends its device's logs on,
// each point a LogEntry: level, log_timestamp, tag, message, line.
const LogStream = "logs"

// LogLine is a point of the logs stream read as a log line.
type LogLine struct {
	Timestamp    time.Time `json:"timestamp"`
	Level        string    `json:"level"`
	Tag          string    `json:"tag"`
	Message      string    `json:"message"`
	Line         string    `json:"line,omitempty" doc:"where the line was logged, when the device says"`
	LogTimestamp string    `json:"log_timestamp,omitempty" doc:"the time the device's logger wrote, as it wrote it"`
}

// logLevels ranks the levels loggers name, lower case, least severe
// first; journald's priorities and Android's logcat letters are among them.
var logLevels = map[string]int{
	"trace": 0, "verbose": 0, "v": 0,
	"debug": 1, "d": 1,
	"info": 2, "i": 2, "notice": 2,
	"warn": 3, "warning": 3, "w": 3,
	"error": 4, "err": 4, "e": 4,
	"critical": 5, "crit": 5, "fatal": 5, "alert": 5, "emerg": 5, "emergency": 5, "f": 5, "a": 5,
}

// LogLevels lists the levels a filter may name.
var LogLevels = []string{"trace", "debug", "info", "warn", "error", "critical"}

// LogQuery selects log lines: those of [From, To) at MinLevel or above
// whose message, tag or line contains Contains (ignoring case), Limit at
// a time, after Cursor.
type LogQuery struct {
	From, To time.Time
	MinLevel string
	Contains string
	Limit    int
	Cursor   string
}

// maxLogScan bounds the points one read of logs looks at: a filter that
// matches little answers with fewer lines and a cursor to go on from.
const maxLogScan = 20_000

// LogPage is a page of log lines, oldest first. Next is the cursor of the
// next page, "" when every line kept so far was read; Resume is where to
// read on from once more lines arrive.
type LogPage struct {
	Lines        []LogLine
	Next, Resume string
}

// ReadLogs returns a page of a device's log lines.
func ReadLogs(ctx context.Context, h HistoryService, tenant, device string, q LogQuery) (*LogPage, error) {
	keep, err := logFilter(q)
	if err != nil {
		return nil, err
	}
	out := &LogPage{Lines: []LogLine{}, Resume: q.Cursor}
	pq := PointQuery{From: q.From, To: q.To, Limit: MaxLimit, Cursor: q.Cursor}
	for scanned := 0; scanned < maxLogScan; {
		page, err := h.FindPoints(ctx, tenant, device, LogStream, pq)
		if err != nil {
			return nil, err
		}
		for i, p := range page.Points {
			l := logLine(p)
			if keep(l) {
				out.Lines = append(out.Lines, l)
				if len(out.Lines) == q.Limit && i < len(page.Points)-1 {
					// Resume after this point: read the page again up to it.
					pq.Limit = i + 1
					if page, err = h.FindPoints(ctx, tenant, device, LogStream, pq); err != nil {
						return nil, err
					}
					out.Next, out.Resume = page.Next, page.End
					return out, nil
				}
			}
		}
		scanned += len(page.Points)
		if page.End != "" {
			out.Resume = page.End
		}
		out.Next = page.Next
		if page.Next == "" || len(out.Lines) == q.Limit {
			return out, nil
		}
		pq.Cursor = page.Next
	}
	return out, nil
}

// ReadRecentLogs returns the newest q.Limit lines of [q.From, q.To) that
// q's level and text keep, newest first, looking at maxLogScan points at
// most; q.Cursor is not used.
func ReadRecentLogs(ctx context.Context, h HistoryService, tenant, device string, q LogQuery) ([]LogLine, error) {
	keep, err := logFilter(q)
	if err != nil {
		return nil, err
	}
	out := []LogLine{}
	pq := PointQuery{From: q.From, To: q.To, Desc: true, Limit: MaxLimit}
	if q.MinLevel == "" && q.Contains == "" && q.Limit > 0 {
		pq.Limit = min(q.Limit, MaxLimit) // every line is kept: read no more
	}
	for scanned := 0; scanned < maxLogScan; {
		page, err := h.FindPoints(ctx, tenant, device, LogStream, pq)
		if err != nil {
			return nil, err
		}
		for _, p := range page.Points {
			if l := logLine(p); keep(l) {
				if out = append(out, l); len(out) == q.Limit {
					return out, nil
				}
			}
		}
		scanned += len(page.Points)
		if page.Next == "" {
			break
		}
		pq.Cursor = page.Next
	}
	return out, nil
}

// logFilter returns what keeps the lines q's level and text select, or
// EINVALID naming level.
func logFilter(q LogQuery) (func(LogLine) bool, error) {
	minRank := -1
	if q.MinLevel != "" {
		r, ok := logLevels[strings.ToLower(q.MinLevel)]
		if !ok {
			return nil, FieldErrors(map[string]string{"level": "must be one of " + strings.Join(LogLevels, ", ")})
		}
		minRank = r
	}
	contains := strings.ToLower(q.Contains)
	return func(l LogLine) bool {
		return (minRank < 0 || levelRank(l.Level) >= minRank) && (contains == "" || matchesLog(l, contains))
	}, nil
}

func levelRank(level string) int {
	if r, ok := logLevels[strings.ToLower(level)]; ok {
		return r
	}
	return logLevels["info"]
}

func matchesLog(l LogLine, lower string) bool {
	for _, s := range []string{l.Message, l.Tag, l.Line} {
		if strings.Contains(strings.ToLower(s), lower) {
			return true
		}
	}
	return false
}

// logLine reads a point of the logs stream: its text fields as they are,
// any other value as its JSON.
func logLine(p HistoryPoint) LogLine {
	data, _ := p.Values() // kept as an object: the ingest took only objects
	text := func(k string) string {
		switch v := data[k].(type) {
		case nil:
			return ""
		case string:
			return v
		default:
			b, _ := MarshalCanonical(v)
			return string(b)
		}
	}
	return LogLine{Timestamp: p.Timestamp, Level: text("level"), Tag: text("tag"), Message: text("message"),
		Line: text("line"), LogTimestamp: text("log_timestamp")}
}
