package sqlstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetd/fleet"
	kflate "github.com/klauspost/compress/flate"
	"github.com/klauspost/compress/zstd"
)

// Stream history (docs/telemetry.md, migration 0027). The points of one
// ingest call that fall in one UTC hour are one row of stream_points, a
// chunk: a batch costs a row, not a row a point, which keeps ingest with
// history near the speed of latest-only ingest (docs/operations.md, "Stream
// history"). A chunk spans at most an hour, so a read of [lo, hi) finds
// every chunk that holds one of its points among those that start in
// [lo's hour, hi).
//
// Tables are partitioned by time (a partition is a table on SQLite and a
// declarative range partition on PostgreSQL, named alike) and expire by
// dropping whole partitions: O(1) in the points they hold on PostgreSQL;
// SQLite's are emptied in slices first (dropSliced).

const (
	hourMs   = int64(time.Hour / time.Millisecond)
	minuteMs = int64(time.Minute / time.Millisecond)
	dayMs    = 24 * hourMs
)

// partKind is one of the partitioned tables.
type partKind struct {
	table   string
	monthly bool // else daily
}

var (
	pointsPart = partKind{"stream_points", false}
	minutePart = partKind{"stream_rollup_1m", false}
	hourPart   = partKind{"stream_rollup_1h", true}
	// tenMinutePart (migration 0048) holds the rollups of 10 minutes,
	// which RollUp adds from the minute rollups it adds: a chart of a day
	// in 10-minute buckets reads 144 rows of a field, not 1440.
	tenMinutePart = partKind{"stream_rollup_10m", false}
	partKinds     = []partKind{pointsPart, minutePart, hourPart, tenMinutePart}
)

const tenMinutesMs = 10 * minuteMs

// start returns the start of the partition holding ms.
func (k partKind) start(ms int64) int64 {
	t := time.UnixMilli(ms).UTC()
	if k.monthly {
		return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	}
	return floorTo(ms, dayMs)
}

// next returns the start of the partition after the one starting at start.
func (k partKind) next(start int64) int64 {
	if k.monthly {
		return time.UnixMilli(start).UTC().AddDate(0, 1, 0).UnixMilli()
	}
	return start + dayMs
}

// name returns the name of the partition starting at start.
func (k partKind) name(start int64) string {
	t := time.UnixMilli(start).UTC()
	if k.monthly {
		return fmt.Sprintf("%s_%04d%02d", k.table, t.Year(), t.Month())
	}
	return fmt.Sprintf("%s_%04d%02d%02d", k.table, t.Year(), t.Month(), t.Day())
}

// parse returns the start of the partition named name, if it is one.
func (k partKind) parse(name string) (int64, bool) {
	suffix, ok := strings.CutPrefix(name, k.table+"_")
	layout := "20060102"
	if k.monthly {
		layout = "200601"
	}
	if !ok || len(suffix) != len(layout) {
		return 0, false
	}
	t, err := time.Parse(layout, suffix)
	if err != nil {
		return 0, false
	}
	return t.UnixMilli(), true
}

func floorTo(ms, unit int64) int64 {
	r := ms % unit
	if r < 0 {
		r += unit
	}
	return ms - r
}

// createPartition returns the DDL that makes the partition of k starting
// at start, if it does not exist.
func (d dialect) createPartition(k partKind, start int64) string {
	name := k.name(start)
	if d == postgres {
		return fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s PARTITION OF %s FOR VALUES FROM (%d) TO (%d)", name, k.table, start, k.next(start))
	}
	if k == pointsPart {
		return `CREATE TABLE IF NOT EXISTS ` + name + ` (
			tenant TEXT NOT NULL, device_id TEXT NOT NULL, stream TEXT NOT NULL,
			ts_min INTEGER NOT NULL, ts_max INTEGER NOT NULL, id INTEGER NOT NULL, n INTEGER NOT NULL,
			received_at INTEGER NOT NULL, points BLOB NOT NULL,
			PRIMARY KEY (tenant, device_id, stream, ts_min, id)) WITHOUT ROWID`
	}
	// The index is migration 0043's, which PostgreSQL's partitions have
	// from their parent.
	return `CREATE TABLE IF NOT EXISTS ` + name + ` (
		tenant TEXT NOT NULL, device_id TEXT NOT NULL, stream TEXT NOT NULL, field TEXT NOT NULL,
		bucket INTEGER NOT NULL, n INTEGER NOT NULL, vmin REAL NOT NULL, vmax REAL NOT NULL,
		vsum REAL NOT NULL, vlast REAL NOT NULL, last_ts INTEGER NOT NULL, last_seq INTEGER NOT NULL,
		PRIMARY KEY (tenant, device_id, stream, field, bucket)) WITHOUT ROWID;
		CREATE INDEX IF NOT EXISTS ` + name + `_by_stream ON ` + name + ` (tenant, stream, field, bucket)`
}

