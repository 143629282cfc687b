package sqlstore

// Reading actions and device actions: the action lists with their
// per-status counts, an action's device actions, and S7.

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/fleetd/fleet"
)

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

// FindAction returns one action with its per-status counts and, for a
// rollout, its schedule and state.
func (db *DB) FindAction(ctx context.Context, tenant string, id int64) (*fleet.Action, error) {
	a, err := scanAction(db.queryRow(ctx, "SELECT "+actionColumns+" FROM actions WHERE tenant = ? AND id = ?", tenant, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fleet.Errorf(fleet.ENOTFOUND, "action %d not found", id)
	} else if err != nil {
		return nil, db.classify(err)
	}
	if err := db.describeActions(ctx, tenant, []*fleet.Action{a}); err != nil {
		return nil, err
	}
	return a, nil
}

// FindActions lists actions, newest first, as FindAction shows them.
func (db *DB) FindActions(ctx context.Context, tenant string, f fleet.ActionFilter) ([]*fleet.Action, int, error) {
	cond, args := "tenant = ?", []any{tenant}
	if f.Action != "" {
		cond += " AND action = ?"
		args = append(args, f.Action)
	}
	if f.ExceptAction != "" {
		cond += " AND action <> ?"
		args = append(args, f.ExceptAction)
	}
	if f.Incomplete {
		// The action's counts of its live statuses (device_action_counts'
		// rows of the action, a few per phase): Queued device actions have
		// no range of device_actions_by_status to probe (migration 0045).
		// On PostgreSQL a count is the sum of its slots.
		cond += " AND (SELECT COALESCE(sum(c.n), 0) FROM device_action_counts c WHERE c.tenant = actions.tenant AND c.action_id = actions.id AND c." +
			statusIn(liveStatuses) + ") > 0"
	}
	acts, count, err := findPage(ctx, db, "SELECT count(*) FROM actions WHERE "+cond,
		"SELECT "+actionColumns+" FROM actions WHERE "+cond+" ORDER BY id DESC", args, f.Page, scanAction)
	if err != nil || len(acts) == 0 {
		return acts, count, err
	}
	return acts, count, db.describeActions(ctx, tenant, acts)
}

// describeActions adds to acts their counts per status (and per phase),
// from device_action_counts (migration 0018), and their rollouts.
func (db *DB) describeActions(ctx context.Context, tenant string, acts []*fleet.Action) error {
	byID := make(map[int64]*fleet.Action, len(acts))
	ids := make([]any, 0, len(acts)+1)
	ids = append(ids, tenant)
	for _, a := range acts {
		a.Statuses, a.StatusesPhased = map[string]int{}, map[string]map[string]int{}
		byID[a.ID] = a
		ids = append(ids, a.ID)
	}
	in := "tenant = ? AND action_id IN (" + placeholders(len(acts)) + ")"
	rows, err := db.query(ctx, "SELECT "+rolloutColumns+` FROM rollouts r JOIN actions a ON a.tenant = r.tenant AND a.id = r.action_id
		WHERE r.`+in, ids...)
	if err != nil {
		return db.classify(err)
	}
	rollouts, err := scanAll(rows, scanRollout)
	if err != nil {
		return db.classify(err)
	}
	rrows, err := db.query(ctx, "SELECT action_id, retry_of FROM action_retries WHERE "+in, ids...)
	if err != nil {
		return db.classify(err)
	}
	retries, err := scanAll(rrows, func(s scanner) ([2]int64, error) {
		var r [2]int64
		return r, s.Scan(&r[0], &r[1])
	})
	if err != nil {
		return db.classify(err)
	}
	for _, r := range retries {
		byID[r[0]].RetryOf = &r[1]
	}
	phased := map[int64]bool{}
	for _, r := range rollouts {
		byID[r.ActionID].SetRollout(r)
		phased[r.ActionID] = true
	}
	srows, err := db.query(ctx, "SELECT action_id, action_status, phase, CAST(sum(n) AS BIGINT) FROM device_action_counts WHERE "+in+
		" GROUP BY action_id, action_status, phase", ids...)
	if err != nil {
		return db.classify(err)
	}
	defer srows.Close()
	for srows.Next() {
		var id int64
		var status string
		var phase, n int
		if err := srows.Scan(&id, &status, &phase, &n); err != nil {
			return err
		}
		if n == 0 {
			continue // a count that every device action left
		}
		a := byID[id]
		a.Statuses[status] += n
		key := "-1"
		if phased[id] {
			key = strconv.Itoa(phase)
		}
		if a.StatusesPhased[key] == nil {
			a.StatusesPhased[key] = map[string]int{}
		}
		a.StatusesPhased[key][status] += n
	}
	return srows.Err()
}

// finalSortIndexes are the indexes of migrations 0009 and 0022 by sort
// column.
var finalSortIndexes = map[string]string{
	"action_id":   "device_actions_final_by_id",
	"type":        "device_actions_final_by_type",
	"status":      "device_actions_final_by_status",
	"user_email":  "device_actions_final_by_user_email",
	"user_name":   "device_actions_final_by_user_name",
	"updated_at":  "device_actions_final_by_updated_at",
	"error_count": "device_actions_final_by_errors",
}

// finalSortColumns are the columns the sort indexes hold instead of a
// sort column that reports change while a device action is in flight: its
// value once the device action is final, NULL before (migration 0022), so
// that a report in flight changes no indexed column and PostgreSQL updates
// the row in place.
var finalSortColumns = map[string]string{
	"status":      "final_status",
	"updated_at":  "final_updated_at",
	"error_count": "final_error_count",
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

const deviceActionColumns = `action_id, device_id, type, status, action_status, phase, progress, errors, user_email, user_name,
	serial_metadata, created_at, updated_at`

// pageDeviceActionColumns are deviceActionColumns of the CTE page.
var pageDeviceActionColumns = prefixed("page.", deviceActionColumns)

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
	return db.findDeviceActionsOfAction(ctx, tenant, f)
}

// findDeviceActionsOfAction lists an action's device actions by device id.
// How many there are is the action's counts' (migration 0018), not a count
// of up to a million rows, and it chooses the page's plan: the rows of a
// status that most of the action's device actions have are found soonest
// in device order (the primary key), those of a rare status from
// device_actions_by_status, sorted (on SQLite, which plans without
// statistics, told so), except Queued ones, which it leaves out
// (migration 0045): they are always read in device order. Every device action of an action has its type,
// the action's name.
func (db *DB) findDeviceActionsOfAction(ctx context.Context, tenant string, f fleet.DeviceActionFilter) ([]*fleet.DeviceAction, int, error) {
	var name sql.NullString
	var count, total int
	const sum = "SELECT CAST(COALESCE(sum(n), 0) AS BIGINT) FROM device_action_counts WHERE tenant = ? AND action_id = ?"
	if err := db.queryRow(ctx, "SELECT (SELECT action FROM actions WHERE tenant = ? AND id = ?), ("+sum+" AND action_status = ?), ("+sum+")",
		tenant, f.ActionID, tenant, f.ActionID, string(f.ActionStatus), tenant, f.ActionID).Scan(&name, &count, &total); err != nil {
		return nil, 0, db.classify(err)
	}
	switch {
	case !name.Valid:
		return nil, 0, fleet.Errorf(fleet.ENOTFOUND, "action %d not found", f.ActionID)
	case f.Type != "" && f.Type != name.String:
		return []*fleet.DeviceAction{}, 0, nil
	}
	cond, args, from := "tenant = ? AND action_id = ?", []any{tenant, f.ActionID}, "device_actions"
	if f.ActionStatus == "" {
		count = total
	}
	if f.Offset() >= count {
		return []*fleet.DeviceAction{}, count, nil
	}
	if f.ActionStatus != "" {
		// A status with device actions counted is one of the lifecycle's
		// words, written into the query: a partial index's predicate is
		// proved from literals (notQueued).
		ss := []fleet.ActionStatus{f.ActionStatus}
		cond += " AND " + statusIndexed(ss)
		// Device order reads about (offset+limit)·total/count rows, the
		// status's range count of them and a sort. Queued device actions
		// have no range (migration 0045): they are read in device order.
		if f.ActionStatus != fleet.StatusQueued && count*count < (f.Offset()+f.Limit)*total {
			from += db.dialect.indexedBy("device_actions_by_status")
		}
	}
	// The page is chosen first and joined to its actions (for params)
	// after, so sorting never touches the actions table.
	page, err := db.scanDeviceActions(ctx, f.Limit, `WITH page AS (SELECT `+deviceActionColumns+`, tenant FROM `+from+` WHERE `+cond+
		` ORDER BY device_id`+limitClause(pageLimit(f.Limit))+` OFFSET ?)
		SELECT `+pageDeviceActionColumns+`, COALESCE(a.device_params, a.params)
		FROM page JOIN actions a ON a.tenant = page.tenant AND a.id = page.action_id ORDER BY page.device_id`,
		append(args, f.Offset())...)
	if err != nil {
		return nil, 0, db.classify(err)
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

// liveStatuses are the statuses that are not final.
var liveStatuses = func() []fleet.ActionStatus {
	var out []fleet.ActionStatus
	for _, s := range fleet.ActionStatuses {
		if !s.Final() {
			out = append(out, s)
		}
	}
	return out
}()

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
	finalKey := cmp.Or(finalSortColumns[col], col)
	finalOrder, liveKey := finalKey+dir+", action_id"+dir, col
	if col == "action_id" {
		// The merge wants the live parts in order too, and by action_id
		// SQLite would walk the tenant's device_actions_by_status for them
		// rather than the device's few live rows: an expression is not
		// in any index's order.
		finalOrder, liveKey = "action_id"+dir, "action_id + 0"
	}
	// The live parts are not limited: they are small, and sorted by the
	// merge. The final part's rows past the page's end in its order are
	// never on the page, so its LIMIT may be pageLimit's step above it.
	top := limitClause(pageLimit(f.Offset() + f.Limit))
	// Written piece by piece into one buffer: concatenated, the parts
	// made several times the query's size in garbage on every page.
	var q strings.Builder
	q.Grow(2048)
	write := func(parts ...string) {
		for _, p := range parts {
			q.WriteString(p)
		}
	}
	write(`WITH page AS (
		SELECT * FROM (SELECT `, deviceActionColumns, `, `, finalKey, ` AS k FROM device_actions`, db.dialect.indexedBy(finalSortIndexes[col]),
		` WHERE `, cond, ` AND `, finalStatuses, `
			ORDER BY `, finalOrder, top, `) final`)
	qargs := make([]any, 0, (1+len(liveStatuses))*len(args)+2)
	qargs = append(qargs, args...)
	for _, st := range liveStatuses {
		write(`
		UNION ALL SELECT `, deviceActionColumns, `, `, liveKey, ` AS k FROM device_actions WHERE `, cond, ` AND action_status = '`, string(st), `'`)
		qargs = append(qargs, args...)
	}
	write(`
		ORDER BY k`, dir, `, action_id`, dir, limitClause(pageLimit(f.Limit)), ` OFFSET ?)
		SELECT `, pageDeviceActionColumns, `, COALESCE(a.device_params, a.params)
		FROM page JOIN actions a ON a.tenant = ? AND a.id = page.action_id
		ORDER BY page.k`, dir, `, page.action_id`, dir)
	page, err := db.scanDeviceActions(ctx, f.Limit, q.String(), append(qargs, f.Offset(), tenant)...)
	if err := cmp.Or(wait(), err); err != nil {
		return nil, 0, db.classify(err)
	}
	if !exists.Valid {
		return nil, 0, fleet.Errorf(fleet.ENOTFOUND, "device %q not found", f.DeviceID)
	}
	return page, count, nil
}

// FindRecentFailures returns the tenant's latest Failed device actions
// from the partial index of migrations 0016 and 0022, which holds
// final_updated_at: a Failed device action's updated_at.
func (db *DB) FindRecentFailures(ctx context.Context, tenant string, limit int) ([]*fleet.DeviceAction, error) {
	das, err := db.scanDeviceActions(ctx, limit, `WITH page AS (SELECT `+deviceActionColumns+`, tenant FROM device_actions
		WHERE tenant = ? AND action_status = 'Failed' ORDER BY final_updated_at DESC`+limitClause(pageLimit(limit))+`)
		SELECT `+pageDeviceActionColumns+`, COALESCE(a.device_params, a.params)
		FROM page JOIN actions a ON a.tenant = page.tenant AND a.id = page.action_id ORDER BY page.updated_at DESC, page.action_id DESC`,
		tenant)
	return das, db.classify(err)
}

// scanDeviceActions reads the first n device actions a query selects (its
// LIMIT is pageLimit's); never nil.
func (db *DB) scanDeviceActions(ctx context.Context, n int, query string, args ...any) ([]*fleet.DeviceAction, error) {
	rows, err := db.query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return scanPage(rows, n, newDeviceActionRow().scan)
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
	da, err := newDeviceActionRow().scan(db.queryRow(ctx, `SELECT `+prefixed("da.", deviceActionColumns)+`, COALESCE(a.device_params, a.params)
		FROM device_actions da JOIN actions a ON a.tenant = da.tenant AND a.id = da.action_id
		WHERE da.tenant = ? AND da.action_id = ? AND da.device_id = ?`, tenant, actionID, deviceID))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fleet.Errorf(fleet.ENOTFOUND, "device %q has no action %d", deviceID, actionID)
	}
	return da, db.classify(err)
}

// deviceActionRow is what a row of deviceActionColumns and the params is
// scanned into. Its Scan destinations are made once for all the rows of
// a query: made for each row, they escaped to the heap (a slice of
// fourteen and four values), and the integer columns that the record
// keeps as int were converted through text by database/sql. Rows with
// equal errors or metadata share their maps (objectMemo).
type deviceActionRow struct {
	da                                fleet.DeviceAction
	actionStatus, errs, meta          string
	phase, progress, created, updated int64
	dest                              []any
	errors                            objectMemo[[]string]
	metadata                          objectMemo[string]
}

func newDeviceActionRow() *deviceActionRow {
	r := &deviceActionRow{}
	r.dest = []any{&r.da.ActionID, &r.da.DeviceID, &r.da.Type, &r.da.Status, &r.actionStatus, &r.phase, &r.progress, &r.errs,
		&r.da.UserEmail, &r.da.UserName, &r.meta, &r.created, &r.updated, &r.da.Params}
	r.errors.value, r.metadata.value = (*objectLexer).strs, (*objectLexer).str
	return r
}

func (r *deviceActionRow) scan(s scanner) (*fleet.DeviceAction, error) {
	if err := s.Scan(r.dest...); err != nil {
		return nil, err
	}
	da := r.da
	da.ActionStatus, da.Phase, da.Progress = fleet.ActionStatus(r.actionStatus), int(r.phase), int(r.progress)
	var err error
	if da.Errors, err = r.errors.decode(r.errs); err != nil {
		return nil, fmt.Errorf("device action %d/%s errors: %w", da.ActionID, da.DeviceID, err)
	}
	if da.SerialMetadata, err = r.metadata.decode(r.meta); err != nil {
		return nil, fmt.Errorf("device action %d/%s metadata: %w", da.ActionID, da.DeviceID, err)
	}
	da.CreatedAt, da.UpdatedAt = fromMillis(r.created), fromMillis(r.updated)
	return &da, nil
}
