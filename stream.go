package fleet

import (
	"context"
	"fmt"
	"sort"
	"time"
	"unicode/utf8"
)

// DataPoint is one reading of a device's data stream: the time the device
// took it, its sequence number and its data fields.
type DataPoint struct {
	DeviceID   string         `json:"device_id"`
	Stream     string         `json:"stream"`
	Timestamp  time.Time      `json:"timestamp"`
	Sequence   int64          `json:"sequence"`
	Data       map[string]any `json:"data"`
	ReceivedAt time.Time      `json:"received_at"`
}

// After reports whether p comes after q in a stream: by timestamp, then by
// sequence.
func (p *DataPoint) After(q *DataPoint) bool {
	if !p.Timestamp.Equal(q.Timestamp) {
		return p.Timestamp.After(q.Timestamp)
	}
	return p.Sequence > q.Sequence
}

// SortDataPoints orders points by timestamp, then sequence, keeping the
// order of equal points.
func SortDataPoints(pts []DataPoint) {
	sort.SliceStable(pts, func(i, j int) bool { return pts[j].After(&pts[i]) })
}

// Limits on stream ingest (docs/alerts.md).
const (
	MaxPointsPerBatch = 10_000
	MaxPointFields    = 256
	MaxPointBytes     = 64 << 10 // a point's size as JSON, roughly
	MaxFieldNameLen   = 256
	// Timestamps must fall in [MinPointTime, MaxPointTime] epoch ms: after
	// 2000-01-01 (a device that has not set its clock sends 0 or 1970) and
	// before 9999-12-31.
	MinPointTime int64 = 946_684_800_000
	MaxPointTime int64 = 253_402_300_799_999
)

// ValidStreamName reports whether s may name a data stream: 1 to 128
// characters from A-Z a-z 0-9 . _ -, so that a stream is one MQTT topic level
// without wildcards.
func ValidStreamName(s string) bool { return validName(s, 128, "._-") }

// StreamNameRule says what a stream name may be, for error messages.
const StreamNameRule = "must be 1 to 128 characters from A-Z a-z 0-9 . _ -"

// ReadDataPoints is the typed decode of an ingest batch: a canonical array
// of objects, each with "timestamp" (epoch ms, required), "sequence" (an
// integer ≥ 0, optional) and data fields. A single object counts as a batch
// of one. It returns the usable points, in batch order, and a problem for
// each unusable one keyed by "[index]" or "[index].field"; a batch that is
// not an array at all is one problem keyed "body".
func ReadDataPoints(v any, device, stream string, received time.Time) ([]DataPoint, map[string]string) {
	problems := map[string]string{}
	var items []any
	switch v := v.(type) {
	case []any:
		items = v
	case map[string]any:
		items = []any{v}
	default:
		problems["body"] = "must be an array of data points, not " + Describe(v)
		return nil, problems
	}
	if len(items) > MaxPointsPerBatch {
		problems["body"] = fmt.Sprintf("must hold at most %d data points, not %d", MaxPointsPerBatch, len(items))
		return nil, problems
	}
	pts := make([]DataPoint, 0, len(items))
	for i, item := range items {
		p, field, problem := readDataPoint(item)
		if problem != "" {
			key := fmt.Sprintf("[%d]", i)
			if field != "" {
				key += "." + field
			}
			problems[key] = problem
			continue
		}
		p.DeviceID, p.Stream, p.ReceivedAt = device, stream, received
		pts = append(pts, p)
	}
	return pts, problems
}

func readDataPoint(item any) (p DataPoint, field, problem string) {
	m, ok := item.(map[string]any)
	if !ok {
		return p, "", "must be an object, not " + Describe(item)
	}
	if len(m) > MaxPointFields+2 {
		return p, "", fmt.Sprintf("has %d fields; at most %d data fields are allowed", len(m), MaxPointFields)
	}
	ts, ok := m["timestamp"]
	if !ok || ts == nil {
		return p, "timestamp", "is required: the time of the reading in epoch milliseconds"
	}
	ms, ok := AsInt(ts)
	if !ok || ms < MinPointTime || ms > MaxPointTime {
		return p, "timestamp", "must be an integer number of epoch milliseconds between 2000-01-01 and 9999-12-31, not " + describeValue(ts)
	}
	p.Timestamp = time.UnixMilli(ms).UTC()
	if s, ok := m["sequence"]; ok && s != nil {
		n, ok := AsInt(s)
		if !ok || n < 0 {
			return p, "sequence", "must be an integer ≥ 0, not " + describeValue(s)
		}
		p.Sequence = n
	}
	p.Data = make(map[string]any, len(m))
	size := 2
	for k, v := range m {
		if k == "timestamp" || k == "sequence" {
			continue
		}
		if k == "" || utf8.RuneCountInString(k) > MaxFieldNameLen {
			return p, "", fmt.Sprintf("field names must be 1 to %d characters", MaxFieldNameLen)
		}
		size += len(k) + 4 + valueSize(v, MaxPointBytes)
		if size > MaxPointBytes {
			return p, "", fmt.Sprintf("is larger than %d KiB", MaxPointBytes>>10)
		}
		p.Data[k] = v
	}
	return p, "", ""
}

// describeValue is Describe with the value itself for short scalars.
func describeValue(v any) string {
	switch v := v.(type) {
	case int64, float64, bool:
		return fmt.Sprintf("%v", v)
	case string:
		if len(v) <= 32 {
			return fmt.Sprintf("%q", v)
		}
	}
	return Describe(v)
}

// valueSize estimates the JSON size of a canonical value, stopping once it
// passes limit so that a huge value costs no more than a small one.
func valueSize(v any, limit int) int {
	switch v := v.(type) {
	case nil, bool:
		return 5
	case int64, float64:
		return 20
	case string:
		return len(v) + 2
	case []any:
		n := 2
		for _, e := range v {
			n += valueSize(e, limit-n) + 1
			if n > limit {
				return n
			}
		}
		return n
	case map[string]any:
		n := 2
		for k, e := range v {
			n += len(k) + 4 + valueSize(e, limit-n)
			if n > limit {
				return n
			}
		}
		return n
	}
	return 20
}

// StreamService receives device data and keeps each stream's latest point.
type StreamService interface {
	// IngestPoints stores a batch of one device's points on one stream (the
	// latest point is kept) and evaluates the tenant's alert rules on them.
	// It returns once everything is committed. An unknown device is
	// ENOTFOUND.
	IngestPoints(ctx context.Context, tenant, device, stream string, pts []DataPoint) error
	// FindLatestPoint returns the stream's latest point by timestamp, then
	// sequence; ENOTFOUND when the device never sent one.
	FindLatestPoint(ctx context.Context, tenant, device, stream string) (*DataPoint, error)
	// FindDeviceStreams returns the latest point of each of the device's
	// streams, by stream name, a page at a time, and how many streams it
	// has; none for an unknown device.
	FindDeviceStreams(ctx context.Context, tenant, device string, p Page) ([]*DataPoint, int, error)
}