// historyState is what the DB keeps in memory for history.
type historyState struct {
	retention time.Duration // the server's default
	// known holds the partitions known to exist: those the maintenance
	// made or found. A write to another makes it first.
	known sync.Map // name -> struct{}
	mu    sync.Mutex
	// tenants caches each tenant's retention for ingest, which must not
	// read it for every batch; a change made on another replica is seen
	// within retentionTTL.
	tenants map[string]tenantRetention
	stats   struct{ kept, expired, future atomic.Uint64 }
	// inflated keeps the text of the chunks read last (history_read.go).
	inflated inflatedChunks
	// parts keeps the partitions listed last on SQLite (partitions).
	parts partitionLists
	// maxSeries is fleet.MaxSeriesBuckets; tests lower it.
	maxSeries int
	// tenMinutesFrom is the bucket 10-minute rollups are whole from
	// (tenMinuteRollupsFrom); -1 until read.
	tenMinutesFrom atomic.Int64
	// wake asks RunHistoryMaintenance to run now: a retention was set.
	wake chan struct{}
}

type tenantRetention struct {
	d       time.Duration
	own     bool
	fetched time.Time
}

const retentionTTL = time.Minute

// HistoryStats counts what stream history did since the DB was opened.
type HistoryStats struct {
	Kept    uint64 // points kept
	Expired uint64 // points not kept: older than the retention on arrival
	Future  uint64 // points not kept: beyond fleet.FutureHorizon
}

// HistoryStats returns the history counters, for metrics.
func (db *DB) HistoryStats() HistoryStats {
	s := &db.history.stats
	return HistoryStats{Kept: s.kept.Load(), Expired: s.expired.Load(), Future: s.future.Load()}
}

// StreamRetention returns a tenant's retention of raw points and whether
// it is the tenant's own rather than the server's.
func (db *DB) StreamRetention(ctx context.Context, tenant string) (time.Duration, bool, error) {
	var ms sql.NullInt64
	err := db.queryRow(ctx, "SELECT stream_retention_ms FROM tenants WHERE name = ?", tenant).Scan(&ms)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, fleet.Errorf(fleet.ENOTFOUND, "tenant %q not found", tenant)
	} else if err != nil {
		return 0, false, db.classify(err)
	}
	d, own := db.history.retention, ms.Valid
	if own {
		d = time.Duration(ms.Int64) * time.Millisecond
	}
	db.history.mu.Lock()
	db.history.tenants[tenant] = tenantRetention{d, own, db.now()}
	db.history.mu.Unlock()
	return d, own, nil
}

// SetStreamRetention sets a tenant's retention of raw points; 0 returns
// it to the server's. Points already dropped stay dropped; a longer
// retention keeps partitions longer from the next maintenance on, which
// RunHistoryMaintenance runs at once (a shorter one frees what it no
// longer keeps without waiting for the hour).
func (db *DB) SetStreamRetention(ctx context.Context, tenant string, d time.Duration) error {
	if d != 0 && (d < fleet.MinStreamRetention || d > fleet.MaxStreamRetention) {
		return fleet.FieldErrors(map[string]string{"retention_seconds": fmt.Sprintf("must be 0 (the server's) or between %d and %d",
			int64(fleet.MinStreamRetention/time.Second), int64(fleet.MaxStreamRetention/time.Second))})
	}
	var ms any
	if d != 0 {
		ms = d.Milliseconds()
	}
	// Under the maintenance's lock on PostgreSQL: a drop that found a
	// partition expired drops it before a longer retention commits, and
	// one after sees it (dropDetached).
	err := db.updateAlone(ctx, func(ctx context.Context, tx *Tx) error {
		if err := tx.lockHistory(ctx); err != nil {
			return err
		}
		n, err := tx.execCount(ctx, "UPDATE tenants SET stream_retention_ms = ? WHERE name = ?", ms, tenant)
		if err == nil && n == 0 {
			err = fleet.Errorf(fleet.ENOTFOUND, "tenant %q not found", tenant)
		}
		return err
	})
	if err != nil {
		return err
	}
	select {
	case db.history.wake <- struct{}{}:
	default:
	}
	_, _, err = db.StreamRetention(ctx, tenant)
	return err
}

// tenantRetention returns a tenant's retention for ingest, cached.
func (db *DB) tenantRetention(ctx context.Context, tenant string) (time.Duration, error) {
	db.history.mu.Lock()
	r, ok := db.history.tenants[tenant]
	db.history.mu.Unlock()
	if ok && db.now().Sub(r.fetched) < retentionTTL {
		return r.d, nil
	}
	d, _, err := db.StreamRetention(ctx, tenant)
	return d, err
}

// chunk is the points of one ingest call in one hour, encoded, with their
// rollups.
//
// The points are a canonical JSON array of [timestamp, sequence, data],
// compressed with Zstandard at its fastest (packPoints; chunks written
// before are DEFLATE): a point's field names repeat in every point, and
// 100 points of three fields take under 1 KB rather than
// 5.3 KB, which fits a chunk in a database page with its neighbours
// instead of three pages of its own. Writing those pages, not compressing,
// was what ingest with history spent its time on: 4x fewer points a
// second than latest-only ingest uncompressed, on SQLite.
type chunk struct {
	tsMin, tsMax, id int64
	n                int
	received         int64
	points           []byte // compressed (packPoints)
	rollups          string // the chunk's rollups, queued (rollup.go)
}

// rollup is the aggregate of one numeric field's values in one minute or
// hour bucket.
type rollup struct {
	kind            partKind
	field           string
	bucket, n       int64
	min, max, sum   float64
	last            float64
	lastTS, lastSeq int64
}

