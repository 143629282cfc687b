package sqlstore

// Dispatch and cancellation: choosing an action's targets and writing its
// device actions, and ending them on an operator's word.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/fleetd/fleet"
)

// DispatchAction stores an action and one device action per targeted
// device in one transaction. The targets are chosen and inserted inside the
// database (INSERT … SELECT FROM devices), so a dispatch to a million
// devices is a handful of statements.
func (db *DB) DispatchAction(ctx context.Context, tenant string, d *fleet.Dispatch) (*fleet.Action, error) {
	var a *fleet.Action
	err := db.update(ctx, func(ctx context.Context, tx *Tx) error {
		var err error
		a, err = tx.dispatch(ctx, tenant, d, false)
		return err
	})
	if err != nil {
		return nil, err
	}
	if db.dialect == postgres && a.Targeted >= analyzeAfter {
		// Until autovacuum catches up (a minute or more), PostgreSQL plans
		// the hottest queries, status reports, without knowing these rows
		// and may scan a whole action per report. ANALYZE samples a bounded
		// number of rows, so it costs the same for 10,000 as for 10,000,000.
		if _, err := db.write.ExecContext(ctx, "ANALYZE device_actions"); err != nil {
			db.log.Warn("analyze device_actions after a large dispatch", "targeted", a.Targeted, "err", err)
		}
	}
	return a, nil
}

// analyzeAfter is the size of a dispatch after which PostgreSQL's
// statistics of device_actions are refreshed at once.
const analyzeAfter = 10_000

// searchInFlight is the selection of a cancellation that CancelAction
// sends: the devices that have the action it cancels (d.CancelActionID) in
// flight. Clients cannot ask for it.
const searchInFlight = "in-flight"

