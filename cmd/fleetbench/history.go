package main

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	segjson "github.com/segmentio/encoding/json"
)

// The history scenario (docs/telemetry.md): a day of one device's points
// at 1 Hz, kept through the API, then read back, aggregated over 30 days,
// measured on disk and dropped, each beside a baseline of the same run.

// dayPoints is a day at 1 Hz.
const dayPoints = 86_400

// history measures stream history on one device's day of points.
func (r *runner) history(ctx context.Context) error {
	dev, stream := "hist-"+r.runID, "day"+r.runID
	if _, err := r.admin.provision(ctx, []string{dev}, nil, r.p, "history: provisioned the device"); err != nil {
		return err
	}
	day := time.Now().UTC().Truncate(24*time.Hour).AddDate(0, 0, -1) // yesterday: a partition nothing else writes
	rawBytes := 0
	for i := 0; i < dayPoints; i += 1000 {
		pts := make([]map[string]any, min(1000, dayPoints-i))
		for j := range pts {
			k := i + j
			pts[j] = map[string]any{"timestamp": day.Add(time.Duration(k) * time.Second).UnixMilli(), "sequence": k, "temp": 20 + float64(k%1000)/8}
			rawBytes += len(fmt.Sprintf(`{"timestamp":%d,"sequence":%d,"temp":%g}`, pts[j]["timestamp"], k, pts[j]["temp"]))
		}
		if err := r.admin.call(ctx, "POST", "/api/v1/devices/"+dev+"/streams/"+stream, pts, http.StatusOK, nil); err != nil {
			return err
		}
		r.p.count("history: kept a day of points", i+len(pts), dayPoints)
	}
	// The rollup job folds the day in about a second after its ingest:
	// the read is measured once it has, as the SQL read it is set beside
	// runs on a machine that does nothing else.
	agg := "/api/v1/devices/" + dev + "/streams/" + stream + "/aggregate?field=temp&fn=avg&interval=1h&from=" +
		url.QueryEscape(time.Now().Add(-30*24*time.Hour).Format(time.RFC3339))
	if err := r.awaitRollups(ctx, agg); err != nil {
		return err
	}
	if err := r.historyRead(ctx, dev, stream, day); err != nil {
		return err
	}
	if err := r.historyAggregate(ctx, dev, agg); err != nil {
		return err
	}
	return r.historyDisk(ctx, dev, day, rawBytes)
}

