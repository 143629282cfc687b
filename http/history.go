package fleethttp

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/codec"
)

// Stream history's endpoints (docs/telemetry.md).

// streamList answers GET /api/v1/devices/{id}/streams.
type streamList struct {
	Streams []fleet.StreamInfo `json:"streams"`
}

// pointPage answers a read of points.
type pointPage struct {
	Points []fleet.HistoryPoint `json:"points"`
	Next   *string              `json:"next" doc:"the cursor of the next page; null after the last"`
}

// aggregateResult answers an aggregate: one series, or with by=device one
// per device under series (buckets is then empty).
type aggregateResult struct {
	Buckets []fleet.Bucket       `json:"buckets"`
	Series  []fleet.DeviceSeries `json:"series,omitempty" doc:"by=device: each device's buckets, by device id"`
}

// streamRetention is a tenant's retention of raw points.
type streamRetention struct {
	RetentionSeconds int64 `json:"retention_seconds" doc:"raw points older than this are not kept, nor shown"`
	ServerDefault    bool  `json:"server_default" doc:"true when the tenant follows the server's --stream-retention"`
}

// streamRetentionBody sets it.
type streamRetentionBody struct {
	RetentionSeconds int64 `json:"retention_seconds" openapi:"required" doc:"86400 (a day) to 315360000 (ten years); 0 returns to the server's --stream-retention"`
}

var historyRangeParams = []param{
	{Name: "from", Desc: "the oldest time, inclusive: epoch milliseconds or RFC 3339"},
	{Name: "to", Desc: "the newest time, exclusive: epoch milliseconds or RFC 3339"},
}

var pointParams = append([]param{
	{Name: "order", Desc: "asc (oldest first, default) or desc", Enum: []string{"asc", "desc"}},
	{Name: "limit", Type: "integer", Desc: "points in a page, 1 to 1000; default 50"},
	{Name: "cursor", Desc: "the next of the previous page; keep the other parameters as they were"},
}, historyRangeParams...)

var aggregateParams = append([]param{
	{Name: "field", Desc: "the numeric data field to aggregate (required); points without it, or with another type, are left out"},
	{Name: "fn", Desc: "avg (default), min, max, sum, count or last", Enum: fleet.AggregateFuncs},
	{Name: "interval", Desc: "the buckets' length, aligned to the Unix epoch (so to UTC midnight when it divides a day): 1s to 59s reads raw points over at most 6h; whole minutes read 1-minute rollups, whole multiples of 10 minutes 10-minute rollups, whole hours 1-hour rollups. Go duration syntax, or Nd for days; default 1h"},
}, historyRangeParams...)

var fleetAggregateParams = append([]param{
	{Name: "metadata.{key}", Desc: "only devices whose metadata value under key equals this; repeatable with other keys"},
	{Name: "group", Desc: "only devices in this group of the tenant (GET /api/v1/groups), as its selector chooses them now; with metadata.{key}, devices that match both; an unknown group is 400"},
	{Name: "by", Desc: "device: one series per device; at most 100000 buckets over all the series", Enum: []string{"device"}},
}, aggregateParams...)

// historyRange reads from and to, to defaulting to now and from to span
// before it; to must come after from.
func historyRange(q *query, now time.Time, span time.Duration) (time.Time, time.Time) {
	to := q.Instant("to", now)
	from := q.Instant("from", to.Add(-span))
	if !to.After(from) {
		q.fail("to", "must be after from")
	}
	return from, to
}

// readPointQuery reads the parameters of a read of points.
func readPointQuery(q *query) fleet.PointQuery {
	pq := fleet.PointQuery{
		From:   q.Instant("from", time.Time{}),
		To:     q.Instant("to", time.Time{}),
		Desc:   q.Enum("order", "asc", "asc", "desc") == "desc",
		Limit:  int(q.Int("limit", fleet.DefaultLimit, 1, fleet.MaxLimit)),
		Cursor: q.String("cursor"),
	}
	if !pq.From.IsZero() && !pq.To.IsZero() && !pq.To.After(pq.From) {
		q.fail("to", "must be after from")
	}
	return pq
}

