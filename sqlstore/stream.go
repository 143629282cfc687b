package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/fleetd/fleet"
	"github.com/jackc/pgx/v5/pgconn"
	msqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// CommitStream writes what one ingest call of a device's stream produced, in
// one job: its points (pts, sorted by timestamp, then sequence; none for a
// commit of alert changes alone) kept in history within the tenant's
// retention (history.go), the stream's latest point (the last of pts, kept
// only if it is newer than the stored one, by timestamp, then sequence) and
// the alert changes the evaluation made, with their notifications. An
// unknown device is ENOTFOUND.
//
// An alert that another replica opened first for the same rule and device is
// adopted: change.Open.ID becomes its id and nothing is notified twice. The
// job may run again after a failed batch commit; every write is idempotent.
func (db *DB) CommitStream(ctx context.Context, tenant, device, stream string, pts []fleet.DataPoint, changes []*fleet.AlertChange) error {
	w, err := db.prepareStream(ctx, tenant, pts)
	if err != nil {
		return err
	}
	return db.rewriteHistory(ctx, w.chunks, func() error {
		return db.update(ctx, func(ctx context.Context, tx *Tx) error {
			return tx.commitStream(ctx, tenant, device, stream, w, changes)
		})
	})
}

// streamWrite is what a commit of a stream writes, encoded before its job.
type streamWrite struct {
	latest *fleet.DataPoint
	data   string // latest's data
	chunks []chunk
}

func (db *DB) prepareStream(ctx context.Context, tenant string, pts []fleet.DataPoint) (streamWrite, error) {
	var w streamWrite
	if len(pts) == 0 {
		return w, nil
	}
	w.latest = &pts[len(pts)-1]
	b, err := fleet.MarshalCanonical(w.latest.Data)
	if err != nil {
		return w, fleet.Errorf(fleet.EINVALID, "data point cannot be stored: %v", err)
	}
	w.data = string(b)
	w.chunks, err = db.prepareHistory(ctx, tenant, pts)
	return w, err
}

// commitStream is CommitStream's job; the stream's version advances with a
// newer point (CommitStreamVersion advances it with every commit).
func (tx *Tx) commitStream(ctx context.Context, tenant, device, stream string, w streamWrite, changes []*fleet.AlertChange) error {
	if latest := w.latest; latest != nil {
		_, err := tx.exec(ctx, `INSERT INTO stream_latest (tenant, device_id, stream, ts, seq, data, received_at)
			VALUES (?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (tenant, device_id, stream) DO UPDATE SET
				ts = excluded.ts, seq = excluded.seq, data = excluded.data, received_at = excluded.received_at,
				version = stream_latest.version + 1
			WHERE excluded.ts > stream_latest.ts OR (excluded.ts = stream_latest.ts AND excluded.seq > stream_latest.seq)`,
			tenant, device, stream, millis(latest.Timestamp), latest.Sequence, w.data, millis(latest.ReceivedAt))
		if isForeignKeyViolation(err) {
			return fleet.Errorf(fleet.ENOTFOUND, "device %q not found", device)
		} else if err != nil {
			return err
		}
	}
	if err := tx.writeHistory(ctx, tenant, device, stream, w.chunks); err != nil {
		return err
	}
	return tx.applyAlertChanges(ctx, tenant, device, stream, changes)
}

// applyAlertChanges records an evaluation's alert changes.
func (tx *Tx) applyAlertChanges(ctx context.Context, tenant, device, stream string, changes []*fleet.AlertChange) error {
	adopted := map[string]string{} // our alert id -> the id of the alert open already
	for _, c := range changes {
		if err := tx.applyAlertChange(ctx, tenant, device, c, adopted); err != nil {
			return err
		}
	}
	return nil
}