// add folds a value at (ts, seq) into r.
func (r *rollup) add(v float64, ts, seq int64) {
	if r.n == 0 {
		r.min, r.max = v, v
	}
	r.n++
	r.min, r.max, r.sum = min(r.min, v), max(r.max, v), r.sum+v
	if r.n == 1 || r.before(ts, seq, v) {
		r.last, r.lastTS, r.lastSeq = v, ts, seq
	}
}

// before reports whether r's last value comes before the value v at (ts,
// seq): by timestamp, then sequence, then value. Of points equal in
// timestamp and sequence the greatest value is last, not the one that
// arrived last: the order of arrival is not kept where rollups are added
// up, nor known between two devices, and a rule on the value gives every
// order of merging, and the raw points, the same last (docs/telemetry.md).
// upsertRollup's SQL says the same.
func (r *rollup) before(ts, seq int64, v float64) bool {
	switch {
	case ts != r.lastTS:
		return ts > r.lastTS
	case seq != r.lastSeq:
		return seq > r.lastSeq
	}
	return v > r.last
}

// merge folds o into r.
func (r *rollup) merge(o *rollup) {
	if o.n == 0 {
		return
	}
	if r.n == 0 {
		*r = *o
		return
	}
	r.n += o.n
	r.min, r.max, r.sum = min(r.min, o.min), max(r.max, o.max), r.sum+o.sum
	if r.before(o.lastTS, o.lastSeq, o.last) {
		r.last, r.lastTS, r.lastSeq = o.last, o.lastTS, o.lastSeq
	}
}

// numeric returns a data value as a number, if it is one.
func numeric(v any) (float64, bool) {
	switch v := v.(type) {
	case int64:
		return float64(v), true
	case float64:
		return v, true
	}
	return 0, false
}

