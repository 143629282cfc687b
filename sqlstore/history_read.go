package sqlstore

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleet"
)

// segment is a table to read and the range of its partition key to read
// in it.
type segment struct {
	table  string
	lo, hi int64
}

// segments returns what to read of k's partitions for keys in [lo, hi),
// oldest first: on SQLite the partition tables that exist; on PostgreSQL
// the parent table, once for the whole range or, with perPartition, once
// for each partition's part of it, so that a read can stop early.
func (db *DB) segments(ctx context.Context, q querier, k partKind, lo, hi int64, perPartition bool) ([]segment, error) {
	if lo >= hi {
		return nil, nil
	}
	var segs []segment
	if db.dialect == postgres {
		if !perPartition {
			return []segment{{k.table, lo, hi}}, nil
		}
		for s := k.start(lo); s < hi; s = k.next(s) {
			segs = append(segs, segment{k.table, max(lo, s), min(hi, k.next(s))})
		}
		return segs, nil
	}
	starts, err := db.partitions(ctx, q, k)
	if err != nil {
		return nil, err
	}
	for _, s := range starts {
		if s < hi && k.next(s) > lo {
			segs = append(segs, segment{k.name(s), max(lo, s), min(hi, k.next(s))})
		}
	}
	return segs, nil
}

// floor returns the oldest timestamp of a tenant's points that reads
// show: now less the retention, down to its hour, so that a chunk (which
// holds the points of one hour) is shown whole or not at all.
func (db *DB) floor(ctx context.Context, tenant string) (int64, error) {
	d, _, err := db.StreamRetention(ctx, tenant)
	if err != nil {
		return 0, err
	}
	return floorTo(millis(db.now().Add(-d)), hourMs), nil
}

// ceiling is past the newest timestamp a kept point may have.
func (db *DB) ceiling() int64 {
	return floorTo(millis(db.now().Add(fleet.FutureHorizon)), hourMs) + 2*hourMs
}

// FindStreams lists the streams a device has points of.
func (db *DB) FindStreams(ctx context.Context, tenant, device string) ([]fleet.StreamInfo, error) {
	d, err := db.FindDevice(ctx, tenant, device)
	if err != nil {
		return nil, err
	}
	floor, err := db.floor(ctx, tenant)
	if err != nil {
		return nil, err
	}
	tx, err := db.readTx(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	segs, err := db.segments(ctx, tx, pointsPart, floor, db.ceiling(), false)
	if err != nil {
		return nil, db.classify(err)
	}
	byName := map[string]*fleet.StreamInfo{}
	for _, s := range segs {
		rows, err := tx.query(ctx, `SELECT stream, sum(n), min(ts_min), max(ts_max) FROM `+s.table+`
			WHERE tenant = ? AND device_id = ? AND ts_min >= ? AND ts_min < ? AND received_at >= ? GROUP BY stream`,
			tenant, device, s.lo, s.hi, millis(d.CreatedAt))
		if err != nil {
			return nil, db.classify(err)
		}
		for rows.Next() {
			var name string
			var n, first, last int64
			if err := rows.Scan(&name, &n, &first, &last); err != nil {
				rows.Close()
				return nil, db.classify(err)
			}
			si := byName[name]
			if si == nil {
				si = &fleet.StreamInfo{Name: name, FirstTimestamp: fromMillis(first), LastTimestamp: fromMillis(last)}
				byName[name] = si
			}
			si.Points += n
			if t := fromMillis(first); t.Before(si.FirstTimestamp) {
				si.FirstTimestamp = t
			}
			if t := fromMillis(last); t.After(si.LastTimestamp) {
				si.LastTimestamp = t
			}
		}
		if err := rows.Close(); err != nil {
			return nil, db.classify(err)
		}
	}
	out := make([]fleet.StreamInfo, 0, len(byName))
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		out = append(out, *byName[name])
	}
	return out, nil
}

// pointKey orders a stream's points: by timestamp, sequence, then where
// they are kept (the chunk's id, the index in the chunk), so that equal
// timestamps and sequences still have one order a cursor can resume.
type pointKey struct {
	ts, seq, chunk int64
	idx            int
}

func comparePointKeys(a, b pointKey) int {
	switch {
	case a.ts != b.ts:
		return cmpInt(a.ts, b.ts)
	case a.seq != b.seq:
		return cmpInt(a.seq, b.seq)
	case a.chunk != b.chunk:
		return cmpInt(a.chunk, b.chunk)
	}
	return cmpInt(int64(a.idx), int64(b.idx))
}

func cmpInt(a, b int64) int {
	if a < b {
		return -1
	} else if a > b {
		return 1
	}
	return 0
}

// cursor is a position in a read of points: after key, in the order desc
// says.
type cursor struct {
	desc bool
	key  pointKey
}

func (c cursor) String() string {
	dir := "a"
	if c.desc {
		dir = "d"
	}
	return base64.RawURLEncoding.EncodeToString(fmt.Appendf(nil, "1.%s.%d.%d.%d.%d", dir, c.key.ts, c.key.seq, c.key.chunk, c.key.idx))
}

func parseCursor(s string) (cursor, error) {
	bad := fleet.FieldErrors(map[string]string{"cursor": "is not a cursor this server gave; start again without it"})
	b, err := base64.RawURLEncoding.DecodeString(s)
	parts := strings.Split(string(b), ".")
	if err != nil || len(parts) != 6 || parts[0] != "1" || parts[1] != "a" && parts[1] != "d" {
		return cursor{}, bad
	}
	var n [4]int64
	for i, p := range parts[2:] {
		if n[i], err = strconv.ParseInt(p, 10, 64); err != nil {
			return cursor{}, bad
		}
	}
	if n[3] < 0 || n[3] > fleet.MaxPointsPerBatch {
		return cursor{}, bad
	}
	return cursor{desc: parts[1] == "d", key: pointKey{n[0], n[1], n[2], int(n[3])}}, nil
}

