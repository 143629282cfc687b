package sqlstore

// The SQL form of the device-action lifecycle (fleet.Lifecycle). Statements
// that move device actions take their states from here rather than writing
// status words of their own, so the table in the fleet package is the one
// place that says which event moves which status where; status reports
// follow it through fleet.ApplyReport. TestLifecycle drives each row of the
// table through the store.

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/fleetd/fleet"
)

// move is the SQL of an event the server applies to many device actions in
// one statement.
type move struct {
	// from are the statuses of the device actions the event moves. A
	// statement moves those of one at a time (Tx.applyMove), to count what
	// left each.
	from []fleet.ActionStatus
	// set assigns the status the event moves them to, its status word, the
	// progress of a Completed one, and clears a deadline the event clears.
	// A deadline the event starts is for the statement to compute.
	set string
	t   fleet.Transition
}

// moveOf returns the move of event from those of its source statuses keep
// accepts (all when nil). Every such source must lead to the same status
// (or each stay where it is), word and deadline change: one statement
// moves them all.
func moveOf(event fleet.Event, keep func(fleet.Transition) bool) move {
	from := fleet.Sources(event, keep)
	if len(from) == 0 {
		panic(fmt.Sprintf("sqlstore: event %s moves no device action", event))
	}
	t, _ := fleet.Next(from[0], event)
	stays := func(t fleet.Transition) bool { return t.To == t.From }
	for _, s := range from[1:] {
		u, _ := fleet.Next(s, event)
		if stays(u) != stays(t) || !stays(t) && u.To != t.To || u.Status != t.Status || u.Deadline != t.Deadline {
			panic(fmt.Sprintf("sqlstore: event %s moves %s and %s differently", event, from[0], s))
		}
	}
	if t.Status == "" {
		panic(fmt.Sprintf("sqlstore: event %s keeps the device's word; it is applied by fleet.ApplyReport", event))
	}
	set := "status = " + quote(t.Status)
	if !stays(t) {
		set = "action_status = " + quote(string(t.To)) + ", " + set
	}
	if t.To == fleet.StatusCompleted {
		set += ", progress = 100"
	}
	if t.Deadline == fleet.DeadlineCleared && slices.ContainsFunc(from, func(s fleet.ActionStatus) bool { return slices.Contains(fleet.InFlight, s) }) {
		// Only device actions in flight have a deadline; on SQLite, setting
		// a column costs a write of every index that has it.
		set += ", deadline = NULL"
	}
	return move{from: from, set: set, t: t}
}

// The moves the store makes.
var (
	moveDelivered = moveOf(fleet.EventDelivered, nil)
	moveRefused   = moveOf(fleet.EventRefused, nil)
	// moveCancel ends what the device does not have yet; moveCancelTold
	// marks what it has, which waits for its answer to the cancel_action
	// (moveCancelAccepted, moveCancelRejected).
	moveCancel          = moveOf(fleet.EventCancel, func(t fleet.Transition) bool { return !t.TellDevice })
	moveCancelTold      = moveOf(fleet.EventCancel, func(t fleet.Transition) bool { return t.TellDevice })
	moveCancelAccepted  = moveOf(fleet.EventCancelAccepted, nil)
	moveCancelRejected  = moveOf(fleet.EventCancelRejected, nil)
	moveTimeout         = moveOf(fleet.EventTimeout, nil)
	moveNothingToCancel = moveOf(fleet.EventNothingToCancel, nil)
	moveRelease         = moveOf(fleet.EventRelease, nil)
	moveScheduleEnded   = moveOf(fleet.EventScheduleEnded, nil)
	// moveConfirmed and moveDenied record a DDI device's answer to an
	// update waiting for its confirmation (ConfirmDeviceAction).
	moveConfirmed = moveOf(fleet.EventConfirmed, nil)
	moveDenied    = moveOf(fleet.EventDenied, nil)
)

// lockInOrder locks, on PostgreSQL, the device actions that cond (a
// condition on device_actions, with args) selects, in the order in which
// status reports lock theirs: (action_id, device_id), then tenant, as action
// ids are each tenant's own. A move of a status at
// a time (applyMove) locks its rows status by status, in the order its
// plan reads them; a batch of reports that holds one of them and wants
// another would wait for it as it waits for the batch, until PostgreSQL
// aborts one of the two, a second later. Locked first in one order, the
// rows are waited for, never deadlocked on. SQLite's one writer needs no
// locks.
func (tx *Tx) lockInOrder(ctx context.Context, cond string, args ...any) error {
	if tx.db.dialect != postgres {
		return nil
	}
	_, err := tx.exec(ctx, "SELECT 1 FROM device_actions WHERE "+cond+" ORDER BY action_id, device_id, tenant FOR UPDATE", args...)
	return err
}

// lockKey is a device action a job locks (job.locks).
type lockKey struct {
	tenant   string
	actionID int64
	deviceID string
}

// noLocks are the locks of a job known to lock no device action; nil ones
// are not known (job.locks).
var noLocks = []lockKey{}