// prepareHistory returns the chunks that keep pts (sorted by timestamp,
// then sequence), leaving out and counting those outside the tenant's
// retention. It runs before the write job, so a job run again after a
// failed batch writes the same chunks, whose ids make the write
// idempotent.
func (db *DB) prepareHistory(ctx context.Context, tenant string, pts []fleet.DataPoint) ([]chunk, error) {
	if len(pts) == 0 {
		return nil, nil
	}
	retention, err := db.tenantRetention(ctx, tenant)
	if err != nil {
		return nil, err
	}
	now := db.now()
	oldest, newest := millis(now.Add(-retention)), millis(now.Add(fleet.FutureHorizon))
	var chunks []chunk
	var b []byte
	var c *chunk
	var fields map[string]*fieldRollups
	flush := func() error {
		if c == nil {
			return nil
		}
		b = append(b, ']')
		if len(b) > maxChunkText {
			// unpackPoints would refuse it: kept, it would be a chunk no
			// read gets past (raised --max-body-bytes or
			// --mqtt-max-packet-size let a batch be this large).
			return fleet.Errorf(fleet.EINVALID, "the data points of one hour of the batch take %d bytes; at most %d are kept at once", len(b), maxChunkText)
		}
		c.id = chunkID(b)
		c.points = packPoints(b)
		var rs []rollup
		for _, f := range fields {
			rs = append(append(rs, f.done...), f.minute, f.hour)
		}
		c.rollups = encodeRollups(rs)
		chunks = append(chunks, *c)
		c = nil
		return nil
	}
	for i := range pts {
		p := &pts[i]
		ts := millis(p.Timestamp)
		switch {
		case ts < oldest:
			db.history.stats.expired.Add(1)
			continue
		case ts > newest:
			db.history.stats.future.Add(1)
			continue
		}
		if c != nil && floorTo(ts, hourMs) != floorTo(c.tsMin, hourMs) {
			if err := flush(); err != nil {
				return nil, err
			}
		}
		if c == nil {
			c = &chunk{tsMin: ts, received: millis(p.ReceivedAt)}
			b = append(b[:0], '[')
			fields = map[string]*fieldRollups{}
		} else {
			b = append(b, ',')
		}
		if b, err = appendPoint(b, ts, p.Sequence, p.Data); err != nil {
			return nil, fleet.Errorf(fleet.EINVALID, "data point cannot be stored: %v", err)
		}
		c.tsMax, c.n = ts, c.n+1
		for name, v := range p.Data {
			if x, ok := numeric(v); ok {
				f := fields[name]
				if f == nil {
					f = &fieldRollups{minute: rollup{kind: minutePart, field: name}, hour: rollup{kind: hourPart, field: name}}
					fields[name] = f
				}
				f.add(x, ts, p.Sequence)
			}
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return chunks, db.ensurePartitions(ctx, chunks)
}

// appendPoint appends a point of a chunk's text: [timestamp, sequence,
// data], data in canonical JSON, without spaces (chunkPoints reads it).
func appendPoint(b []byte, ts, seq int64, data map[string]any) ([]byte, error) {
	b = append(b, '[')
	b = append(strconv.AppendInt(b, ts, 10), ',')
	b = append(strconv.AppendInt(b, seq, 10), ',')
	b, err := fleet.AppendCanonical(b, data)
	return append(b, ']'), err
}

// chunkID is the id of the chunk whose points are the canonical text
// points: a hash of them, so that a batch a device sends again (after a
// lost PUBACK, or as an HTTP client's retry) makes the chunks it made the
// first time, whose rows exist, and is neither kept nor rolled up twice,
// on a replica or another, at once or later. A batch that overlaps an
// earlier one only in part is another chunk and is kept as sent.
func chunkID(points []byte) int64 {
	h := sha256.Sum256(points)
	return int64(binary.BigEndian.Uint64(h[:8]))
}

// fieldRollups are a field's rollups in a chunk: its points come in
// timestamp order, so each minute's rollup is done when the next begins.
// The chunk spans one hour: one hour rollup.
type fieldRollups struct {
	minute, hour rollup
	done         []rollup // minutes past
}

func (f *fieldRollups) add(x float64, ts, seq int64) {
	if m := floorTo(ts, minuteMs); f.minute.n > 0 && m != f.minute.bucket {
		f.done = append(f.done, f.minute)
		f.minute = rollup{kind: minutePart, field: f.minute.field}
	}
	f.minute.bucket, f.hour.bucket = floorTo(ts, minuteMs), floorTo(ts, hourMs)
	f.minute.add(x, ts, seq)
	f.hour.add(x, ts, seq)
}

// ensurePartitions makes the partitions chunks write to unless they are
// known to exist, before the write's job: DDL in a group commit would
// hold every writer of the batch behind its locks. The maintenance makes
// partitions ahead, so this is for partitions of the past within the
// retention that nothing wrote to yet. Replicas on PostgreSQL take turns
// through the maintenance's advisory lock, as CREATE TABLE IF NOT EXISTS
// may otherwise fail on a table made meanwhile.
func (db *DB) ensurePartitions(ctx context.Context, chunks []chunk) error {
	var missing []part
	for _, c := range chunks {
		for _, p := range c.parts() {
			if _, ok := db.history.known.Load(p.k.name(p.start)); !ok && !slices.Contains(missing, p) {
				missing = append(missing, p)
			}
		}
	}
	if len(missing) == 0 {
		return nil
	}
	err := db.updateAlone(ctx, func(ctx context.Context, tx *Tx) error { return tx.makePartitions(ctx, missing) })
	if err != nil {
		return err
	}
	for _, p := range missing {
		db.history.known.Store(p.k.name(p.start), struct{}{})
	}
	return nil
}

// makePartitions makes parts, those that do not exist, taking turns with
// other replicas (lockHistory).
func (tx *Tx) makePartitions(ctx context.Context, parts []part) error {
	var missing []part
	for _, p := range parts {
		// One that exists needs no lock, which a replica's drop holds while
		// its detach waits for the parent's readers (dropDetached).
		if ok, err := tx.partitionExists(ctx, p); err != nil {
			return err
		} else if !ok {
			missing = append(missing, p)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if err := tx.lockHistory(ctx); err != nil {
		return err
	}
	for _, p := range missing {
		if err := tx.makePartition(ctx, p); err != nil {
			return fmt.Errorf("create partition %s: %w", p.k.name(p.start), err)
		}
	}
	return nil
}

// makePartition makes p unless it exists. On PostgreSQL the partition is
// made a table of its own, then attached to its parent, which takes the
// parent's SHARE UPDATE EXCLUSIVE lock (CREATE TABLE … PARTITION OF takes
// its ACCESS EXCLUSIVE lock, which reads and writes of the parent wait
// for, as they wait for any statement queued for it behind a long read);
// a table of the name that is not attached (detached, not yet dropped) is
// attached, if its range is not expired, or dropped by the maintenance.
func (tx *Tx) makePartition(ctx context.Context, p part) error {
	if tx.db.dialect != postgres {
		_, err := tx.tx.ExecContext(ctx, tx.db.dialect.createPartition(p.k, p.start))
		return err
	}
	name := p.k.name(p.start)
	_, err := tx.tx.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS "+name+" (LIKE "+p.k.table+" INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
	if err != nil {
		return err
	}
	var exists, attached, pending bool
	if err := tx.queryRow(ctx, partitionState, name).Scan(&exists, &attached, &pending); err != nil || attached {
		return err
	}
	_, err = tx.tx.ExecContext(ctx, fmt.Sprintf("ALTER TABLE %s ATTACH PARTITION %s FOR VALUES FROM (%d) TO (%d)", p.k.table, name, p.start, p.k.next(p.start)))
	return err
}

// partitionState tells whether PostgreSQL's table named ? exists, is a
// partition, and is being detached (DETACH … CONCURRENTLY cut short). It
// reads the catalog in the statement's snapshot: to_regclass reads the
// backend's cache of it, which an advisory lock does not bring up to date
// with what another replica committed before letting go of it.
const partitionState = `SELECT c.oid IS NOT NULL, i.inhrelid IS NOT NULL, coalesce(i.inhdetachpending, false)
	FROM (SELECT 1) AS one
	LEFT JOIN pg_class c ON c.relname = ? AND c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())
	LEFT JOIN pg_inherits i ON i.inhrelid = c.oid`

// partitionExists reports whether p is a partition of its parent on
// PostgreSQL, not being detached; on SQLite it reports false, and
// makePartition's CREATE TABLE IF NOT EXISTS tells.
func (tx *Tx) partitionExists(ctx context.Context, p part) (bool, error) {
	if tx.db.dialect != postgres {
		return false, nil
	}
	var exists, attached, pending bool
	err := tx.queryRow(ctx, partitionState, p.k.name(p.start)).Scan(&exists, &attached, &pending)
	return attached && !pending, err
}

// part is one partition: its kind and the start of its range.
type part struct {
	k     partKind
	start int64
}

// parts are the partitions a chunk writes to: its points' and its rollups'.
func (c chunk) parts() []part {
	return []part{{pointsPart, pointsPart.start(c.tsMin)}, {minutePart, minutePart.start(c.tsMin)}, {hourPart, hourPart.start(c.tsMin)},
		{tenMinutePart, tenMinutePart.start(c.tsMin)}}
}

// rewriteHistory runs write, a commit of chunks, and runs it once more if
// it failed on a partition that this DB took to exist but another dropped
// (another replica's maintenance, or an operator): the chunks'
// partitions are forgotten and made again first.
func (db *DB) rewriteHistory(ctx context.Context, chunks []chunk, write func() error) error {
	err := write()
	if len(chunks) == 0 || !isMissingTable(err) {
		return err
	}
	for _, c := range chunks {
		for _, p := range c.parts() {
			db.history.known.Delete(p.k.name(p.start))
		}
	}
	if err := db.ensurePartitions(ctx, chunks); err != nil {
		return err
	}
	return write()
}

// lockHistory makes replicas on PostgreSQL change partitions one at a
// time, until the transaction ends.
func (tx *Tx) lockHistory(ctx context.Context) error {
	if tx.db.dialect != postgres {
		return nil
	}
	_, err := tx.exec(ctx, "SELECT pg_advisory_xact_lock(?, hashtext(current_schema()))", historyLock)
	return err
}

// writeHistory writes chunks of a device's stream and queues their
// rollups (rollup.go). A chunk written before (the same id) is skipped with
// its rollups, so the write is idempotent.
//
// A device deleted and made again with the same id does not read its
// predecessor's chunks (their received_at is before its created_at); when
// it sends a batch byte for byte one its predecessor sent, the chunk's id
// is taken by the predecessor's row, and the chunk is written under
// another id made of the device's creation time (successorChunkID). Only
// a write that finds its id taken pays the query that tells the two apart.
func (tx *Tx) writeHistory(ctx context.Context, tenant, device, stream string, chunks []chunk) error {
	for i := range chunks {
		c := &chunks[i]
		table := pointsPart.name(pointsPart.start(c.tsMin))
		n, err := tx.writeChunk(ctx, table, tenant, device, stream, c, c.id)
		if err == nil && n == 0 {
			var created int64
			err = tx.queryRow(ctx, `SELECT d.created_at FROM `+table+` p JOIN devices d ON d.tenant = p.tenant AND d.id = p.device_id
				WHERE p.tenant = ? AND p.device_id = ? AND p.stream = ? AND p.ts_min = ? AND p.id = ? AND p.received_at < d.created_at`,
				tenant, device, stream, c.tsMin, c.id).Scan(&created)
			switch {
			case errors.Is(err, sql.ErrNoRows):
				err = nil // this device's own chunk, sent again
			case err == nil:
				n, err = tx.writeChunk(ctx, table, tenant, device, stream, c, successorChunkID(c.id, created))
			}
		}
		if err != nil {
			return err
		}
		if n > 0 {
			tx.db.history.stats.kept.Add(uint64(c.n))
		}
	}
	return nil
}

// writeChunk writes c under id with its queued rollups, unless a chunk of
// that id exists; n is the chunks written, 0 or 1.
func (tx *Tx) writeChunk(ctx context.Context, table, tenant, device, stream string, c *chunk, id int64) (n int64, err error) {
	insert := "INSERT INTO " + table + ` (tenant, device_id, stream, ts_min, ts_max, id, n, received_at, points)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`
	args := []any{tenant, device, stream, c.tsMin, c.tsMax, id, c.n, c.received, c.points}
	if tx.db.dialect == postgres {
		// One round trip for the chunk and its queued rollups.
		err = tx.queryRow(ctx, `WITH c AS (`+insert+` RETURNING id),
			q AS (INSERT INTO stream_rollup_queue (tenant, device_id, stream, rollups) SELECT ?, ?, ?, ? FROM c WHERE ? <> '')
			SELECT count(*) FROM c`, append(args, tenant, device, stream, c.rollups, c.rollups)...).Scan(&n)
	} else if n, err = tx.execCount(ctx, insert, args...); err == nil && n > 0 && c.rollups != "" {
		_, err = tx.exec(ctx, "INSERT INTO stream_rollup_queue (tenant, device_id, stream, rollups) VALUES (?, ?, ?, ?)",
			tenant, device, stream, c.rollups)
	}
	return n, err
}

// successorChunkID is the id of a chunk whose own id (chunkID) a
// predecessor of its device, made at another time, holds: a hash of that
// id and the device's creation time, the same for every sending.
func successorChunkID(id, deviceCreated int64) int64 {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], uint64(id))
	binary.BigEndian.PutUint64(b[8:], uint64(deviceCreated))
	return chunkID(b[:])
}

// retentions returns how long each kind of partition is kept: raw points
// as long as the longest retention of any tenant, rollups at least as
// long as their own.
func (db *DB) retentions(ctx context.Context) (map[partKind]time.Duration, error) {
	return db.retentionsFrom(func(q string) *sql.Row { return db.queryRow(ctx, q) })
}

// retentionsFrom is retentions read by row: in a write job, or on the
// connection that holds the maintenance's lock.
func (db *DB) retentionsFrom(row func(query string) *sql.Row) (map[partKind]time.Duration, error) {
	var longest sql.NullInt64
	if err := row("SELECT max(stream_retention_ms) FROM tenants").Scan(&longest); err != nil {
		return nil, db.classify(err)
	}
	raw := db.history.retention
	if longest.Valid {
		raw = max(raw, time.Duration(longest.Int64)*time.Millisecond)
	}
	return map[partKind]time.Duration{
		pointsPart:    raw,
		minutePart:    max(raw, fleet.MinuteRollupRetention),
		hourPart:      max(raw, fleet.HourRollupRetention),
		tenMinutePart: max(raw, fleet.TenMinuteRollupRetention),
	}, nil
}

// expired reports whether the partition of k starting at start is wholly
// older than keep's retention of k at now.
func expired(keep map[partKind]time.Duration, k partKind, start, now int64) bool {
	return k.next(start) <= now-keep[k].Milliseconds()
}

// partitions returns the partitions of k that exist, by start, oldest
// first. The slice is shared: callers do not change it. On PostgreSQL
// they are the tables named as partitions of k, attached or not: a
// partition detached and not yet dropped (a stop between the two) is one
// to drop.
func (db *DB) partitions(ctx context.Context, q querier, k partKind) ([]int64, error) {
	// In a read transaction on SQLite, the list read last for the same
	// schema: SQLite counts the changes of a schema that commit (its
	// schema_version), and a read transaction sees one committed schema.
	// Listing the tables scans every row of sqlite_master, about 80 µs of
	// each page of points read, 7 ms a day's read.
	var version int64 = -1
	if rt, ok := q.(readTx); ok && db.dialect == sqlite {
		if err := rt.queryRow(ctx, "PRAGMA schema_version").Scan(&version); err != nil {
			return nil, err
		}
		if starts, ok := db.history.parts.get(version, k); ok {
			return starts, nil
		}
	}
	query := "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE ? ESCAPE '\\'"
	if db.dialect == postgres {
		query = `SELECT c.relname FROM pg_class c WHERE c.relkind = 'r' AND c.relname LIKE ? ESCAPE '\' AND pg_table_is_visible(c.oid)`
	}
	rows, err := q.query(ctx, query, k.table+"\\_%")
	if err != nil {
		return nil, err
	}
	var starts []int64
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return nil, err
		}
		if s, ok := k.parse(name); ok {
			starts = append(starts, s)
		}
	}
	if err := rows.Close(); err != nil {
		return nil, err
	}
	slices.Sort(starts)
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if version >= 0 {
		db.history.parts.put(version, k, starts)
	}
	return starts, nil
}

// partitionLists keeps the partitions of each kind listed last on SQLite,
// with the schema_version they were listed at (partitions).
type partitionLists struct {
	mu      sync.Mutex
	version int64
	starts  map[partKind][]int64
}

func (l *partitionLists) get(version int64, k partKind) ([]int64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	starts, ok := l.starts[k]
	return starts, ok && l.version == version
}

func (l *partitionLists) put(version int64, k partKind, starts []int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.starts == nil || l.version != version {
		l.version, l.starts = version, map[partKind][]int64{}
	}
	l.starts[k] = starts
}

// MaintainHistory makes the partitions of today and the next two days (or
// months) and drops those wholly older than their retention, each in
// transactions of its own: on PostgreSQL a partition is made and attached
// to its parent, or detached from it and dropped, under the parent's
// SHARE UPDATE EXCLUSIVE lock, which ingest and reads do not wait for, and
// no transaction holds it across partitions (docs/telemetry.md). Replicas
// on PostgreSQL take turns through an advisory lock, and a drop checks
// under it that the partition is still expired: a tenant's retention made
// longer meanwhile keeps it. It returns the partitions it dropped.
func (db *DB) MaintainHistory(ctx context.Context) ([]string, error) {
	keep, err := db.retentions(ctx)
	if err != nil {
		return nil, err
	}
	now := millis(db.now())
	for _, k := range partKinds {
		for s, i := k.start(now), 0; i < 3; s, i = k.next(s), i+1 {
			if _, ok := db.history.known.Load(k.name(s)); ok {
				// Made or found by an earlier run, or by ingest; one
				// dropped since by another (an operator) is made again by
				// the first write to it (rewriteHistory).
				continue
			}
			err := db.updateAlone(ctx, func(ctx context.Context, tx *Tx) error { return tx.makePartitions(ctx, []part{{k, s}}) })
			if err != nil {
				return nil, err
			}
			db.history.known.Store(k.name(s), struct{}{})
		}
	}
	var dropped []string
	for _, k := range partKinds {
		starts, err := db.partitions(ctx, db, k)
		if err != nil {
			return dropped, err
		}
		var kept []part
		for _, s := range starts {
			if !expired(keep, k, s, now) {
				if db.dialect == sqlite && k != pointsPart {
					kept = append(kept, part{k, s})
				}
				continue
			}
			var ok bool
			if db.dialect == sqlite {
				ok, err = db.dropSliced(ctx, k, s)
			} else {
				ok, err = db.dropDetached(ctx, k, s)
			}
			if err != nil {
				return dropped, err
			}
			if ok {
				dropped = append(dropped, k.name(s))
				db.history.known.Delete(k.name(s))
			}
		}
		if len(kept) > 0 {
			// A partition made before migration 0043 gains its index; for
			// the others this does nothing.
			err := db.update(ctx, func(ctx context.Context, tx *Tx) error {
				for _, p := range kept {
					if _, err := tx.tx.ExecContext(ctx, db.dialect.createPartition(p.k, p.start)); err != nil {
						return fmt.Errorf("index partition %s: %w", p.k.name(p.start), err)
					}
				}
				return nil
			})
			if err != nil {
				return dropped, err
			}
		}
	}
	return dropped, nil
}

// historyLock is the first key of the advisory lock under which replicas on
// PostgreSQL make and drop partitions ("fleet"); the second is a hash of
// the schema, so that installations in schemas of one database (and
// tests) do not wait for each other's drops, which hold it while their
// detach waits for their readers.
const historyLock = 439788553

// dropDetached drops PostgreSQL's partition of k starting at start if it
// is still expired once this replica holds the maintenance's lock, and
// reports whether it did. It is detached first (DETACH PARTITION
// CONCURRENTLY, which takes the parent's SHARE UPDATE EXCLUSIVE lock, not
// the ACCESS EXCLUSIVE lock a DROP TABLE of an attached partition takes
// and holds, which every read and write of the parent would wait for) and
// dropped once it is a table of its own. DETACH CONCURRENTLY commits twice
// and may not run in a transaction block, so the lock is the session's,
// on a connection held for it; a detach cut short (a stop, a lost
// connection) is finished with FINALIZE at the next maintenance.
func (db *DB) dropDetached(ctx context.Context, k partKind, start int64) (bool, error) {
	name := k.name(start)
	conn, err := db.write.Conn(ctx)
	if err != nil {
		return false, db.classify(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_lock($1, hashtext(current_schema()))", historyLock); err != nil {
		return false, db.classify(err)
	}
	defer func() {
		if _, err := conn.ExecContext(context.Background(), "SELECT pg_advisory_unlock($1, hashtext(current_schema()))", historyLock); err != nil {
			// The connection is not given back to the pool holding the lock.
			conn.Raw(func(any) error { return driver.ErrBadConn })
		}
	}()
	keep, err := db.retentionsFrom(func(q string) *sql.Row { return conn.QueryRowContext(ctx, q) })
	if err != nil {
		return false, err
	}
	if !expired(keep, k, start, millis(db.now())) {
		return false, nil // a retention was made longer
	}
	var exists, attached, pending bool
	err = conn.QueryRowContext(ctx, db.dialect.rebind(partitionState), name).Scan(&exists, &attached, &pending)
	if err != nil {
		return false, db.classify(err)
	}
	if !exists {
		return false, nil // another replica dropped it
	}
	switch {
	case pending:
		_, err = conn.ExecContext(ctx, "ALTER TABLE "+k.table+" DETACH PARTITION "+name+" FINALIZE")
	case attached:
		_, err = conn.ExecContext(ctx, "ALTER TABLE "+k.table+" DETACH PARTITION "+name+" CONCURRENTLY")
	}
	if err == nil {
		_, err = conn.ExecContext(ctx, "DROP TABLE IF EXISTS "+name)
	}
	if err != nil {
		return false, fmt.Errorf("drop partition %s: %w", name, db.classify(err))
	}
	return true, nil
}

// Dropping a partition on SQLite frees its pages: DROP TABLE walks the
// table's B-tree and every overflow page of its chunks to put them on the
// free list (a day of 10 million points in chunks of 1000 is 94 MB), in
// the write transaction, and every writer waits for it: 35-357 ms on the
// development machine, once 1.9 s, and ingest's p99 while it ran 4.5x
// its p99 before under load (docs/benchmarks-notebook.md, "Dropping a
// day in slices"). No statement frees a table's pages in O(1) in a
// database file, so SQLite's expired partitions are emptied a slice of
// rows a write job, each job about a millisecond among the others of its
// group commit, with a pause as long as the slice between two, and
// dropped once empty. Slices of 2 ms left ingest's p99 during the drop of
// five days 2.1-3.0x its p99 before in 5 runs of 6; slices of 1 ms,
// 1.4-2.0x, the days taking 0.3-0.4 s rather than 0.2 (notebook, "Slices
// of a millisecond"). Each job checks first that the partition is still
// expired: a tenant's retention made longer since keeps what is left of
// it. A drop cut short (a stop, a crash) goes on at the next maintenance.
const (
	dropSliceTarget = time.Millisecond // a slice's time in its job
	dropSliceMin    = 16               // rows
	dropSliceMax    = 1 << 16
)

// dropSliced empties SQLite's partition of k starting at start a slice at
// a time, then drops it, and reports whether it did: not if, at a slice,
// the partition is no longer expired. A slice is the rows up to the key of
// the nth, n doubled while a slice takes under half dropSliceTarget and
// halved while it takes over it.
func (db *DB) dropSliced(ctx context.Context, k partKind, start int64) (bool, error) {
	name := k.name(start)
	key := "tenant, device_id, stream, ts_min, id"
	if k != pointsPart {
		key = "tenant, device_id, stream, field, bucket"
	}
	nth := "SELECT " + key + " FROM " + name + " ORDER BY " + key + " LIMIT 1 OFFSET ?"
	del := "DELETE FROM " + name + " WHERE (" + key + ") <= (?, ?, ?, ?, ?)"
	n := dropSliceMin * 4
	for {
		var took time.Duration
		done, stopped := false, false
		err := db.update(ctx, func(ctx context.Context, tx *Tx) error {
			t0 := time.Now()
			defer func() { took = time.Since(t0) }()
			// Jobs of other writers ran since the last: a tenant's
			// retention made longer keeps the partition.
			keep, err := db.retentionsFrom(func(q string) *sql.Row { return tx.tx.QueryRowContext(ctx, q) })
			if err != nil {
				return err
			}
			if !expired(keep, k, start, millis(db.now())) {
				stopped = true
				return nil
			}
			last := make([]any, 5)
			ptrs := make([]any, len(last))
			for i := range last {
				ptrs[i] = &last[i]
			}
			err = tx.tx.QueryRowContext(ctx, nth, n-1).Scan(ptrs...)
			if errors.Is(err, sql.ErrNoRows) {
				// Fewer than n rows left: the drop frees no more
				// than a slice does.
				done = true
				_, err = tx.tx.ExecContext(ctx, "DROP TABLE IF EXISTS "+name)
				return err
			} else if err != nil {
				return err
			}
			_, err = tx.tx.ExecContext(ctx, del, last...)
			return err
		})
		if err != nil {
			return false, fmt.Errorf("drop partition %s: %w", name, err)
		}
		if stopped {
			return false, nil
		}
		if done {
			return true, nil
		}
		switch {
		case took < dropSliceTarget/2:
			n = min(2*n, dropSliceMax)
		case took > dropSliceTarget:
			n = max(n/2, dropSliceMin)
		}
		if len(db.jobs) == 0 {
			continue // no writer waits
		}
		select {
		case <-time.After(took):
		case <-ctx.Done():
			return false, ctx.Err()
		case <-db.stop:
			return false, fleet.Errorf(fleet.EUNAVAILABLE, "the server is shutting down")
		}
	}
}

// RunHistoryMaintenance runs MaintainHistory now, every interval and
// after SetStreamRetention, until ctx ends, logging failures.
func (db *DB) RunHistoryMaintenance(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if dropped, err := db.MaintainHistory(ctx); err != nil && ctx.Err() == nil {
			db.log.Error("stream history maintenance", "err", err)
		} else if len(dropped) > 0 {
			db.log.Info("stream history partitions dropped", "partitions", dropped)
		}
		select {
		case <-t.C:
		case <-db.history.wake:
		case <-ctx.Done():
			return
		}
	}
}

// A chunk's points are compressed with Zstandard (docs/telemetry.md, "How
// points are kept"): a chunk of 1000 points of one field (35 KB of JSON)
// is 4.3 KB, against 8.0 KB in DEFLATE at its fastest, which chunks were
// written in before, and it is read back in 35 µs against 83 and written
// in 110 against 138 (notebook, "Chunks in Zstandard"). The window is a
// chunk's largest text: an encoder's memory stays that of one chunk.
var (
	chunkEncoder, _ = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest),
		zstd.WithWindowSize(maxChunkWindow), zstd.WithLowerEncoderMem(true))
	chunkDecoder, _ = zstd.NewReader(nil, zstd.WithDecoderLowmem(true), zstd.WithDecoderMaxMemory(maxChunkText),
		zstd.WithDecoderMaxWindow(maxChunkText))
)