// pagePoint is a point read with its key.
type pagePoint struct {
	key pointKey
	p   fleet.HistoryPoint
}

// bestPoints keeps the first n points of a read in its order. Points
// come mostly in that order (a chunk's points are sorted, and chunks come
// by their first timestamp): while they do, pts is a sorted list, which a
// point joins at its end and a point after a full list is dropped from at
// once. A point out of order makes it a heap whose top is the last of the
// points kept.
type bestPoints struct {
	n      int
	desc   bool
	pts    []pagePoint
	isHeap bool
}

// before reports whether a comes before b in the read's order.
func (h *bestPoints) before(a, b pointKey) bool {
	if h.desc {
		return comparePointKeys(a, b) > 0
	}
	return comparePointKeys(a, b) < 0
}

// above reports whether the point at i belongs above the one at j in the
// heap: it comes after it.
func (h *bestPoints) above(i, j int) bool { return h.before(h.pts[j].key, h.pts[i].key) }

func (h *bestPoints) full() bool { return len(h.pts) == h.n }

// last returns the key of the last point kept; there is one.
func (h *bestPoints) last() pointKey {
	if h.isHeap {
		return h.pts[0].key
	}
	return h.pts[len(h.pts)-1].key
}

// offer keeps p if it is among the first n so far.
func (h *bestPoints) offer(p pagePoint) {
	if !h.isHeap {
		if len(h.pts) == 0 || h.before(h.last(), p.key) {
			if !h.full() {
				h.pts = append(h.pts, p)
			}
			return
		}
		h.isHeap = true
		for i := len(h.pts)/2 - 1; i >= 0; i-- {
			h.down(i)
		}
	}
	if !h.full() {
		h.pts = append(h.pts, p)
		for i := len(h.pts) - 1; i > 0; {
			up := (i - 1) / 2
			if !h.above(i, up) {
				break
			}
			h.pts[i], h.pts[up] = h.pts[up], h.pts[i]
			i = up
		}
	} else if h.before(p.key, h.pts[0].key) {
		h.pts[0] = p
		h.down(0)
	}
}

// down moves the point at i down the heap to its place.
func (h *bestPoints) down(i int) {
	for {
		top, l, r := i, 2*i+1, 2*i+2
		if l < len(h.pts) && h.above(l, top) {
			top = l
		}
		if r < len(h.pts) && h.above(r, top) {
			top = r
		}
		if top == i {
			return
		}
		h.pts[i], h.pts[top] = h.pts[top], h.pts[i]
		i = top
	}
}

// sorted returns the points kept in the read's order.
func (h *bestPoints) sorted() []pagePoint {
	if h.isHeap {
		slices.SortFunc(h.pts, func(a, b pagePoint) int {
			if h.before(a.key, b.key) {
				return -1
			}
			return 1
		})
	}
	return h.pts
}

// chunkPoints calls f on each point of a chunk's inflated text, the
// canonical JSON array of [timestamp, sequence, data] prepareHistory
// writes (no spaces), in order, until f returns false. It reads each
// point's timestamp and sequence and hands its data over as text, a
// slice of b, without decoding it: a page of points mostly skips or
// copies data, and decoding every point of a chunk into values was most
// of a read's time.
func chunkPoints(b []byte, f func(i int, ts, seq int64, data []byte) bool) error {
	bad := func(at int) error {
		return fmt.Errorf("a chunk's points are not as kept, at byte %d of %d", at, len(b))
	}
	if len(b) < 2 || b[0] != '[' {
		return bad(0)
	}
	if string(b) == "[]" {
		return nil
	}
	pos := 1
	for i := 0; ; i++ {
		if pos >= len(b) || b[pos] != '[' {
			return bad(pos)
		}
		ts, next, ok := chunkInt(b, pos+1)
		if !ok {
			return bad(pos + 1)
		}
		seq, next, ok := chunkInt(b, next)
		if !ok {
			return bad(next)
		}
		end, ok := skipJSONValue(b, next)
		if !ok || end+1 >= len(b) || b[end] != ']' {
			return bad(next)
		}
		// Capped at its end: the data is read-only, shared by the reads
		// that find the chunk in inflatedChunks.
		if !f(i, ts, seq, b[next:end:end]) {
			return nil
		}
		switch pos = end + 2; b[end+1] {
		case ',':
		case ']':
			if pos != len(b) {
				return bad(pos)
			}
			return nil
		default:
			return bad(end + 1)
		}
	}
}

// chunkInt reads the integer at b[pos:] up to a comma, and returns it and
// the position after the comma.
func chunkInt(b []byte, pos int) (int64, int, bool) {
	i := pos
	if i < len(b) && b[i] == '-' {
		i++
	}
	var n int64
	digits := i
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		n = 10*n + int64(b[i]-'0')
	}
	if i == len(b) || b[i] != ',' || i == digits {
		return 0, 0, false
	}
	if i-digits > 18 { // might overflow: rare
		n, err := strconv.ParseInt(string(b[pos:i]), 10, 64)
		return n, i + 1, err == nil
	}
	if digits > pos {
		n = -n
	}
	return n, i + 1, true
}

// skipJSONValue returns the end of the compact JSON value at b[pos:]: a
// string, an object or array (to its closing bracket, strings inside
// skipped whole), or a number, true, false or null (to the next comma or
// closing bracket).
func skipJSONValue(b []byte, pos int) (int, bool) {
	depth := 0
	for i := pos; i < len(b); i++ {
		switch b[i] {
		case '"':
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
			if i >= len(b) {
				return 0, false
			}
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i, i > pos // a number, true, false or null ends
			}
			depth--
		case ',':
			if depth == 0 {
				return i, i > pos
			}
		default:
			continue
		}
		if depth == 0 {
			return i + 1, true // a string, object or array ends
		}
	}
	return 0, false
}

