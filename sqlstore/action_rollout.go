package sqlstore

// Rollouts: a schedule's phases assigned at dispatch, its state, the facts
// its decisions need, and the steps and operations that change it
// (docs/actions.md, "Rollouts"). What a rollout does next is decided by
// fleet.Rollout; this file reads what it needs and applies the decision in
// the same transaction, with the rollout's row locked, so that of many
// replicas exactly one applies each step and a step is whole or absent.

import (
	"context"
	"crypto/md5"
	"database/sql"
	"database/sql/driver"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleet"
	msqlite "modernc.org/sqlite"
)

// unassigned is the phase of a rollout's device action between its insert
// and assignPhases, inside the dispatch's transaction.
const unassigned = -1

// rank is SQL that orders device ids in the stable order percentage
// phases release them: the first 64 bits of the MD5 of the id, as a
// signed integer. It is the same in both dialects, so a fleet moved from
// SQLite to PostgreSQL keeps its order. Ties (none in practice) break on
// the id.
func (d dialect) rank(col string) string {
	if d == postgres {
		return "('x' || substr(md5(" + col + "), 1, 16))::bit(64)::bigint"
	}
	return "fleet_rank(" + col + ")"
}

// rankOf is rank in Go; SQLite calls it as fleet_rank.
func rankOf(id string) int64 {
	sum := md5.Sum([]byte(id))
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

var registerRank sync.Once

// registerSQLiteFunctions makes fleet_rank known to SQLite connections.
func registerSQLiteFunctions() error {
	var err error
	registerRank.Do(func() {
		err = msqlite.RegisterDeterministicScalarFunction("fleet_rank", 1, func(_ *msqlite.FunctionContext, args []driver.Value) (driver.Value, error) {
			switch v := args[0].(type) {
			case string:
				return rankOf(v), nil
			case []byte:
				return rankOf(string(v)), nil
			}
			return nil, fmt.Errorf("fleet_rank: a text argument, not %T", args[0])
		})
	})
	return err
}

// assignPhases gives each of a rollout's total targets, inserted with the
// phase unassigned, the phase that releases it.
// fixed_list phases take their devices first, each of which must be a
// target; then each percentage phase takes, in rank order, what its
// cumulative quota still lacks. A target no phase takes is an error: the
// phases must partition the targets.
func (tx *Tx) assignPhases(ctx context.Context, tenant string, id int64, s *fleet.Schedule, total int) error {
	if tx.db.dialect == postgres && total >= analyzeAfter {
		// The statements below look rows up by key among the ones just
		// inserted, which PostgreSQL's statistics do not know yet: it may
		// choose an index that reads all of the action's rows for each
		// (measured: 43 s for 20,000 devices). ANALYZE in the transaction
		// counts the transaction's own rows; it samples a bounded number.
		if _, err := tx.exec(ctx, "ANALYZE device_actions"); err != nil {
			return err
		}
	}
	for k, p := range s.Phases {
		if p.Info.Type == fleet.PhaseGroup {
			if _, err := groupSelector(ctx, tx, tenant, p.Info.Group); fleet.ErrorCode(err) == fleet.ENOTFOUND {
				return fleet.FieldErrors(map[string]string{fmt.Sprintf("schedule.phases[%d].info.group", k): fmt.Sprintf("no group is named %q", p.Info.Group)})
			} else if err != nil {
				return err
			}
		}
		if p.Info.Type != fleet.PhaseFixedList {
			continue
		}
		n, err := tx.setPhase(ctx, tenant, id, k, p.Info.DeviceIDs)
		if err != nil {
			return err
		}
		if n < len(p.Info.DeviceIDs) {
			return tx.notTargets(ctx, tenant, id, fmt.Sprintf("schedule.phases[%d].info.device_ids", k), p.Info.DeviceIDs)
		}
	}
	for k, p := range s.Phases {
		if p.Info.Type != fleet.PhasePercentage {
			continue
		}
		var taken int
		if err := tx.queryRow(ctx, "SELECT count(*) FROM device_actions WHERE tenant = ? AND action_id = ? AND "+notQueued+" AND phase >= 0 AND phase < ?",
			tenant, id, k).Scan(&taken); err != nil {
			return err
		}
		if more := fleet.PhaseQuota(p.Info.Percentage, total) - taken; more > 0 {
			// The choice is made once (a materialised CTE) and joined by
			// key: as a subquery of the UPDATE, PostgreSQL planned a sort
			// per row of the action. more is any number, but this runs
			// once for each percentage phase of a rollout made: taken in
			// steps (batchLimit), the sort would be made for each.
			n, err := tx.execCount(ctx, `WITH picked AS MATERIALIZED (SELECT device_id FROM device_actions
					WHERE tenant = ? AND action_id = ? AND phase = ? ORDER BY `+tx.db.dialect.rank("device_id")+`, device_id`+limitClause(more)+`)
				UPDATE device_actions SET phase = ? FROM picked
				WHERE device_actions.tenant = ? AND device_actions.action_id = ? AND device_actions.device_id = picked.device_id`,
				tenant, id, unassigned, k, tenant, id)
			if err != nil {
				return err
			}
			tx.countPhased(tenant, id, k, int(n))
		}
	}
	var left int
	if err := tx.queryRow(ctx, "SELECT count(*) FROM device_actions WHERE tenant = ? AND action_id = ? AND "+notQueued+" AND phase = ?",
		tenant, id, unassigned).Scan(&left); err != nil {
		return err
	}
	if left > 0 {
		return fleet.FieldErrors(map[string]string{"schedule.phases": fmt.Sprintf(
			"release %d of the %d targets; the phases must release every target: end with a percentage phase of 100, or list the rest "+
				"(a metadata or group phase takes its devices from the later phases when it triggers)",
			total-left, total)})
	}
	return nil
}

// setPhase assigns the unassigned targets among ids to phase k and returns
// how many there were.
func (tx *Tx) setPhase(ctx context.Context, tenant string, id int64, k int, ids []string) (int, error) {
	total := 0
	for start := 0; start < len(ids); start += idChunk {
		chunk := ids[start:min(start+idChunk, len(ids))]
		n, err := tx.execCount(ctx, "UPDATE device_actions SET phase = ? WHERE tenant = ? AND action_id = ? AND phase = ? AND device_id IN ("+
			placeholders(len(chunk))+")", append([]any{k, tenant, id, unassigned}, anys(chunk)...)...)
		if err != nil {
			return 0, err
		}
		total += int(n)
	}
	tx.countPhased(tenant, id, k, total)
	return total, nil
}

// countPhased records that n of the rollout's targets, Scheduled and in
// no phase (as assignPhases finds them at dispatch), moved to phase k.
func (tx *Tx) countPhased(tenant string, id int64, k, n int) {
	tx.count(countKey{tenant, id, unassigned, fleet.StatusScheduled}, -n)
	tx.count(countKey{tenant, id, k, fleet.StatusScheduled}, n)
}

// notTargets is the error of a fixed_list phase that named devices the
// action does not target.
func (tx *Tx) notTargets(ctx context.Context, tenant string, id int64, field string, ids []string) error {
	missing, err := tx.missing(ctx, "SELECT device_id FROM device_actions WHERE tenant = ? AND action_id = ? AND device_id IN (", []any{tenant, id}, ids)
	if err != nil {
		return err
	}
	return &fleet.Error{
		Code:    fleet.EINVALID,
		Message: fmt.Sprintf("%d devices of a fixed_list phase are not targets of the dispatch: %s; nothing was dispatched", len(missing), listSome(missing)),
		Fields:  map[string]string{field: "not targets of the dispatch: " + listSome(missing)},
	}
}

// insertRollout stores a new rollout, nothing released yet.
func (tx *Tx) insertRollout(ctx context.Context, tenant string, id int64, s *fleet.Schedule) error {
	sched, _ := json.Marshal(s) // plain fields always encode
	var window sql.NullString
	if s.MaintenanceWindow != nil {
		w, _ := json.Marshal(s.MaintenanceWindow)
		window = sql.NullString{String: string(w), Valid: true}
	}
	_, err := tx.exec(ctx, `INSERT INTO rollouts (tenant, action_id, schedule, maintenance_window, status, next_phase, triggered_at,
		pause_reason, gate_paused, waived_phase, ended, window_opened, updated_at) VALUES (?, ?, ?, ?, ?, 0, '[]', '', ?, -1, ?, 0, ?)`,
		tenant, id, string(sched), window, string(fleet.RolloutScheduled), false, false, millis(tx.now))
	return err
}

// querier is what reads need: a write transaction, a read transaction or
// the database.
type querier interface {
	query(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	queryRow(ctx context.Context, query string, args ...any) *sql.Row
}

const rolloutColumns = `r.action_id, a.action, a.created_at, r.schedule, r.status, r.next_phase, r.triggered_at, r.pause_reason,
	r.gate_paused, r.waived_phase, r.ended, r.window_opened`

func scanRollout(s scanner) (*fleet.Rollout, error) {
	var r fleet.Rollout
	var created int64
	var sched, triggered, status string
	if err := s.Scan(&r.ActionID, &r.Action, &created, &sched, &status, &r.NextPhase, &triggered, &r.PauseReason,
		&r.GatePaused, &r.WaivedPhase, &r.Ended, &r.WindowOpened); err != nil {
		return nil, err
	}
	r.CreatedAt, r.Status = fromMillis(created), fleet.RolloutStatus(status)
	if err := json.Unmarshal([]byte(sched), &r.Schedule); err != nil {
		return nil, fmt.Errorf("rollout %d schedule: %w", r.ActionID, err)
	}
	var at []int64
	if err := json.Unmarshal([]byte(triggered), &at); err != nil {
		return nil, fmt.Errorf("rollout %d triggered_at: %w", r.ActionID, err)
	}
	for _, ms := range at {
		r.TriggeredAt = append(r.TriggeredAt, fromMillis(ms))
	}
	return &r, nil
}

// How a transaction reads a rollout it will change, on PostgreSQL (SQLite
// has one writer): skipping one another transaction holds, as the driver
// does (another replica is at it), or waiting for it, as an operator's
// operation does (an operator's word must not be skipped).
const (
	lockSkip = " FOR UPDATE OF r SKIP LOCKED"
	lockWait = " FOR UPDATE OF r"
)

// rollout reads an action's rollout, locked with lock: ENOTFOUND for an
// unknown action, ECONFLICT for one without a schedule, and nil, nil for
// one lockSkip skipped.
func (tx *Tx) rollout(ctx context.Context, tenant string, id int64, lock string) (*fleet.Rollout, error) {
	q := "SELECT " + rolloutColumns + " FROM rollouts r JOIN actions a ON a.tenant = r.tenant AND a.id = r.action_id WHERE r.tenant = ? AND r.action_id = ?"
	if tx.db.dialect == postgres {
		q += lock
	}
	r, err := scanRollout(tx.queryRow(ctx, q, tenant, id))
	if errors.Is(err, sql.ErrNoRows) {
		if lock == lockSkip && tx.db.dialect == postgres {
			var one int
			if err := tx.queryRow(ctx, "SELECT 1 FROM rollouts WHERE tenant = ? AND action_id = ?", tenant, id).Scan(&one); err == nil {
				return nil, nil // locked by another transaction
			}
		}
		return nil, tx.noRollout(ctx, tenant, id)
	}
	return r, err
}

// noRollout says why an action has no rollout.
func (tx *Tx) noRollout(ctx context.Context, tenant string, id int64) error {
	var one int
	err := tx.queryRow(ctx, "SELECT 1 FROM actions WHERE tenant = ? AND id = ?", tenant, id).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return fleet.Errorf(fleet.ENOTFOUND, "action %d not found", id)
	} else if err != nil {
		return err
	}
	return fleet.Errorf(fleet.ECONFLICT, "action %d has no schedule: it went to all its devices at dispatch", id)
}

// rolloutFacts reads what r's decision at now needs, and no more: most
// looks at a rollout find it waiting for a time, and read nothing. An
// operator's trigger (manual) judges the next phase's gate whatever its
// trigger says, so it needs the gate's facts even when the phase is not due.
func (db *DB) rolloutFacts(ctx context.Context, q querier, tenant string, r *fleet.Rollout, now time.Time, manual bool) (fleet.RolloutFacts, error) {
	var f fleet.RolloutFacts
	if r.Settling() {
		var err error
		if f.Live, err = countOf(ctx, q, tenant, r.ActionID, math.MaxInt32, liveStatuses); err != nil {
			return f, err
		}
	}
	if r.WaitsForPrevious() {
		if err := db.earlierFinal(ctx, q, tenant, r, &f); err != nil {
			return f, err
		}
	}
	g := r.PendingGate()
	if g == nil || !(manual || r.Due(now, f)) {
		return f, nil
	}
	k := r.NextPhase
	if g.MaxFailureRate != nil {
		if err := q.queryRow(ctx, `SELECT count(*), COALESCE(sum(CASE WHEN action_status = ? THEN 1 ELSE 0 END), 0) FROM device_actions
			WHERE tenant = ? AND action_id = ? AND `+statusIndexed([]fleet.ActionStatus{fleet.StatusCompleted, fleet.StatusFailed})+` AND phase < ?`,
			string(fleet.StatusFailed), tenant, r.ActionID, k).Scan(&f.Finished, &f.Failed); err != nil {
			return f, err
		}
	}
	if len(g.AlertRules) > 0 {
		live, err := countOf(ctx, q, tenant, r.ActionID, k, liveStatuses)
		if err != nil {
			return f, err
		}
		f.EarlierLive = live
		watch := g.WatchSeconds * 1000
		// Alerts of the gate's rules since the rollout began, each checked
		// against its device's record: few rows, from alerts_by_rule.
		var a fleet.GateAlert
		var after int64
		err = q.queryRow(ctx, `SELECT ar.name, al.device_id, al.started_at - da.updated_at
			FROM alerts al
			JOIN alert_rules ar ON ar.id = al.rule_id
			JOIN device_actions da ON da.tenant = al.tenant AND da.action_id = ? AND da.device_id = al.device_id
			WHERE al.tenant = ? AND al.rule_id IN (`+placeholders(len(g.AlertRules))+`) AND al.started_at >= ?
			AND da.action_status = ? AND da.phase < ? AND al.started_at >= da.updated_at AND al.started_at <= da.updated_at + ?
			ORDER BY al.started_at, al.device_id LIMIT 1`,
			append(append([]any{r.ActionID, tenant}, anys(g.AlertRules)...), millis(r.TriggeredAt[0]), string(fleet.StatusCompleted), k, watch)...).
			Scan(&a.RuleName, &a.DeviceID, &after)
		switch {
		case err == nil:
			a.After = time.Duration(after) * time.Millisecond
			f.Alert = &a
		case !errors.Is(err, sql.ErrNoRows):
			return f, err
		}
		if f.EarlierLive > 0 || f.Alert != nil {
			return f, nil // the watch cannot end yet, or need not
		}
		var last sql.NullInt64
		if err := q.queryRow(ctx, "SELECT max(updated_at) FROM device_actions WHERE tenant = ? AND action_id = ? AND "+
			statusIndexed([]fleet.ActionStatus{fleet.StatusCompleted})+" AND phase < ?", tenant, r.ActionID, k).Scan(&last); err != nil {
			return f, err
		}
		if last.Valid {
			f.WatchedUntil = fromMillis(last.Int64 + watch)
		}
	}
	return f, nil
}

// earlierFinal reads how many device actions the phases before r's next
// phase have and how many are final, from their counts, and when the share
// the next phase's after_previous trigger waits for was reached: the
// FinalNeeded-th to become final, counted back from the latest (for the
// default share of every device, the latest).
func (db *DB) earlierFinal(ctx context.Context, q querier, tenant string, r *fleet.Rollout, f *fleet.RolloutFacts) error {
	rows, err := q.query(ctx, `SELECT action_status, CAST(sum(n) AS BIGINT) FROM device_action_counts
		WHERE tenant = ? AND action_id = ? AND phase >= 0 AND phase < ? GROUP BY action_status`, tenant, r.ActionID, r.NextPhase)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var st string
		var n int
		if err := rows.Scan(&st, &n); err != nil {
			return err
		}
		f.EarlierDevices += n
		if fleet.ActionStatus(st).Final() {
			f.EarlierFinal += n
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	need := fleet.FinalNeeded(r.Schedule.Phases[r.NextPhase].TriggerOn.Ratio(), f.EarlierDevices)
	if need == 0 || f.EarlierFinal < need {
		return nil
	}
	var at int64
	err = q.queryRow(ctx, "SELECT updated_at FROM device_actions WHERE tenant = ? AND action_id = ? AND "+finalStatuses+" AND "+notQueued+
		" AND phase >= 0 AND phase < ? ORDER BY updated_at DESC LIMIT 1 OFFSET ?", tenant, r.ActionID, r.NextPhase, f.EarlierFinal-need).Scan(&at)
	if err != nil {
		return err
	}
	f.ReachedAt = fromMillis(at)
	return nil
}

// RolloutWait reads what the rollout of action id waits for at now
// (fleet.RolloutWait): nil for an action without a schedule, or one paused
// or done.
func (db *DB) RolloutWait(ctx context.Context, tenant string, id int64, now time.Time) (*fleet.RolloutWait, error) {
	rtx, err := db.readTx(ctx)
	if err != nil {
		return nil, err
	}
	defer rtx.Rollback()
	r, err := scanRollout(rtx.queryRow(ctx, "SELECT "+rolloutColumns+
		" FROM rollouts r JOIN actions a ON a.tenant = r.tenant AND a.id = r.action_id WHERE r.tenant = ? AND r.action_id = ?", tenant, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	} else if err != nil {
		return nil, db.classify(err)
	}
	if r.Status.Done() || r.Status == fleet.RolloutPaused {
		return nil, nil
	}
	w := &fleet.RolloutWait{Rollout: r}
	// The gate's facts too (manual), to say why it cannot judge yet.
	if w.Facts, err = db.rolloutFacts(ctx, rtx, tenant, r, now, true); err != nil {
		return nil, db.classify(err)
	}
	// The devices of the phases released: those before the next phase,
	// or all once every phase triggered (or the schedule ended).
	phases := r.NextPhase
	if r.Settling() {
		phases = len(r.Schedule.Phases)
	}
	released := []fleet.ActionStatus{fleet.StatusQueued, fleet.StatusInitiated, fleet.StatusProgress}
	// Released device actions have their phases (0 or more).
	if w.Unfinished, err = countOf(ctx, rtx, tenant, id, phases, released); err != nil {
		return nil, db.classify(err)
	}
	if w.Unfinished == 0 {
		return w, nil
	}
	rows, err := rtx.query(ctx, `SELECT da.device_id, da.action_status,
		(SELECT s.last_seen_at FROM device_sightings s WHERE s.tenant = da.tenant AND s.device_id = da.device_id)
		FROM device_actions da
		WHERE da.tenant = ? AND da.action_id = ? AND da.phase >= 0 AND da.phase < ? AND da.`+statusIn(released)+`
		ORDER BY da.device_id`+limitClause(fleet.WaitingShown), tenant, id, phases)
	if err != nil {
		return nil, db.classify(err)
	}
	w.Devices, err = scanAll(rows, func(s scanner) (fleet.WaitingDevice, error) {
		var d fleet.WaitingDevice
		var seen sql.NullInt64
		err := s.Scan(&d.ID, &d.Status, &seen)
		if seen.Valid {
			t := fromMillis(seen.Int64)
			d.LastSeenAt = &t
		}
		return d, err
	})
	return w, db.classify(err)
}

// ActiveRollouts lists the rollouts of every tenant that may still change.
func (db *DB) ActiveRollouts(ctx context.Context) ([]fleet.RolloutRef, error) {
	rows, err := db.query(ctx, "SELECT tenant, action_id FROM rollouts WHERE status IN ('scheduled', 'running', 'paused') ORDER BY tenant, action_id")
	if err != nil {
		return nil, db.classify(err)
	}
	return scanAll(rows, func(s scanner) (fleet.RolloutRef, error) {
		var r fleet.RolloutRef
		return r, s.Scan(&r.Tenant, &r.ActionID)
	})
}

// AdvanceRollout takes the step rollout id decides at now, if any. The
// decision is first made on a read: most looks find nothing to do, and
// cost no write. When there is a step, it is decided again with the
// rollout locked and applied in that transaction. A rollout another
// transaction holds is skipped (a change with no step, StepWait) unless
// wait: then it is locked once that transaction ends, and decided on what
// it committed.
func (db *DB) AdvanceRollout(ctx context.Context, tenant string, id int64, now time.Time, wait bool) (*fleet.RolloutChange, error) {
	rtx, err := db.readTx(ctx)
	if err != nil {
		return nil, err
	}
	r, err := scanRollout(rtx.queryRow(ctx, "SELECT "+rolloutColumns+
		" FROM rollouts r JOIN actions a ON a.tenant = r.tenant AND a.id = r.action_id WHERE r.tenant = ? AND r.action_id = ?", tenant, id))
	if err != nil {
		rtx.Rollback()
		if errors.Is(err, sql.ErrNoRows) {
			return &fleet.RolloutChange{}, nil // gone with its tenant
		}
		return nil, db.classify(err)
	}
	f, err := db.rolloutFacts(ctx, rtx, tenant, r, now, false)
	if err != nil {
		rtx.Rollback()
		return nil, db.classify(err)
	}
	if step := r.Next(now, f); step.Kind == fleet.StepWait {
		// A desired rollout's release left unfinished (a replica stopped
		// between its chunks) is taken up again (ReleaseDesired).
		more := false
		if r.Action == fleet.ActionDesired && desiredOpen(r, now) {
			queued, err := countOf(ctx, rtx, tenant, id, math.MaxInt32, []fleet.ActionStatus{fleet.StatusQueued})
			if err != nil {
				rtx.Rollback()
				return nil, db.classify(err)
			}
			more = queued > 0
		}
		rtx.Rollback()
		return &fleet.RolloutChange{Step: step, MoreDesired: more}, nil
	}
	rtx.Rollback()
	var c *fleet.RolloutChange
	err = db.update(ctx, func(ctx context.Context, tx *Tx) error {
		c = &fleet.RolloutChange{}
		lock := lockSkip
		if wait {
			lock = lockWait
		}
		r, err := tx.rollout(ctx, tenant, id, lock)
		if err != nil || r == nil {
			return err
		}
		f, err := db.rolloutFacts(ctx, tx, tenant, r, now, false)
		if err != nil {
			return err
		}
		c, err = tx.applyStep(ctx, tenant, r, r.Next(now, f), now)
		return err
	})
	if fleet.ErrorCode(err) == fleet.ENOTFOUND {
		return &fleet.RolloutChange{}, nil
	}
	return c, err
}

// applyStep makes step happen to r, locked in this transaction.
func (tx *Tx) applyStep(ctx context.Context, tenant string, r *fleet.Rollout, step fleet.RolloutStep, now time.Time) (*fleet.RolloutChange, error) {
	c := &fleet.RolloutChange{Step: step}
	at := millis(now)
	ev := &fleet.RolloutEvent{ActionID: r.ActionID, Action: r.Action, At: now.UTC().Truncate(time.Millisecond)}
	switch step.Kind {
	case fleet.StepWait:
		return c, nil
	case fleet.StepTrigger:
		if err := tx.takeByInfo(ctx, tenant, r.ActionID, step.Phase, r.Schedule.Phases[step.Phase].Info); err != nil {
			return nil, err
		}
		n, err := tx.applyMove(ctx, moveRelease, "UPDATE device_actions{by} SET "+moveRelease.set+
			", updated_at = ? WHERE tenant = ? AND action_id = ? AND {from} AND phase = ?", millis(tx.now), tenant, r.ActionID, step.Phase)
		if err != nil {
			return nil, err
		}
		r.TriggeredAt = append(r.TriggeredAt, now)
		r.NextPhase, r.Status, r.PauseReason, r.GatePaused = step.Phase+1, fleet.RolloutRunning, "", false
		window := r.Schedule.MaintenanceWindow == nil || step.Window != 0
		if r.Action == fleet.ActionDesired && window {
			if c.Shadows, c.MoreDesired, err = tx.releaseDesired(ctx, tenant, r.ActionID); err != nil {
				return nil, err
			}
		}
		if step.Window > r.WindowOpened {
			r.WindowOpened = step.Window
		}
		ev.Event, ev.Phase, ev.PhaseName, ev.Released = fleet.RolloutEventTriggered, &step.Phase, r.Schedule.Phases[step.Phase].Name, n
		c.Deliver, c.Targeted = window && n > 0, n
	case fleet.StepPause:
		r.Status, r.PauseReason, r.GatePaused = fleet.RolloutPaused, step.Reason, true
		ev.Event, ev.Phase, ev.PhaseName, ev.Reason = fleet.RolloutEventPaused, &step.Phase, r.Schedule.Phases[step.Phase].Name, step.Reason
	case fleet.StepEnd:
		n, err := tx.applyMove(ctx, moveScheduleEnded, "UPDATE device_actions{by} SET "+moveScheduleEnded.set+
			", updated_at = ? WHERE tenant = ? AND action_id = ? AND {from}", millis(tx.now), tenant, r.ActionID)
		if err != nil {
			return nil, err
		}
		r.Ended = true
		ev = nil // the completion says it, with the cancelled in its counts
		tx.db.log.Info("rollout: the schedule ended", "tenant", tenant, "action_id", r.ActionID, "cancelled", n)
	case fleet.StepComplete:
		r.Status = fleet.RolloutCompleted
		ev.Event, ev.Reason = fleet.RolloutEventCompleted, r.CompletionReason()
	case fleet.StepOpenWindow:
		r.WindowOpened = step.Window
		c.Deliver, ev = true, nil
		if r.Action == fleet.ActionDesired {
			var err error
			if c.Shadows, c.MoreDesired, err = tx.releaseDesired(ctx, tenant, r.ActionID); err != nil {
				return nil, err
			}
		}
		if err := tx.queryRow(ctx, "SELECT targeted FROM actions WHERE tenant = ? AND id = ?", tenant, r.ActionID).Scan(&c.Targeted); err != nil {
			return nil, err
		}
	}
	if err := tx.saveRollout(ctx, tenant, r, at); err != nil {
		return nil, err
	}
	if c.Deliver {
		a, err := scanAction(tx.queryRow(ctx, "SELECT "+actionColumns+" FROM actions WHERE tenant = ? AND id = ?", tenant, r.ActionID))
		if err != nil {
			return nil, err
		}
		c.Action = a
	}
	if ev != nil {
		ev.Status = string(r.Status)
		c.Event = ev
	}
	return c, tx.notifyRollout(ctx, tenant, c.Event)
}

// takeByInfo moves into phase k, about to trigger, the action's device
// actions of later phases, not released yet, whose device the phase's
// info chooses now: for a metadata phase, those whose metadata has every
// pair; for a group phase, the group's devices. A group deleted since the
// dispatch has no devices. Other phases took theirs at dispatch.
func (tx *Tx) takeByInfo(ctx context.Context, tenant string, id int64, k int, info fleet.PhaseInfo) error {
	var conds []deviceCond
	switch info.Type {
	case fleet.PhaseMetadata:
		for _, key := range slices.Sorted(maps.Keys(info.Metadata)) {
			conds = append(conds, tx.db.dialect.metadataIs(tenant, key, info.Metadata[key]))
		}
	case fleet.PhaseGroup:
		sel, err := groupSelector(ctx, tx, tenant, info.Group)
		if fleet.ErrorCode(err) == fleet.ENOTFOUND {
			tx.db.log.Warn("rollout: the group of a phase is gone; the phase takes no device", "tenant", tenant, "action_id", id, "phase", k, "group", info.Group)
			return nil
		} else if err != nil {
			return err
		}
		conds = tx.db.dialect.selectorConds(tenant, sel)
	default:
		return nil
	}
	cond, condArgs, _, err := devicesWhere(ctx, tx, conds)
	if err != nil {
		return err
	}
	rows, err := tx.query(ctx, `SELECT device_id, phase FROM device_actions WHERE tenant = ? AND action_id = ? AND `+
		statusIndexed([]fleet.ActionStatus{fleet.StatusScheduled})+` AND phase > ?
		AND device_id IN (SELECT id FROM devices WHERE tenant = ? AND `+cond+`) ORDER BY device_id`,
		append([]any{tenant, id, k, tenant}, condArgs...)...)
	if err != nil {
		return err
	}
	type taken struct {
		device string
		phase  int
	}
	matched, err := scanAll(rows, func(s scanner) (taken, error) {
		var t taken
		return t, s.Scan(&t.device, &t.phase)
	})
	if err != nil {
		return err
	}
	for start := 0; start < len(matched); start += idChunk {
		chunk := matched[start:min(start+idChunk, len(matched))]
		ids := make([]string, len(chunk))
		for i, t := range chunk {
			ids[i] = t.device
			tx.count(countKey{tenant, id, t.phase, fleet.StatusScheduled}, -1)
			tx.count(countKey{tenant, id, k, fleet.StatusScheduled}, 1)
		}
		if _, err := tx.exec(ctx, "UPDATE device_actions SET phase = ? WHERE tenant = ? AND action_id = ? AND action_status = ? AND device_id IN ("+
			placeholders(len(ids))+")", append([]any{k, tenant, id, string(fleet.StatusScheduled)}, anys(ids)...)...); err != nil {
			return err
		}
	}
	return nil
}

// saveRollout writes r's state.
func (tx *Tx) saveRollout(ctx context.Context, tenant string, r *fleet.Rollout, at int64) error {
	triggered := make([]int64, len(r.TriggeredAt))
	for i, t := range r.TriggeredAt {
		triggered[i] = millis(t)
	}
	tj, _ := json.Marshal(triggered)
	sj, _ := json.Marshal(r.Schedule)
	_, err := tx.exec(ctx, `UPDATE rollouts SET schedule = ?, status = ?, next_phase = ?, triggered_at = ?, pause_reason = ?, gate_paused = ?,
		waived_phase = ?, ended = ?, window_opened = ?, updated_at = ? WHERE tenant = ? AND action_id = ?`,
		string(sj), string(r.Status), r.NextPhase, string(tj), r.PauseReason, r.GatePaused, r.WaivedPhase, r.Ended, r.WindowOpened, at,
		tenant, r.ActionID)
	return err
}

// PauseRollout pauses a scheduled or running rollout: nothing more is
// released until it is resumed.
func (db *DB) PauseRollout(ctx context.Context, tenant string, id int64, now time.Time) (*fleet.RolloutChange, error) {
	return db.operate(ctx, tenant, id, "rollout.pause", func(tx *Tx, r *fleet.Rollout) (*fleet.RolloutChange, error) {
		if err := r.State().Allows(fleet.OpPause); err != nil {
			return nil, err
		}
		by := "an operator"
		if a := fleet.ActorFromContext(ctx); a != nil && a.UserName != "" {
			by = a.UserName
		}
		r.Status, r.PauseReason, r.GatePaused = fleet.RolloutPaused, "paused by "+by, false
		return &fleet.RolloutChange{Event: &fleet.RolloutEvent{Event: fleet.RolloutEventPaused, Reason: r.PauseReason}}, nil
	}, now)
}

// ResumeRollout resumes a paused rollout. A pause of a gate waives that
// gate: the phase it held back is released when its trigger comes.
func (db *DB) ResumeRollout(ctx context.Context, tenant string, id int64, now time.Time) (*fleet.RolloutChange, error) {
	return db.operate(ctx, tenant, id, "rollout.resume", func(tx *Tx, r *fleet.Rollout) (*fleet.RolloutChange, error) {
		if err := r.State().Allows(fleet.OpResume); err != nil {
			return nil, err
		}
		if r.GatePaused {
			r.WaivedPhase = r.NextPhase
		}
		r.Status, r.PauseReason, r.GatePaused = fleet.RolloutRunning, "", false
		if r.NextPhase == 0 {
			r.Status = fleet.RolloutScheduled
		}
		return &fleet.RolloutChange{Event: &fleet.RolloutEvent{Event: fleet.RolloutEventResumed}}, nil
	}, now)
}

// TriggerNextPhase releases the next phase now, whatever its trigger, if
// the rollout may release and the phase's gate holds. A gate that does not
// hold pauses the rollout, and that is what the change says.
func (db *DB) TriggerNextPhase(ctx context.Context, tenant string, id int64, now time.Time) (*fleet.RolloutChange, error) {
	return db.operate(ctx, tenant, id, "rollout.trigger_next_phase", func(tx *Tx, r *fleet.Rollout) (*fleet.RolloutChange, error) {
		f, err := db.rolloutFacts(ctx, tx, tenant, r, now, true)
		if err != nil {
			return nil, err
		}
		// The gate is judged now, whatever the trigger says.
		step, err := r.TriggerNow(now, f)
		if err != nil {
			return nil, err
		}
		return tx.applyStep(ctx, tenant, r, step, now)
	}, now)
}

// AbortRollout cancels every device action of a rollout that is not
// final, as CancelAction does (tell is the cancel_action for the devices
// that have the action in flight), and ends the rollout: nothing more is
// released.
func (db *DB) AbortRollout(ctx context.Context, tenant string, id int64, tell *fleet.Dispatch, now time.Time) (*fleet.RolloutChange, error) {
	return db.operate(ctx, tenant, id, "rollout.abort", func(tx *Tx, r *fleet.Rollout) (*fleet.RolloutChange, error) {
		if err := r.State().Allows(fleet.OpAbort); err != nil {
			return nil, err
		}
		c, err := tx.cancel(ctx, tenant, id, tell)
		if err != nil {
			return nil, err
		}
		r.Status = fleet.RolloutAborted
		return &fleet.RolloutChange{Sent: c.Sent, Event: &fleet.RolloutEvent{Event: fleet.RolloutEventAborted,
			Reason: fmt.Sprintf("aborted: %d device actions cancelled", c.Cancelled)}}, nil
	}, now)
}

// AppendPhase adds a fixed_list phase to a rollout that is not done: its
// devices, which must be devices of the tenant the action does not target
// yet, become targets, Scheduled in the new phase. check, when set, is the
// action's CheckDevice (fleet.Dispatch), asked about them as at dispatch.
func (db *DB) AppendPhase(ctx context.Context, tenant string, id int64, p fleet.Phase, check func(map[string]string) string, now time.Time) (*fleet.RolloutChange, error) {
	return db.operate(ctx, tenant, id, "rollout.append_phase", func(tx *Tx, r *fleet.Rollout) (*fleet.RolloutChange, error) {
		if err := r.State().Allows(fleet.OpAppendPhase); err != nil {
			return nil, err
		}
		k := len(r.Schedule.Phases)
		a, err := scanAction(tx.queryRow(ctx, "SELECT "+actionColumns+" FROM actions WHERE tenant = ? AND id = ?", tenant, id))
		if err != nil {
			return nil, err
		}
		n, err := tx.insertTargets(ctx, tenant, a, selection{ids: p.Info.DeviceIDs, cond: `NOT EXISTS (SELECT 1 FROM device_actions t
			WHERE t.tenant = devices.tenant AND t.action_id = ` + strconv.FormatInt(id, 10) + ` AND t.device_id = devices.id)`},
			fleet.StatusScheduled, k, millis(tx.now))
		if fleet.ErrorCode(err) == fleet.EINVALID {
			return nil, tx.notAppendable(ctx, tenant, id, p.Info.DeviceIDs)
		} else if err != nil {
			return nil, err
		}
		if check != nil {
			if _, err := tx.checkDevices(ctx, tenant, id, check, millis(tx.now), &k); err != nil {
				return nil, err
			}
		}
		if _, err := tx.exec(ctx, "UPDATE actions SET targeted = targeted + ? WHERE tenant = ? AND id = ?", n, tenant, id); err != nil {
			return nil, err
		}
		r.Schedule.Phases = append(r.Schedule.Phases, p)
		return &fleet.RolloutChange{}, nil
	}, now)
}

// notAppendable says which devices of an appended phase cannot join the
// action: unknown in the tenant, or already its targets.
func (tx *Tx) notAppendable(ctx context.Context, tenant string, id int64, ids []string) error {
	unknown, err := tx.missing(ctx, "SELECT id FROM devices WHERE tenant = ? AND id IN (", []any{tenant}, ids)
	if err != nil {
		return err
	}
	untargeted, err := tx.missing(ctx, "SELECT device_id FROM device_actions WHERE tenant = ? AND action_id = ? AND device_id IN (", []any{tenant, id}, ids)
	if err != nil {
		return err
	}
	free := make(map[string]bool, len(untargeted))
	for _, d := range untargeted {
		free[d] = true
	}
	var targets []string
	for _, d := range ids {
		if !free[d] {
			targets = append(targets, d)
		}
	}
	var problems []string
	if len(unknown) > 0 {
		problems = append(problems, "unknown devices: "+listSome(unknown))
	}
	if len(targets) > 0 {
		problems = append(problems, fmt.Sprintf("already targets of action %d: %s", id, listSome(targets)))
	}
	msg := strings.Join(problems, "; ")
	return &fleet.Error{Code: fleet.EINVALID, Message: msg + "; nothing was appended", Fields: map[string]string{"info.device_ids": msg}}
}

// operate runs an operator's operation on a rollout, locked, saves what it
// changed and audits it as action. op returns the change, whose event it
// fills in.
func (db *DB) operate(ctx context.Context, tenant string, id int64, action string, op func(tx *Tx, r *fleet.Rollout) (*fleet.RolloutChange, error), now time.Time) (*fleet.RolloutChange, error) {
	var c *fleet.RolloutChange
	err := db.update(ctx, func(ctx context.Context, tx *Tx) error {
		c = nil
		r, err := tx.rollout(ctx, tenant, id, lockWait)
		if err != nil {
			return err
		}
		before := *r
		if c, err = op(tx, r); err != nil {
			return err
		}
		if c.Step.Kind == fleet.StepWait { // applyStep saved and notified what a step changed
			if err := tx.saveRollout(ctx, tenant, r, millis(now)); err != nil {
				return err
			}
			if ev := c.Event; ev != nil {
				ev.ActionID, ev.Action, ev.Status, ev.At = r.ActionID, r.Action, string(r.Status), now.UTC().Truncate(time.Millisecond)
				if err := tx.notifyRollout(ctx, tenant, ev); err != nil {
					return err
				}
			}
		}
		details := map[string]any{"status": string(r.Status), "was": string(before.Status)}
		switch c.Step.Kind {
		case fleet.StepTrigger:
			details["phase"] = c.Step.Phase
			details["released"] = c.Event.Released
		case fleet.StepPause:
			details["paused"] = c.Step.Reason
		}
		if action == "rollout.append_phase" {
			details["phase"] = len(r.Schedule.Phases) - 1
		}
		return tx.audit(ctx, tenant, action, "actions/"+strconv.FormatInt(id, 10), details)
	})
	return c, err
}
