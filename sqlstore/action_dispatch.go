package sqlstore

// Dispatch and cancellation: choosing an action's targets and writing its
// device actions, and ending them on an operator's word.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
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
		sel, err := db.dialect.selectionOf(ctx, tx, tenant, d)
		if err != nil {
			return err
		}
		a, err = tx.dispatch(ctx, tenant, d, sel, false)
		return err
	})
	if err != nil {
		return nil, err
	}
	// Until autovacuum catches up (a minute or more), PostgreSQL plans the
	// hottest queries, status reports, without knowing these rows and may
	// scan a whole action per report; the statistics are refreshed after
	// the answer where the table has some already (analyzeAfterWrite).
	db.analyzeAfterWrite(ctx, "device_actions", a.Targeted)
	return a, nil
}

// analyzeAfter is the size of a write (a dispatch's device actions, a
// provisioning's devices) after which PostgreSQL's statistics of its table
// are refreshed at once, whatever they were.
const analyzeAfter = 10_000

// growth counts the rows a table gained through this process since its
// statistics were last refreshed, and says when they are stale: a gain of
// a tenth of what it gained in all, and of analyzeGrowth rows at least, as
// autovacuum's analyze threshold judges, for where autovacuum is off or
// has not come round yet (writes of a few rows each, which
// analyzeAfterWrite's rule for large writes does not see).
type growth struct {
	mu           sync.Mutex
	since, total int
}

// analyzeGrowth is the fewest rows gained that make a table's statistics
// stale for growth.
const analyzeGrowth = 1_000

// add counts n rows gained and reports whether the statistics are stale;
// if so it counts them fresh from now.
func (g *growth) add(n int) bool {
	if n == 0 {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.since, g.total = g.since+n, g.total+n
	if g.since < max(analyzeGrowth, g.total/10) {
		return false
	}
	g.since = 0
	return true
}

// analyzeAfterWrite refreshes PostgreSQL's statistics of table after a
// committed write of n of its rows, if n is analyzeAfter or more or the
// table has no statistics yet. Until autovacuum analyzes the table (a
// minute or more; never where it is off), the planner takes a tenant's or
// an action's rows for a few dozen and reads all of them where an index
// would find the few a statement names: the reports' locking SELECT read
// an action's 2,000 device actions for each batch
// (docs/benchmarks-notebook.md, 2026-11-26). Statistics that are merely old do not mislead it so:
// they overstate a new action's or tenant's share, if anything. ANALYZE
// samples a bounded number of rows, so it costs the same for 10,000 as
// for 10,000,000.
//
// So a table without statistics is analyzed before the caller has its
// answer, and one that has them (this process saw them once: it asks the
// catalog a table's first time only) after: the refresh of a large write
// runs in the background (analyzeInBackground). It cost a dispatch to
// 100,000 devices a quarter of its time to the 201
// (docs/benchmarks-notebook.md, "The dispatch's ANALYZE after the answer").
func (db *DB) analyzeAfterWrite(ctx context.Context, table string, n int) {
	if db.dialect != postgres || n == 0 {
		return
	}
	if !db.analyzed.seen(table) {
		var none bool
		err := db.write.QueryRowContext(ctx, `SELECT NOT EXISTS (SELECT 1 FROM pg_stats s
			JOIN pg_class c ON c.relname = s.tablename JOIN pg_namespace ns ON ns.oid = c.relnamespace AND ns.nspname = s.schemaname
			WHERE c.oid = $1::regclass)`, table).Scan(&none)
		if err != nil {
			return
		}
		if none {
			db.analyze(ctx, table, n)
			return
		}
		db.analyzed.see(table)
	}
	if n >= analyzeAfter {
		db.analyzeInBackground(table, n)
	}
}

// analyze runs ANALYZE on table now, after a write of n rows.
func (db *DB) analyze(ctx context.Context, table string, n int) {
	if _, err := db.write.ExecContext(ctx, "ANALYZE "+table); err != nil {
		if ctx.Err() == nil {
			db.log.Warn("analyze after a write", "table", table, "rows", n, "err", err)
		}
		return
	}
	db.analyzed.see(table)
}

// analyzeInBackground analyzes table after a write of n rows without
// holding its caller: one ANALYZE of a table at a time, and one more after
// it if writes came while it ran (it may have sampled the table before
// them). Close cancels it and waits for it.
func (db *DB) analyzeInBackground(table string, n int) {
	if !db.analyzed.start(table, &db.analyzeWG) {
		return
	}
	go func() {
		defer db.analyzeWG.Done()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			select {
			case <-db.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		for {
			db.analyze(ctx, table, n)
			if !db.analyzed.again(table) {
				return
			}
		}
	}()
}

// tableStats is what this process knows of PostgreSQL's statistics of its
// tables: those it saw with statistics, and the ANALYZEs it runs in the
// background.
type tableStats struct {
	mu     sync.Mutex
	closed bool // Close began: nothing more starts
	known  map[string]bool
	// running holds the tables an ANALYZE runs on in the background, true
	// for one a write came to while it ran (it runs once more).
	running map[string]bool
}

func (s *tableStats) seen(table string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.known[table]
}

func (s *tableStats) see(table string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.known == nil {
		s.known = map[string]bool{}
	}
	s.known[table] = true
}

// start reports whether a background ANALYZE of table is to start, and
// adds it to wg: none runs and Close has not begun. If one runs, it is
// asked to run again.
func (s *tableStats) start(table string, wg *sync.WaitGroup) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if s.running == nil {
		s.running = map[string]bool{}
	}
	if _, ok := s.running[table]; ok {
		s.running[table] = true
		return false
	}
	s.running[table] = false
	wg.Add(1)
	return true
}

// close starts no background ANALYZE from now on.
func (s *tableStats) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
}