// FindPoints returns a page of a stream's points.
func (db *DB) FindPoints(ctx context.Context, tenant, device, stream string, q fleet.PointQuery) (*fleet.PointPage, error) {
	var after *cursor
	if q.Cursor != "" {
		c, err := parseCursor(q.Cursor)
		if err != nil {
			return nil, err
		}
		if c.desc != q.Desc {
			return nil, fleet.FieldErrors(map[string]string{"cursor": "was given for the other order; keep order as on the first page"})
		}
		after = &c
	}
	// lo and hi bound the page's timestamps as the query and the cursor
	// do; the retention's floor (pointScope) is not yet among them.
	lo, bounded, hi := int64(math.MinInt64), false, db.ceiling()
	if !q.From.IsZero() {
		lo, bounded = millis(q.From), true
	}
	if !q.To.IsZero() {
		hi = min(hi, millis(q.To))
	}
	if after != nil {
		if q.Desc {
			hi = min(hi, after.key.ts+1)
		} else {
			lo, bounded = max(lo, after.key.ts), true
		}
	}
	limit := q.Limit
	if limit <= 0 {
		limit = fleet.DefaultLimit
	}
	// Chunks hold the points of one hour: one that holds a point in
	// [lo, hi) starts in [lo's hour, hi). On PostgreSQL a page within one
	// day's partition is first read with one statement, which sees one
	// snapshot on its own: from the pool, without a transaction's two more
	// round trips (as historyReader), and with the device's scope
	// (pointScope) in it, which was a round trip of its own before each
	// page's chunks. A page over several partitions, one whose chunks that
	// statement did not all bring (see chunkBatch), and every page on
	// SQLite (whose partition tables segments lists), reads in a
	// transaction, so that no point that arrives between two statements
	// falls behind the cursor.
	buf := pagePoints.Get().(*[]pagePoint)
	if cap(*buf) < limit+1 {
		*buf = make([]pagePoint, 0, limit+1)
	}
	defer func() {
		clear((*buf)[:cap(*buf)]) // the pool holds no chunk's text
		pagePoints.Put(buf)
	}()
	r := pageRead{db: db, tenant: tenant, device: device, stream: stream, q: q, after: after, lo: lo, hi: hi,
		best: &bestPoints{n: limit + 1, desc: q.Desc, pts: (*buf)[:0]}}
	scoped := false
	if db.dialect == postgres && bounded {
		if segs, _ := db.segments(ctx, nil, pointsPart, floorTo(lo, hourMs), hi, true); len(segs) == 1 { // queries nothing
			r.scope = &pointScopeRead{}
			read, err := r.read(ctx, db, segs, false)
			if err != nil {
				return nil, err
			}
			if !r.scope.found {
				return nil, deviceNotFound(device)
			}
			scoped, r.created, r.floor, r.scope = true, r.scope.created, r.scope.floor, nil
			if read {
				return r.page(limit), nil
			}
		}
	}
	if !scoped {
		var err error
		if r.created, r.floor, err = db.pointScope(ctx, tenant, device); err != nil {
			return nil, err
		}
	}
	r.lo = max(r.lo, r.floor)
	tx, err := db.readTx(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	segs, err := db.segments(ctx, tx, pointsPart, floorTo(r.lo, hourMs), hi, true)
	if err != nil {
		return nil, db.classify(err)
	}
	if _, err := r.read(ctx, tx, segs, true); err != nil {
		return nil, err
	}
	return r.page(limit), nil
}

// page returns the page of points r read, at most limit of them.
func (r *pageRead) page(limit int) *fleet.PointPage {
	got := r.best.sorted()
	page := fleet.NewPointPage(min(len(got), limit))
	for _, p := range got[:min(len(got), limit)] {
		page.Points = append(page.Points, p.p)
	}
	if n := len(page.Points); n > 0 {
		page.End = cursor{r.q.Desc, got[n-1].key}.String()
	}
	if len(got) > limit {
		page.Next = page.End
	}
	return page
}

// pagePoints are the slices of a page's points to reuse: a page of 1000
// is 112 KB, allocated and cleared 87 times a day's read.
var pagePoints = sync.Pool{New: func() any { return new([]pagePoint) }}

// chunkBatch is how many chunks a statement of a page's read asks for at
// first, and the factor it asks for more by. A page of 1000 points of
// ingest calls of 1000 usually needs three or four chunks (the page's, its
// split at the hour, and the next, whose first point ends the page). The
// statement once had no limit: PostgreSQL sent every chunk of the range
// to the end of the day (each de-TOASTed, about 7 KB for 1000 points)
// however few the page read, so reading a day's 87 pages sent and
// received about 35 MB; newest first, SQLite sorted every chunk of the
// range, blobs and all, for each page.
const chunkBatch = 4

// pageRead reads a page of points: the chunks of its segments in the
// read's order, a few at a time, each point the page keeps offered to best.
type pageRead struct {
	db                     *DB
	tenant, device, stream string
	q                      fleet.PointQuery
	after                  *cursor
	lo, hi, created        int64 // the points of [lo, hi) of chunks received since created
	floor                  int64 // the retention's (pointScope), which lo is not below once known
	best                   *bestPoints
	// scope, when set, has the statement read the device's scope too
	// (pointScope's, into scope) and the chunks received since its
	// created_at from its floor on; created and floor are not yet known.
	scope *pointScopeRead
	// held is the chunk of the stream inflated last, whose points that
	// statement does not send (text nil: none).
	held chunkText
}

// pointScopeRead is what a page's statement read of pointScope's.
type pointScopeRead struct {
	found          bool // the device is there: the statement brought a row
	created, floor int64
}

// read reads the page's points from segs with rd, the page's one
// statement or its transaction (inTx). Without a transaction a statement
// that brings as many chunks as it asked for while the page may need more
// is not followed by another, which would see another snapshot: read
// reports false, and the page is to be read again in a transaction.
func (r *pageRead) read(ctx context.Context, rd querier, segs []segment, inTx bool) (bool, error) {
	r.best.pts, r.best.isHeap = r.best.pts[:0], false
	// The chunks after the last one a statement brought, in the read's
	// order: (ts_min, id) after (from, id) ascending, (ts_max, id) before
	// (from, id) descending.
	order, scopedOrder, after := "ts_min, id", "c.ts_min, c.id", "ts_min >= ? AND (ts_min > ? OR id > ?)"
	// The chunk the cursor is in is left out once the cursor is at its
	// last point in the read's order: the page before ended there (as a
	// page of ingest calls of 1000 does), and it would be read and walked
	// for none of its points.
	spent, spentArg := "n = ?", int64(-1) // no chunk has -1 points
	if r.after != nil {
		spentArg = int64(r.after.key.idx) + 1
	}
	if r.q.Desc {
		slices.Reverse(segs)
		order, scopedOrder, after = "ts_max DESC, id DESC", "c.ts_max DESC, c.id DESC", "ts_max <= ? AND (ts_max < ? OR id < ?)"
		spent, spentArg = "0 = ?", 1
		if r.after != nil {
			spentArg = int64(r.after.key.idx)
		}
	}
	spentID := int64(0)
	if r.after != nil {
		spentID = r.after.key.chunk
	}
	for _, s := range segs {
		if r.best.full() {
			return true, nil // every later partition's points come after
		}
		// The statement is query, its LIMIT, and end.
		query := `SELECT ts_min, ts_max, id, received_at, points FROM ` + s.table + `
			WHERE tenant = ? AND device_id = ? AND stream = ? AND ts_min >= ? AND ts_min < ? AND ts_max >= ? AND received_at >= ?
			AND ` + after + ` AND NOT (id = ? AND ` + spent + `) ORDER BY ` + order
		end := ""
		var scopeArgs []any
		if r.scope != nil {
			// The device's row (none: not found) joined to its chunks
			// (none: one row of NULLs), which start at the floor or
			// after: a chunk holds the points of one hour, and the floor
			// is an hour's start, so the points are those pointScope's
			// floor lets through. A chunk's points are not sent (NULL)
			// when they are inflated at hand (r.held: the chunk the page
			// before read last, whose first point ended it), nor when
			// the chunks before it in the statement hold the whole page
			// (pts_before: their points wholly in the page's range, the
			// cursor's chunk not counted): the page then needs only its
			// place in the order, which shows the page done (chunks).
			// Of a page's four chunks, usually one was at hand and one
			// or two were only that end.
			query = `SELECT s.created_at, s.floor_ms, c.id IS NOT NULL, coalesce(c.ts_min, 0), coalesce(c.ts_max, 0), coalesce(c.id, 0),
				coalesce(c.received_at, 0), CASE WHEN c.id = ? AND CAST(? AS BOOLEAN) OR c.pts_before >= CAST(? AS BIGINT) THEN NULL ELSE c.points END
				FROM (` + pointScopeQuery + `) s LEFT JOIN LATERAL (SELECT *, coalesce(sum(CASE WHEN ts_min >= ? AND ts_max < ? AND id <> ? THEN n ELSE 0 END)
					OVER (ORDER BY ` + order + ` ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS pts_before
				FROM (SELECT ts_min, ts_max, id, n, received_at, points FROM ` + s.table + `
					WHERE tenant = ? AND device_id = ? AND stream = ? AND ts_min >= ? AND ts_min < ? AND ts_max >= ? AND received_at >= s.created_at
					AND ts_min >= s.floor_ms AND ` + after + ` AND NOT (id = ? AND ` + spent + `) ORDER BY ` + order
			end = `) c0) c ON true
				ORDER BY ` + scopedOrder
			// Counted: chunks whose points are all in the page's range
			// and after the cursor.
			countLo, countHi := r.lo, r.hi
			if r.after != nil && !r.q.Desc {
				countLo = max(countLo, r.after.key.ts+1)
			} else if r.after != nil {
				countHi = min(countHi, r.after.key.ts)
			}
			r.held = r.db.history.inflated.latest(r.tenant, r.device, r.stream)
			scopeArgs = slices.Concat([]any{r.held.key.id, r.held.text != nil, int64(r.best.n)},
				r.db.pointScopeArgs(r.tenant, r.device), []any{countLo, countHi, spentID})
		}
		// At first no chunk is left out: ts_min > s.lo-1, ts_max < MaxInt64.
		from, fromNot, id := s.lo, s.lo-1, int64(0)
		if r.q.Desc {
			from, fromNot = math.MaxInt64, math.MaxInt64
		}
		for n := chunkBatch; ; n *= chunkBatch {
			args := []any{r.tenant, r.device, r.stream, s.lo, s.hi, r.lo, r.created, from, fromNot, id, spentID, spentArg}
			if r.scope != nil {
				args = slices.Concat(scopeArgs, args[:6], args[7:]) // received_at against the device's
			}
			got, done, err := r.chunks(ctx, rd, query+limitClause(n)+end, args)
			if err != nil {
				return false, err
			}
			if done {
				return true, nil
			}
			if got.cut {
				return false, nil // a chunk's points were needed after all
			}
			if got.n < n {
				break // the segment's chunks are read
			}
			if !inTx {
				return false, nil
			}
			from, fromNot, id = got.tsMin, got.tsMin, got.id
			if r.q.Desc {
				from, fromNot = got.tsMax, got.tsMax
			}
		}
	}
	return true, nil
}

// chunksRead is what a statement of a page's read brought: how many
// chunks, and the last one's ts_min, ts_max and id.
type chunksRead struct {
	n                int
	tsMin, tsMax, id int64
	cut              bool // a chunk whose points were not sent was needed
}

// chunks runs a statement of the page's read and offers the points of the
// chunks it brings, until no later chunk can hold a point of the page
// (done).
func (r *pageRead) chunks(ctx context.Context, rd querier, query string, args []any) (chunksRead, bool, error) {
	var got chunksRead
	rows, err := rd.query(ctx, query, args...)
	if err != nil {
		return got, false, r.db.classify(err)
	}
	defer rows.Close()
	best, q, after := r.best, r.q, r.after
	for rows.Next() {
		var received int64
		// The packed points are inflated (or found inflated) before the
		// next row: the driver's bytes, not a copy of them.
		var points sql.RawBytes
		if sc := r.scope; sc != nil {
			var chunk bool
			if err := rows.Scan(&sc.created, &sc.floor, &chunk, &got.tsMin, &got.tsMax, &got.id, &received, &points); err != nil {
				return got, false, r.db.classify(err)
			}
			sc.found = true
			if !chunk {
				continue
			}
		} else if err := rows.Scan(&got.tsMin, &got.tsMax, &got.id, &received, &points); err != nil {
			return got, false, r.db.classify(err)
		}
		got.n++
		if best.full() {
			top := best.last().ts
			if !q.Desc && top < got.tsMin || q.Desc && top > got.tsMax {
				return got, true, nil // no point of this chunk or a later one can be in the page
			}
		}
		id := got.id
		var text []byte
		if r.scope != nil && points == nil {
			if r.held.text == nil || id != r.held.key.id {
				got.cut = true // overlapping chunks: the page reads again with every chunk's points
				return got, false, nil
			}
			text = r.held.text
		} else if text, err = r.db.history.inflated.text(chunkKey{r.tenant, r.device, r.stream, id}, points); err != nil {
			return got, false, fmt.Errorf("stream %s of %s: %w", r.stream, r.device, err)
		}
		receivedAt := fromMillis(received) // the chunk's points were received together
		err = chunkPoints(text, func(i int, ts, seq int64, data []byte) bool {
			if ts < r.lo || ts >= r.hi {
				return true
			}
			k := pointKey{ts, seq, id, i}
			if after != nil && !best.before(after.key, k) {
				return true
			}
			if !q.Desc && best.full() && !best.before(k, best.last()) {
				// The chunk's points come in the read's order: none
				// after this one is in the page either.
				return false
			}
			best.offer(pagePoint{k, fleet.HistoryPoint{Timestamp: fromMillis(ts), Sequence: seq, Data: data, ReceivedAt: receivedAt}})
			return true
		})
		if err != nil {
			return got, false, fmt.Errorf("stream %s of %s: %w", r.stream, r.device, err)
		}
	}
	return got, false, r.db.classify(rows.Err())
}

// pointScope returns what a read of a device's points needs besides the
// points, in one statement: when the device was made (its points are
// those received since, not those of a device of the same id deleted
// before) and the oldest timestamp the tenant's retention shows (floor).
// A read of a day is 87 pages, and a device lookup and a retention lookup
// were two more round trips of each.
func (db *DB) pointScope(ctx context.Context, tenant, device string) (created, floor int64, err error) {
	err = db.queryRow(ctx, pointScopeQuery, db.pointScopeArgs(tenant, device)...).Scan(&created, &floor)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, 0, deviceNotFound(device)
	} else if err != nil {
		return 0, 0, db.classify(err)
	}
	return created, floor, nil
}

