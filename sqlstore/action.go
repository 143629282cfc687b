package sqlstore

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/fleetd/fleet"
)

// idChunk is how many ids one IN list carries.
const idChunk = 500

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

func (tx *Tx) execCount(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := tx.exec(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func placeholders(n int) string {
	return "?" + strings.Repeat(", ?", n-1)
}

func anys(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
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

// PendingDevices returns the devices, among candidates (all when nil),
// whose device action is Queued: they have yet to acknowledge it.
func (db *DB) PendingDevices(ctx context.Context, tenant string, actionID int64, candidates []string) ([]string, error) {
	const q = "SELECT device_id FROM device_actions WHERE tenant = ? AND action_id = ? AND action_status = 'Queued'"
	if candidates == nil {
		return db.strings(ctx, q, tenant, actionID)
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

func (db *DB) strings(ctx context.Context, query string, args ...any) ([]string, error) {
	rows, err := db.query(ctx, query, args...)
	if err != nil {
		return nil, db.classify(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// PendingActions returns the actions Queued for a device, oldest first.
func (db *DB) PendingActions(ctx context.Context, tenant, device string) ([]fleet.PendingAction, error) {
	rows, err := db.query(ctx, `SELECT da.action_id, da.type, COALESCE(a.device_params, a.params)
		FROM device_actions da JOIN actions a ON a.tenant = da.tenant AND a.id = da.action_id
		WHERE da.tenant = ? AND da.device_id = ? AND da.action_status = 'Queued'
		ORDER BY da.action_id`, tenant, device)
	if err != nil {
		return nil, db.classify(err)
	}
	defer rows.Close()
	var out []fleet.PendingAction
	for rows.Next() {
		var p fleet.PendingAction
		if err := rows.Scan(&p.ActionID, &p.Name, &p.Params); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// MarkDelivered records devices' acknowledgements of action messages: a
// Queued device action becomes Initiated and its timeout starts.
// Acknowledgements of anything else (a redelivery, or an action the device
// reported on first) change nothing. A batch costs one statement per
// hundred receipts.
func (db *DB) MarkDelivered(ctx context.Context, receipts []fleet.ActionReceipt) error {
	return db.update(ctx, func(ctx context.Context, tx *Tx) error {
		now := millis(tx.now)
		for start := 0; start < len(receipts); start += reportChunk {
			chunk := receipts[start:min(start+reportChunk, len(receipts))]
			args := make([]any, 0, 3*len(chunk)+2)
			args = append(args, now, now, now)
			for _, r := range chunk {
				args = append(args, r.Tenant, r.ActionID, r.DeviceID)
			}
			for range sizeClass(len(chunk)) - len(chunk) {
				args = append(args, "", 0, "") // matches nothing
			}
			if _, err := tx.exec(ctx, `UPDATE device_actions SET action_status = 'Initiated', status = 'Initiated',
				initiated_at = ?, updated_at = ?,
				deadline = ? + 1000 * (SELECT timeout FROM actions a WHERE a.tenant = device_actions.tenant AND a.id = device_actions.action_id)
				FROM `+tx.db.dialect.valuesTable("r", []string{"tenant", "action_id", "device_id"}, []string{"TEXT", "BIGINT", "TEXT"}, sizeClass(len(chunk)))+`
				WHERE device_actions.tenant = r.tenant AND device_actions.action_id = r.action_id AND device_actions.device_id = r.device_id
				AND device_actions.action_status = 'Queued'`, args...); err != nil {
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
func (db *DB) TimeOutDeviceActions(ctx context.Context, now time.Time, limit int) (int, error) {
	var n int64
	err := db.update(ctx, func(ctx context.Context, tx *Tx) error {
		at := millis(now)
		var err error
		n, err = tx.execCount(ctx, `UPDATE device_actions SET action_status = 'Failed', status = 'TimedOut',
			errors = `+db.dialect.jsonSetList("errors", fleet.StateTimedOut)+`, error_count = error_count + 1,
			deadline = NULL, updated_at = ?
			WHERE deadline IS NOT NULL AND deadline <= ? AND (tenant, action_id, device_id) IN (
				SELECT tenant, action_id, device_id FROM device_actions
				WHERE deadline IS NOT NULL AND deadline <= ? ORDER BY deadline LIMIT ?`+db.dialect.skipLocked()+`)`,
			"the action's timeout elapsed before the device reported Completed or Failed", at, at, at, limit)
		return err
	})
	return int(n), err
}

// ReportStatus applies status reports in one transaction; see
// fleet.ActionService. However many reports there are, it reads their
// device actions with one statement per action and writes the changed ones
// with one statement: the action service hands it the reports of many
// concurrent callers at once. It does not touch the devices' last_seen_at:
// the action service records sightings in batches (TouchDevices), off the
// hottest path.
func (db *DB) ReportStatus(ctx context.Context, tenant string, reports []fleet.StatusReport) ([]error, error) {
	errs := make([]error, len(reports))
	err := db.update(ctx, func(ctx context.Context, tx *Tx) error {
		found, err := tx.applyReports(ctx, tenant, reports)
		if err != nil {
			return err
		}
		for i, r := range reports {
			errs[i] = nil
			if !found[i] {
				errs[i] = tx.reportNotFound(ctx, tenant, r)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return errs, nil
}

// TouchDevices records that devices were seen at t. A device seen later
// already keeps its time.
func (db *DB) TouchDevices(ctx context.Context, tenant string, ids []string, t time.Time) error {
	return db.update(ctx, func(ctx context.Context, tx *Tx) error {
		for start := 0; start < len(ids); start += idChunk {
			chunk := ids[start:min(start+idChunk, len(ids))]
			if _, err := tx.exec(ctx, "UPDATE devices SET last_seen_at = ? WHERE tenant = ? AND (last_seen_at IS NULL OR last_seen_at < ?) AND id IN ("+
				placeholders(len(chunk))+")", append([]any{millis(t), tenant, millis(t)}, anys(chunk)...)...); err != nil {
				return err
			}
		}
		return nil
	})
}

// reportKey names a device action.
type reportKey struct {
	actionID int64
	deviceID string
}

// reportRow is a device action as status reports see it.
type reportRow struct {
	typ         string
	state       fleet.ReportState
	errsText    string // as stored
	errsChanged bool
	initiatedAt sql.NullInt64
	timeout     int64 // seconds
	dirty       bool
	// As loaded: what decides whether only the progress columns change.
	loadedStatus    fleet.ActionStatus
	loadedInitiated bool
}

// progressOnly reports whether the row's changes are to the columns every
// report changes, and none of action_status, initiated_at, deadline or
// errors: the usual report on an action in flight.
func (r *reportRow) progressOnly() bool {
	return r.state.ActionStatus == r.loadedStatus && r.loadedInitiated && !r.errsChanged
}

// reportChunk bounds the rows one statement reads or writes.
const reportChunk = 100

// sizeClass rounds n (1 to reportChunk) up to one of a few sizes, so that
// the batched statements have few distinct texts, which stay prepared
// (SQLite's statement cache) instead of being parsed anew for every batch
// size. The rows added to reach it match nothing.
func sizeClass(n int) int {
	c := 1
	for c < n && c < 64 {
		c *= 2
	}
	if n > c {
		return reportChunk
	}
	return c
}

// applyReports applies reports in order and reports which found their
// device action. Reports after a final state, older than the last one
// applied or repeating it change nothing.
func (tx *Tx) applyReports(ctx context.Context, tenant string, reports []fleet.StatusReport) ([]bool, error) {
	rows := map[reportKey]*reportRow{}
	byAction := map[int64][]string{}
	var actions []int64
	seen := map[reportKey]bool{}
	for _, r := range reports {
		k := reportKey{r.ActionID, r.DeviceID}
		if seen[k] {
			continue
		}
		seen[k] = true
		if byAction[r.ActionID] == nil {
			actions = append(actions, r.ActionID)
		}
		byAction[r.ActionID] = append(byAction[r.ActionID], r.DeviceID)
	}
	timeouts, err := tx.actionTimeouts(ctx, tenant, actions)
	if err != nil {
		return nil, err
	}
	for _, a := range actions {
		timeout, ok := timeouts[a]
		if !ok {
			continue // no such action: no device action to find
		}
		devs := byAction[a]
		sort.Strings(devs) // writers lock rows in one order
		for start := 0; start < len(devs); start += reportChunk {
			if err := tx.loadReportRows(ctx, tenant, a, timeout, devs[start:min(start+reportChunk, len(devs))], rows); err != nil {
				return nil, err
			}
		}
	}

	found := make([]bool, len(reports))
	now := millis(tx.now)
	var dirty, installed []reportKey
	for i, r := range reports {
		k := reportKey{r.ActionID, r.DeviceID}
		row := rows[k]
		if row == nil {
			continue
		}
		found[i] = true
		next, changed := fleet.ApplyReport(row.state, r, tx.now)
		if !changed {
			continue
		}
		row.state = next
		row.errsChanged = row.errsChanged || len(r.Errors) > 0
		if !row.initiatedAt.Valid {
			row.initiatedAt = sql.NullInt64{Int64: now, Valid: true}
		}
		if !row.dirty {
			row.dirty = true
			dirty = append(dirty, k)
		}
		if next.ActionStatus == fleet.StatusCompleted && row.typ == fleet.ActionUpdateFirmware {
			installed = append(installed, k)
		}
	}
	for start := 0; start < len(dirty); start += reportChunk {
		if err := tx.writeReportRows(ctx, tenant, dirty[start:min(start+reportChunk, len(dirty))], rows, now); err != nil {
			return nil, err
		}
	}
	for _, k := range installed {
		if err := tx.recordComponents(ctx, tenant, k.deviceID, k.actionID, fleet.ActionUpdateFirmware); err != nil {
			return nil, err
		}
	}
	return found, nil
}

// actionTimeouts returns the timeouts, in seconds, of those of the
// tenant's actions ids names that exist.
func (tx *Tx) actionTimeouts(ctx context.Context, tenant string, ids []int64) (map[int64]int64, error) {
	out := make(map[int64]int64, len(ids))
	for start := 0; start < len(ids); start += reportChunk {
		chunk := ids[start:min(start+reportChunk, len(ids))]
		args := []any{tenant}
		for _, id := range chunk {
			args = append(args, id)
		}
		for n := sizeClass(len(chunk)); len(args) < 1+n; {
			args = append(args, chunk[len(chunk)-1]) // a repeat matches no more rows
		}
		rows, err := tx.query(ctx, "SELECT id, timeout FROM actions WHERE tenant = ? AND id IN ("+placeholders(len(args)-1)+")", args...)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var id, timeout int64
			if err := rows.Scan(&id, &timeout); err != nil {
				rows.Close()
				return nil, err
			}
			out[id] = timeout
		}
		if err := cmp.Or(rows.Err(), rows.Close()); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// loadReportRows reads (and on PostgreSQL locks) the device actions of one
// action, whose timeout is timeout seconds, on devs into rows.
func (tx *Tx) loadReportRows(ctx context.Context, tenant string, actionID, timeout int64, devs []string, rows map[reportKey]*reportRow) error {
	args := append([]any{tenant, actionID}, anys(devs)...)
	for n := sizeClass(len(devs)); len(args) < 2+n; {
		args = append(args, devs[len(devs)-1]) // a repeat matches no more rows
	}
	q, err := tx.query(ctx, `SELECT device_id, type, status, action_status, progress, errors, last_ts, last_seq, initiated_at
		FROM device_actions WHERE tenant = ? AND action_id = ? AND device_id IN (`+placeholders(len(args)-2)+`)
		ORDER BY device_id`+tx.db.dialect.forUpdate(), args...)
	if err != nil {
		return err
	}
	defer q.Close()
	for q.Next() {
		var (
			dev             string
			row             = reportRow{timeout: timeout}
			lastTS, lastSeq sql.NullInt64
		)
		if err := q.Scan(&dev, &row.typ, &row.state.Status, &row.state.ActionStatus, &row.state.Progress, &row.errsText,
			&lastTS, &lastSeq, &row.initiatedAt); err != nil {
			return err
		}
		if lastTS.Valid {
			row.state.Last = &fleet.ReportKey{Timestamp: lastTS.Int64, Sequence: lastSeq.Int64}
		}
		row.loadedStatus, row.loadedInitiated = row.state.ActionStatus, row.initiatedAt.Valid
		if err := unmarshalObject(row.errsText, &row.state.Errors); err != nil {
			return fmt.Errorf("device action %d/%s errors: %w", actionID, dev, err)
		}
		rows[reportKey{actionID, dev}] = &row
	}
	return q.Err()
}

// reportColumns are the columns writeReportRows sets, after the two of
// the key, with their SQL types ("" is the dialect's JSON type), and
// progressColumns those it sets on rows whose only changes are progress
// (reportRow.progressOnly). SQLite rewrites the entries of every index
// that has a column an UPDATE sets, changed or not, and
// device_actions_by_device, device_actions_by_status, the deadline index
// and the final-only sort indexes all have action_status (in their key or
// predicate): a report that sets it costs four index rewrites or more.
var (
	reportColumns = []string{"action_id", "device_id", "status", "action_status", "progress", "errors", "error_count",
		"last_ts", "last_seq", "initiated_at", "deadline", "updated_at"}
	reportTypes = []string{"BIGINT", "TEXT", "TEXT", "TEXT", "INTEGER", "", "INTEGER",
		"BIGINT", "BIGINT", "BIGINT", "BIGINT", "BIGINT"}
	progressColumns = []string{"action_id", "device_id", "status", "progress", "last_ts", "last_seq", "updated_at"}
	progressTypes   = []string{"BIGINT", "TEXT", "TEXT", "INTEGER", "BIGINT", "BIGINT", "BIGINT"}
)

// writeReportRows writes changed device actions: one statement for those
// whose reports only moved them along, one for the others.
func (tx *Tx) writeReportRows(ctx context.Context, tenant string, keys []reportKey, rows map[reportKey]*reportRow, now int64) error {
	var progress, full []reportKey
	for _, k := range keys {
		if rows[k].progressOnly() {
			progress = append(progress, k)
		} else {
			full = append(full, k)
		}
	}
	if len(progress) > 0 {
		args := make([]any, 0, len(progress)*len(progressColumns))
		for _, k := range progress {
			st := rows[k].state
			args = append(args, k.actionID, k.deviceID, st.Status, st.Progress, st.Last.Timestamp, st.Last.Sequence, now)
		}
		// Action id 0 names no action.
		pad := []any{0, "", "", 0, 0, 0, now}
		if err := tx.updateReportRows(ctx, tenant, progressColumns, progressTypes, args, pad); err != nil {
			return err
		}
	}
	if len(full) > 0 {
		args := make([]any, 0, len(full)*len(reportColumns))
		for _, k := range full {
			row := rows[k]
			st := row.state
			errs := row.errsText
			if row.errsChanged {
				b, _ := json.Marshal(st.Errors) // a map of string lists always encodes
				errs = string(b)
			}
			var deadline sql.NullInt64
			if !st.ActionStatus.Final() {
				deadline = sql.NullInt64{Int64: row.initiatedAt.Int64 + 1000*row.timeout, Valid: true}
			}
			args = append(args, k.actionID, k.deviceID, st.Status, string(st.ActionStatus), st.Progress, errs, fleet.ErrorCount(st.Errors),
				st.Last.Timestamp, st.Last.Sequence, row.initiatedAt, deadline, now)
		}
		pad := []any{0, "", "", "", 0, "{}", 0, 0, 0, nil, nil, now}
		if err := tx.updateReportRows(ctx, tenant, reportColumns, reportTypes, args, pad); err != nil {
			return err
		}
	}
	return nil
}

// updateReportRows sets cols (after the two of the key) of the device
// actions whose values args holds, a row after another, with one
// statement; pad is a row that matches nothing, to round the statement up
// to its size class.
func (tx *Tx) updateReportRows(ctx context.Context, tenant string, cols, types []string, args, pad []any) error {
	rowCount := len(args) / len(cols)
	set := make([]string, 0, len(cols)-2)
	if rowCount == 1 {
		// One row, the usual case when reports are few: by primary key,
		// without the derived table.
		for _, c := range cols[2:] {
			set = append(set, c+" = ?")
		}
		_, err := tx.exec(ctx, "UPDATE device_actions SET "+strings.Join(set, ", ")+
			" WHERE action_id = ? AND device_id = ? AND tenant = ?", append(args[2:], args[0], args[1], tenant)...)
		return err
	}
	n := sizeClass(rowCount)
	for range n - rowCount {
		args = append(args, pad...)
	}
	args = append(args, tenant)
	for _, c := range cols[2:] {
		set = append(set, c+" = v."+c)
	}
	types = slices.Clone(types)
	for i, t := range types {
		if t == "" {
			types[i] = tx.db.dialect.jsonType()
		}
	}
	_, err := tx.exec(ctx, "UPDATE device_actions SET "+strings.Join(set, ", ")+
		" FROM "+tx.db.dialect.valuesTable("v", cols, types, n)+
		" WHERE device_actions.action_id = v.action_id AND device_actions.device_id = v.device_id AND device_actions.tenant = ?", args...)
	return err
}

// recordComponents merges the component versions a completed action
// installed into the device's record (DESIGN §5).
func (tx *Tx) recordComponents(ctx context.Context, tenant, device string, actionID int64, typ string) error {
	var params string
	if err := tx.queryRow(ctx, "SELECT COALESCE(device_params, params) FROM actions WHERE tenant = ? AND id = ?", tenant, actionID).Scan(&params); err != nil {
		return err
	}
	installed := fleet.CompletedComponents(typ, []byte(params))
	if len(installed) == 0 {
		return nil
	}
	var text string
	if err := tx.queryRow(ctx, "SELECT components FROM devices WHERE tenant = ? AND id = ?"+tx.db.dialect.forUpdate(), tenant, device).Scan(&text); err != nil {
		return err
	}
	comps := map[string]string{}
	if err := json.Unmarshal([]byte(text), &comps); err != nil {
		return fmt.Errorf("device %s components: %w", device, err)
	}
	maps.Copy(comps, installed)
	_, err := tx.exec(ctx, "UPDATE devices SET components = ? WHERE tenant = ? AND id = ?", encodeMetadata(comps), tenant, device)
	return err
}

// reportNotFound says why a report found no device action.
func (tx *Tx) reportNotFound(ctx context.Context, tenant string, r fleet.StatusReport) error {
	var one int
	err := tx.queryRow(ctx, "SELECT 1 FROM devices WHERE tenant = ? AND id = ?", tenant, r.DeviceID).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return fleet.Errorf(fleet.ENOTFOUND, "device %q not found", r.DeviceID)
	} else if err != nil {
		return err
	}
	return fleet.Errorf(fleet.ENOTFOUND, "action %d was not sent to device %q", r.ActionID, r.DeviceID)
}

const actionColumns = `id, action, params, device_params, search_type, search_key, search_query, metadata, timeout,
	user_email, user_name, created_at, targeted`

func scanAction(s scanner) (*fleet.Action, error) {
	var a fleet.Action
	var params, meta string
	var deviceParams sql.NullString
	var created int64
	if err := s.Scan(&a.ID, &a.Action, &params, &deviceParams, &a.SearchType, &a.SearchKey, &a.SearchQuery, &meta, &a.Timeout,
		&a.UserEmail, &a.UserName, &created, &a.Targeted); err != nil {
		return nil, err
	}
	a.Params, a.Metadata = json.RawMessage(params), json.RawMessage(meta)
	if deviceParams.Valid {
		a.DeviceParams = json.RawMessage(deviceParams.String)
	}
	a.CreatedAt = fromMillis(created)
	return &a, nil
}

// FindAction returns one action with its per-status counts.
func (db *DB) FindAction(ctx context.Context, tenant string, id int64) (*fleet.Action, error) {
	a, err := scanAction(db.queryRow(ctx, "SELECT "+actionColumns+" FROM actions WHERE tenant = ? AND id = ?", tenant, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fleet.Errorf(fleet.ENOTFOUND, "action %d not found", id)
	} else if err != nil {
		return nil, db.classify(err)
	}
	if a.Statuses, err = db.actionStatuses(ctx, tenant, id); err != nil {
		return nil, err
	}
	return a, nil
}

// FindActions lists actions, newest first, with their per-status counts.
func (db *DB) FindActions(ctx context.Context, tenant string, f fleet.ActionFilter) ([]*fleet.Action, int, error) {
	cond, args := "tenant = ?", []any{tenant}
	if f.Action != "" {
		cond += " AND action = ?"
		args = append(args, f.Action)
	}
	acts, count, err := findPage(ctx, db, "SELECT count(*) FROM actions WHERE "+cond,
		"SELECT "+actionColumns+" FROM actions WHERE "+cond+" ORDER BY id DESC", args, f.Page, scanAction)
	if err != nil || len(acts) == 0 {
		return acts, count, err
	}
	byID := make(map[int64]*fleet.Action, len(acts))
	ids := make([]any, 0, len(acts)+1)
	ids = append(ids, tenant)
	for _, a := range acts {
		a.Statuses = map[string]int{}
		byID[a.ID] = a
		ids = append(ids, a.ID)
	}
	srows, err := db.query(ctx, "SELECT action_id, action_status, count(*) FROM device_actions WHERE tenant = ? AND action_id IN ("+
		placeholders(len(acts))+") GROUP BY action_id, action_status", ids...)
	if err != nil {
		return nil, 0, db.classify(err)
	}
	defer srows.Close()
	for srows.Next() {
		var id int64
		var status string
		var n int
		if err := srows.Scan(&id, &status, &n); err != nil {
			return nil, 0, err
		}
		byID[id].Statuses[status] = n
	}
	return acts, count, srows.Err()
}

// actionStatuses counts an action's device actions per status.
func (db *DB) actionStatuses(ctx context.Context, tenant string, id int64) (map[string]int, error) {
	rows, err := db.query(ctx, "SELECT action_status, count(*) FROM device_actions WHERE tenant = ? AND action_id = ? GROUP BY action_status", tenant, id)
	if err != nil {
		return nil, db.classify(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var status string
		var n int
		if err := rows.Scan(&status, &n); err != nil {
			return nil, err
		}
		out[status] = n
	}
	return out, rows.Err()
}

// finalSortIndexes are the indexes of migration 0009 by sort column.
var finalSortIndexes = map[string]string{
	"action_id":   "device_actions_final_by_id",
	"type":        "device_actions_final_by_type",
	"status":      "device_actions_final_by_status",
	"user_email":  "device_actions_final_by_user_email",
	"user_name":   "device_actions_final_by_user_name",
	"updated_at":  "device_actions_final_by_updated_at",
	"error_count": "device_actions_final_by_errors",
}

// deviceActionSorts maps S7's sort_by to columns.
var deviceActionSorts = map[string]string{
	"action_id":  "action_id",
	"type":       "type",
	"status":     "status",
	"user_email": "user_email",
	"user_name":  "user_name",
	"updated_at": "updated_at",
	"errors":     "error_count",
}

const deviceActionColumns = `action_id, device_id, type, status, action_status, progress, errors, user_email, user_name,
	serial_metadata, created_at, updated_at`

// FindDeviceActions lists the device actions of one device (S7) or of one
// action; see fleet.DeviceActionFilter.
func (db *DB) FindDeviceActions(ctx context.Context, tenant string, f fleet.DeviceActionFilter) ([]*fleet.DeviceAction, int, error) {
	var filters []string
	var filterArgs []any
	if f.ActionStatus != "" {
		filters = append(filters, "action_status = ?")
		filterArgs = append(filterArgs, string(f.ActionStatus))
	}
	if f.Type != "" {
		filters = append(filters, "type = ?")
		filterArgs = append(filterArgs, f.Type)
	}
	switch {
	case f.DeviceID != "":
		return db.findDeviceActionsOfDevice(ctx, tenant, f, filters, filterArgs)
	case f.ActionID == 0:
		return nil, 0, fleet.Errorf(fleet.EINVALID, "name a device or an action")
	}
	cond := strings.Join(append([]string{"tenant = ?", "action_id = ?"}, filters...), " AND ")
	args := append([]any{tenant, f.ActionID}, filterArgs...)
	// Whether the action exists and how many device actions match, in one
	// round trip, while the page is read.
	var exists sql.NullInt64
	var count int
	wait := db.queryRowAside(ctx, "SELECT (SELECT 1 FROM actions WHERE tenant = ? AND id = ?), (SELECT count(*) FROM device_actions WHERE "+cond+")",
		append([]any{tenant, f.ActionID}, args...), &exists, &count)
	// The page is chosen first and joined to its actions (for params)
	// after, so sorting never touches the actions table.
	page, err := db.scanDeviceActions(ctx, `WITH page AS (SELECT `+deviceActionColumns+`, tenant FROM device_actions WHERE `+cond+
		` ORDER BY device_id LIMIT ? OFFSET ?)
		SELECT `+prefixed("page.", deviceActionColumns)+`, COALESCE(a.device_params, a.params)
		FROM page JOIN actions a ON a.tenant = page.tenant AND a.id = page.action_id ORDER BY page.device_id`,
		append(args, f.Limit, f.Offset())...)
	if err := cmp.Or(wait(), err); err != nil {
		return nil, 0, db.classify(err)
	}
	if !exists.Valid {
		return nil, 0, fleet.Errorf(fleet.ENOTFOUND, "action %d not found", f.ActionID)
	}
	return page, count, nil
}

// finalStatuses and liveStatuses split a device's actions in two: the
// sort indexes of migration 0009 hold the final ones, whose sort keys
// never change; the others, usually few, are read through
// device_actions_by_device, a range for each live status, and sorted. The
// final predicate must be the indexes' for the databases to use them: the
// final statuses are those that sort before Initiated (see 0009). As it is
// also a range of device_actions_by_device, SQLite is told which index to
// read.
const finalStatuses = "action_status < 'Initiated'"

var liveStatuses = []fleet.ActionStatus{fleet.StatusQueued, fleet.StatusInitiated, fleet.StatusProgress}

// findDeviceActionsOfDevice is S7: the first offset+limit final rows in
// the sort's order, from its index, merged with the device's live rows.
//
// Each part carries whole rows rather than keys to join back: a device
// with 10,000 actions is far from the average in the planner's statistics,
// and PostgreSQL would join the keys back by reading all of the device's
// index entries. For the same reason each live status is a part of its
// own: an IN list on the index's third column became a filter on every
// row of the device.
func (db *DB) findDeviceActionsOfDevice(ctx context.Context, tenant string, f fleet.DeviceActionFilter, filters []string, filterArgs []any) ([]*fleet.DeviceAction, int, error) {
	cond := strings.Join(append([]string{"tenant = ?", "device_id = ?"}, filters...), " AND ")
	args := append([]any{tenant, f.DeviceID}, filterArgs...)
	// Whether the device exists and how many actions match, in one round
	// trip, while the page is read.
	var exists sql.NullInt64
	var count int
	wait := db.queryRowAside(ctx, "SELECT (SELECT 1 FROM devices WHERE tenant = ? AND id = ?), (SELECT count(*) FROM device_actions WHERE "+cond+")",
		append([]any{tenant, f.DeviceID}, args...), &exists, &count)
	col, ok := deviceActionSorts[f.SortBy]
	if !ok {
		col = "action_id"
	}
	dir := " DESC"
	if f.Ascending {
		dir = " ASC"
	}
	finalOrder, liveKey := col+dir+", action_id"+dir, col
	if col == "action_id" {
		// The merge wants the live parts in order too, and by action_id
		// SQLite would walk the tenant's device_actions_by_status for them
		// rather than the device's few live rows: an expression is not
		// in any index's order.
		finalOrder, liveKey = "action_id"+dir, "action_id + 0"
	}
	// The live parts are not limited: they are small, and sorted by the
	// merge. The limits are written into the query: SQLite plans with a
	// bound LIMIT's value, so binding one re-prepares the statement.
	top := strconv.Itoa(f.Offset() + f.Limit)
	limit, offset := strconv.Itoa(f.Limit), strconv.Itoa(f.Offset())
	q := `WITH page AS (
		SELECT * FROM (SELECT ` + deviceActionColumns + `, ` + col + ` AS k FROM device_actions` + db.dialect.indexedBy(finalSortIndexes[col]) +
		` WHERE ` + cond + ` AND ` + finalStatuses + `
			ORDER BY ` + finalOrder + ` LIMIT ` + top + `) final`
	qargs := slices.Clone(args)
	for _, st := range liveStatuses {
		q += `
		UNION ALL SELECT ` + deviceActionColumns + `, ` + liveKey + ` AS k FROM device_actions WHERE ` + cond + ` AND action_status = '` + string(st) + `'`
		qargs = append(qargs, args...)
	}
	q += `
		ORDER BY k` + dir + `, action_id` + dir + ` LIMIT ` + limit + ` OFFSET ` + offset + `)
		SELECT ` + prefixed("page.", deviceActionColumns) + `, COALESCE(a.device_params, a.params)
		FROM page JOIN actions a ON a.tenant = ? AND a.id = page.action_id
		ORDER BY page.k` + dir + `, page.action_id` + dir
	page, err := db.scanDeviceActions(ctx, q, append(qargs, tenant)...)
	if err := cmp.Or(wait(), err); err != nil {
		return nil, 0, db.classify(err)
	}
	if !exists.Valid {
		return nil, 0, fleet.Errorf(fleet.ENOTFOUND, "device %q not found", f.DeviceID)
	}
	return page, count, nil
}

// scanDeviceActions reads the device actions a query selects; never nil.
func (db *DB) scanDeviceActions(ctx context.Context, query string, args ...any) ([]*fleet.DeviceAction, error) {
	rows, err := db.query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return scanAll(rows, scanDeviceAction)
}

// unmarshalObject decodes a stored JSON object into v, a map; "{}", which
// most device actions' errors and many metadata are, leaves v as it is
// without a decoder's reflection walk.
func unmarshalObject(text string, v any) error {
	if text == "{}" {
		return nil
	}
	return json.Unmarshal([]byte(text), v)
}

// prefixed qualifies each comma-separated column (with its ordering
// words) by prefix.
func prefixed(prefix, cols string) string {
	parts := strings.Split(cols, ",")
	for i, p := range parts {
		parts[i] = prefix + strings.TrimSpace(p)
	}
	return strings.Join(parts, ", ")
}

// FindDeviceAction returns one device's record of one action.
func (db *DB) FindDeviceAction(ctx context.Context, tenant string, actionID int64, deviceID string) (*fleet.DeviceAction, error) {
	da, err := scanDeviceAction(db.queryRow(ctx, `SELECT `+prefixed("da.", deviceActionColumns)+`, COALESCE(a.device_params, a.params)
		FROM device_actions da JOIN actions a ON a.tenant = da.tenant AND a.id = da.action_id
		WHERE da.tenant = ? AND da.action_id = ? AND da.device_id = ?`, tenant, actionID, deviceID))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fleet.Errorf(fleet.ENOTFOUND, "device %q has no action %d", deviceID, actionID)
	}
	return da, db.classify(err)
}

func scanDeviceAction(s scanner) (*fleet.DeviceAction, error) {
	var da fleet.DeviceAction
	var errs, meta string
	var created, updated int64
	if err := s.Scan(&da.ActionID, &da.DeviceID, &da.Type, &da.Status, &da.ActionStatus, &da.Progress, &errs,
		&da.UserEmail, &da.UserName, &meta, &created, &updated, &da.Params); err != nil {
		return nil, err
	}
	if err := unmarshalObject(errs, &da.Errors); err != nil {
		return nil, fmt.Errorf("device action %d/%s errors: %w", da.ActionID, da.DeviceID, err)
	}
	if err := unmarshalObject(meta, &da.SerialMetadata); err != nil {
		return nil, fmt.Errorf("device action %d/%s metadata: %w", da.ActionID, da.DeviceID, err)
	}
	if da.Errors == nil {
		da.Errors = map[string][]string{}
	}
	if da.SerialMetadata == nil {
		da.SerialMetadata = map[string]string{}
	}
	da.CreatedAt, da.UpdatedAt = fromMillis(created), fromMillis(updated)
	return &da, nil
}