// dispatch is DispatchAction inside a transaction. With allowEmpty, a
// selection that matches no device dispatches nothing and returns nil.
func (tx *Tx) dispatch(ctx context.Context, tenant string, d *fleet.Dispatch, allowEmpty bool) (*fleet.Action, error) {
	a := &fleet.Action{
		Action:       d.Action,
		Params:       d.Params,
		SearchType:   d.SearchType,
		SearchKey:    d.SearchKey,
		SearchQuery:  d.SearchQuery,
		Metadata:     d.Metadata,
		Timeout:      d.Timeout,
		UserEmail:    d.UserEmail,
		UserName:     d.UserName,
		DeviceParams: d.DeviceParams,
		CreatedAt:    tx.now.Truncate(time.Millisecond),
	}
	if a.Metadata == nil {
		a.Metadata = json.RawMessage("{}")
	}
	if a.SearchType == searchInFlight {
		a.SearchType = fleet.SearchDefault
	}
	now := millis(a.CreatedAt)
	if d.CancelActionID != 0 {
		var cancelled string
		err := tx.queryRow(ctx, "SELECT action FROM actions WHERE tenant = ? AND id = ?", tenant, d.CancelActionID).Scan(&cancelled)
		if errors.Is(err, sql.ErrNoRows) {
			return nil, fleet.FieldErrors(map[string]string{"params.action_id": fmt.Sprintf("there is no action %d to cancel", d.CancelActionID)})
		} else if err != nil {
			return nil, err
		}
		a.DeviceParams, _ = json.Marshal(map[string]string{"action_id": strconv.FormatInt(d.CancelActionID, 10), "name": cancelled})
	}
	if err := tx.queryRow(ctx, `INSERT INTO action_counters (tenant, last_id) VALUES (?, 1)
		ON CONFLICT (tenant) DO UPDATE SET last_id = action_counters.last_id + 1 RETURNING last_id`, tenant).Scan(&a.ID); err != nil {
		return nil, err
	}
	n, err := tx.insertTargets(ctx, tenant, a, d, now)
	if err != nil {
		return nil, err
	}
	if n == 0 && allowEmpty {
		return nil, nil
	} else if n == 0 {
		return nil, fleet.Errorf(fleet.EINVALID, "no device matches the selection; nothing was dispatched")
	}
	a.Targeted = n
	// The counts are known without counting.
	a.Statuses = map[string]int{string(fleet.StatusQueued): n}
	if d.CheckDevice != nil {
		failed, err := tx.checkDevices(ctx, tenant, a.ID, d.CheckDevice, now)
		if err != nil {
			return nil, err
		}
		a.Statuses[string(fleet.StatusFailed)] = failed
	}
	if d.CancelActionID != 0 {
		done, err := tx.cancelOnTargets(ctx, tenant, a.ID, d.CancelActionID, now)
		if err != nil {
			return nil, err
		}
		a.Statuses[string(fleet.StatusCompleted)] = done
	}
	for _, s := range []fleet.ActionStatus{fleet.StatusFailed, fleet.StatusCompleted} {
		a.Statuses[string(fleet.StatusQueued)] -= a.Statuses[string(s)]
	}
	for k, v := range a.Statuses {
		if v == 0 {
			delete(a.Statuses, k)
		}
	}
	var deviceParams *string
	if a.DeviceParams != nil {
		s := string(a.DeviceParams)
		deviceParams = &s
	}
	if _, err := tx.exec(ctx, `INSERT INTO actions (tenant, id, action, params, device_params, search_type, search_key, search_query,
		metadata, timeout, user_email, user_name, created_at, targeted) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		tenant, a.ID, a.Action, string(a.Params), deviceParams, a.SearchType, a.SearchKey, a.SearchQuery,
		string(a.Metadata), a.Timeout, a.UserEmail, a.UserName, now, a.Targeted); err != nil {
		return nil, err
	}
	details := map[string]any{"action": a.Action, "search_type": a.SearchType, "targeted": a.Targeted}
	if d.CancelActionID != 0 {
		details["cancels"] = d.CancelActionID
	}
	return a, tx.audit(ctx, tenant, "action.dispatch", "actions/"+strconv.FormatInt(a.ID, 10), details)
}

// insertTargets inserts a Queued device action for every device the
// dispatch selects and returns how many. For search_type default every id
// must exist: otherwise the error lists the unknown ones, and the caller's
// transaction is rolled back.
func (tx *Tx) insertTargets(ctx context.Context, tenant string, a *fleet.Action, d *fleet.Dispatch, now int64) (int, error) {
	d8 := tx.db.dialect
	// Constants are cast so that PostgreSQL knows their types in a SELECT.
	insert := `INSERT INTO device_actions (tenant, action_id, device_id, type, status, action_status, progress, errors, error_count,
		user_email, user_name, serial_metadata, created_at, updated_at)
		SELECT tenant, CAST(? AS BIGINT), id, CAST(? AS TEXT), 'Queued', 'Queued', 0, CAST('{}' AS ` + d8.jsonType() + `), 0,
		CAST(? AS TEXT), CAST(? AS TEXT), metadata, CAST(? AS BIGINT), CAST(? AS BIGINT) FROM devices WHERE tenant = ?`
	args := []any{a.ID, a.Action, a.UserEmail, a.UserName, now, now, tenant}
	var total int64
	switch d.SearchType {
	case fleet.SearchDefault:
		short := false
		for start := 0; start < len(d.DeviceIDs); start += idChunk {
			chunk := d.DeviceIDs[start:min(start+idChunk, len(d.DeviceIDs))]
			n, err := tx.execCount(ctx, insert+" AND id IN ("+placeholders(len(chunk))+")", append(slices.Clip(args), anys(chunk)...)...)
			if err != nil {
				return 0, err
			}
			short = short || int(n) < len(chunk)
			total += n
		}
		if short {
			return 0, tx.unknownTargets(ctx, tenant, a.ID, d.DeviceIDs)
		}
	case fleet.SearchAll:
		n, err := tx.execCount(ctx, insert, args...)
		if err != nil {
			return 0, err
		}
		total = n
	case fleet.SearchMetadata:
		n, err := tx.execCount(ctx, insert+" AND "+d8.jsonKeyEquals("metadata"), append(args, d.SearchKey, d.SearchQuery)...)
		if err != nil {
			return 0, err
		}
		total = n
	case fleet.SearchSearch:
		cond := d8.jsonValueContainsFold("metadata")
		more := []any{d.SearchQuery, d.SearchQuery}
		if d.SearchKey != "" {
			cond = d8.jsonKeyContainsFold("metadata")
			more = []any{d.SearchQuery, d.SearchKey, d.SearchQuery}
		}
		n, err := tx.execCount(ctx, insert+" AND ("+d8.containsFold("id")+" OR "+cond+")", append(args, more...)...)
		if err != nil {
			return 0, err
		}
		total = n
	case searchInFlight:
		n, err := tx.execCount(ctx, insert+` AND id IN (SELECT device_id FROM device_actions
			WHERE tenant = ? AND action_id = ? AND action_status IN ('Initiated', 'Progress'))`, append(args, tenant, d.CancelActionID)...)
		if err != nil {
			return 0, err
		}
		total = n
	default:
		return 0, fleet.FieldErrors(map[string]string{"search_type": "must be one of default, all, metadata, search"})
	}
	return int(total), nil
}

// unknownTargets is the error of a default dispatch that named devices the
// tenant does not have: those are the ones the insert left out.
func (tx *Tx) unknownTargets(ctx context.Context, tenant string, actionID int64, ids []string) error {
	found := make(map[string]bool, len(ids))
	rows, err := tx.query(ctx, "SELECT device_id FROM device_actions WHERE tenant = ? AND action_id = ?", tenant, actionID)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return err
		}
		found[id] = true
	}
	if err := rows.Err(); err != nil {
		return err
	}
	var unknown []string
	for _, id := range ids {
		if !found[id] {
			unknown = append(unknown, id)
		}
	}
	return &fleet.Error{
		Code:    fleet.EINVALID,
		Message: fmt.Sprintf("%d unknown devices: %s; nothing was dispatched", len(unknown), listSome(unknown)),
		Fields:  map[string]string{"device_ids": "unknown devices: " + listSome(unknown)},
	}
}

// checkDevices asks check about every targeted device with recorded
// component versions and fails the device actions of those it rejects.
func (tx *Tx) checkDevices(ctx context.Context, tenant string, actionID int64, check func(map[string]string) string, now int64) (int, error) {
	rows, err := tx.query(ctx, `SELECT d.id, d.components FROM device_actions da
		JOIN devices d ON d.tenant = da.tenant AND d.id = da.device_id
		WHERE da.tenant = ? AND da.action_id = ? AND d.components <> '{}'`, tenant, actionID)
	if err != nil {
		return 0, err
	}
	type rejection struct{ id, reason string }
	var rejected []rejection
	for rows.Next() {
		var id, comps string
		if err := rows.Scan(&id, &comps); err != nil {
			rows.Close()
			return 0, err
		}
		var c map[string]string
		if err := json.Unmarshal([]byte(comps), &c); err != nil {
			rows.Close()
			return 0, fmt.Errorf("device %s components: %w", id, err)
		}
		if len(c) == 0 {
			continue // nothing recorded, nothing to check
		}
		if reason := check(c); reason != "" {
			rejected = append(rejected, rejection{id, reason})
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	for _, r := range rejected {
		errs, _ := json.Marshal(map[string][]string{string(fleet.StatusFailed): {r.reason}})
		if _, err := tx.exec(ctx, `UPDATE device_actions SET action_status = 'Failed', status = 'Failed', errors = ?, error_count = 1, updated_at = ?
			WHERE tenant = ? AND action_id = ? AND device_id = ?`, string(errs), now, tenant, actionID, r.id); err != nil {
			return 0, err
		}
	}
	return len(rejected), nil
}

// cancelOnTargets does what a cancel_action dispatch means: the cancelled
// action's records on the targeted devices become Cancelled, and the
// cancel_action's own record is Completed at once wherever the device never
// had the action, so only devices that have it are sent the cancellation.
func (tx *Tx) cancelOnTargets(ctx context.Context, tenant string, actionID, cancelled int64, now int64) (int, error) {
	done, err := tx.execCount(ctx, `UPDATE device_actions SET action_status = 'Completed', status = 'Completed', progress = 100, updated_at = ?
		WHERE tenant = ? AND action_id = ? AND NOT EXISTS (SELECT 1 FROM device_actions t
			WHERE t.tenant = device_actions.tenant AND t.action_id = ? AND t.device_id = device_actions.device_id
			AND t.action_status IN ('Initiated', 'Progress'))`, now, tenant, actionID, cancelled)
	if err != nil {
		return 0, err
	}
	_, err = tx.exec(ctx, `UPDATE device_actions SET action_status = 'Cancelled', status = 'Cancelled', deadline = NULL, updated_at = ?
		WHERE tenant = ? AND action_id = ? AND action_status IN ('Queued', 'Initiated', 'Progress')
		AND device_id IN (SELECT device_id FROM device_actions WHERE tenant = ? AND action_id = ?)`,
		now, tenant, cancelled, tenant, actionID)
	return int(done), err
}

// CancelAction cancels every device action of an action that is not
// final, and returns how many. Devices that have the action (Initiated or
// Progress) must be told: for them it dispatches a cancel_action in the
// same transaction and returns it (nil when there are none), to be sent
// like any action.
func (db *DB) CancelAction(ctx context.Context, tenant string, id int64) (*fleet.Action, int, error) {
	var n int64
	var sent *fleet.Action
	err := db.update(ctx, func(ctx context.Context, tx *Tx) error {
		sent, n = nil, 0
		var name string
		var timeout int64
		err := tx.queryRow(ctx, "SELECT action, timeout FROM actions WHERE tenant = ? AND id = ?", tenant, id).Scan(&name, &timeout)
		if errors.Is(err, sql.ErrNoRows) {
			return fleet.Errorf(fleet.ENOTFOUND, "action %d not found", id)
		} else if err != nil {
			return err
		}
		var inFlight int
		if err := tx.queryRow(ctx, "SELECT count(*) FROM device_actions WHERE tenant = ? AND action_id = ? AND action_status IN ('Initiated', 'Progress')",
			tenant, id).Scan(&inFlight); err != nil {
			return err
		}
		if inFlight > 0 {
			d := &fleet.Dispatch{
				Action:         fleet.ActionCancel,
				Params:         json.RawMessage(`{"action_id":"` + strconv.FormatInt(id, 10) + `"}`),
				SearchType:     searchInFlight,
				Timeout:        timeout,
				CancelActionID: id,
			}
			if a := fleet.ActorFromContext(ctx); a != nil {
				d.UserEmail, d.UserName = a.UserEmail, a.UserName
			}
			// On PostgreSQL the devices may finish meanwhile: then none is
			// left to tell.
			if sent, err = tx.dispatch(ctx, tenant, d, true); err != nil {
				return err
			}
		}
		// What the cancellation did not reach was Queued: it needs no word.
		queued, err := tx.execCount(ctx, `UPDATE device_actions SET action_status = 'Cancelled', status = 'Cancelled', deadline = NULL, updated_at = ?
			WHERE tenant = ? AND action_id = ? AND action_status IN ('Queued', 'Initiated', 'Progress')`,
			millis(tx.now), tenant, id)
		if err != nil {
			return err
		}
		n = queued
		if sent != nil {
			n += int64(sent.Targeted)
		}
		if n == 0 {
			return nil // nothing left to cancel is not worth an audit row
		}
		details := map[string]any{"cancelled": n}
		if sent != nil {
			details["cancel_action"] = sent.ID
		}
		return tx.audit(ctx, tenant, "action.cancel", "actions/"+strconv.FormatInt(id, 10), details)
	})
	return sent, int(n), err
}