func (tx *Tx) applyAlertChange(ctx context.Context, tenant, device string, c *fleet.AlertChange, adopted map[string]string) error {
	if id, ok := adopted[c.State.AlertID]; ok {
		c.State.AlertID = id
	}
	var exists int
	if err := tx.queryRow(ctx, `SELECT count(*) FROM alert_rules r, devices d
		WHERE r.id = ? AND r.tenant = ? AND d.tenant = ? AND d.id = ?`, c.State.RuleID, tenant, tenant, device).Scan(&exists); err != nil {
		return err
	}
	if exists == 0 {
		return nil // the rule or the device was deleted meanwhile: nothing to record
	}
	if o := c.Open; o != nil {
		value, err := encodePoint(o.Value)
		if err != nil {
			return err
		}
		res, err := tx.exec(ctx, `INSERT INTO alerts (id, tenant, rule_id, device_id, stream, started_at, value)
			VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`,
			o.ID, tenant, o.RuleID, device, c.Stream, millis(o.StartedAt), value)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		if n == 0 {
			// Open already: this job ran before, or another replica was
			// first. Either way the open alert is the one to follow.
			var id string
			err := tx.queryRow(ctx, "SELECT id FROM alerts WHERE rule_id = ? AND device_id = ? AND ended_at IS NULL", o.RuleID, device).Scan(&id)
			if errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("alert %s exists already but is not open", o.ID)
			} else if err != nil {
				return err
			}
			adopted[o.ID] = id
			o.ID, c.State.AlertID = id, id
		} else if err := tx.enqueueOpened(ctx, tenant, o.ID, o.RuleID); err != nil {
			return err
		}
	}
	if cl := c.Close; cl != nil {
		if id, ok := adopted[cl.ID]; ok {
			cl.ID = id
		}
		// An alert never ends before it started, whatever the devices'
		// clocks say.
		res, err := tx.exec(ctx, "UPDATE alerts SET ended_at = CASE WHEN started_at > ? THEN started_at ELSE ? END WHERE id = ? AND tenant = ? AND ended_at IS NULL",
			millis(cl.EndedAt), millis(cl.EndedAt), cl.ID, tenant)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n > 0 {
			if err := tx.enqueueClosed(ctx, tenant, cl.ID, c.State.RuleID); err != nil {
				return err
			}
		}
	}
	s := c.State
	if s.Phase == fleet.PhaseNormal {
		_, err := tx.exec(ctx, "DELETE FROM alert_states WHERE rule_id = ? AND device_id = ?", s.RuleID, device)
		return err
	}
	var sinceData int64 = -1
	if !s.SinceData.IsZero() {
		sinceData = millis(s.SinceData)
	}
	_, err := tx.exec(ctx, `INSERT INTO alert_states (rule_id, device_id, tenant, phase, since_data, since_clock, alert_id)
		VALUES (?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (rule_id, device_id) DO UPDATE SET
			phase = excluded.phase, since_data = excluded.since_data, since_clock = excluded.since_clock, alert_id = excluded.alert_id`,
		s.RuleID, device, tenant, s.Phase, sinceData, millis(s.SinceClock), s.AlertID)
	return err
}

// FindLatestPoint returns a stream's latest point.
func (db *DB) FindLatestPoint(ctx context.Context, tenant, device, stream string) (*fleet.DataPoint, error) {
	p, err := scanPoint(db.queryRow(ctx, `SELECT device_id, stream, ts, seq, data, received_at FROM stream_latest
		WHERE tenant = ? AND device_id = ? AND stream = ?`, tenant, device, stream))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fleet.Errorf(fleet.ENOTFOUND, "device %q has sent no data on stream %q", device, stream)
	}
	return p, db.classify(err)
}

// FindDeviceStreams returns the latest point of each of a device's
// streams, by stream name, a page at a time (the primary key's range).
func (db *DB) FindDeviceStreams(ctx context.Context, tenant, device string, p fleet.Page) ([]*fleet.DataPoint, int, error) {
	return findPage(ctx, db, "SELECT count(*) FROM stream_latest WHERE tenant = ? AND device_id = ?",
		`SELECT device_id, stream, ts, seq, data, received_at FROM stream_latest
		WHERE tenant = ? AND device_id = ? ORDER BY stream`, []any{tenant, device}, p, scanPoint)
}