// historyRead reads the day back through the API, 87 pages of 1000, beside
// the same points read with SQL from a table of a row per point; the best
// of three each. The pages are read as a client that reads many points
// would (readPages): each next page asked for on its predecessor's Link
// header while the predecessor is decoded, into two buffers in turn, with
// segmentio/encoding's json (decodePointPage); the note gives what
// encoding/json would have spent on the same pages.
func (r *runner) historyRead(ctx context.Context, dev, stream string, day time.Time) error {
	var best time.Duration
	settled := r.settle(ctx, "history")
	// Each measured part starts with the collector's work of what came
	// before it done, the API's read as the SQL read (both in this process).
	runtime.GC()
	stopProfile := sync.OnceFunc(r.profile("history-read", 8*time.Second))
	defer stopProfile()
	const reads = 3
	path := "/api/v1/devices/" + dev + "/streams/" + stream + "/points?"
	q := url.Values{"limit": {"1000"}, "from": {day.Format(time.RFC3339)}, "to": {day.Add(24 * time.Hour).Format(time.RFC3339)}}
	cpu0, self0 := procCPU(r.t.pid), procCPU(os.Getpid())
	for range reads {
		t0 := time.Now()
		n, err := r.readPages(ctx, r.admin.base+path+q.Encode())
		if err != nil {
			return err
		}
		if n != dayPoints {
			return fmt.Errorf("history: read %d points of %d", n, dayPoints)
		}
		if d := time.Since(t0); best == 0 || d < best {
			best = d
		}
	}
	// CPU a read survives a busy machine better than the time does.
	note := fmt.Sprintf("JSON over HTTP on loopback, decoded by fleetbench with segmentio/encoding; CPU a read: fleetbench %.0f ms", 1000*(procCPU(os.Getpid())-self0)/reads)
	if r.t.pid != 0 {
		note += fmt.Sprintf(", fleetd %.0f ms", 1000*(procCPU(r.t.pid)-cpu0)/reads)
	}
	note += settled
	stopProfile() // the untimed reads below are not the profile's
	var raw time.Duration
	var rawCPU float64
	if r.store != nil {
		runtime.GC()
		var err error
		if raw, rawCPU, err = r.store.pointReadTime(ctx, dayPoints); err != nil {
			return err
		}
	}
	fast, std, size, err := r.historyDecodeCPU(ctx, path, q)
	if err != nil {
		return err
	}
	note += fmt.Sprintf("; decoding the day's %.1f MB: %.0f ms of CPU, encoding/json's %.0f ms", float64(size)/1e6, 1000*fast, 1000*std)
	if r.store != nil {
		where := "the database's work and the driver's"
		if r.t.dialect == "postgres" {
			where = "the driver's; the server's is not counted"
		}
		r.rep.addBaseline("point-read", "SQL read", &figure{Name: "86,400 rows of a point each (timestamp, sequence, JSON data, received) read with one SELECT by primary key, best of 3",
			Value: ms(raw), Unit: millis, Note: fmt.Sprintf("CPU a read: fleetbench %.0f ms (%s)", 1000*rawCPU, where)})
	}
	f := r.rep.compare(r.rep.add(&figure{Scenario: "history", Name: "a day of a device's points at 1 Hz (86,400) read through the API, 87 pages of 1000, best of 3",
		Value: ms(best), Unit: millis, Note: note}), "point-read")
	judge(f, r.t.dialect, goalHistoryRead, "no storage baseline (--url without --database)")
	return nil
}

// readPages reads the pages from first on, each next one asked for on
// its predecessor's Link header while its predecessor is decoded, as a
// client reading many pages would (docs/api.md, Lists), and returns how
// many points they held. Two page buffers take turns.
func (r *runner) readPages(ctx context.Context, first string) (int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type fetched struct {
		buf  *bytes.Buffer
		last bool
		err  error
	}
	pages, free := make(chan fetched, 1), make(chan *bytes.Buffer, 2)
	free <- new(bytes.Buffer)
	free <- new(bytes.Buffer)
	go func() {
		for u := first; ; {
			var buf *bytes.Buffer
			select {
			case buf = <-free:
			case <-ctx.Done():
				return
			}
			next, err := r.admin.getURLInto(ctx, u, http.StatusOK, buf)
			select {
			case pages <- fetched{buf, next == "", err}:
			case <-ctx.Done():
				return
			}
			if err != nil || next == "" {
				return
			}
			u = next
		}
	}()
	n := 0
	for {
		f := <-pages
		if f.err != nil {
			return n, f.err
		}
		var page pointPage
		if err := decodePointPage(f.buf.Bytes(), &page); err != nil {
			return n, err
		}
		n += len(page.Points)
		if (page.Next == nil) != f.last {
			return n, fmt.Errorf("history: a page's Link header and its next disagree (next %v, Link %v)", page.Next != nil, !f.last)
		}
		if f.last {
			return n, nil
		}
		free <- f.buf
	}
}

// pointPage is a page of GET …/points, each point decoded to the values
// the SQL read scans of its row (pointReadTime): timestamp, sequence, the
// data's JSON text, received.
type pointPage struct {
	Points []struct {
		Timestamp  time.Time       `json:"timestamp"`
		Sequence   int64           `json:"sequence"`
		Data       json.RawMessage `json:"data"`
		ReceivedAt time.Time       `json:"received_at"`
	} `json:"points"`
	Next *string `json:"next"`
}