// readAggregateQuery reads the parameters of an aggregate; the range
// defaults to the last day.
func readAggregateQuery(q *query, now time.Time) fleet.AggregateQuery {
	aq := fleet.AggregateQuery{
		Field:    q.String("field"),
		Fn:       q.Enum("fn", fleet.AggAvg, fleet.AggregateFuncs...),
		Interval: q.Interval("interval", time.Hour),
	}
	if aq.Field == "" {
		q.fail("field", "is required: the numeric data field to aggregate")
	} else if len(aq.Field) > fleet.MaxFieldNameLen {
		q.fail("field", "must be a field name of at most 256 characters")
	}
	aq.From, aq.To = historyRange(q, now, 24*time.Hour)
	return aq
}

func (s *Server) handleDeviceStreams(w http.ResponseWriter, r *http.Request) error {
	id, err := deviceID(r)
	if err != nil {
		return err
	}
	if err := newQuery(r).Err(); err != nil {
		return err
	}
	streams, err := s.History.FindStreams(r.Context(), tenantOf(r), id)
	if err != nil {
		return err
	}
	s.respond(w, r, http.StatusOK, streamList{Streams: streams})
	return nil
}

func (s *Server) handlePoints(w http.ResponseWriter, r *http.Request) error {
	id, stream, err := streamPath(r)
	if err != nil {
		return err
	}
	q := newQuery(r)
	pq := readPointQuery(q)
	if err := q.Err(); err != nil {
		return err
	}
	page, err := s.pointsAhead.find(r.Context(), s.History, tenantOf(r), id, stream, pq)
	if err != nil {
		return err
	}
	defer page.Release() // written before it returns
	nextLink(w, r, page.Next)
	if f := codec.Negotiate(r.Header.Get("Accept")); f == codec.JSON {
		b := pointPageJSON.Get().(*[]byte)
		*b = appendPointPageJSON((*b)[:0], page)
		writeBody(w, r, f, http.StatusOK, *b)
		if cap(*b) <= maxPooledPage {
			pointPageJSON.Put(b)
		}
		return nil
	}
	res := pointPage{Points: page.Points}
	if page.Next != "" {
		res.Next = &page.Next
	}
	s.respond(w, r, http.StatusOK, res)
	return nil
}

// A page of points in JSON is written by appendPointPageJSON, not the
// codec: each point's data is the compact JSON text history keeps
// (fleet.HistoryPoint), which goes out as it is rather than through
// json.Compact, and a page's 1000 points through the codec's reflection
// were half of fleetd's CPU in reading a day of points. Its
// bytes are the codec's (a test holds them equal); other encodings go
// through the codec.
var pointPageJSON = sync.Pool{New: func() any { return new([]byte) }}

// maxPooledPage bounds the buffers kept: a page of 1000 small points
// takes about 110 KB.
const maxPooledPage = 1 << 20

// hourTimes appends times as codec.AppendTime does, the date and hour of
// the last one's hour kept as text: a page's points mostly fall in an
// hour, and formatting each of their 2000 times whole was a third of the
// page's CPU.
type hourTimes struct {
	hour   int64  // the Unix milliseconds prefix is of
	prefix []byte // "2006-01-02T15:"
}

func (h *hourTimes) append(b []byte, t time.Time) []byte {
	const hourMs = int64(time.Hour / time.Millisecond)
	ms := t.UnixMilli()
	if ms < 0 {
		return codec.AppendTime(b, t)
	}
	if hour := ms - ms%hourMs; h.prefix == nil || hour != h.hour {
		h.prefix = codec.AppendTime(h.prefix[:0], time.UnixMilli(hour))
		h.prefix, h.hour = h.prefix[:len(h.prefix)-len("04:05.000Z")], hour
	}
	off := int(ms % hourMs)
	minute, sec, milli := off/60_000, off/1000%60, off%1000
	return append(append(b, h.prefix...), byte('0'+minute/10), byte('0'+minute%10), ':', byte('0'+sec/10), byte('0'+sec%10), '.',
		byte('0'+milli/100), byte('0'+milli/10%10), byte('0'+milli%10), 'Z')
}