// lockAhead locks, on PostgreSQL, the device actions of the batch's jobs
// (job.locks), all of them, in the order of lockInOrder, before any job
// runs, when every job names the device actions it locks, and two or more
// name some or one asks to (job.ahead). Each job locks its own in that
// order, but a batch's jobs run one after the other: the second's rows may
// come before the first's, and a cancel, which locks every device action
// of its action in order, would wait for the batch while the batch waited
// for it, until PostgreSQL aborted one, a second later, most often the
// cancel. Locked first as one set, the rows of a batch are waited for in
// the one order too. A batch with a job that does not name its locks (a
// rollout's, which locks the rollout before its device actions as a cancel
// does) is left to lock as its jobs do: ahead of them, its device actions
// would come before the rollout.
func (tx *Tx) lockAhead(ctx context.Context, batch []*job) error {
	if tx.db.dialect != postgres {
		return nil
	}
	var keys []lockKey
	jobs, ahead := 0, false
	for _, j := range batch {
		if j.ctx.Err() != nil {
			continue // it will not run
		}
		if j.locks == nil {
			return nil
		}
		if len(j.locks) > 0 {
			keys = append(keys, j.locks...)
			jobs++
			ahead = ahead || j.ahead
		}
	}
	if jobs < 2 && !ahead {
		return nil
	}
	slices.SortFunc(keys, compareLockKeys)
	keys = slices.Compact(keys)
	for start := 0; start < len(keys); start += reportChunk {
		cond, args, _ := keysIn(keys[start:min(start+reportChunk, len(keys))])
		if err := tx.lockInOrder(ctx, cond, args...); err != nil {
			return err
		}
	}
	return nil
}

// compareLockKeys orders device actions as lockInOrder locks them.
func compareLockKeys(a, b lockKey) int {
	return cmp.Or(cmp.Compare(a.actionID, b.actionID), strings.Compare(a.deviceID, b.deviceID), strings.Compare(a.tenant, b.tenant))
}

// keysIn is the condition that a device action is one of keys (at most
// reportChunk), with its arguments: the keys, then keys that match nothing
// up to n, their size class (sizeClass), so that a statement has a text a
// size class.
func keysIn(keys []lockKey) (cond string, args []any, n int) {
	n = sizeClass(len(keys))
	args = make([]any, 0, 3*n)
	for _, k := range keys {
		args = append(args, k.tenant, k.actionID, k.deviceID)
	}
	for range n - len(keys) {
		args = append(args, "", 0, "") // matches nothing
	}
	return "(tenant, action_id, device_id) IN (" + strings.TrimSuffix(strings.Repeat("(?, ?, ?), ", n), ", ") + ")", args, n
}

// Conditions on action_status the statements share.
var (
	// pending: the device has yet to acknowledge the action.
	pending = statusIn(fleet.Sources(fleet.EventDelivered, nil))
	// inFlight: the device has the action and has not finished it.
	inFlight = statusIn(fleet.InFlight)
	// untold: in flight, and not asked to stop with no word since: a
	// second cancel does not ask again a device that has not answered.
	untold = inFlight + " AND " + notQueued + " AND status <> " + quote(fleet.StateCancelling)
	// notQueued is device_actions_by_status's predicate (migration 0045).
	// A statement reads that index only where its WHERE clause has this
	// term word for word: SQLite proves a partial index usable from the
	// clause's terms as written, not from what they imply
	// (action_status = 'Progress' does not count), and PostgreSQL does not
	// from a bound parameter. statusIndexed adds it.
	notQueued = "action_status <> " + quote(string(fleet.StatusQueued))
)

// statusIndexed is statusIn(ss) with notQueued when none of ss is Queued,
// so that device_actions_by_status can find them: Queued device actions
// are not in it, and are read through the primary key (primaryKey).
func statusIndexed(ss []fleet.ActionStatus) string {
	if slices.Contains(ss, fleet.StatusQueued) {
		return statusIn(ss)
	}
	return statusIn(ss) + " AND " + notQueued
}

// primaryKey is SQLite's name of device_actions' primary key, for
// INDEXED BY: the index SQLite makes for a PRIMARY KEY of a rowid table
// (migration 0017 renamed the table, and SQLite the index with it). An
// action's Queued device actions are read through it.
const primaryKey = "sqlite_autoindex_device_actions_1"

// statusIn is the SQL condition that action_status is one of ss.
func statusIn(ss []fleet.ActionStatus) string {
	if len(ss) == 1 {
		return "action_status = " + quote(string(ss[0]))
	}
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = quote(string(s))
	}
	return "action_status IN (" + strings.Join(q, ", ") + ")"
}

// quote is a status word as an SQL literal. The words are the lifecycle's
// constants, letters only; anything else is a programming error.
func quote(word string) string {
	for _, r := range word {
		if !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z') {
			panic(fmt.Sprintf("sqlstore: status word %q is not letters", word))
		}
	}
	return "'" + word + "'"
}
