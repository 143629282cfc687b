package sqlstore

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fleetd/fleet"
)

// Rollups (docs/telemetry.md). Ingest computes each chunk's rollups per
// numeric field and minute and hour, and appends them to
// stream_rollup_queue in the chunk's transaction; RollUp claims queued
// rows in order, merges those of the same field and bucket, and adds each
// once to its row of stream_rollup_1m or _1h. Adding at ingest wrote two
// more random pages a batch (a device's rows of each table) and halved
// ingest on SQLite again; a queue row is appended, on the page the batch's
// other queue rows share. A claim takes its rows with FOR
// UPDATE SKIP LOCKED on PostgreSQL, so replicas drain the queue together,
// and the adds commit with the claim: a row is added exactly once.

// queuedRollup is a rollup as the queue keeps it.
type queuedRollup struct {
	Hour    bool    `json:"h,omitempty"`
	Field   string  `json:"f"`
	Bucket  int64   `json:"b"`
	N       int64   `json:"n"`
	Min     float64 `json:"lo"`
	Max     float64 `json:"hi"`
	Sum     float64 `json:"s"`
	Last    float64 `json:"l"`
	LastTS  int64   `json:"t"`
	LastSeq int64   `json:"q"`
}

// encodeRollups writes rs as a JSON array of queuedRollup, by hand: it
// runs at ingest, where encoding/json's reflection cost a tenth of the
// time.
func encodeRollups(rs []rollup) string {
	if len(rs) == 0 {
		return ""
	}
	b := make([]byte, 0, 128*len(rs))
	b = append(b, '[')
	for i, r := range rs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"h":`...)
		b = strconv.AppendBool(b, r.kind == hourPart)
		b = append(b, `,"f":`...)
		b, _ = fleet.AppendCanonical(b, r.field) // a string: never fails
		for _, n := range []struct {
			key string
			v   int64
		}{{`,"b":`, r.bucket}, {`,"n":`, r.n}, {`,"t":`, r.lastTS}, {`,"q":`, r.lastSeq}} {
			b = strconv.AppendInt(append(b, n.key...), n.v, 10)
		}
		for _, f := range []struct {
			key string
			v   float64
		}{{`,"lo":`, r.min}, {`,"hi":`, r.max}, {`,"s":`, r.sum}, {`,"l":`, r.last}} {
			b = strconv.AppendFloat(append(b, f.key...), f.v, 'g', -1, 64)
		}
		b = append(b, '}')
	}
	return string(append(b, ']'))
}

func decodeRollups(s string) ([]rollup, error) {
	var q []queuedRollup
	if err := json.Unmarshal([]byte(s), &q); err != nil {
		return nil, err
	}
	rs := make([]rollup, len(q))
	for i, r := range q {
		k := minutePart
		if r.Hour {
			k = hourPart
		}
		rs[i] = rollup{k, r.Field, r.Bucket, r.N, r.Min, r.Max, r.Sum, r.Last, r.LastTS, r.LastSeq}
	}
	return rs, nil
}

// rollupClaim is how many queued rows one RollUp claims at most.
const rollupClaim = 1000

// RollUp adds up to rollupClaim queued chunks' rollups to their rows, in
// one transaction, and returns how many it added.
func (db *DB) RollUp(ctx context.Context) (int, error) {
	keep, err := db.retentions(ctx)
	if err != nil {
		return 0, err
	}
	now := millis(db.now())
	claimed := 0
	// The 10-minute partitions to make first: those of chunks queued
	// before migration 0048, which ingest did not make (ensurePartitions).
	var made []part
	err = db.updateAlone(ctx, func(ctx context.Context, tx *Tx) error {
		rows, err := tx.query(ctx, `DELETE FROM stream_rollup_queue WHERE id IN
			(SELECT id FROM stream_rollup_queue ORDER BY id`+limitClause(rollupClaim)+db.dialect.skipLocked()+`)
			RETURNING tenant, device_id, stream, rollups`)
		if err != nil {
			return err
		}
		type key struct {
			tenant, device, stream string
			kind                   partKind
			field                  string
			bucket                 int64
		}
		merged := map[key]*rollup{}
		claimed = 0
		for rows.Next() {
			var tenant, device, stream, text string
			if err := rows.Scan(&tenant, &device, &stream, &text); err != nil {
				rows.Close()
				return err
			}
			claimed++
			rs, err := decodeRollups(text)
			if err != nil {
				// A sum past the largest double is written +Inf, which
				// JSON cannot hold: the row is dropped, not retried for
				// ever.
				db.log.Error("queued rollups unreadable: dropped", "tenant", tenant, "device", device, "stream", stream, "err", err)
				continue
			}
			add := func(r *rollup) {
				if r.kind.next(r.kind.start(r.bucket)) <= now-keep[r.kind].Milliseconds() {
					return // its partition expired, or is about to
				}
				k := key{tenant, device, stream, r.kind, r.field, r.bucket}
				if m := merged[k]; m != nil {
					m.merge(r)
				} else {
					merged[k] = r
				}
			}
			for i := range rs {
				add(&rs[i])
				if rs[i].kind == minutePart {
					// A 10-minute rollup is its minutes', added as they
					// are: the queue is as it was before migration 0048.
					ten := rs[i]
					ten.kind, ten.bucket = tenMinutePart, floorTo(ten.bucket, tenMinutesMs)
					add(&ten)
				}
			}
		}
		if err := rows.Close(); err != nil {
			return err
		}
		keys := make([]key, 0, len(merged))
		for k := range merged {
			keys = append(keys, k)
		}
		// One order for every replica, so that two adding to the same
		// rows never deadlock.
		slices.SortFunc(keys, func(a, b key) int {
			if c := cmpStrings(a.tenant, b.tenant, a.device, b.device, a.stream, b.stream, a.kind.table, b.kind.table, a.field, b.field); c != 0 {
				return c
			}
			return cmpInt(a.bucket, b.bucket)
		})
		made = made[:0]
		for _, k := range keys {
			if p := (part{k.kind, k.kind.start(k.bucket)}); k.kind == tenMinutePart && !slices.Contains(made, p) {
				if _, ok := db.history.known.Load(k.kind.name(p.start)); !ok {
					made = append(made, p)
				}
			}
		}
		if err := tx.makePartitions(ctx, made); err != nil {
			return err
		}
		for _, k := range keys {
			if err := tx.upsertRollup(ctx, k.tenant, k.device, k.stream, merged[k]); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		for _, p := range made {
			db.history.known.Store(p.k.name(p.start), struct{}{})
		}
	}
	return claimed, err
}

// cmpStrings compares pairs of strings in turn: a0 with b0, then a1 with
// b1, and so on.
func cmpStrings(pairs ...string) int {
	for i := 0; i+1 < len(pairs); i += 2 {
		if c := strings.Compare(pairs[i], pairs[i+1]); c != 0 {
			return c
		}
	}
	return 0
}

// RunRollups drains the rollup queue now and every interval until ctx
// ends, logging failures.
func (db *DB) RunRollups(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		for {
			n, err := db.RollUp(ctx)
			if err != nil && ctx.Err() == nil {
				db.log.Error("stream rollups", "err", err)
			}
			if err != nil || n < rollupClaim {
				break
			}
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

// upsertRollup adds r to its row. One row a statement: the statement's
// text is the same for every row of a table, so SQLite keeps it prepared,
// where a statement of many rows would be parsed at each run.
func (tx *Tx) upsertRollup(ctx context.Context, tenant, device, stream string, r *rollup) error {
	table := r.kind.name(r.kind.start(r.bucket))
	least, greatest := "min", "max"
	if tx.db.dialect == postgres {
		least, greatest = "LEAST", "GREATEST"
	}
	// The order of rollup.before.
	newer := `(excluded.last_ts > t.last_ts OR (excluded.last_ts = t.last_ts AND
		(excluded.last_seq > t.last_seq OR (excluded.last_seq = t.last_seq AND excluded.vlast > t.vlast))))`
	_, err := tx.exec(ctx, "INSERT INTO "+table+` AS t (tenant, device_id, stream, field, bucket, n, vmin, vmax, vsum, vlast, last_ts, last_seq)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (tenant, device_id, stream, field, bucket) DO UPDATE SET
			n = t.n + excluded.n, vmin = `+least+`(t.vmin, excluded.vmin), vmax = `+greatest+`(t.vmax, excluded.vmax),
			vsum = t.vsum + excluded.vsum,
			vlast = CASE WHEN `+newer+` THEN excluded.vlast ELSE t.vlast END,
			last_seq = CASE WHEN `+newer+` THEN excluded.last_seq ELSE t.last_seq END,
			last_ts = CASE WHEN `+newer+` THEN excluded.last_ts ELSE t.last_ts END`,
		tenant, device, stream, r.field, r.bucket, r.n, r.min, r.max, r.sum, r.last, r.lastTS, r.lastSeq)
	return err
}