// FindLatestPoints returns the latest point of every device on a stream of
// the tenant: what the timers of no_data_seconds start from.
func (db *DB) FindLatestPoints(ctx context.Context, tenant, stream string) ([]*fleet.DataPoint, error) {
	rows, err := db.query(ctx, `SELECT device_id, stream, ts, seq, data, received_at FROM stream_latest
		WHERE tenant = ? AND stream = ? ORDER BY device_id`, tenant, stream)
	if err != nil {
		return nil, db.classify(err)
	}
	return scanAll(rows, scanPoint)
}

func scanPoint(s scanner) (*fleet.DataPoint, error) {
	var p fleet.DataPoint
	var ts, received int64
	var data string
	if err := s.Scan(&p.DeviceID, &p.Stream, &ts, &p.Sequence, &data, &received); err != nil {
		return nil, err
	}
	v, err := decodeCanonical(data)
	if err != nil {
		return nil, fmt.Errorf("stream %s of %s: %w", p.Stream, p.DeviceID, err)
	}
	p.Data, _ = v.(map[string]any)
	p.Timestamp, p.ReceivedAt = fromMillis(ts), fromMillis(received)
	return &p, nil
}

// storedPoint is how an alert's value is kept; Data is the point's data
// as fleet.MarshalCanonical writes it.
type storedPoint struct {
	DeviceID   string          `json:"device_id"`
	Stream     string          `json:"stream"`
	Timestamp  int64           `json:"timestamp"`
	Sequence   int64           `json:"sequence"`
	Data       json.RawMessage `json:"data"`
	ReceivedAt int64           `json:"received_at"`
}

func encodePoint(p *fleet.DataPoint) (any, error) {
	if p == nil {
		return nil, nil
	}
	data, err := fleet.MarshalCanonical(p.Data)
	if err != nil {
		return nil, fleet.Errorf(fleet.EINVALID, "data point cannot be stored: %v", err)
	}
	b, err := json.Marshal(storedPoint{p.DeviceID, p.Stream, millis(p.Timestamp), p.Sequence, data, millis(p.ReceivedAt)})
	if err != nil {
		return nil, fleet.Errorf(fleet.EINVALID, "data point cannot be stored: %v", err)
	}
	return string(b), nil
}

func decodePoint(s sql.NullString) (*fleet.DataPoint, error) {
	if !s.Valid {
		return nil, nil
	}
	var sp storedPoint
	if err := json.Unmarshal([]byte(s.String), &sp); err != nil {
		return nil, err
	}
	data, err := decodeCanonical(string(sp.Data))
	if err != nil {
		return nil, err
	}
	p := &fleet.DataPoint{DeviceID: sp.DeviceID, Stream: sp.Stream, Timestamp: fromMillis(sp.Timestamp),
		Sequence: sp.Sequence, ReceivedAt: fromMillis(sp.ReceivedAt)}
	p.Data, _ = data.(map[string]any)
	return p, nil
}

// decodeCanonical reads stored JSON text into canonical values
// (fleet.ParseCanonical).
func decodeCanonical(s string) (any, error) {
	return fleet.ParseCanonical([]byte(s))
}

// isForeignKeyViolation reports whether err is a foreign-key constraint
// failure, by the driver's error code.
// isMissingTable reports whether err is a statement's on a table that does
// not exist: SQLite has no code of its own for it, only its message.
func isMissingTable(err error) bool {
	var se *msqlite.Error
	if errors.As(err, &se) {
		return strings.Contains(se.Error(), "no such table")
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == "42P01"
	}
	return false
}

func isForeignKeyViolation(err error) bool {
	var se *msqlite.Error
	if errors.As(err, &se) {
		return se.Code() == sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == "23503"
	}
	return false
}
