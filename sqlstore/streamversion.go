package sqlstore

import (
	"context"
	"database/sql"
	"errors"

	"github.com/fleetd/fleet"
)

// CommitStreamVersion is CommitStream for a replica among others: it
// commits only if the stream is still at version expect (0: the stream has
// no latest point yet, as far as the caller knows), advances the version
// and returns it. Otherwise it
// commits nothing and returns fleet.ErrStale: another replica committed the
// stream since this one read it, and evaluating again from FindStreamSnapshot
// is in order. On PostgreSQL the version check takes the stream's row lock,
// so replicas commit one device stream in turn.
func (db *DB) CommitStreamVersion(ctx context.Context, tenant, device, stream string, pts []fleet.DataPoint, changes []*fleet.AlertChange, expect int64) (int64, error) {
	w, err := db.prepareStream(ctx, tenant, pts)
	if err != nil {
		return 0, err
	}
	latest, data := w.latest, w.data
	var version int64
	update := func(ctx context.Context, tx *Tx) error {
		switch {
		case expect > 0 && latest != nil:
			// One statement: the version check, and the point if newer.
			// Every SET expression sees the row as it was.
			ts := millis(latest.Timestamp)
			newer := "(ts < ? OR (ts = ? AND seq < ?))"
			n, err := tx.execCount(ctx, `UPDATE stream_latest SET version = version + 1,
				ts = CASE WHEN `+newer+` THEN ? ELSE ts END,
				seq = CASE WHEN `+newer+` THEN ? ELSE seq END,
				data = CASE WHEN `+newer+` THEN ? ELSE data END,
				received_at = CASE WHEN `+newer+` THEN ? ELSE received_at END
				WHERE tenant = ? AND device_id = ? AND stream = ? AND version = ?`,
				ts, ts, latest.Sequence, ts,
				ts, ts, latest.Sequence, latest.Sequence,
				ts, ts, latest.Sequence, data,
				ts, ts, latest.Sequence, millis(latest.ReceivedAt),
				tenant, device, stream, expect)
			if err != nil {
				return err
			}
			if n == 0 {
				return fleet.ErrStale
			}
			version = expect + 1
		case expect > 0:
			n, err := tx.execCount(ctx, "UPDATE stream_latest SET version = version + 1 WHERE tenant = ? AND device_id = ? AND stream = ? AND version = ?",
				tenant, device, stream, expect)
			if err != nil {
				return err
			}
			if n == 0 {
				return fleet.ErrStale
			}
			version = expect + 1
		case latest != nil:
			// The first point: whoever inserts it first wins.
			n, err := tx.execCount(ctx, `INSERT INTO stream_latest (tenant, device_id, stream, ts, seq, data, received_at, version)
				VALUES (?, ?, ?, ?, ?, ?, ?, 1) ON CONFLICT (tenant, device_id, stream) DO NOTHING`,
				tenant, device, stream, millis(latest.Timestamp), latest.Sequence, data, millis(latest.ReceivedAt))
			if isForeignKeyViolation(err) {
				return fleet.Errorf(fleet.ENOTFOUND, "device %q not found", device)
			} else if err != nil {
				return err
			}
			if n == 0 {
				return fleet.ErrStale
			}
			version = 1
		default:
			// Changes alone from a replica that never read the stream's
			// version (its no_data timers start from FindLatestPoints).
			var n int
			if err := tx.queryRow(ctx, "SELECT count(*) FROM stream_latest WHERE tenant = ? AND device_id = ? AND stream = ?",
				tenant, device, stream).Scan(&n); err != nil {
				return err
			}
			if n > 0 {
				return fleet.ErrStale
			}
		}
		if err := tx.writeHistory(ctx, tenant, device, stream, w.chunks); err != nil {
			return err
		}
		return tx.applyAlertChanges(ctx, tenant, device, stream, changes)
	}
	err = db.rewriteHistory(ctx, w.chunks, func() error { return db.update(ctx, update) })
	if err != nil {
		return 0, err
	}
	return version, nil
}

// FindStreamSnapshot reads what the store holds of a device stream for
// alert evaluation, at one moment: its latest point, version, and the
// states of the device's rules on the stream.
func (db *DB) FindStreamSnapshot(ctx context.Context, tenant, device, stream string) (*fleet.StreamSnapshot, error) {
	tx, err := db.readTx(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	snap := &fleet.StreamSnapshot{}
	var version int64
	row := tx.queryRow(ctx, `SELECT device_id, stream, ts, seq, data, received_at, version FROM stream_latest
		WHERE tenant = ? AND device_id = ? AND stream = ?`, tenant, device, stream)
	p, err := scanPoint(versioned{row, &version})
	switch {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return nil, db.classify(err)
	default:
		snap.Latest, snap.Version = p, version
	}
	rows, err := tx.query(ctx, `SELECT s.tenant, s.rule_id, s.device_id, s.phase, s.since_data, s.since_clock, s.alert_id
		FROM alert_states s JOIN alert_rules r ON r.id = s.rule_id
		WHERE s.tenant = ? AND s.device_id = ? AND r.stream = ?`, tenant, device, stream)
	if err != nil {
		return nil, db.classify(err)
	}
	defer rows.Close()
	for rows.Next() {
		var s fleet.AlertState
		var sinceData, sinceClock int64
		if err := rows.Scan(&s.Tenant, &s.RuleID, &s.DeviceID, &s.Phase, &sinceData, &sinceClock, &s.AlertID); err != nil {
			return nil, err
		}
		if sinceData >= 0 {
			s.SinceData = fromMillis(sinceData)
		}
		s.SinceClock = fromMillis(sinceClock)
		snap.States = append(snap.States, &s)
	}
	return snap, rows.Err()
}

// versioned scans a point row with its version in the last column.
type versioned struct {
	row     scanner
	version *int64
}

func (v versioned) Scan(dest ...any) error { return v.row.Scan(append(dest, v.version)...) }