const (
	// maxChunkWindow is the Zstandard window chunks are written with.
	maxChunkWindow = 1 << 20
	// maxChunkText bounds what a chunk inflates to: a chunk is the points
	// of one ingest call (a request body or an MQTT payload, at most a
	// few MB at the default limits), so a larger one is a damaged row,
	// not points. prepareHistory refuses to write one.
	maxChunkText = 64 << 20
)

// packPoints compresses a chunk's JSON.
func packPoints(b []byte) []byte {
	return chunkEncoder.EncodeAll(b, make([]byte, 0, len(b)/6+64))
}

// inflaters are DEFLATE readers to reuse: a reader's state is 40 KB.
var inflaters sync.Pool

// unpackPoints reads a chunk's JSON back: a Zstandard frame, or DEFLATE
// from chunks written before (no DEFLATE stream starts with Zstandard's
// magic number: those bytes would be a stored block whose length and its
// complement disagree). DEFLATE is read with
// github.com/klauspost/compress/flate, about three times as fast as the
// standard library from a *bytes.Reader.
func unpackPoints(b []byte) ([]byte, error) {
	if bytes.HasPrefix(b, zstdMagic) {
		return chunkDecoder.DecodeAll(b, nil)
	}
	src := bytes.NewReader(b)
	r, _ := inflaters.Get().(io.ReadCloser)
	if r == nil {
		r = kflate.NewReader(src)
	} else if err := r.(kflate.Resetter).Reset(src, nil); err != nil {
		return nil, err
	}
	defer inflaters.Put(r)
	// Points took about 5 times their compressed size.
	out := bytes.NewBuffer(make([]byte, 0, 6*len(b)+512))
	_, err := out.ReadFrom(io.LimitReader(r, maxChunkText+1))
	if err == nil && out.Len() > maxChunkText {
		err = fmt.Errorf("a chunk's points exceed %d bytes", maxChunkText)
	}
	return out.Bytes(), err
}

// zstdMagic starts every Zstandard frame.
var zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}