// again reports whether the background ANALYZE of table that just ended
// is to run again; if not, it is no longer running.
func (s *tableStats) again(table string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running[table] {
		s.running[table] = false
		return true
	}
	delete(s.running, table)
	return false
}

// selection is how a dispatch chooses its targets among the tenant's
// devices: a condition on the devices table with its arguments, or one
// for devicesWhere to choose the reading of, and, for search_type default,
// the ids, every one of which must be selected.
type selection struct {
	cond    string
	args    []any
	devices []deviceCond
	ids     []string
}

// where returns sel's condition and its arguments, and how many devices
// it selects when that was counted, else -1.
func (sel selection) where(ctx context.Context, q querier) (string, []any, int, error) {
	if sel.devices != nil {
		return devicesWhere(ctx, q, sel.devices)
	}
	return sel.cond, sel.args, -1, nil
}

// selectionOf is the selection of a dispatch's search type
// (docs/actions.md#dispatch) among tenant's devices; q reads a group's
// selector.
func (d8 dialect) selectionOf(ctx context.Context, q querier, tenant string, d *fleet.Dispatch) (selection, error) {
	if d.RetryOf != 0 {
		return selection{cond: "id IN (SELECT device_id FROM device_actions da WHERE " + unretried(d.RetryStatuses) + ")",
			args: []any{tenant, d.RetryOf}}, nil
	}
	switch d.SearchType {
	case fleet.SearchDefault:
		return selection{ids: d.DeviceIDs}, nil
	case fleet.SearchAll:
		return selection{}, nil
	case fleet.SearchMetadata:
		if err := checkText("search_query", d.SearchKey+d.SearchQuery); err != nil {
			return selection{}, err
		}
		return selection{devices: []deviceCond{d8.metadataIs(tenant, d.SearchKey, d.SearchQuery)}}, nil
	case fleet.SearchSearch:
		if err := checkText("search_query", d.SearchKey+d.SearchQuery); err != nil {
			return selection{}, err
		}
		return selection{devices: []deviceCond{d8.deviceSearch(tenant, d.SearchKey, d.SearchQuery)}}, nil
	case fleet.SearchGroup:
		sel, err := groupSelector(ctx, q, tenant, d.Group)
		if fleet.ErrorCode(err) == fleet.ENOTFOUND {
			return selection{}, fleet.FieldErrors(map[string]string{"group": fmt.Sprintf("no group is named %q", d.Group)})
		} else if err != nil {
			return selection{}, err
		}
		return selection{devices: d8.selectorConds(tenant, sel)}, nil
	}
	return selection{}, fleet.FieldErrors(map[string]string{"search_type": fleet.SearchTypeRule})
}