// pointScopeQuery selects a device's created_at and the floor of its
// tenant's retention, from pointScopeArgs: the floor of the server's
// retention, now in milliseconds, and the tenant and device. The floor of
// a tenant's own retention is now less it, down to its hour.
const pointScopeQuery = `SELECT d.created_at, CASE WHEN t.stream_retention_ms IS NULL THEN CAST(? AS BIGINT)
		ELSE (CAST(? AS BIGINT) - t.stream_retention_ms) - ((CAST(? AS BIGINT) - t.stream_retention_ms) % 3600000 + 3600000) % 3600000 END AS floor_ms
	FROM devices d JOIN tenants t ON t.name = d.tenant WHERE d.tenant = ? AND d.id = ?`

func (db *DB) pointScopeArgs(tenant, device string) []any {
	now := db.now()
	return []any{floorTo(millis(now.Add(-db.history.retention)), hourMs), millis(now), millis(now), tenant, device}
}

func deviceNotFound(device string) error {
	return fleet.Errorf(fleet.ENOTFOUND, "device %q not found", device)
}

// chunkKey names a chunk of a device's stream.
type chunkKey struct {
	tenant, device, stream string
	id                     int64
}

// inflatedChunks keeps the text of the chunks read last: a page of points
// usually ends inside a chunk, whose rest the next page reads, and
// inflating it again took a fifth of the CPU of reading a day. A chunk's
// text does not change: its id is a hash of it (chunkID), and a chunk
// written again is the same row or none.
type inflatedChunks struct {
	mu   sync.Mutex
	ring [32]chunkText
	next int
}

