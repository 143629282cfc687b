package sqlstore

import (
	"context"
	"time"

	"github.com/fleetd/fleet"
)

// The redelivery records are bookkeeping of the device channel, written at
// every arrival of a device at an external broker: like last_seen_at, they
// are not audited.

// ScheduleRedelivery records that a device arrived at the external broker
// and is owed its queued actions at at. A device already recorded is due at
// the new time, and a claim on it in progress will not remove it. An unknown
// device is ignored: nothing can be queued for it.
func (db *DB) ScheduleRedelivery(ctx context.Context, tenant, device string, at time.Time) error {
	return db.update(ctx, func(ctx context.Context, tx *Tx) error {
		// INSERT … SELECT rather than a foreign-key error, which would
		// abort a PostgreSQL batch.
		_, err := tx.exec(ctx, `INSERT INTO device_redeliveries (tenant, device_id, due_at, version, lease_owner, lease_until)
			SELECT tenant, id, ?, 1, '', 0 FROM devices WHERE tenant = ? AND id = ?
			ON CONFLICT (tenant, device_id) DO UPDATE SET due_at = excluded.due_at, version = device_redeliveries.version + 1`,
			millis(at), tenant, device)
		return err
	})
}

// ClaimRedeliveries leases up to limit due redeliveries to owner for lease
// and returns them. Rows another replica holds are skipped until its lease
// runs out.
func (db *DB) ClaimRedeliveries(ctx context.Context, owner string, lease time.Duration, limit int) ([]fleet.Redelivery, error) {
	var out []fleet.Redelivery
	err := db.update(ctx, func(ctx context.Context, tx *Tx) error {
		out = out[:0]
		now := millis(tx.now)
		rows, err := tx.query(ctx, `UPDATE device_redeliveries SET lease_owner = ?, lease_until = ?
			WHERE (tenant, device_id) IN (
				SELECT tenant, device_id FROM device_redeliveries WHERE due_at <= ? AND lease_until < ?
				ORDER BY due_at`+limitClause(limit)+db.dialect.skipLocked()+`)
			RETURNING tenant, device_id, version`,
			owner, now+lease.Milliseconds(), now, now)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var r fleet.Redelivery
			if err := rows.Scan(&r.Tenant, &r.DeviceID, &r.Version); err != nil {
				return err
			}
			out = append(out, r)
		}
		return rows.Err()
	})
	return out, err
}

// CompleteRedelivery ends owner's claim on r. When done, the record is
// removed, unless the device arrived again since the claim; otherwise (the
// device could not be served: the broker connection is down) it is due
// again at once, for any replica.
func (db *DB) CompleteRedelivery(ctx context.Context, r fleet.Redelivery, owner string, done bool) error {
	return db.update(ctx, func(ctx context.Context, tx *Tx) error {
		if done {
			res, err := tx.exec(ctx, "DELETE FROM device_redeliveries WHERE tenant = ? AND device_id = ? AND version = ?",
				r.Tenant, r.DeviceID, r.Version)
			if err != nil {
				return err
			}
			if n, err := res.RowsAffected(); err != nil || n > 0 {
				return err
			}
		}
		_, err := tx.exec(ctx, "UPDATE device_redeliveries SET lease_owner = '', lease_until = 0 WHERE tenant = ? AND device_id = ? AND lease_owner = ?",
			r.Tenant, r.DeviceID, owner)
		return err
	})
}