// untoldOf selects the devices that have action id in flight and have not
// been asked to stop it: those a cancellation of it must tell, a range of
// device_actions_by_status each (untold names its predicate). SQLite is
// told the index: its planner would read every device action of the
// tenant through device_actions_by_device.
func (d8 dialect) untoldOf(tenant string, id int64) selection {
	return selection{cond: "id IN (SELECT device_id FROM device_actions" + d8.indexedBy("device_actions_by_status") +
		" WHERE tenant = ? AND action_id = ? AND " + untold + ")", args: []any{tenant, id}}
}

// dispatch is DispatchAction inside a transaction, to the devices sel
// selects. With allowEmpty, a selection that matches no device dispatches
// nothing and returns nil.
func (tx *Tx) dispatch(ctx context.Context, tenant string, d *fleet.Dispatch, sel selection, allowEmpty bool) (*fleet.Action, error) {
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
	now := millis(a.CreatedAt)
	if d.RetryOf != 0 {
		if err := tx.retryable(ctx, tenant, d); err != nil {
			return nil, err
		}
		a.RetryOf = &d.RetryOf
	}
	if err := tx.queryRow(ctx, `INSERT INTO action_counters (tenant, last_id) VALUES (?, 1)
		ON CONFLICT (tenant) DO UPDATE SET last_id = action_counters.last_id + 1 RETURNING last_id`, tenant).Scan(&a.ID); err != nil {
		return nil, err
	}
	// A rollout's device actions start Scheduled, in no phase until
	// assignPhases gives them one.
	initial, phase := fleet.StatusQueued, 0
	if d.Schedule != nil {
		initial, phase = fleet.StatusScheduled, unassigned
	}
	if d.RetryOf != 0 {
		var err error
		if sel, err = tx.claimRetry(ctx, tenant, d, a.ID); err != nil {
			return nil, err
		}
	}
	n, err := tx.insertTargets(ctx, tenant, a, sel, initial, phase, now)
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
	a.Statuses = map[string]int{string(initial): n}
	if d.Schedule != nil {
		if err := tx.assignPhases(ctx, tenant, a.ID, d.Schedule, n); err != nil {
			return nil, err
		}
	}
	if d.CheckDevice != nil {
		failed, err := tx.checkDevices(ctx, tenant, a.ID, d.CheckDevice, now, nil)
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
		a.Statuses[string(initial)] -= a.Statuses[string(s)]
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
	if a.RetryOf != nil {
		if _, err := tx.exec(ctx, "INSERT INTO action_retries (tenant, action_id, retry_of) VALUES (?, ?, ?)", tenant, a.ID, *a.RetryOf); err != nil {
			return nil, err
		}
	}
	if d.Schedule != nil {
		if err := tx.insertRollout(ctx, tenant, a.ID, d.Schedule); err != nil {
			return nil, err
		}
		a.SetRollout(&fleet.Rollout{Schedule: *d.Schedule, Status: fleet.RolloutScheduled, WaivedPhase: -1})
	}
	details := map[string]any{"action": a.Action, "search_type": a.SearchType, "targeted": a.Targeted}
	if d.CancelActionID != 0 {
		details["cancels"] = d.CancelActionID
	}
	kind := "action.dispatch"
	if d.RetryOf != 0 {
		kind, details["retry_of"], details["statuses"] = "action.retry", d.RetryOf, d.RetryStatuses
	}
	return a, tx.audit(ctx, tenant, kind, "actions/"+strconv.FormatInt(a.ID, 10), details)
}

// retryable checks that the action a retry retries is the tenant's and
// finished, and has device actions in the statuses retried.
func (tx *Tx) retryable(ctx context.Context, tenant string, d *fleet.Dispatch) error {
	var one int
	err := tx.queryRow(ctx, "SELECT 1 FROM actions WHERE tenant = ? AND id = ?", tenant, d.RetryOf).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return fleet.Errorf(fleet.ENOTFOUND, "action %d not found", d.RetryOf)
	} else if err != nil {
		return err
	}
	var matching int
	live, err := countOf(ctx, tx, tenant, d.RetryOf, math.MaxInt32, liveStatuses)
	if err != nil {
		return err
	}
	if live > 0 {
		what := fmt.Sprintf("%d device actions are", live)
		if live == 1 {
			what = "1 device action is"
		}
		return fleet.Errorf(fleet.ECONFLICT, "action %d is not finished: %s not final (Scheduled, Queued, Initiated or Progress); "+
			"retry once they are, or cancel them first", d.RetryOf, what)
	}
	if err := tx.queryRow(ctx, "SELECT count(*) FROM device_actions WHERE tenant = ? AND action_id = ? AND "+statusIndexed(d.RetryStatuses),
		tenant, d.RetryOf).Scan(&matching); err != nil {
		return err
	}
	if matching == 0 {
		words := make([]string, len(d.RetryStatuses))
		for i, s := range d.RetryStatuses {
			words[i] = string(s)
		}
		return fleet.Errorf(fleet.ECONFLICT, "no device action of action %d is %s; nothing was dispatched", d.RetryOf, strings.Join(words, " or "))
	}
	return nil
}