// appendPointPageJSON appends page as pointPage's JSON.
func appendPointPageJSON(b []byte, page *fleet.PointPage) []byte {
	var ts, received hourTimes
	b = append(b, `{"points":[`...)
	for i, p := range page.Points {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"timestamp":"`...)
		b = ts.append(b, p.Timestamp)
		b = append(b, `","sequence":`...)
		b = strconv.AppendInt(b, p.Sequence, 10)
		b = append(b, `,"data":`...)
		if len(p.Data) == 0 {
			b = append(b, "null"...)
		} else {
			b = append(b, p.Data...)
		}
		b = append(b, `,"received_at":"`...)
		b = received.append(b, p.ReceivedAt)
		b = append(b, `"}`...)
	}
	b = append(b, `],"next":`...)
	if page.Next == "" {
		b = append(b, "null"...)
	} else {
		next, _ := json.Marshal(page.Next) // a string always encodes
		b = append(b, next...)
	}
	return append(b, '}')
}

func (s *Server) handleAggregate(w http.ResponseWriter, r *http.Request) error {
	id, stream, err := streamPath(r)
	if err != nil {
		return err
	}
	q := newQuery(r)
	aq := readAggregateQuery(q, s.Now())
	if err := q.Err(); err != nil {
		return err
	}
	bs, err := s.History.Aggregate(r.Context(), tenantOf(r), id, stream, aq)
	if err != nil {
		return err
	}
	s.respond(w, r, http.StatusOK, aggregateResult{Buckets: bs})
	return nil
}

func (s *Server) handleFleetAggregate(w http.ResponseWriter, r *http.Request) error {
	stream, err := pathValue(r, "stream", "stream name", fleet.ValidStreamName, fleet.StreamNameRule)
	if err != nil {
		return err
	}
	q := newQuery(r)
	aq := readAggregateQuery(q, s.Now())
	aq.Metadata = q.Prefixed("metadata.")
	if aq.Group = q.String("group"); aq.Group != "" && !fleet.ValidGroupName(aq.Group) {
		q.fail("group", "names a group: it "+fleet.GroupNameRule)
	}
	aq.ByDevice = q.Enum("by", "", "device") == "device"
	if err := q.Err(); err != nil {
		return err
	}
	bs, series, err := s.History.AggregateFleet(r.Context(), tenantOf(r), stream, aq)
	if err != nil {
		return err
	}
	if bs == nil {
		bs = []fleet.Bucket{}
	}
	s.respond(w, r, http.StatusOK, aggregateResult{Buckets: bs, Series: series})
	return nil
}

func (s *Server) handleGetStreamRetention(w http.ResponseWriter, r *http.Request) error {
	tenant, err := pathTenant(r)
	if err != nil {
		return err
	}
	d, own, err := s.History.StreamRetention(r.Context(), tenant)
	if err != nil {
		return err
	}
	s.respond(w, r, http.StatusOK, streamRetention{RetentionSeconds: int64(d / time.Second), ServerDefault: !own})
	return nil
}

func (s *Server) handleSetStreamRetention(w http.ResponseWriter, r *http.Request) error {
	tenant, err := pathTenant(r)
	if err != nil {
		return err
	}
	body, err := s.decode(w, r, s.Limits.Body, ordinaryElements)
	if err != nil {
		return err
	}
	f := fleet.NewFields(body)
	secs := f.Int("retention_seconds", true, 0, int64(fleet.MaxStreamRetention/time.Second))
	if err := f.Err(); err != nil {
		return err
	}
	if err := s.History.SetStreamRetention(r.Context(), tenant, time.Duration(secs)*time.Second); err != nil {
		return err
	}
	return s.quiet(w, r, http.StatusNoContent, func() (any, error) {
		d, own, err := s.History.StreamRetention(r.Context(), tenant)
		return streamRetention{RetentionSeconds: int64(d / time.Second), ServerDefault: !own}, err
	})
}

// logList answers a read of logs.
type logList struct {
	Logs []fleet.LogLine `json:"logs"`
	Next *string         `json:"next" doc:"the cursor to read on from; null when nothing more was kept yet"`
}

var logParams = append([]param{
	{Name: "level", Desc: "only lines at this level or above: trace, debug, info, warn, error, critical (journald's and logcat's names are understood)"},
	{Name: "q", Desc: "only lines whose message, tag or line contains this, ignoring case"},
	{Name: "limit", Type: "integer", Desc: "lines, 1 to 1000; default 100"},
	{Name: "cursor", Desc: "the next of the previous answer"},
	{Name: "follow", Desc: "true: answer with server-sent events (text/event-stream), each event a line (event: log), and keep sending lines as they arrive", Enum: []string{"true", "false"}},
}, historyRangeParams...)