// decodePointPage decodes a page of points as a client reading many of them
// would: with a JSON decoder faster than encoding/json, to the same values
// (TestPointPageDecoders; BenchmarkPointPage weighs the decoders).
// segmentio/encoding's json is encoding/json's API, about a quarter of its
// CPU on these pages (docs/benchmarks-notebook.md, "A day's read: the
// client's decoder").
func decodePointPage(b []byte, p *pointPage) error {
	return segjson.Unmarshal(b, p)
}

// historyDecodeCPU reads the day's pages once more (untimed) and returns
// the CPU seconds fleetbench spends decoding them with decodePointPage and
// with encoding/json, the mean of 3 rounds in turns, and their bytes. It
// fails if the two decode a page to different values.
func (r *runner) historyDecodeCPU(ctx context.Context, path string, q url.Values) (fast, std float64, size int, err error) {
	q.Del("cursor")
	var bodies [][]byte
	for {
		b, err := r.admin.send(ctx, "GET", path+q.Encode(), nil, http.StatusOK)
		if err != nil {
			return 0, 0, 0, err
		}
		bodies, size = append(bodies, b), size+len(b)
		var a, s pointPage
		if err := decodePointPage(b, &a); err != nil {
			return 0, 0, 0, err
		}
		if err := json.Unmarshal(b, &s); err != nil {
			return 0, 0, 0, err
		}
		if !samePointPage(a, s) {
			return 0, 0, 0, fmt.Errorf("history: page %d decoded to other values than encoding/json's", len(bodies))
		}
		if a.Next == nil {
			break
		}
		q.Set("cursor", *a.Next)
	}
	const rounds = 3
	for range rounds {
		for _, d := range []struct {
			decode func([]byte, *pointPage) error
			cpu    *float64
		}{{decodePointPage, &fast}, {func(b []byte, p *pointPage) error { return json.Unmarshal(b, p) }, &std}} {
			c0 := selfCPU()
			for _, b := range bodies {
				var p pointPage
				if err := d.decode(b, &p); err != nil {
					return 0, 0, 0, err
				}
			}
			*d.cpu += (selfCPU() - c0) / rounds
		}
	}
	return fast, std, size, nil
}

// samePointPage reports whether a and b hold the same points and next.
func samePointPage(a, b pointPage) bool {
	if len(a.Points) != len(b.Points) || (a.Next == nil) != (b.Next == nil) || (a.Next != nil && *a.Next != *b.Next) {
		return false
	}
	for i, p := range a.Points {
		o := b.Points[i]
		if !p.Timestamp.Equal(o.Timestamp) || p.Timestamp.Location() != o.Timestamp.Location() || p.Sequence != o.Sequence ||
			!bytes.Equal(p.Data, o.Data) || !p.ReceivedAt.Equal(o.ReceivedAt) || p.ReceivedAt.Location() != o.ReceivedAt.Location() {
			return false
		}
	}
	return true
}

// awaitRollups waits, at most a minute, until agg (the day's hourly
// aggregate) counts every point of the day: the hour rollups have caught
// up with the ingest.
func (r *runner) awaitRollups(ctx context.Context, agg string) error {
	n := 0
	err := waitFor(ctx, time.Minute, func() (bool, error) {
		var res struct {
			Buckets []struct{ Count int } `json:"buckets"`
		}
		if err := r.admin.call(ctx, "GET", agg, nil, http.StatusOK, &res); err != nil {
			return false, err
		}
		n = 0
		for _, b := range res.Buckets {
			n += b.Count
		}
		return n == dayPoints, nil
	})
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		return fmt.Errorf("history: the hour rollups hold %d points of %d after a minute", n, dayPoints)
	}
	return err
}

