package sqlstore

// Status reports, the hottest write path: devices' reports applied in
// batches (docs/actions.md#status-reports).

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
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleet"
	"github.com/jackc/pgx/v5/pgconn"
)

// ReportStatus applies status reports in one transaction; see
// fleet.ActionService. However many reports there are, it writes those
// that only move a device action in flight along with one statement,
// without reading them first (advanceReports), reads the device actions
// of the others with one statement per action and writes the changed ones
// with one statement: the action service hands it the reports of many
// concurrent callers at once. It does not touch the devices' last_seen_at:
// the action service records sightings in batches (TouchDevices), off the
// hottest path.
func (db *DB) ReportStatus(ctx context.Context, tenant string, reports []fleet.StatusReport) ([]error, error) {
	j, errs := db.reportJob(tenant, reports)
	if err := db.updateLocking(ctx, j.locks, j.ahead, j.fn); err != nil {
		return nil, err
	}
	return errs, nil
}

// reportJob is ReportStatus's piece of a batch, without its context, and
// the reports' errors it fills in.
func (db *DB) reportJob(tenant string, reports []fleet.StatusReport) (*job, []error) {
	errs := make([]error, len(reports))
	locks := noLocks // SQLite's one writer locks no rows
	if db.dialect == postgres {
		locks = make([]lockKey, len(reports))
		for i, r := range reports {
			locks[i] = lockKey{tenant, r.ActionID, r.DeviceID}
		}
	}
	// A batch of reports advanceReports writes and others the locking
	// SELECT reads would lock its device actions in two passes, each in
	// order but not the two together: it locks them first (lockAhead).
	// The steady flow, all of one kind, needs no statement more.
	cands := db.advanceable(reports)
	mixed := db.dialect == postgres && len(cands) > 0 && len(cands) < len(reports)
	return &job{locks: locks, ahead: mixed, fn: func(ctx context.Context, tx *Tx) error {
		found, err := tx.applyReports(ctx, tenant, reports, cands)
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
	}}, errs
}

// TouchDevices records that devices were seen at t. A device seen later
// already keeps its time.
//
// On PostgreSQL a device deleted while the statement ran (after its
// snapshot, before the foreign key's check of a first sighting) fails it;
// it is run again, and its next snapshot no longer holds the device.
func (db *DB) TouchDevices(ctx context.Context, tenant string, ids []string, t time.Time) error {
	for n := 1; ; n++ {
		err := db.updateLocking(ctx, noLocks, false, func(ctx context.Context, tx *Tx) error {
			return tx.touchDevices(ctx, tenant, ids, t)
		})
		var pe *pgconn.PgError
		if n == writeAttempts || !errors.As(err, &pe) || pe.Code != "23503" {
			return err
		}
	}
}