// unretried is the condition on device_actions da (tenant and action id
// its two arguments) of the device actions in statuses that no retry has
// retried yet.
func unretried(statuses []fleet.ActionStatus) string {
	return "da.tenant = ? AND da.action_id = ? AND da." + statusIndexed(statuses) +
		" AND NOT EXISTS (SELECT 1 FROM device_action_retries r WHERE r.tenant = da.tenant AND r.action_id = da.action_id AND r.device_id = da.device_id)"
}

// CountRetriable counts the device actions of action id in statuses that
// no retry took yet (see unretried).
func (db *DB) CountRetriable(ctx context.Context, tenant string, id int64, statuses []fleet.ActionStatus) (int, error) {
	var n int
	err := db.queryRow(ctx, "SELECT count(*) FROM device_actions da WHERE "+unretried(statuses), tenant, id).Scan(&n)
	return n, db.classify(err)
}

// claimRetry records retry id as the retry of the device actions of
// d.RetryOf in d.RetryStatuses that no retry took before, and returns the
// selection of their devices. The claim is the primary key of
// device_action_retries: of two retries at once, on PostgreSQL in two
// transactions, the second waits for the first to commit and then claims
// only what is left, so a device action is retried once.
func (tx *Tx) claimRetry(ctx context.Context, tenant string, d *fleet.Dispatch, id int64) (selection, error) {
	n, err := tx.execCount(ctx, `INSERT INTO device_action_retries (tenant, action_id, device_id, retried_by)
		SELECT da.tenant, da.action_id, da.device_id, ? FROM device_actions da WHERE `+unretried(d.RetryStatuses)+`
		ON CONFLICT DO NOTHING`, id, tenant, d.RetryOf)
	if err != nil {
		return selection{}, err
	}
	if n == 0 {
		var by int64
		if err := tx.queryRow(ctx, `SELECT max(r.retried_by) FROM device_action_retries r JOIN device_actions da
			ON da.tenant = r.tenant AND da.action_id = r.action_id AND da.device_id = r.device_id
			WHERE r.tenant = ? AND r.action_id = ? AND da.`+statusIn(d.RetryStatuses), tenant, d.RetryOf).Scan(&by); err != nil {
			return selection{}, err
		}
		return selection{}, fleet.Errorf(fleet.ECONFLICT, "the device actions of action %d in those statuses were retried already, by action %d: "+
			"retry that action instead", d.RetryOf, by)
	}
	return selection{cond: "id IN (SELECT device_id FROM device_action_retries WHERE tenant = ? AND action_id = ? AND retried_by = ?)",
		args: []any{tenant, d.RetryOf, id}}, nil
}