// chunkText is a chunk's inflated text.
type chunkText struct {
	key  chunkKey
	text []byte
}

// latest returns the chunk of a device's stream inflated last, if one is
// kept.
func (c *inflatedChunks) latest(tenant, device, stream string) chunkText {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range len(c.ring) {
		e := c.ring[(c.next-1-i+2*len(c.ring))%len(c.ring)]
		if e.text != nil && e.key.tenant == tenant && e.key.device == device && e.key.stream == stream {
			return e
		}
	}
	return chunkText{}
}

// text returns the inflated text of the chunk key names, packed.
func (c *inflatedChunks) text(key chunkKey, packed []byte) ([]byte, error) {
	c.mu.Lock()
	for _, e := range c.ring {
		if e.key == key && e.text != nil {
			c.mu.Unlock()
			return e.text, nil
		}
	}
	c.mu.Unlock()
	text, err := unpackPoints(packed)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.ring[c.next].key, c.ring[c.next].text = key, text
	c.next = (c.next + 1) % len(c.ring)
	c.mu.Unlock()
	return text, nil
}

// Aggregate aggregates a device's stream.
func (db *DB) Aggregate(ctx context.Context, tenant, device, stream string, q fleet.AggregateQuery) ([]fleet.Bucket, error) {
	series, err := db.aggregate(ctx, tenant, device, stream, q, false)
	if err != nil {
		return nil, err
	}
	return series[""], nil
}