// touchDevices is TouchDevices in tx: each device's row of
// device_sightings (migration 0046), a narrow row whose update changes no
// indexed column, inserted or moved forward. Each statement reads only
// the devices it names, by primary key (dialect.anyOf), and writes only
// those that exist: a device deleted since it was heard from has none.
func (tx *Tx) touchDevices(ctx context.Context, tenant string, ids []string, t time.Time) error {
	for start := 0; start < len(ids); start += idChunk {
		in, args := tx.db.dialect.anyOf("id", ids[start:min(start+idChunk, len(ids))])
		if _, err := tx.exec(ctx, `INSERT INTO device_sightings (tenant, device_id, last_seen_at)
			SELECT tenant, id, `+tx.db.dialect.param("BIGINT")+` FROM devices WHERE tenant = ? AND `+in+`
			ON CONFLICT (tenant, device_id) DO UPDATE SET last_seen_at = excluded.last_seen_at
			WHERE device_sightings.last_seen_at < excluded.last_seen_at`,
			append([]any{millis(t), tenant}, args...)...); err != nil {
			return err
		}
	}
	return nil
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
	phase       int
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

// pgArrays reports whether a statement on n device actions passes them
// as one array parameter a column (unnestTable, dialect.anyOf) rather than
// a parameter a value: on PostgreSQL, above the largest size class but
// one. Measured by BenchmarkReportBatch (docs/benchmarks-notebook.md,
// "Arrays for large report batches on PostgreSQL"): at 100 and 500
// reports a call the arrays took about 30% less of fleetd's CPU and 15-25%
// less of PostgreSQL's; at 10 and 20 none less of fleetd's and rather more
// of PostgreSQL's (a plan made for each call's arrays, most likely), so
// smaller batches keep the size classes' texts.
func (db *DB) pgArrays(n int) bool { return db.dialect == postgres && n > 64 }

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
// applied or repeating it change nothing. cands are those advanceReports
// may write (db.advanceable).
func (tx *Tx) applyReports(ctx context.Context, tenant string, reports []fleet.StatusReport, cands []int) ([]bool, error) {
	found := make([]bool, len(reports))
	if len(cands) > 0 {
		advanced, err := tx.advanceReports(ctx, tenant, reports, cands, found)
		if err != nil {
			return nil, err
		}
		if advanced == len(reports) {
			return found, nil
		}
	}
	rows := map[reportKey]*reportRow{}
	byAction := map[int64][]string{}
	var actions []int64
	seen := map[reportKey]bool{}
	for i, r := range reports {
		k := reportKey{r.ActionID, r.DeviceID}
		if found[i] || seen[k] {
			continue
		}
		seen[k] = true
		if byAction[r.ActionID] == nil {
			actions = append(actions, r.ActionID)
		}
		byAction[r.ActionID] = append(byAction[r.ActionID], r.DeviceID)
	}
	// Writers lock device actions in one order, (action_id, device_id):
	// two that lock the same rows the other way round wait for each other
	// until PostgreSQL aborts one (see lockInOrder).
	slices.Sort(actions)
	for _, a := range actions {
		devs := byAction[a]
		sort.Strings(devs)
		for start := 0; start < len(devs); start += reportChunk {
			if err := tx.loadReportRows(ctx, tenant, a, devs[start:min(start+reportChunk, len(devs))], rows); err != nil {
				return nil, err
			}
		}
	}

	now := millis(tx.now)
	var dirty, installed, answered []reportKey
	for i, r := range reports {
		if found[i] {
			continue // advanced
		}
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
		if next.ActionStatus.Final() && row.typ == fleet.ActionCancel {
			answered = append(answered, k)
		}
	}
	for start := 0; start < len(dirty); start += reportChunk {
		if err := tx.writeReportRows(ctx, tenant, dirty[start:min(start+reportChunk, len(dirty))], rows, now); err != nil {
			return nil, err
		}
	}
	moved := map[countKey]int{}
	for _, k := range dirty {
		if row := rows[k]; row.state.ActionStatus != row.loadedStatus {
			moved[countKey{tenant, k.actionID, row.phase, row.loadedStatus}]--
			moved[countKey{tenant, k.actionID, row.phase, row.state.ActionStatus}]++
		}
	}
	for k, n := range moved {
		tx.count(k, n)
	}
	for _, k := range installed {
		if err := tx.recordComponents(ctx, tenant, k.deviceID, k.actionID, fleet.ActionUpdateFirmware); err != nil {
			return nil, err
		}
	}
	for _, k := range answered {
		if err := tx.answerCancel(ctx, tenant, k, rows[k].state.ActionStatus); err != nil {
			return nil, err
		}
	}
	return found, nil
}

// advanceCandidates are the reports advanceReports may write without
// reading their device actions first: those of a state that is not final,
// without errors, with a timestamp, the only one of the batch on their
// device action.
func advanceCandidates(reports []fleet.StatusReport) []int {
	var cands []int
	once := make(map[reportKey]int, len(reports)) // a key's reports in the batch
	for i, r := range reports {
		k := reportKey{r.ActionID, r.DeviceID}
		once[k]++
		if r.Timestamp != nil && len(r.Errors) == 0 && fleet.ReportEvent(r.State) == fleet.EventProgress {
			cands = append(cands, i)
		}
	}
	return slices.DeleteFunc(cands, func(i int) bool { return once[reportKey{reports[i].ActionID, reports[i].DeviceID}] > 1 })
}

// advanceable is advanceCandidates, or none where every report is to be
// read first (reportsReadFirst).
func (db *DB) advanceable(reports []fleet.StatusReport) []int {
	if db.reportsReadFirst {
		return nil
	}
	return advanceCandidates(reports)
}

// advanceReports applies, without reading them first, the reports of
// cands (advanceCandidates), those that only move a device action in
// flight along: a report of a state that is
// not final, without errors, with its own timestamp, the only one of the
// batch on its device action. One UPDATE a size class of them (sizeClass;
// on PostgreSQL above it, arrays, pgArrays) writes those whose device
// action is in Progress, initiated, and last reported before them: what
// fleet.ApplyReport makes of such a report there, in SQL (the status word
// Cancelling kept, a missing progress kept). When it wrote every report of
// its chunk, as it does in the steady flow of reports, it marks them found;
// it returns how many it marked. The others (an older or repeated report,
// another status, no such device action, and their chunk's neighbours) are
// left to the locking SELECT and Go's state machine, which sees them as
// they were, or, those written, as repeats that change nothing. A batch is
// otherwise a locking SELECT and an UPDATE, and on PostgreSQL one round
// trip more.
func (tx *Tx) advanceReports(ctx context.Context, tenant string, reports []fleet.StatusReport, cands []int, found []bool) (int, error) {
	if len(cands) == 0 {
		return 0, nil
	}
	// In the writers' order of locks (applyReports). The locking SELECT
	// of the reports left after it may then lock a device action before
	// one this statement locked, out of that order: ReportStatus has a
	// batch with reports of both kinds locked first, all in order
	// (lockAhead), and those that are left (a chunk of which this
	// statement wrote some) meet another batch only on the same device
	// action, which a device reports on one report at a time, or a cancel
	// of the action, and a deadlock is retried (db.update).
	slices.SortFunc(cands, func(a, b int) int {
		if c := cmp.Compare(reports[a].ActionID, reports[b].ActionID); c != 0 {
			return c
		}
		return strings.Compare(reports[a].DeviceID, reports[b].DeviceID)
	})
	advanced := 0
	for start := 0; start < len(cands); start += reportChunk {
		chunk := cands[start:min(start+reportChunk, len(cands))]
		n, err := tx.advanceReportRows(ctx, tenant, reports, chunk, found)
		if err != nil {
			return 0, err
		}
		advanced += n
	}
	return advanced, nil
}

// advanceSet and advanceWhere are advanceReportRows' statement around the
// table of reports v: the columns it sets, and what a device action must
// be for them (fleet.Lifecycle: Progress is the status a report that is
// not final keeps, with no change to its deadline or its indexed columns).
// The conditions on the device action are inside a CASE, which neither
// planner reads as an index's key or a partial index's predicate: each
// report's device action is then found by its primary key. As plain
// conditions, SQLite searched the tenant's device actions for each report
// through an index on the tenant alone (1.3 ms a report in
// BenchmarkReportBatch), and PostgreSQL's generic plan, with statistics
// from the dispatch (no device action in Progress then), hashed them all
// through the same index (TestAdvancedReportsReadOnlyTheirDeviceActions).
const (
	advanceSet = `UPDATE device_actions SET status = CASE WHEN device_actions.status = '` + fleet.StateCancelling + `' THEN device_actions.status ELSE v.status END,
		progress = COALESCE(v.progress, device_actions.progress), last_ts = v.last_ts, last_seq = v.last_seq, updated_at = ?`
	advanceWhere = ` WHERE device_actions.action_id = v.action_id AND device_actions.device_id = v.device_id AND device_actions.tenant = ?
		AND CASE WHEN device_actions.action_status = '` + string(fleet.StatusProgress) + `' AND device_actions.initiated_at IS NOT NULL
			THEN device_actions.last_ts IS NULL OR device_actions.last_ts < v.last_ts
				OR device_actions.last_ts = v.last_ts AND COALESCE(device_actions.last_seq, 0) < v.last_seq
			ELSE FALSE END`
)

var (
	advanceColumns = []string{"action_id", "device_id", "status", "progress", "last_ts", "last_seq"}
	advanceTypes   = []string{"BIGINT", "TEXT", "TEXT", "INTEGER", "BIGINT", "BIGINT"}
)

// advanceReportRows is advanceReports' statement for the reports of
// idx (at most reportChunk, in order): it marks them found if it wrote
// every one.
func (tx *Tx) advanceReportRows(ctx context.Context, tenant string, reports []fleet.StatusReport, idx []int, found []bool) (int, error) {
	vals := make([]any, 0, len(advanceColumns)*sizeClass(len(idx)))
	// A batch's reports are mostly of one action and of a few states: each
	// is boxed once for its run of reports, not once a report.
	var action, state any
	for _, i := range idx {
		r := reports[i]
		var progress any
		if r.Progress != nil {
			progress = *r.Progress
		}
		var seq int64
		if r.Sequence != nil {
			seq = *r.Sequence
		}
		if a, ok := action.(int64); !ok || a != r.ActionID {
			action = r.ActionID
		}
		if st, ok := state.(string); !ok || st != r.State {
			state = r.State
		}
		vals = append(vals, action, r.DeviceID, state, progress, *r.Timestamp, seq)
	}
	query, args := tx.advanceStatement(tenant, vals)
	res, err := tx.execBound(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, err
	}
	if int(n) < len(idx) {
		// Not every one was written, and the count does not say which:
		// all are left to the locking SELECT, which reads those written
		// here as repeats of their last report, which change nothing. The
		// statement returns no rows (RETURNING each key was a string and a
		// scan a report, for the few chunks a batch that are not whole).
		return 0, nil
	}
	for _, i := range idx {
		found[i] = true
	}
	return len(idx), nil
}

// advanceStatement is advanceReportRows' statement and its arguments for
// the reports whose advanceColumns vals holds, a row after another. A size
// class's text is made once (advanceTexts), already in the dialect's
// placeholders: built and looked up for every batch, it was a third of the
// bytes fleetd allocated in S10 on PostgreSQL (docs/benchmarks-notebook.md,
// "The advancing UPDATE's text made once").
func (tx *Tx) advanceStatement(tenant string, vals []any) (string, []any) {
	rows := len(vals) / len(advanceColumns)
	if tx.db.pgArrays(rows) {
		from, arrays := unnestTable("v", advanceColumns, advanceTypes, vals)
		args := make([]any, 0, 2+len(arrays))
		args = append(append(append(args, millis(tx.now)), arrays...), tenant)
		return tx.db.dialect.rebind(advanceSet + " FROM " + from + advanceWhere), args
	}
	n := sizeClass(rows)
	args := make([]any, 0, 2+n*len(advanceColumns))
	args = append(append(args, millis(tx.now)), vals...)
	for range n - rows {
		args = append(args, 0, "", "", nil, 0, 0) // action id 0 names no action
	}
	return advanceTexts[tx.db.dialect].of(n), append(args, tenant)
}

// advanceText holds advanceStatement's texts of one dialect, a size class
// each, made on first use.
type advanceText struct {
	d     dialect
	texts sync.Map // size class → string
}

var advanceTexts = [...]*advanceText{sqlite: {d: sqlite}, postgres: {d: postgres}}

func (a *advanceText) of(n int) string {
	if q, ok := a.texts.Load(n); ok {
		return q.(string)
	}
	q := a.d.rebind(advanceSet + " FROM " + a.d.valuesTable("v", advanceColumns, advanceTypes, n) + advanceWhere)
	a.texts.Store(n, q)
	return q
}

// answerCancel applies a device's final word on a cancel_action to the
// action it cancels on that device: Completed, the device stopped it
// (Cancelled); Failed, it refused or could not, and the action goes on
// (docs/actions.md, Cancel). The cancelled action's id is smaller than the
// cancel_action's, so on PostgreSQL this locks out of the reports' order;
// a deadlock it meets is retried (db.update), and answers are rare.
func (tx *Tx) answerCancel(ctx context.Context, tenant string, k reportKey, to fleet.ActionStatus) error {
	event, ok := fleet.CancelAnswer(to)
	if !ok {
		return nil
	}
	var params string
	if err := tx.queryRow(ctx, "SELECT device_params FROM actions WHERE tenant = ? AND id = ?", tenant, k.actionID).Scan(&params); err != nil {
		return err
	}
	cancelled, ok := fleet.CancelledActionID([]byte(params))
	if !ok {
		return nil
	}
	m := moveCancelAccepted
	if event == fleet.EventCancelRejected {
		m = moveCancelRejected
	}
	_, err := tx.applyMove(ctx, m, `UPDATE device_actions SET `+m.set+`, updated_at = ?
		WHERE tenant = ? AND action_id = ? AND device_id = ? AND {from}`, millis(tx.now), tenant, cancelled, k.deviceID)
	return err
}

// loadReportRows reads (and on PostgreSQL locks) the device actions of one
// action on devs into rows. The action's timeout (actions are never
// removed) comes with each row, from a subquery run once and not locked
// (FOR UPDATE locks the rows of FROM's tables): on PostgreSQL each
// statement of a batch is a round trip, and a batch's time is mostly its
// round trips and its commit.
func (tx *Tx) loadReportRows(ctx context.Context, tenant string, actionID int64, devs []string, rows map[reportKey]*reportRow) error {
	in, devArgs := "device_id = ANY(?)", []any{devs} // one array (pgArrays)
	if !tx.db.pgArrays(len(devs)) {
		devArgs = anys(devs)
		for n := sizeClass(len(devs)); len(devArgs) < n; {
			devArgs = append(devArgs, devs[len(devs)-1]) // a repeat matches no more rows
		}
		in = "device_id IN (" + placeholders(len(devArgs)) + ")"
	}
	q, err := tx.query(ctx, `SELECT device_id, type, status, action_status, progress, errors, last_ts, last_seq, initiated_at, phase,
		(SELECT timeout FROM actions WHERE tenant = ? AND id = ?)
		FROM device_actions WHERE tenant = ? AND action_id = ? AND `+in+`
		ORDER BY device_id`+tx.db.dialect.forUpdate(), append([]any{tenant, actionID, tenant, actionID}, devArgs...)...)
	if err != nil {
		return err
	}
	defer q.Close()
	for q.Next() {
		var (
			dev             string
			row             reportRow
			lastTS, lastSeq sql.NullInt64
		)
		if err := q.Scan(&dev, &row.typ, &row.state.Status, &row.state.ActionStatus, &row.state.Progress, &row.errsText,
			&lastTS, &lastSeq, &row.initiatedAt, &row.phase, &row.timeout); err != nil {
			return err
		}
		if lastTS.Valid {
			row.state.Last = &fleet.ReportKey{Timestamp: lastTS.Int64, Sequence: lastSeq.Int64}
		}
		row.loadedStatus, row.loadedInitiated = row.state.ActionStatus, row.initiatedAt.Valid
		if err := decodeObject(row.errsText, &row.state.Errors, (*objectLexer).strs); err != nil {
			return fmt.Errorf("device action %d/%s errors: %w", actionID, dev, err)
		}
		if !row.state.ActionStatus.Sent() {
			continue // a report on it is on an action not sent to the device
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
	if tx.db.pgArrays(rowCount) {
		from, arrays := unnestTable("v", cols, types, args)
		for i, c := range cols[2:] {
			if types[i+2] == "" {
				set = append(set, c+" = CAST(v."+c+" AS JSONB)")
			} else {
				set = append(set, c+" = v."+c)
			}
		}
		_, err := tx.exec(ctx, "UPDATE device_actions SET "+strings.Join(set, ", ")+" FROM "+from+
			" WHERE device_actions.action_id = v.action_id AND device_actions.device_id = v.device_id AND device_actions.tenant = ?",
			append(arrays, tenant)...)
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
// installed into the device's record (docs/firmware.md#update_firmware).
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