// insertTargets inserts a new device action for every device sel selects
// and returns how many. When sel names ids every one must exist: otherwise
// the error lists the unknown ones, and the caller's transaction is rolled
// back.
func (tx *Tx) insertTargets(ctx context.Context, tenant string, a *fleet.Action, sel selection, status fleet.ActionStatus, phase int, now int64) (int, error) {
	if err := tx.lockTargets(ctx, tenant, false); err != nil {
		return 0, err
	}
	// Parameters are cast on PostgreSQL, which must know their types in a
	// SELECT (dialect.param). SQLite evaluates the list once per row, so
	// what is constant per action is a parameter or a literal there.
	d8 := tx.db.dialect
	errs := "'{}'"
	if d8 == postgres {
		errs = "CAST('{}' AS " + d8.jsonType() + ")"
	}
	insert := `INSERT INTO device_actions (tenant, action_id, device_id, type, status, action_status, progress, errors, error_count,
		user_email, user_name, serial_metadata, created_at, updated_at, phase)
		SELECT tenant, ` + d8.param("BIGINT") + `, id, ` + d8.param("TEXT") + `, ` + quote(string(status)) + `, ` + quote(string(status)) + `, 0, ` + errs + `, 0,
		` + d8.param("TEXT") + `, ` + d8.param("TEXT") + `, metadata, ` + d8.param("BIGINT") + `, ` + d8.param("BIGINT") + `, ` + strconv.Itoa(phase) + ` FROM devices WHERE tenant = ?`
	args := []any{a.ID, a.Action, a.UserEmail, a.UserName, now, now, tenant}
	cond, condArgs, _, err := sel.where(ctx, tx)
	if err != nil {
		return 0, err
	}
	if cond != "" {
		insert += " AND " + cond
		args = append(args, condArgs...)
	}
	if sel.ids == nil {
		n, err := tx.execCount(ctx, insert, args...)
		tx.count(countKey{tenant, a.ID, phase, status}, int(n))
		return int(n), err
	}
	var total int64
	short := false
	for start := 0; start < len(sel.ids); start += idChunk {
		chunk := sel.ids[start:min(start+idChunk, len(sel.ids))]
		n, err := tx.execCount(ctx, insert+" AND id IN ("+placeholders(len(chunk))+")", append(slices.Clip(args), anys(chunk)...)...)
		if err != nil {
			return 0, err
		}
		short = short || int(n) < len(chunk)
		total += n
	}
	if short {
		return 0, tx.unknownTargets(ctx, tenant, a.ID, sel.ids)
	}
	tx.count(countKey{tenant, a.ID, phase, status}, int(total))
	return int(total), nil
}

// unknownTargets is the error of a default dispatch that named devices the
// tenant does not have: those are the ones the insert left out.
func (tx *Tx) unknownTargets(ctx context.Context, tenant string, actionID int64, ids []string) error {
	unknown, err := tx.missing(ctx, "SELECT device_id FROM device_actions WHERE tenant = ? AND action_id = ? AND device_id IN (", []any{tenant, actionID}, ids)
	if err != nil {
		return err
	}
	return &fleet.Error{
		Code:    fleet.EINVALID,
		Message: fmt.Sprintf("%d unknown devices: %s; nothing was dispatched", len(unknown), listSome(unknown)),
		Fields:  map[string]string{"device_ids": "unknown devices: " + listSome(unknown)},
	}
}

// missing returns those of ids, in their order, that query selects none
// of: query ends in "IN (" and takes args, then a chunk of ids.
func (tx *Tx) missing(ctx context.Context, query string, args []any, ids []string) ([]string, error) {
	found := make(map[string]bool, len(ids))
	for start := 0; start < len(ids); start += idChunk {
		chunk := ids[start:min(start+idChunk, len(ids))]
		got, err := queryStrings(ctx, tx, query+placeholders(len(chunk))+")", append(slices.Clip(args), anys(chunk)...)...)
		if err != nil {
			return nil, err
		}
		for _, id := range got {
			found[id] = true
		}
	}
	var out []string
	for _, id := range ids {
		if !found[id] {
			out = append(out, id)
		}
	}
	return out, nil
}

// checkDevices asks check about every targeted device with recorded
// component versions and fails the device actions of those it rejects.
func (tx *Tx) checkDevices(ctx context.Context, tenant string, actionID int64, check func(map[string]string) string, now int64, phase *int) (int, error) {
	q, args := `SELECT d.id, d.components FROM device_actions da
		JOIN devices d ON d.tenant = da.tenant AND d.id = da.device_id
		WHERE da.tenant = ? AND da.action_id = ? AND d.components <> '{}'`, []any{tenant, actionID}
	if phase != nil {
		q, args = q+" AND da.phase = ?", append(args, *phase)
	}
	rows, err := tx.query(ctx, q, args...)
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
		errs, _ := json.Marshal(map[string][]string{moveRefused.t.Status: {r.reason}})
		if _, err := tx.applyMove(ctx, moveRefused, `UPDATE device_actions SET `+moveRefused.set+`, errors = ?, error_count = 1, updated_at = ?
			WHERE tenant = ? AND action_id = ? AND device_id = ? AND {from}`, string(errs), now, tenant, actionID, r.id); err != nil {
			return 0, err
		}
	}
	return len(rejected), nil
}