// AggregateFleet aggregates a stream over the tenant's devices whose
// metadata matches q.Metadata.
func (db *DB) AggregateFleet(ctx context.Context, tenant, stream string, q fleet.AggregateQuery) ([]fleet.Bucket, []fleet.DeviceSeries, error) {
	series, err := db.aggregate(ctx, tenant, "", stream, q, false)
	if err != nil {
		return nil, nil, err
	}
	if !q.ByDevice {
		return series[""], nil, nil
	}
	out := make([]fleet.DeviceSeries, 0, len(series))
	for _, d := range slices.Sorted(maps.Keys(series)) {
		out = append(out, fleet.DeviceSeries{DeviceID: d, Buckets: series[d]})
	}
	return nil, out, nil
}

// aggregateSource says where an aggregate reads: raw points, or the
// rollups of a kind.
func aggregateSource(q fleet.AggregateQuery) (partKind, bool, error) {
	iv := q.Interval
	switch {
	case iv < time.Second || iv%time.Second != 0:
		return partKind{}, false, fleet.FieldErrors(map[string]string{"interval": "must be a whole number of seconds, at least 1s"})
	case iv < time.Minute:
		return pointsPart, true, nil
	case iv%time.Minute != 0:
		return partKind{}, false, fleet.FieldErrors(map[string]string{"interval": "must be under a minute, or a whole number of minutes"})
	case iv%time.Hour == 0:
		return hourPart, false, nil
	case iv%(10*time.Minute) == 0:
		return tenMinutePart, false, nil
	}
	return minutePart, false, nil
}

// eachRollupSpan calls f on the spans of [lo, hi) to read and the kind of
// rollups each reads: kind's, but 10-minute rollups only from the bucket
// they are whole from (migration 0048) and minute rollups before it.
func (db *DB) eachRollupSpan(ctx context.Context, kind partKind, lo, hi int64, f func(kind partKind, lo, hi int64) error) error {
	if kind == tenMinutePart {
		from, err := db.tenMinuteRollupsFrom(ctx)
		if err != nil {
			return err
		}
		if lo < from {
			if err := f(minutePart, lo, min(hi, from)); err != nil {
				return err
			}
			lo = from
		}
		if lo >= hi {
			return nil
		}
	}
	return f(kind, lo, hi)
}

// tenMinuteRollupsFrom returns the bucket from which 10-minute rollups
// are whole, which migration 0048 kept: read once, as it does not change.
func (db *DB) tenMinuteRollupsFrom(ctx context.Context) (int64, error) {
	if from := db.history.tenMinutesFrom.Load(); from >= 0 {
		return from, nil
	}
	var from int64
	if err := db.queryRow(ctx, "SELECT bucket FROM stream_rollups_10m_from").Scan(&from); err != nil {
		return 0, err
	}
	db.history.tenMinutesFrom.Store(from)
	return from, nil
}

// aggregate computes q on a device's stream (device "" for the tenant's
// devices) by device, or under "" unless q.ByDevice. raw reads raw points
// whatever the interval (tests compare the rollups with it). A device's
// raw points are those it received since it was made, as FindPoints reads
// them: not those of a device of the same id deleted before.
func (db *DB) aggregate(ctx context.Context, tenant, device, stream string, q fleet.AggregateQuery, raw bool) (map[string][]fleet.Bucket, error) {
	acc, err := db.accumulate(ctx, tenant, device, stream, []string{q.Field}, q, raw, false)
	if err != nil {
		return nil, err
	}
	out := map[string][]fleet.Bucket{}
	for key, m := range acc {
		bs := make([]fleet.Bucket, 0, len(m))
		for _, start := range slices.Sorted(maps.Keys(m)) {
			r := m[start]
			bs = append(bs, fleet.Bucket{Start: fromMillis(start), Value: r.value(q.Fn), Count: r.n})
		}
		out[key.device] = bs
	}
	if _, ok := out[""]; !ok && (device != "" || !q.ByDevice) {
		out[""] = []fleet.Bucket{}
	}
	return out, nil
}

// AggregateStats returns, for each of fields, the count, average, minimum
// and maximum of each bucket of q over a device's stream, or with device ""
// over the tenant's devices that q.Metadata and q.Group select (one series
// a field; q.Field, q.Fn and q.ByDevice are not used): the line and band
// of a page's charts of a stream from one device lookup and one statement
// (a device page's charts took four round trips each on PostgreSQL).
func (db *DB) AggregateStats(ctx context.Context, tenant, device, stream string, fields []string, q fleet.AggregateQuery) (map[string][]fleet.BucketStats, error) {
	if len(fields) == 0 {
		return nil, fleet.FieldErrors(map[string]string{"field": "must name a field"})
	}
	q.Fn, q.ByDevice = fleet.AggAvg, false
	acc, err := db.accumulate(ctx, tenant, device, stream, fields, q, false, true)
	if err != nil {
		return nil, err
	}
	out := make(map[string][]fleet.BucketStats, len(fields))
	for _, f := range fields {
		m := acc[seriesKey{field: f}]
		bs := make([]fleet.BucketStats, 0, len(m))
		for _, start := range slices.Sorted(maps.Keys(m)) {
			r := m[start]
			bs = append(bs, fleet.BucketStats{Start: fromMillis(start), Count: r.n, Avg: r.value(fleet.AggAvg), Min: r.min, Max: r.max})
		}
		out[f] = bs
	}
	return out, nil
}

// seriesKey names a series accumulate merges: a field's, of a device or
// ("") of all that the read chose.
type seriesKey struct{ field, device string }