// historyAggregate measures agg, a 30-day hourly aggregate of the device
// (from hour rollups), beside a primary-key lookup (the device itself),
// each 200 requests one at a time.
func (r *runner) historyAggregate(ctx context.Context, dev, agg string) error {
	timed := func(path string) (latencies, error) {
		lat := make(latencies, 0, 200)
		for i := range 220 {
			t0 := time.Now()
			if err := r.admin.call(ctx, "GET", path, nil, http.StatusOK, nil); err != nil {
				return nil, err
			}
			if i >= 20 {
				lat = append(lat, time.Since(t0))
			}
		}
		slices.Sort(lat)
		return lat, nil
	}
	pk, err := timed("/api/v1/devices/" + dev)
	if err != nil {
		return err
	}
	r.rep.addBaseline("pk-lookup", "device read", &figure{Name: "GET /api/v1/devices/{id} (a primary-key lookup), p99 of 200", Value: ms(pk.percentile(99)), Unit: millis,
		Note: fmt.Sprintf("p50 %.2f ms", ms(pk.percentile(50)))})
	lat, err := timed(agg)
	if err != nil {
		return err
	}
	f := r.rep.compare(r.rep.add(&figure{Scenario: "history", Name: "a 30-day hourly aggregate of the device (hour rollups), p99 of 200",
		Value: ms(lat.percentile(99)), Unit: millis, Note: fmt.Sprintf("p50 %.2f ms", ms(lat.percentile(50)))}), "pk-lookup")
	judge(f, r.t.dialect, goalAggregateP99, "")
	return nil
}