// cancelOnTargets does what a cancel_action dispatch means: the cancelled
// action's records on the targeted devices are cancelled, those the
// devices have in flight once the devices answer (answerCancels), and the
// cancel_action's own record is done at once wherever the device does not
// have the action in flight, so only devices that have it are sent the
// cancellation.
func (tx *Tx) cancelOnTargets(ctx context.Context, tenant string, actionID, cancelled int64, now int64) (int, error) {
	done, err := tx.applyMove(ctx, moveNothingToCancel, tx.db.dialect.nothingToCancel(), now, tenant, actionID, cancelled)
	if err != nil {
		return 0, err
	}
	for _, m := range []move{moveCancel, moveCancelTold} {
		if _, err := tx.applyMove(ctx, m, `UPDATE device_actions{by} SET `+m.set+`, updated_at = ?
			WHERE tenant = ? AND action_id = ? AND {from}
			AND device_id IN (SELECT device_id FROM device_actions WHERE tenant = ? AND action_id = ?)`,
			now, tenant, cancelled, tenant, actionID); err != nil {
			return 0, err
		}
	}
	return done, nil
}

// nothingToCancel moves a cancel_action's device actions (tenant,
// action_id, {from}) to done where the device does not have the cancelled
// action (the last argument) in flight. They were dispatched Queued in the
// same transaction, so they are read through the primary key, as
// pendingOfAction reads them: SQLite's planner would read every device
// action of the tenant through device_actions_by_device.
func (d dialect) nothingToCancel() string {
	return `UPDATE device_actions` + d.indexedBy(primaryKey) + ` SET ` + moveNothingToCancel.set + `, updated_at = ?
		WHERE tenant = ? AND action_id = ? AND {from} AND NOT EXISTS (SELECT 1 FROM device_actions t
			WHERE t.tenant = device_actions.tenant AND t.action_id = ? AND t.device_id = device_actions.device_id
			AND t.` + inFlight + `)`
}

// CancelAction cancels every device action of action id that is not
// final, and aborts its rollout if it has one not done. Devices that have
// the action in flight must be told: tell, a cancel_action of id
// (tell.CancelActionID), is dispatched to exactly those in the same
// transaction and returned (nil when there are none), to be sent like any
// action.
func (db *DB) CancelAction(ctx context.Context, tenant string, id int64, tell *fleet.Dispatch) (*fleet.Cancellation, error) {
	var c *fleet.Cancellation
	// A transaction of its own on PostgreSQL: in a group commit's, the
	// rows other jobs locked before it would come before its own in no
	// common order (see lockAhead).
	err := db.updateAlone(ctx, func(ctx context.Context, tx *Tx) error {
		var one int
		err := tx.queryRow(ctx, "SELECT 1 FROM actions WHERE tenant = ? AND id = ?", tenant, id).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) {
			return fleet.Errorf(fleet.ENOTFOUND, "action %d not found", id)
		} else if err != nil {
			return err
		}
		// The rollout first, then its device actions: the order in which
		// a phase's release locks them (AdvanceRollout), so that the two
		// never wait for each other (see lockInOrder).
		r, err := tx.rollout(ctx, tenant, id, lockWait)
		if fleet.ErrorCode(err) == fleet.ECONFLICT {
			err, r = nil, nil // no schedule
		}
		if err != nil {
			return err
		}
		if c, err = tx.cancel(ctx, tenant, id, tell); err != nil {
			return err
		}
		if r != nil && r.State().Allows(fleet.OpAbort) == nil { // a cancel aborts the rollout, and is idempotent after
			r.Status = fleet.RolloutAborted
			if err := tx.saveRollout(ctx, tenant, r, millis(tx.now)); err != nil {
				return err
			}
			c.Aborted = &fleet.RolloutEvent{Event: fleet.RolloutEventAborted, ActionID: id, Action: r.Action, Status: string(r.Status),
				Reason: fmt.Sprintf("cancelled: %d device actions", c.Cancelled), At: tx.now.UTC().Truncate(time.Millisecond)}
			if err := tx.notifyRollout(ctx, tenant, c.Aborted); err != nil {
				return err
			}
		}
		if c.Cancelled == 0 && c.Aborted == nil {
			return nil // nothing left to cancel is not worth an audit row
		}
		details := map[string]any{"cancelled": c.Cancelled}
		if c.Sent != nil {
			details["cancel_action"] = c.Sent.ID
		}
		return tx.audit(ctx, tenant, "action.cancel", "actions/"+strconv.FormatInt(id, 10), details)
	})
	return c, err
}