// Following logs: the store is read for new lines every logPoll; a
// comment line keeps idle connections open; after logMaxAge the stream
// ends and the client reconnects with the cursor of its last event (the
// event's id, as EventSource sends it back in Last-Event-ID).
const (
	logPoll      = time.Second
	logHeartbeat = 15 * time.Second
	logMaxAge    = time.Hour
)

func (s *Server) handleLogs(w http.ResponseWriter, r *http.Request) error {
	id, err := deviceID(r)
	if err != nil {
		return err
	}
	q := newQuery(r)
	now := s.Now()
	lq := fleet.LogQuery{
		From:     q.Instant("from", now.Add(-time.Hour)),
		To:       q.Instant("to", time.Time{}),
		MinLevel: q.String("level"),
		Contains: q.String("q"),
		Limit:    int(q.Int("limit", 100, 1, fleet.MaxLimit)),
		Cursor:   q.String("cursor"),
	}
	follow := q.Enum("follow", "false", "true", "false") == "true"
	if c := r.Header.Get("Last-Event-ID"); follow && c != "" {
		lq.Cursor = c
	}
	if !lq.To.IsZero() && !lq.To.After(lq.From) {
		q.fail("to", "must be after from")
	}
	if err := q.Err(); err != nil {
		return err
	}
	page, err := fleet.ReadLogs(r.Context(), s.History, tenantOf(r), id, lq)
	if err != nil {
		return err
	}
	if !follow {
		nextLink(w, r, page.Next)
		res := logList{Logs: page.Lines}
		if page.Next != "" {
			res.Next = &page.Next
		}
		s.respond(w, r, http.StatusOK, res)
		return nil
	}
	return FollowLogs(w, r, s.Follows, s.History, tenantOf(r), id, lq, page, logMaxAge, s.logger(r))
}

// FollowLogs sends page (the first read of lq) and then every line that
// arrives as server-sent events, until the client goes or maxAge passes;
// the console's Logs tab follows a device with it too. Each batch's last
// event's id is the cursor after it, which EventSource sends back as
// Last-Event-ID when it reconnects. A tenant holds at most f's cap of
// follows at once; beyond it the answer is 429.
func FollowLogs(w http.ResponseWriter, r *http.Request, f *Follows, h fleet.HistoryService, tenant, device string, lq fleet.LogQuery,
	page *fleet.LogPage, maxAge time.Duration, log *slog.Logger) error {
	release, err := f.take(w, tenant)
	if err != nil {
		return err
	}
	defer release()
	rc := http.NewResponseController(w)
	hd := w.Header()
	hd.Set("Content-Type", "text/event-stream")
	hd.Set("Cache-Control", "no-store")
	hd.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	send := func(b []byte) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(30 * time.Second))
		if _, err := w.Write(b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	if !send([]byte(": following\n\n")) {
		return nil
	}
	poll := time.NewTicker(logPoll)
	defer poll.Stop()
	beat := time.NewTicker(logHeartbeat)
	defer beat.Stop()
	end := time.After(maxAge)
	for {
		for i, l := range page.Lines {
			b, err := json.Marshal(l)
			if err != nil {
				return nil
			}
			msg := fmt.Appendf(nil, "event: log\ndata: %s\n", b)
			if i == len(page.Lines)-1 && page.Resume != "" {
				msg = fmt.Appendf(msg, "id: %s\n", page.Resume)
			}
			if !send(append(msg, '\n')) {
				return nil
			}
		}
		// Lines past a full page come at once; else at the next poll.
		lq.Cursor = page.Resume
		if page.Next == "" {
			select {
			case <-r.Context().Done():
				return nil
			case <-end:
				return nil
			case <-beat.C:
				if !send([]byte(": heartbeat\n\n")) {
					return nil
				}
				page = &fleet.LogPage{Resume: page.Resume}
				continue
			case <-poll.C:
			}
		}
		var err error
		if page, err = fleet.ReadLogs(r.Context(), h, tenant, device, lq); err != nil {
			if r.Context().Err() == nil {
				log.Error("follow logs", "err", err)
			}
			return nil
		}
	}
}