// historyDisk reads the size of the day's partition of raw points in
// fleetd's database, beside the points' JSON, then times the drops of
// expired days as the maintenance does them (historyDrop).
func (r *runner) historyDisk(ctx context.Context, dev string, day time.Time, rawBytes int) error {
	if r.t.dsn == "" {
		return nil // --url without --database
	}
	driver, dsn := "sqlite", "file:"+r.t.dsn+"?_pragma=busy_timeout(10000)"
	size := "SELECT sum(pgsize) FROM dbstat WHERE name = ?"
	if r.t.dialect == "postgres" {
		driver, dsn, size = "pgx", r.t.dsn, "SELECT pg_total_relation_size(CAST($1 AS regclass))"
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	part := "stream_points_" + day.Format("20060102")
	var bytes int64
	if err := db.QueryRowContext(ctx, size, part).Scan(&bytes); err != nil {
		return fmt.Errorf("history: the size of %s: %w", part, err)
	}
	r.rep.addBaseline("point-json", "JSON", &figure{Name: "a point as its JSON ({\"timestamp\",\"sequence\",\"temp\"}), bytes", Value: float64(rawBytes) / dayPoints, Unit: bytesUnit})
	r.rep.compare(r.rep.add(&figure{Scenario: "history", Name: "bytes on disk a point, one numeric field, batches of 1000 (the day's partition, indexes included)",
		Value: float64(bytes) / dayPoints, Unit: bytesUnit, Note: fmt.Sprintf("%s: %d bytes", part, bytes)}), "point-json")
	return r.historyDrop(ctx, db, dev, part, day)
}

// dropDays is how many expired days the history scenario fills and has
// fleetd's maintenance drop in one pass: their drops one after the other
// keep ingest in flight long enough for its p99 to be of a few hundred
// requests, not the longest of the 20 or so one day's drop on PostgreSQL
// lasts (docs/benchmarks-notebook.md, "Ingest during the drops: a real
// p99").
const dropDays = 5

// dropWorkers is how many requests keep points during the drops, each
// for a device of its own, as a fleet's devices each keep their own
// points: one device's requests would queue on its stream's latest point.
const dropWorkers = 8

// historyDrop fills the partitions of dropDays consecutive days past the
// retention up to sz.dropPoints points each, with copies of the day's
// chunks (as ingest wrote them) under other device ids, and has fleetd's
// maintenance drop them (as it does hourly: setting the tenant's
// retention runs it at once, and it drops them one after the other)
// while dropWorkers devices keep points of today through the API, a
// request at a time each: the longest day's drop (the first from the
// setting, each next from its predecessor gone), and the p99 of the
// requests in flight from the setting to the last partition gone beside
// the p99 of those before it.
func (r *runner) historyDrop(ctx context.Context, db *sql.DB, dev, src string, day time.Time) error {
	copies := (r.sz.dropPoints + dayPoints - 1) / dayPoints
	exists := "SELECT name FROM sqlite_master WHERE name IN (%s)"
	srcDDL := ""
	if r.t.dialect == "postgres" {
		exists = "SELECT relname FROM pg_class WHERE relname IN (%s) AND relnamespace = CAST(current_schema() AS regnamespace)"
	} else {
		// The partitions as fleetd makes its own.
		if err := db.QueryRowContext(ctx, "SELECT sql FROM sqlite_master WHERE name = ?", src).Scan(&srcDDL); err != nil {
			return fmt.Errorf("history: the definition of %s: %w", src, err)
		}
	}
	parts := make([]string, dropDays)
	var points int64
	for i := range parts {
		old := day.AddDate(0, 0, -40-i)
		part := "stream_points_" + old.Format("20060102")
		parts[i] = part
		shift := day.Sub(old).Milliseconds()
		ddl := fmt.Sprintf("CREATE TABLE %s PARTITION OF stream_points FOR VALUES FROM (%d) TO (%d)", part, old.UnixMilli(), old.AddDate(0, 0, 1).UnixMilli())
		fill := fmt.Sprintf(`INSERT INTO %[1]s SELECT tenant, device_id || '-' || c.k, stream, ts_min - %[3]d, ts_max - %[3]d, id, n, received_at, points
			FROM %[2]s, generate_series(1, %[4]d) AS c(k)`, part, src, shift, copies)
		if r.t.dialect != "postgres" {
			ddl = strings.Replace(srcDDL, src, part, 1)
			fill = fmt.Sprintf(`WITH RECURSIVE c(k) AS (SELECT 1 UNION ALL SELECT k + 1 FROM c WHERE k < %[4]d)
				INSERT INTO %[1]s SELECT tenant, device_id || '-' || c.k, stream, ts_min - %[3]d, ts_max - %[3]d, id, n, received_at, points FROM %[2]s, c`, part, src, shift, copies)
		}
		t0 := time.Now()
		for _, q := range []string{ddl, fill} {
			if _, err := db.ExecContext(ctx, q); err != nil {
				return fmt.Errorf("history: fill %s: %w", part, err)
			}
		}
		var n int64
		if err := db.QueryRowContext(ctx, "SELECT sum(n) FROM "+part).Scan(&n); err != nil {
			return fmt.Errorf("history: count %s: %w", part, err)
		}
		if i > 0 && n != points {
			return fmt.Errorf("history: %s holds %d points, %s %d", part, n, parts[0], points)
		}
		points = n
		r.p.say("history: %s holds %d points (filled in %.2f s)", part, n, time.Since(t0).Seconds())
	}
	quoted := make([]string, len(parts))
	for i, p := range parts {
		quoted[i] = "'" + p + "'"
	}
	exists = fmt.Sprintf(exists, strings.Join(quoted, ", "))
	// left returns the partitions still there.
	left := func() (map[string]bool, error) {
		rows, err := db.QueryContext(ctx, exists)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		there := map[string]bool{}
		for rows.Next() {
			var name string
			if err := rows.Scan(&name); err != nil {
				return nil, err
			}
			there[name] = true
		}
		return there, rows.Err()
	}
	if there, err := left(); err != nil || len(there) != len(parts) {
		return fmt.Errorf("history: %d of the %d filled partitions there before the retention's setting (%v)", len(there), len(parts), err)
	}
	devs := []string{dev}
	for w := 1; w < dropWorkers; w++ {
		devs = append(devs, fmt.Sprintf("%s-w%d", dev, w))
	}
	if _, err := r.admin.provision(ctx, devs[1:], nil, r.p, "history: provisioned the devices that keep points during the drops"); err != nil {
		return err
	}
	r.p.say("history: dropping %d days of %d points while %d devices keep points", len(parts), points, len(devs))
	type call struct {
		start, end time.Time
	}
	var (
		mu     sync.Mutex
		calls  []call
		failed error
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w, d := range devs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				now := time.Now()
				pts := make([]map[string]any, 10)
				for j := range pts {
					pts[j] = map[string]any{"timestamp": now.UnixMilli(), "sequence": (w*1_000_000+i)*10 + j, "temp": 20.5}
				}
				err := r.admin.call(ctx, "POST", "/api/v1/devices/"+d+"/streams/drop"+r.runID, pts, http.StatusOK, nil)
				mu.Lock()
				if err != nil && failed == nil {
					failed = err
				}
				calls = append(calls, call{now, time.Now()})
				mu.Unlock()
			}
		}()
	}
	// Ingest before the drops, the partitions polled as during them (a
	// query every 2 ms): both windows carry the polling's load.
	var pollErr error
	for until := time.Now().Add(2 * time.Second); pollErr == nil && time.Now().Before(until); time.Sleep(2 * time.Millisecond) {
		_, pollErr = left()
	}
	if pollErr != nil {
		close(stop)
		wg.Wait()
		return fmt.Errorf("history: poll the partitions before their drop: %w", pollErr)
	}
	t0 := time.Now()
	dropErr := r.admin.call(ctx, "PUT", "/api/v1/tenants/"+r.t.tenant+"/stream-retention", map[string]any{"retention_seconds": 0}, http.StatusNoContent, nil)
	var gone []time.Time // each partition's, in the order they went
	for deadline := t0.Add(time.Minute); dropErr == nil && len(gone) < len(parts); time.Sleep(2 * time.Millisecond) {
		there, err := left()
		if dropErr = err; err != nil {
			break
		}
		for now := time.Now(); len(gone) < len(parts)-len(there); {
			gone = append(gone, now)
		}
		if time.Now().After(deadline) {
			dropErr = fmt.Errorf("fleetd's maintenance dropped %d of %d partitions within a minute of the retention's setting", len(gone), len(parts))
		}
	}
	t1 := time.Now()
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	if err := cmp.Or(dropErr, failed); err != nil {
		return fmt.Errorf("history: drop %s…%s while ingesting: %w", parts[len(parts)-1], parts[0], err)
	}
	var before, during latencies
	warm := calls[0].start.Add(500 * time.Millisecond)
	for _, c := range calls {
		switch {
		case c.start.After(warm) && c.end.Before(t0):
			before = append(before, c.end.Sub(c.start))
		case c.start.Before(t1) && c.end.After(t0):
			during = append(during, c.end.Sub(c.start))
		}
	}
	slices.Sort(before)
	slices.Sort(during)
	var longest time.Duration
	each := make([]string, len(gone))
	for i, g := range gone {
		prev := t0
		if i > 0 {
			prev = gone[i-1]
		}
		longest = max(longest, g.Sub(prev))
		each[i] = fmt.Sprintf("%.1f", ms(g.Sub(prev)))
	}
	f := r.rep.add(&figure{Scenario: "history", Name: fmt.Sprintf("dropping an expired day's partition of %s points, the longest of %d days dropped in one pass (fleetd's maintenance; on SQLite in slices of rows)", thousands(float64(points)), len(parts)),
		Value: ms(longest), Unit: millis, Note: fmt.Sprintf("%s…%s: copies of the day's chunks under other device ids, while %d devices keep points; each day's drop (the first from the retention's setting, each next from its predecessor gone) %s ms; all gone %.1f ms after the setting",
			parts[len(parts)-1], parts[0], len(devs), strings.Join(each, ", "), ms(t1.Sub(t0)))})
	judge(f, r.t.dialect, goalHistoryDrop, "")
	r.rep.addBaseline("ingest-p99", "ingest before", &figure{Name: fmt.Sprintf("devices' points kept through the API (batches of 10, %d devices a request at a time each), p99 before the drops", len(devs)),
		Value: ms(before.percentile(99)), Unit: millis, Note: fmt.Sprintf("%d requests, p50 %.2f ms, longest %.2f ms", len(before), ms(before.percentile(50)), ms(before.percentile(100)))})
	f = r.rep.compare(r.rep.add(&figure{Scenario: "history", Name: "the same requests in flight while the partitions were dropped (from the setting to the last gone), p99",
		Value: ms(during.percentile(99)), Unit: millis, Note: fmt.Sprintf("%d requests, longest %.2f ms", len(during), ms(during.percentile(100)))}), "ingest-p99")
	judge(f, r.t.dialect, goalHistoryStall, "")
	return nil
}