// cancel cancels every device action of action id that is not final;
// see CancelAction.
func (tx *Tx) cancel(ctx context.Context, tenant string, id int64, tell *fleet.Dispatch) (*fleet.Cancellation, error) {
	if tell.Action != fleet.ActionCancel || tell.CancelActionID != id {
		return nil, fmt.Errorf("sqlstore: cancel of action %d tells devices with %s of action %d", id, tell.Action, tell.CancelActionID)
	}
	if err := tx.lockInOrder(ctx, "tenant = ? AND action_id = ? AND "+statusIn(fleet.Sources(fleet.EventCancel, nil)), tenant, id); err != nil {
		return nil, err
	}
	c := &fleet.Cancellation{}
	var name string
	if err := tx.queryRow(ctx, "SELECT action FROM actions WHERE tenant = ? AND id = ?", tenant, id).Scan(&name); err != nil {
		return nil, err
	}
	if name == fleet.ActionDesired {
		// No device was sent a desired rollout (docs/twin.md): those in
		// flight wait for no answer, and are cancelled as if they gave it.
		untold, err := tx.applyMove(ctx, moveCancel, `UPDATE device_actions{by} SET `+moveCancel.set+`, updated_at = ?
			WHERE tenant = ? AND action_id = ? AND {from}`, millis(tx.now), tenant, id)
		if err != nil {
			return nil, err
		}
		released, err := tx.applyMove(ctx, moveCancelAccepted, `UPDATE device_actions{by} SET `+moveCancelAccepted.set+`, updated_at = ?
			WHERE tenant = ? AND action_id = ? AND {from}`, millis(tx.now), tenant, id)
		c.Cancelled = untold + released
		return c, err
	}
	var told int
	if err := tx.queryRow(ctx, "SELECT count(*) FROM device_actions WHERE tenant = ? AND action_id = ? AND "+untold,
		tenant, id).Scan(&told); err != nil {
		return nil, err
	}
	if told > 0 {
		// On PostgreSQL the devices may finish meanwhile: then none is
		// left to tell.
		var err error
		if c.Sent, err = tx.dispatch(ctx, tenant, tell, tx.db.dialect.untoldOf(tenant, id), true); err != nil {
			return nil, err
		}
	}
	// What the cancellation did not reach was not sent: it needs no word.
	// What it reached waits for the device's answer (answerCancels).
	untold, err := tx.applyMove(ctx, moveCancel, `UPDATE device_actions{by} SET `+moveCancel.set+`, updated_at = ?
		WHERE tenant = ? AND action_id = ? AND {from}`, millis(tx.now), tenant, id)
	if err != nil {
		return nil, err
	}
	if c.Sent != nil {
		if _, err := tx.applyMove(ctx, moveCancelTold, `UPDATE device_actions{by} SET `+moveCancelTold.set+`, updated_at = ?
			WHERE tenant = ? AND action_id = ? AND {from}`, millis(tx.now), tenant, id); err != nil {
			return nil, err
		}
	}
	c.Cancelled = untold
	if c.Sent != nil {
		c.Cancelled += c.Sent.Targeted
	}
	return c, nil
}

