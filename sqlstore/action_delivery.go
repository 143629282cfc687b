package sqlstore

// Delivery: what is still to be sent to devices, their acknowledgements,
// and the timeouts that start with them.

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/fleetd/fleet"
)

// PendingDevices returns the devices, among candidates (all when nil),
// whose device action is pending (Queued): they have yet to acknowledge it.
func (db *DB) PendingDevices(ctx context.Context, tenant string, actionID int64, candidates []string) ([]string, error) {
	q := "SELECT device_id FROM device_actions WHERE tenant = ? AND action_id = ? AND " + pending
	if candidates == nil {
		return db.strings(ctx, db.dialect.pendingOfAction(), tenant, actionID)
	}
	var out []string
	for start := 0; start < len(candidates); start += idChunk {
		chunk := candidates[start:min(start+idChunk, len(candidates))]
		ids, err := db.strings(ctx, q+" AND device_id IN ("+placeholders(len(chunk))+")", append([]any{tenant, actionID}, anys(chunk)...)...)
		if err != nil {
			return nil, err
		}
		out = append(out, ids...)
	}
	return out, nil
}

// pendingOfAction selects the devices whose device action of an action
// (tenant, action_id) is pending (Queued), through the primary key: Queued
// device actions are not in device_actions_by_status (migration 0045), and
// after a dispatch nearly all of the action's are Queued. SQLite's
// planner, without statistics, would prefer the covering
// device_actions_by_device on its tenant prefix and read every device
// action of the tenant, of any action.
func (d dialect) pendingOfAction() string {
	return "SELECT device_id FROM device_actions" + d.indexedBy(primaryKey) +
		" WHERE tenant = ? AND action_id = ? AND " + pending
}

// PendingActions returns up to limit actions pending (Queued) for a
// device whose ids are above after, oldest first, with their rollout's
// maintenance window: the device channel reads a device's backlog a window
// at a time. A desired rollout's device actions are never sent (its
// release changes the shadow, docs/twin.md): while its window is shut they
// are Queued, and are left out here, or a device that subscribed between
// the window's opening and the rollout's next pass would be sent one.
func (db *DB) PendingActions(ctx context.Context, tenant, device string, after int64, limit int) ([]fleet.PendingAction, error) {
	rows, err := db.query(ctx, `SELECT da.action_id, da.type, COALESCE(a.device_params, a.params), r.maintenance_window
		FROM device_actions da JOIN actions a ON a.tenant = da.tenant AND a.id = da.action_id
		LEFT JOIN rollouts r ON r.tenant = da.tenant AND r.action_id = da.action_id
		WHERE da.tenant = ? AND da.device_id = ? AND da.`+pending+` AND da.action_id > ? AND da.type <> ?
		ORDER BY da.action_id`+limitClause(pageLimit(limit)), tenant, device, after, fleet.ActionDesired)
	if err != nil {
		return nil, db.classify(err)
	}
	defer rows.Close()
	var out []fleet.PendingAction
	for len(out) < limit && rows.Next() {
		var p fleet.PendingAction
		var window sql.NullString
		if err := rows.Scan(&p.ActionID, &p.Name, &p.Params, &window); err != nil {
			return nil, err
		}
		if window.Valid {
			if err := json.Unmarshal([]byte(window.String), &p.Window); err != nil {
				return nil, fmt.Errorf("action %d maintenance window: %w", p.ActionID, err)
			}
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// MarkDelivered records devices' acknowledgements of action messages: a
// Queued device action becomes Initiated and its timeout starts.
// Acknowledgements of anything else (a redelivery, or an action the device
// reported on first) change nothing. A batch costs one statement per
// hundred receipts, and on PostgreSQL one more that locks them in order.
func (db *DB) MarkDelivered(ctx context.Context, receipts []fleet.ActionReceipt) error {
	// Receipts come in the order devices sent them; the device actions are
	// locked in the order every writer locks them (see lockInOrder), so
	// that a batch of receipts and one of status reports never wait for
	// each other.
	locks := make([]lockKey, len(receipts))
	for i, r := range receipts {
		locks[i] = lockKey{r.Tenant, r.ActionID, r.DeviceID}
	}
	slices.SortFunc(locks, compareLockKeys)
	locks = slices.Compact(locks)
	return db.updateLocking(ctx, locks, false, func(ctx context.Context, tx *Tx) error {
		now := millis(tx.now)
		for start := 0; start < len(locks); start += reportChunk {
			cond, keys, n := keysIn(locks[start:min(start+reportChunk, len(locks))])
			if err := tx.lockInOrder(ctx, cond+" AND "+pending, keys...); err != nil {
				return err
			}
			args := append([]any{now, now, now}, keys...)
			if _, err := tx.applyMove(ctx, moveDelivered, `UPDATE device_actions SET `+moveDelivered.set+`,
				initiated_at = ?, updated_at = ?,
				deadline = ? + 1000 * (SELECT timeout FROM actions a WHERE a.tenant = device_actions.tenant AND a.id = device_actions.action_id)
				FROM `+tx.db.dialect.valuesTable("r", []string{"tenant", "action_id", "device_id"}, []string{"TEXT", "BIGINT", "TEXT"}, n)+`
				WHERE device_actions.tenant = r.tenant AND device_actions.action_id = r.action_id AND device_actions.device_id = r.device_id
				AND device_actions.{from}`, args...); err != nil {
				return err
			}
		}
		return nil
	})
}

// TimeOutDeviceActions fails up to limit device actions whose deadline is
// at or before now, with status TimedOut, and returns how many. Any number
// of replicas may call it at once: each claims different rows, and a row
// that another replica finished no longer matches.
//
// The claim is a materialised CTE, run once. As a subquery of the UPDATE,
// PostgreSQL may run it again for each row it updates, and SKIP LOCKED then
// hands each run rows the previous runs locked not: more than limit. It
// claims a source status at a time (Initiated, then Progress, within
// the limit), so that each statement's rows are counted (Tx.moveFrom).
func (db *DB) TimeOutDeviceActions(ctx context.Context, now time.Time, limit int) (int, error) {
	var n int
	err := db.update(ctx, func(ctx context.Context, tx *Tx) error {
		at := millis(now)
		n = 0
		for _, from := range moveTimeout.from {
			// What is left of the limit is any number: it is taken in
			// statements of batchLimit's steps, whose texts are few.
			for n < limit {
				step := batchLimit(limit - n)
				moved, err := tx.moveFrom(ctx, from, moveTimeout.t.To, `WITH due AS MATERIALIZED (SELECT tenant, action_id, device_id FROM device_actions
					WHERE deadline IS NOT NULL AND deadline <= ? AND `+statusIn([]fleet.ActionStatus{from})+` ORDER BY deadline`+limitClause(step)+db.dialect.skipLocked()+`)
				UPDATE device_actions SET `+moveTimeout.set+`,
				errors = `+db.dialect.jsonSetList("errors", moveTimeout.t.Status)+`, error_count = error_count + 1, updated_at = ?
				WHERE deadline IS NOT NULL AND deadline <= ? AND (tenant, action_id, device_id) IN (SELECT tenant, action_id, device_id FROM due)`,
					at, "the action's timeout elapsed before the device reported Completed or Failed", at, at)
				if err != nil {
					return err
				}
				if n += moved; moved < step {
					break // none left of this status, or the rest locked
				}
			}
		}
		return nil
	})
	return n, err
}