// pointReadTime fills a table of a row per point, as a plain schema would
// keep stream points, and times reading n of them back with one SELECT in
// primary-key order, every column scanned: the best of three, and
// fleetbench's CPU seconds a read.
func (s *storage) pointReadTime(ctx context.Context, n int) (time.Duration, float64, error) {
	// The data of the history scenario's points, {"temp":20.125}: a
	// double's shortest text (PostgreSQL's numeric would have written 20
	// decimals, {"temp": 20.00000000000000000000}, three times the bytes).
	typ, data := "JSONB", `CAST('{"temp":' || CAST(20 + (i % 1000) / 8.0 AS DOUBLE PRECISION) || '}' AS JSONB)`
	if s.dialect != "postgres" {
		typ, data = "TEXT", `'{"temp":' || printf('%.15g', 20 + (i % 1000) / 8.0) || '}'`
	}
	fill := fmt.Sprintf("INSERT INTO pts SELECT 'b', 'dev', 'env', i * 1000, i, %s, 0 FROM generate_series(0, %d) AS g(i)", data, n-1)
	if s.dialect != "postgres" {
		fill = fmt.Sprintf("WITH RECURSIVE c(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM c WHERE i + 1 < %d) "+
			"INSERT INTO pts SELECT 'b', 'dev', 'env', i * 1000, i, %s, 0 FROM c", n, data)
	}
	for _, q := range []string{
		"DROP TABLE IF EXISTS pts",
		`CREATE TABLE pts (tenant TEXT NOT NULL, device_id TEXT NOT NULL, stream TEXT NOT NULL, ts BIGINT NOT NULL, seq BIGINT NOT NULL,
			data ` + typ + ` NOT NULL, received_at BIGINT NOT NULL, PRIMARY KEY (tenant, device_id, stream, ts, seq))`,
		fill,
	} {
		if _, err := s.db.ExecContext(ctx, q); err != nil {
			return 0, 0, fmt.Errorf("point read baseline: %w", err)
		}
	}
	var best time.Duration
	const reads = 3
	cpu0 := procCPU(os.Getpid())
	for range reads {
		t0 := time.Now()
		rows, err := s.db.QueryContext(ctx, s.rebind("SELECT ts, seq, data, received_at FROM pts WHERE tenant = ? AND device_id = ? AND stream = ? ORDER BY ts, seq"), "b", "dev", "env")
		if err != nil {
			return 0, 0, fmt.Errorf("point read baseline: %w", err)
		}
		got := 0
		for rows.Next() {
			var ts, seq, received int64
			var data []byte
			if err := rows.Scan(&ts, &seq, &data, &received); err != nil {
				rows.Close()
				return 0, 0, err
			}
			got++
		}
		if err := rows.Err(); err != nil || got != n {
			return 0, 0, fmt.Errorf("point read baseline: %d rows of %d (%v)", got, n, err)
		}
		if d := time.Since(t0); best == 0 || d < best {
			best = d
		}
	}
	cpu := (procCPU(os.Getpid()) - cpu0) / reads
	_, err := s.db.ExecContext(ctx, "DROP TABLE pts")
	return best, cpu, err
}