// accumulate merges the rollups (or raw points) of fields that q reads
// into one rollup a bucket, by field and by device or under "" as
// aggregate's. With stats, the merged rollups need only their count,
// minimum, maximum and sum (not last).
func (db *DB) accumulate(ctx context.Context, tenant, device, stream string, fields []string, q fleet.AggregateQuery, raw, stats bool) (map[seriesKey]map[int64]*rollup, error) {
	where, args := "tenant = ? AND stream = ?", []any{tenant, stream}
	rawWhere, rawArgs := where, args
	if device != "" {
		d, err := db.FindDevice(ctx, tenant, device)
		if err != nil {
			return nil, err
		}
		where, args = "tenant = ? AND device_id = ? AND stream = ?", []any{tenant, device, stream}
		rawWhere, rawArgs = where+" AND received_at >= ?", append(slices.Clip(args), millis(d.CreatedAt))
	}
	kind, fromRaw, err := aggregateSource(q)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(fleet.AggregateFuncs, q.Fn) {
		return nil, fleet.FieldErrors(map[string]string{"fn": "must be one of " + strings.Join(fleet.AggregateFuncs, ", ")})
	}
	iv := q.Interval.Milliseconds()
	lo, hi := floorTo(millis(q.From), iv), floorTo(millis(q.To)+iv-1, iv)
	if hi <= lo {
		return nil, fleet.FieldErrors(map[string]string{"to": "must be after from"})
	}
	if (hi-lo)/iv > fleet.MaxBuckets {
		return nil, fleet.FieldErrors(map[string]string{"interval": fmt.Sprintf("makes %d buckets of the range; at most %d are allowed: choose a longer interval or a shorter range", (hi-lo)/iv, fleet.MaxBuckets)})
	}
	if fromRaw && hi-lo > fleet.MaxRawRange.Milliseconds() {
		return nil, fleet.FieldErrors(map[string]string{"interval": fmt.Sprintf("under a minute reads raw points, over at most %s; choose an interval of a minute or more, or a shorter range", fleet.MaxRawRange)})
	}
	var devices map[string]bool
	if device == "" && (len(q.Metadata) > 0 || q.Group != "") {
		if devices, err = db.devicesMatching(ctx, tenant, q.Metadata, q.Group); err != nil {
			return nil, err
		}
	}
	rd, done, err := db.historyReader(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	acc := map[seriesKey]map[int64]*rollup{}
	held := 0 // buckets in acc: by device, MaxBuckets is each series'
	add := func(field, dev string, r *rollup) error {
		if devices != nil && !devices[dev] {
			return nil
		}
		if device != "" || !q.ByDevice {
			dev = ""
		}
		key := seriesKey{field, dev}
		b := floorTo(r.bucket, iv)
		m := acc[key]
		if m[b] == nil {
			if held == db.history.maxSeries {
				return fleet.FieldErrors(map[string]string{"by": fmt.Sprintf("makes more than %d buckets over all the devices' series; narrow the devices with metadata.{key}, or choose a longer interval or a shorter range", db.history.maxSeries)})
			}
			held++
			if m == nil {
				m = map[int64]*rollup{}
				acc[key] = m
			}
			m[b] = &rollup{bucket: b}
		}
		m[b].merge(r)
		return nil
	}
	switch {
	case fromRaw || raw:
		err = db.aggregateRaw(ctx, rd, tenant, rawWhere, rawArgs, fields, lo, hi, add)
	case stats && devices == nil && !q.ByDevice:
		err = db.eachRollupSpan(ctx, kind, lo, hi, func(kind partKind, lo, hi int64) error {
			return db.aggregateRollupStats(ctx, rd, kind, where, args, fields, iv, lo, hi, add)
		})
	default:
		err = db.eachRollupSpan(ctx, kind, lo, hi, func(kind partKind, lo, hi int64) error {
			return db.aggregateRollups(ctx, rd, kind, where, args, fields, lo, hi, add)
		})
	}
	if fleet.ErrorCode(err) == fleet.EINVALID {
		return nil, err
	} else if err != nil {
		return nil, db.classify(err)
	}
	return acc, nil
}

// value returns fn of the values r aggregates.
func (r *rollup) value(fn string) float64 {
	switch fn {
	case fleet.AggAvg:
		return r.sum / float64(r.n)
	case fleet.AggMin:
		return r.min
	case fleet.AggMax:
		return r.max
	case fleet.AggSum:
		return r.sum
	case fleet.AggCount:
		return float64(r.n)
	}
	return r.last
}

// historyReader is what a history read queries and its end: on SQLite a
// read transaction, so that the partition tables segments lists are still
// those it reads; on PostgreSQL the pool, as a read there is one statement
// over the parent table (segments), which sees one snapshot on its own,
// and a transaction's begin and end would be two more round trips.
func (db *DB) historyReader(ctx context.Context) (querier, func(), error) {
	if db.dialect == postgres {
		return db, func() {}, nil
	}
	tx, err := db.readTx(ctx)
	if err != nil {
		return nil, nil, err
	}
	return tx, func() { tx.Rollback() }, nil
}

// aggregateRaw folds the numeric values of fields in [lo, hi) of the
// chunks where chooses, a point at a time, into add.
func (db *DB) aggregateRaw(ctx context.Context, tx querier, tenant, where string, args []any, fields []string, lo, hi int64, add func(field, dev string, r *rollup) error) error {
	floor, err := db.floor(ctx, tenant)
	if err != nil {
		return err
	}
	lo = max(lo, floor)
	segs, err := db.segments(ctx, tx, pointsPart, floorTo(lo, hourMs), hi, false)
	if err != nil {
		return err
	}
	for _, s := range segs {
		rows, err := tx.query(ctx, `SELECT device_id, id, points FROM `+s.table+` WHERE `+where+`
			AND ts_min >= ? AND ts_min < ? AND ts_max >= ?`, append(slices.Clip(args), s.lo, s.hi, lo)...)
		if err != nil {
			return err
		}
		for rows.Next() {
			var dev string
			var points []byte
			var id int64
			if err := rows.Scan(&dev, &id, &points); err != nil {
				rows.Close()
				return err
			}
			var parsed, added error
			text, err := unpackPoints(points)
			if err == nil {
				err = chunkPoints(text, func(_ int, ts, seq int64, text []byte) bool {
					if ts < lo || ts >= hi {
						return true
					}
					var data any
					if data, parsed = fleet.ParseCanonical(text); parsed != nil {
						return false
					}
					obj, _ := data.(map[string]any)
					for _, field := range fields {
						if x, ok := numeric(obj[field]); ok && added == nil {
							r := rollup{bucket: ts}
							r.add(x, ts, seq)
							added = add(field, dev, &r)
						}
					}
					return added == nil
				})
			}
			if err = cmp.Or(err, parsed); err != nil {
				rows.Close()
				return fmt.Errorf("a chunk of %s: %w", dev, err)
			} else if added != nil {
				rows.Close()
				return added
			}
		}
		if err := rows.Close(); err != nil {
			return err
		}
	}
	return nil
}

// aggregateRollups folds the rollups of kind for fields in [lo, hi) into
// add.
func (db *DB) aggregateRollups(ctx context.Context, tx querier, kind partKind, where string, args []any, fields []string, lo, hi int64, add func(field, dev string, r *rollup) error) error {
	segs, err := db.segments(ctx, tx, kind, lo, hi, false)
	if err != nil {
		return err
	}
	for _, s := range segs {
		rows, err := tx.query(ctx, rollupsQuery(s.table, where, len(fields)), fieldArgs(args, fields, s.lo, s.hi)...)
		if err != nil {
			return err
		}
		for rows.Next() {
			var dev, field string
			var r rollup
			if err := rows.Scan(&dev, &field, &r.bucket, &r.n, &r.min, &r.max, &r.sum, &r.last, &r.lastTS, &r.lastSeq); err != nil {
				rows.Close()
				return err
			}
			if err := add(field, dev, &r); err != nil {
				rows.Close()
				return err
			}
		}
		if err := rows.Close(); err != nil {
			return err
		}
	}
	return nil
}

// aggregateRollupStats folds the count, minimum, maximum and sum of the
// rollups of kind for fields in [lo, hi) into add, a field's bucket of iv
// at a time: the database adds up the rollups of each bucket, so a chart
// of a day in 10-minute buckets reads 144 rows of a field, not the 1440
// minute rollups, which took most of a chart page's time (and, from
// 10-minute rollups, 144).
func (db *DB) aggregateRollupStats(ctx context.Context, tx querier, kind partKind, where string, args []any, fields []string, iv, lo, hi int64, add func(field, dev string, r *rollup) error) error {
	segs, err := db.segments(ctx, tx, kind, lo, hi, false)
	if err != nil {
		return err
	}
	for _, s := range segs {
		rows, err := tx.query(ctx, `SELECT field, bucket - bucket % ?, sum(n), min(vmin), max(vmax), sum(vsum) FROM `+s.table+`
			WHERE `+where+` AND field IN (`+placeholders(len(fields))+`) AND bucket >= ? AND bucket < ? GROUP BY 1, 2`,
			fieldArgs(append([]any{iv}, args...), fields, s.lo, s.hi)...)
		if err != nil {
			return err
		}
		for rows.Next() {
			var field string
			var r rollup
			if err := rows.Scan(&field, &r.bucket, &r.n, &r.min, &r.max, &r.sum); err != nil {
				rows.Close()
				return err
			}
			if err := add(field, "", &r); err != nil {
				rows.Close()
				return err
			}
		}
		if err := rows.Close(); err != nil {
			return err
		}
	}
	return nil
}

// rollupsQuery reads the rollups of table that where chooses, of n fields
// (the next arguments) in a range of buckets (the two after). A fleet-wide
// where (tenant and stream) is served by the index of migration 0043.
func rollupsQuery(table, where string, n int) string {
	return `SELECT device_id, field, bucket, n, vmin, vmax, vsum, vlast, last_ts, last_seq FROM ` + table + `
		WHERE ` + where + ` AND field IN (` + placeholders(n) + `) AND bucket >= ? AND bucket < ?`
}

// fieldArgs are args, then the fields, then the range of buckets [lo, hi).
func fieldArgs(args []any, fields []string, lo, hi int64) []any {
	out := append(slices.Clip(args), make([]any, 0, len(fields)+2)...)
	for _, f := range fields {
		out = append(out, f)
	}
	return append(out, lo, hi)
}

// devicesMatching returns the ids of a tenant's devices whose metadata has
// the values meta gives and, when group is set, that are in the group.
func (db *DB) devicesMatching(ctx context.Context, tenant string, meta map[string]string, group string) (map[string]bool, error) {
	cs, err := db.deviceFilter(tenant, "", meta)
	if err != nil {
		return nil, err
	}
	tx, err := db.readTx(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	if group != "" {
		sel, err := groupSelector(ctx, tx, tenant, group)
		if fleet.ErrorCode(err) == fleet.ENOTFOUND {
			return nil, fleet.FieldErrors(map[string]string{"group": fmt.Sprintf("names no group of the tenant: %q (GET /api/v1/groups lists them)", group)})
		} else if err != nil {
			return nil, db.classify(err)
		}
		cs = append(cs, db.dialect.selectorConds(tenant, sel)...)
	}
	cond, args, _, err := devicesWhere(ctx, tx, cs)
	if err != nil {
		return nil, db.classify(err)
	}
	rows, err := tx.query(ctx, "SELECT id FROM devices WHERE tenant = ? AND "+cond, append([]any{tenant}, args...)...)
	if err != nil {
		return nil, db.classify(err)
	}
	ids, err := scanAll(rows, func(s scanner) (string, error) {
		var id string
		return id, s.Scan(&id)
	})
	if err != nil {
		return nil, db.classify(err)
	}
	out := make(map[string]bool, len(ids))
	for _, id := range ids {
		out[id] = true
	}
	return out, nil
}

var _ fleet.HistoryService = (*DB)(nil)
