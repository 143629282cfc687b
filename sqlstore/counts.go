package sqlstore

// The device actions' counts per action, phase and status (migration
// 0018), kept in the transactions that change the device actions: every
// statement that inserts, moves or deletes device actions says what it did
// (Tx.count), and the transaction's sum is written just before it commits
// (Tx.flushCounts), one upsert per count it changed, however many device
// actions and jobs it carried.

import (
	"cmp"
	"context"
	"slices"
	"strconv"
	"strings"

	"github.com/fleetd/fleet"
)

// countKey names one count: the device actions of an action in a phase
// and status.
type countKey struct {
	tenant string
	action int64
	phase  int
	status fleet.ActionStatus
}

// countDelta is a change to one count.
type countDelta struct {
	key countKey
	n   int
}

// count records that n device actions (fewer when negative) joined k in
// this transaction.
func (tx *Tx) count(k countKey, n int) {
	if n != 0 {
		tx.counts = append(tx.counts, countDelta{k, n})
	}
}

// countMoved records what a statement moved: n[k] device actions from k's
// status to status to.
func (tx *Tx) countMoved(n map[countKey]int, to fleet.ActionStatus) {
	for k, c := range n {
		tx.count(k, -c)
		k.status = to
		tx.count(k, c)
	}
}

// countRows is the size of the upserts flushCounts writes.
const countRows = 100

// countSlots is how many rows a count is spread over on PostgreSQL.
const countSlots = 16

// flushCounts writes the transaction's changes to the counts, summed, and
// forgets them. On PostgreSQL, where transactions commit in parallel, each
// writes the next of countSlots slots in turn: the rows it changes stay
// locked until it commits, and transactions that flush at the same time
// then write different rows rather than wait for each other. Rows are
// written in the counts' order, so transactions that do share a slot lock
// them in one order. SQLite has one writer and slot 0.
func (tx *Tx) flushCounts(ctx context.Context) error {
	if len(tx.counts) == 0 {
		return nil
	}
	sum := make(map[countKey]int, len(tx.counts))
	for _, d := range tx.counts {
		sum[d.key] += d.n
	}
	tx.counts = tx.counts[:0]
	keys := make([]countKey, 0, len(sum))
	for k, n := range sum {
		if n != 0 {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b countKey) int {
		return cmp.Or(cmp.Compare(a.tenant, b.tenant), cmp.Compare(a.action, b.action), cmp.Compare(a.phase, b.phase),
			cmp.Compare(a.status, b.status))
	})
	slot := 0
	if tx.db.dialect == postgres {
		slot = int(tx.db.countSlot.Add(1) % countSlots)
	}
	row := "(?, ?, ?, ?, " + strconv.Itoa(slot) + ", ?)"
	for start := 0; start < len(keys); start += countRows {
		chunk := keys[start:min(start+countRows, len(keys))]
		args := make([]any, 0, 5*len(chunk))
		for _, k := range chunk {
			args = append(args, k.tenant, k.action, k.phase, string(k.status), sum[k])
		}
		if _, err := tx.exec(ctx, `INSERT INTO device_action_counts (tenant, action_id, phase, action_status, slot, n) VALUES `+
			strings.Repeat(row+", ", len(chunk)-1)+row+`
			ON CONFLICT (tenant, action_id, phase, action_status, slot) DO UPDATE SET n = device_action_counts.n + excluded.n`,
			args...); err != nil {
			return err
		}
	}
	return nil
}

// applyMove runs stmt, an UPDATE of device_actions that makes move m, once
// for each of m's source statuses with "{from}" in it replaced by the
// condition on that status (statusIndexed), and "{by}", where an UPDATE of
// an action's device actions names one after the table, by the primary
// key for Queued (SQLite's planner would read the tenant's device actions
// through device_actions_by_device, and Queued ones are not in
// device_actions_by_status: migration 0045) and by nothing for the others,
// which the planner finds in device_actions_by_status; counts what each
// moved, and returns how many device actions moved in all.
func (tx *Tx) applyMove(ctx context.Context, m move, stmt string, args ...any) (int, error) {
	total := 0
	for _, from := range m.from {
		t, _ := fleet.Next(from, m.t.Event)
		q := strings.Replace(stmt, "{from}", statusIndexed([]fleet.ActionStatus{from}), 1)
		by := ""
		if from == fleet.StatusQueued {
			by = tx.db.dialect.indexedBy(primaryKey)
		}
		n, err := tx.moveFrom(ctx, from, t.To, strings.Replace(q, "{by}", by, 1), args...)
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

// moveFrom runs stmt, an UPDATE of device_actions that moves only device
// actions in status from to status to, counts what it moved and returns
// how many.
func (tx *Tx) moveFrom(ctx context.Context, from, to fleet.ActionStatus, stmt string, args ...any) (int, error) {
	moved, n, err := tx.returned(ctx, stmt, "device_actions.tenant, device_actions.action_id, device_actions.phase, "+quote(string(from)), args...)
	if err != nil {
		return 0, err
	}
	tx.countMoved(moved, to)
	return n, nil
}

// deleteCounted runs stmt, a DELETE of device actions, counts what it
// deleted and returns how many.
func (tx *Tx) deleteCounted(ctx context.Context, stmt string, args ...any) (int, error) {
	gone, n, err := tx.returned(ctx, stmt, "tenant, action_id, phase, action_status", args...)
	if err != nil {
		return 0, err
	}
	for k, c := range gone {
		tx.count(k, -c)
	}
	return n, nil
}

// returned runs stmt, which writes device actions, RETURNING a count's
// key of each row it wrote (returning: its tenant, action id, phase and
// status), and returns how many rows each key had and in all.
func (tx *Tx) returned(ctx context.Context, stmt, returning string, args ...any) (map[countKey]int, int, error) {
	rows, err := tx.query(ctx, stmt+" RETURNING "+returning, args...)
	if err != nil {
		return nil, 0, err
	}
	keys, total := map[countKey]int{}, 0
	for rows.Next() {
		var k countKey
		if err := rows.Scan(&k.tenant, &k.action, &k.phase, &k.status); err != nil {
			rows.Close()
			return nil, 0, err
		}
		keys[k]++
		total++
	}
	return keys, total, cmp.Or(rows.Err(), rows.Close())
}

// countOf is how many of action id's device actions of phases below
// phases have one of statuses, from device_action_counts and, when q is a
// transaction, what it has moved and not yet written there (flushCounts
// writes them just before the commit). Counts of statuses that include
// Queued are read here rather than from device_actions: Queued device
// actions have no range of device_actions_by_status (migration 0045), so
// counting them would read every device action of the action.
func countOf(ctx context.Context, q querier, tenant string, id int64, phases int, statuses []fleet.ActionStatus) (int, error) {
	var n int64
	if err := q.queryRow(ctx, "SELECT CAST(COALESCE(sum(n), 0) AS BIGINT) FROM device_action_counts WHERE tenant = ? AND action_id = ? AND phase < ? AND "+
		statusIn(statuses), tenant, id, phases).Scan(&n); err != nil {
		return 0, err
	}
	if tx, ok := q.(*Tx); ok {
		for _, d := range tx.counts {
			if d.key.tenant == tenant && d.key.action == id && d.key.phase < phases && slices.Contains(statuses, d.key.status) {
				n += int64(d.n)
			}
		}
	}
	return int(n), nil
}