// CountTargets returns how many devices a dispatch would target now: the
// same selection DispatchAction inserts from, for the console to show
// before anything is sent. For search_type default it counts the listed
// devices that exist.
func (db *DB) CountTargets(ctx context.Context, tenant string, d *fleet.Dispatch) (int, error) {
	sel, err := db.dialect.selectionOf(ctx, db, tenant, d)
	if err != nil {
		return 0, err
	}
	if sel.ids != nil {
		found := 0
		for start := 0; start < len(sel.ids); start += idChunk {
			chunk := sel.ids[start:min(start+idChunk, len(sel.ids))]
			var n int
			err := db.queryRow(ctx, "SELECT count(*) FROM devices WHERE tenant = ? AND id IN ("+placeholders(len(chunk))+")",
				append([]any{tenant}, anys(chunk)...)...).Scan(&n)
			if err != nil {
				return 0, db.classify(err)
			}
			found += n
		}
		return found, nil
	}
	cond, condArgs, n, err := sel.where(ctx, db)
	if err != nil {
		return 0, db.classify(err)
	} else if n >= 0 {
		return n, nil
	}
	query, args := "SELECT coalesce((SELECT devices FROM device_counts WHERE tenant = ?), 0)", []any{tenant}
	if cond != "" {
		query, args = "SELECT count(*) FROM devices WHERE tenant = ? AND "+cond, append(args, condArgs...)
	}
	if err := db.queryRow(ctx, query, args...).Scan(&n); err != nil {
		return 0, db.classify(err)
	}
	return n, nil
}

// lockTargets orders a tenant's dispatches and device deletions on
// PostgreSQL. device_actions has no foreign key to devices (on PostgreSQL a
// trigger per row, 4.3 s of a dispatch to a million devices; on SQLite a
// lookup per row, a quarter of a dispatch's CPU): dispatches
// share the tenant's lock, a deletion takes it alone, until their
// transactions end. So a dispatch either sees a device deleted or has its
// rows deleted with it, never leaves a record of a device that is gone.
// A deletion runs in a transaction of its own (updateAlone) and takes the
// lock first: in a group commit's transaction it could hold a dispatch's
// shared lock and want the exclusive one, as another transaction could,
// each waiting for the other. SQLite has one writer, which runs a dispatch
// and a deletion one after the other.
func (tx *Tx) lockTargets(ctx context.Context, tenant string, exclusive bool) error {
	if tx.db.dialect != postgres {
		return nil
	}
	lock := "pg_advisory_xact_lock_shared"
	if exclusive {
		lock = "pg_advisory_xact_lock"
	}
	// 1718379891 is "fleet" in the lock's first key: the second is the
	// tenant's hash.
	_, err := tx.exec(ctx, "SELECT "+lock+"(1718379891, hashtext(?))", tenant)
	return err
}

// RemoveOrphanDeviceActions deletes device actions whose device is gone,
// at most limit of them, and returns how many. None should exist (see
// lockTargets); the sweep is the net under that rule where it can break,
// PostgreSQL's concurrent writers. On SQLite, whose one writer never runs
// a dispatch and a deletion at once, it does nothing: there it would hold
// that writer for a scan of every device action.
func (db *DB) RemoveOrphanDeviceActions(ctx context.Context, limit int) (int, error) {
	if db.dialect != postgres {
		return 0, nil
	}
	var n int
	err := db.update(ctx, func(ctx context.Context, tx *Tx) error {
		var err error
		n, err = tx.deleteCounted(ctx, `DELETE FROM device_actions WHERE (tenant, action_id, device_id) IN (
			SELECT da.tenant, da.action_id, da.device_id FROM device_actions da
			WHERE NOT EXISTS (SELECT 1 FROM devices d WHERE d.tenant = da.tenant AND d.id = da.device_id)`+limitClause(limit)+`)`)
		return err
	})
	return n, err
}

// RunOrphanSweep removes orphaned device actions every interval until ctx
// ends, a batch of 10,000 at a time.
func (db *DB) RunOrphanSweep(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		for {
			n, err := db.RemoveOrphanDeviceActions(ctx, 10_000)
			if err != nil {
				if ctx.Err() == nil {
					db.log.Warn("remove orphaned device actions", "err", err)
				}
				break
			}
			if n > 0 {
				db.log.Warn("removed orphaned device actions", "count", n)
			}
			if n < 10_000 {
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
