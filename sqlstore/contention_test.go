package sqlstore_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/internal/poll"
	"github.com/fleetd/fleet/sqlstore"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestWritersContend runs the writers of device actions against each
// other the way the services do, on rows they share: batched status
// reports of two actions at once (as the action service merges many
// callers' reports into one call), each batch in its own order, beside
// sightings, cancellations of the actions being reported on, device
// deletions and new dispatches. On PostgreSQL their transactions commit in
// parallel and lock rows as they go: whatever deadlocks or serialization
// failures the database answers with, no caller sees one.
func TestWritersContend(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, _ := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		ids := numberedDevices(t, db, "acme", "d%03d", 240)
		doomed := ids[len(ids)-24:]

		type pair struct{ a, b int64 }
		var current atomic.Pointer[pair]
		dispatchPair := func() error {
			fw := dispatch(fleet.ActionUpdateFirmware, "all")
			fw.Params = json.RawMessage(`{"components":[{"component_name":"os","version_number":"2"}]}`)
			a, err := db.DispatchAction(ctx, "acme", fw)
			if err != nil {
				return err
			}
			b, err := db.DispatchAction(ctx, "acme", dispatch("reboot", "all"))
			if err != nil {
				return err
			}
			current.Store(&pair{a.ID, b.ID})
			return nil
		}
		if err := dispatchPair(); err != nil {
			t.Fatal(err)
		}

		var (
			wg      sync.WaitGroup
			done    atomic.Bool
			calls   atomic.Int64
			slowest time.Duration // of the cancels, each a second a deadlock it lost
		)
		const reporters = 8
		for w := range reporters {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(w), 20261126))
				for seq := int64(1); !done.Load(); seq++ {
					p := current.Load()
					reports := make([]fleet.StatusReport, 16)
					for i := range reports {
						act := p.a
						if rng.IntN(2) == 0 {
							act = p.b
						}
						state := "Downloading"
						if rng.IntN(4) == 0 {
							state = "Completed"
						}
						reports[i] = fleet.StatusReport{ActionID: act, DeviceID: ids[rng.IntN(len(ids))], State: state,
							Timestamp: i64(seq), Sequence: i64(int64(i))}
					}
					errs, err := db.ReportStatus(ctx, "acme", reports)
					if err != nil {
						t.Errorf("reporter %d: %v", w, err)
						return
					}
					for i, err := range errs {
						if err != nil && fleet.ErrorCode(err) != fleet.ENOTFOUND {
							t.Errorf("reporter %d, report on %d/%s: %v", w, reports[i].ActionID, reports[i].DeviceID, err)
							return
						}
					}
					seen := make([]string, 8)
					for i := range seen {
						seen[i] = ids[rng.IntN(len(ids))]
					}
					if err := db.TouchDevices(ctx, "acme", seen, time.Unix(seq, 0)); err != nil {
						t.Errorf("reporter %d: sightings: %v", w, err)
						return
					}
					calls.Add(1)
				}
			})
		}
		// Each round cancels the pair being reported on, once the
		// reporters are at it, and dispatches the next.
		wg.Go(func() {
			defer done.Store(true)
			for round := range 4 {
				from := calls.Load()
				poll.Until(t, time.Minute, fmt.Sprintf("reports in round %d", round), func() bool { return calls.Load() >= from+2*reporters })
				p := current.Load()
				for _, id := range []int64{p.b, p.a} {
					start := time.Now()
					if _, err := db.CancelAction(ctx, "acme", id, tell(id, "reboot")); err != nil {
						t.Errorf("cancel %d after %s: %v", id, time.Since(start).Round(time.Millisecond), err)
						return
					}
					slowest = max(slowest, time.Since(start))
				}
				if err := dispatchPair(); err != nil {
					t.Errorf("dispatch round %d: %v", round+1, err)
					return
				}
			}
		})
		wg.Go(func() {
			for _, dev := range doomed {
				if err := db.DeleteDevice(ctx, "acme", dev); err != nil {
					t.Errorf("delete %s: %v", dev, err)
					return
				}
			}
		})
		wg.Go(func() {
			for range 6 {
				if _, err := db.DispatchAction(ctx, "acme", dispatch("ping", "all")); err != nil {
					t.Errorf("dispatch: %v", err)
					return
				}
			}
		})
		wg.Wait()
		st := db.Stats()
		t.Logf("%d report calls; %d commits of %d jobs, %d retried; the slowest cancel %s", calls.Load(), st.Commits, st.Jobs, st.Retries, slowest.Round(time.Millisecond))
	})
}

// TestReceiptsAndReportsLockInOneOrder: devices acknowledge an action in
// whatever order their messages arrive while others report on it; the
// receipts' batch and the reports' lock the same device actions, and
// PostgreSQL would abort one of two that lock them the other way round
// (a second's wait and a retry). Each round's receipts come in reverse.
func TestReceiptsAndReportsLockInOneOrder(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, _ := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		ids := numberedDevices(t, db, "acme", "d%03d", 200)
		for round := range 6 {
			a, err := db.DispatchAction(ctx, "acme", dispatch("reboot", "all"))
			if err != nil {
				t.Fatal(err)
			}
			receipts := make([]fleet.ActionReceipt, len(ids))
			reports := make([]fleet.StatusReport, len(ids))
			for i, id := range ids {
				receipts[len(ids)-1-i] = fleet.ActionReceipt{Tenant: "acme", DeviceID: id, ActionID: a.ID}
				reports[i] = fleet.StatusReport{ActionID: a.ID, DeviceID: id, State: "Rebooting", Timestamp: i64(1), Sequence: i64(1)}
			}
			var wg sync.WaitGroup
			wg.Go(func() {
				if err := db.MarkDelivered(ctx, receipts); err != nil {
					t.Errorf("round %d: receipts: %v", round, err)
				}
			})
			wg.Go(func() {
				if _, err := db.ReportStatus(ctx, "acme", reports); err != nil {
					t.Errorf("round %d: reports: %v", round, err)
				}
			})
			wg.Wait()
		}
		if st := db.Stats(); st.Retries != 0 {
			t.Errorf("%d writes were run again after PostgreSQL aborted them; want none", st.Retries)
		}
	})
}

// rowLockStore opens a store with tenant acme and devices d00 to d09 for a
// test of row locks, which only PostgreSQL takes: on SQLite, whose one
// writer locks no rows, the test is skipped.
func rowLockStore(t *testing.T, b sqlstoretest.Backend) *sqlstore.DB {
	t.Helper()
	if b.Name != "postgres" {
		t.Skip("SQLite's one writer locks no rows")
	}
	db, _ := mustOpen(t, b)
	mustTenant(t, db, "acme")
	numberedDevices(t, db, "acme", "d%02d", 10)
	return db
}

// lockDeviceAction locks a device action ($1 tenant, $2 action, $3 device)
// for a transaction that holds it beside the commit loops.
const lockDeviceAction = "SELECT 1 FROM device_actions WHERE tenant = $1 AND action_id = $2 AND device_id = $3 FOR UPDATE"

// awaitWaiter polls until a transaction waits for tx.
func awaitWaiter(t *testing.T, tx *sql.Tx, what string) {
	t.Helper()
	poll.Until(t, time.Minute, what, func() bool {
		var n int
		err := tx.QueryRowContext(context.Background(), `SELECT count(*) FROM pg_locks
			WHERE NOT granted AND locktype = 'transactionid' AND transactionid = pg_current_xact_id()::xid`).Scan(&n)
		return err == nil && n > 0
	})
}

// holdWhileBatch has a transaction beside the commit loops run setup, lock
// the device action of actionID and device, and then waits until batch,
// run meanwhile, waits for it. It returns the transaction (rolled back at
// the test's end, after which the batch is waited for) and a function that
// waits for the batch's answer.
func holdWhileBatch(t *testing.T, db *sqlstore.DB, actionID int64, device string, batch func() error, setup ...string) (*sql.Tx, func() error) {
	t.Helper()
	ctx := context.Background()
	holder, err := db.BeginWrite(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Rollback() })
	for _, q := range setup {
		if _, err := holder.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := holder.ExecContext(ctx, lockDeviceAction, "acme", actionID, device); err != nil {
		t.Fatal(err)
	}
	var batchErr error
	done := make(chan struct{})
	go func() { defer close(done); batchErr = batch() }()
	// A failure in the test must not leave the batch waiting after it.
	t.Cleanup(func() { holder.Rollback(); <-done })
	awaitWaiter(t, holder, "the batch waiting for the holder")
	return holder, func() error { <-done; return batchErr }
}

// mustApplied checks that each report's state is its device action's.
func mustApplied(t *testing.T, db *sqlstore.DB, actionID int64, reports ...fleet.StatusReport) {
	t.Helper()
	for _, r := range reports {
		got, err := db.ReportColumns(context.Background(), "acme", actionID, r.DeviceID)
		if err != nil || !strings.HasPrefix(got, r.State+"|") {
			t.Errorf("%s: %s (%v), want the report of %s applied", r.DeviceID, got, err, r.State)
		}
	}
}

// TestBatchLocksAhead: a batch whose device actions would be locked out of
// order, because it is several callers' reports or one caller's of both
// kinds (some written by the advancing UPDATE, the rest read first), locks
// them all first, in the order a cancel locks them. A transaction holding
// the first device action makes the batch wait there holding none: the
// holder can then lock the second without waiting (NOWAIT), where before
// the batch held it and the two deadlocked.
func TestBatchLocksAhead(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db := rowLockStore(t, b)
		ctx := context.Background()
		for _, tc := range []struct {
			name string
			// reports is the batch's jobs' reports, of first and later.
			reports func(first, later fleet.StatusReport) [][]fleet.StatusReport
		}{
			{"two callers", func(first, later fleet.StatusReport) [][]fleet.StatusReport {
				return [][]fleet.StatusReport{{later}, {first}}
			}},
			{"one caller, both kinds", func(first, later fleet.StatusReport) [][]fleet.StatusReport {
				return [][]fleet.StatusReport{{later, first}}
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				// An action of the case's own, d05 in Progress so that a
				// report of progress on it is written without being read
				// first.
				a, err := db.DispatchAction(ctx, "acme", dispatch("reboot", "all"))
				if err != nil {
					t.Fatal(err)
				}
				if _, err := db.ReportStatus(ctx, "acme", []fleet.StatusReport{{ActionID: a.ID, DeviceID: "d05", State: "Downloading", Timestamp: i64(1), Sequence: i64(1)}}); err != nil {
					t.Fatal(err)
				}
				first := fleet.StatusReport{ActionID: a.ID, DeviceID: "d00", State: "Completed", Timestamp: i64(2), Sequence: i64(2)}
				later := fleet.StatusReport{ActionID: a.ID, DeviceID: "d05", State: "Downloading", Timestamp: i64(3), Sequence: i64(3)}
				holder, wait := holdWhileBatch(t, db, a.ID, first.DeviceID, func() error {
					return db.ReportInOneBatch(ctx, "acme", tc.reports(first, later)...)
				})
				if _, err := holder.ExecContext(ctx, lockDeviceAction+" NOWAIT", "acme", a.ID, later.DeviceID); err != nil {
					t.Fatalf("%s, which the batch waiting for %s should not hold yet: %v", later.DeviceID, first.DeviceID, err)
				}
				if err := holder.Commit(); err != nil {
					t.Fatal(err)
				}
				if err := wait(); err != nil {
					t.Fatal(err)
				}
				mustApplied(t, db, a.ID, first, later)
			})
		}
	})
}

// TestLockAheadDeadlockVictim makes a batch's lockAhead the victim of a
// deadlock: another transaction holds the second of the batch's two device
// actions, lockAhead takes the first and waits for the second, and the
// other then asks for the first. PostgreSQL aborts the batch's transaction
// (the other waits longer before it looks for a deadlock), and the commit
// loop must run the batch again a job at a time, each locking its own: both
// reports apply, and nobody is told of the deadlock.
func TestLockAheadDeadlockVictim(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db := rowLockStore(t, b)
		ctx := context.Background()
		a, err := db.DispatchAction(ctx, "acme", dispatch("reboot", "all"))
		if err != nil {
			t.Fatal(err)
		}
		first := fleet.StatusReport{ActionID: a.ID, DeviceID: "d00", State: "Completed", Timestamp: i64(2), Sequence: i64(2)}
		later := fleet.StatusReport{ActionID: a.ID, DeviceID: "d05", State: "Failed", Timestamp: i64(3), Sequence: i64(3)}
		// The batch's backend looks for a deadlock after the server's
		// deadlock_timeout (1 s by default); the other one only after a
		// minute.
		other, wait := holdWhileBatch(t, db, a.ID, later.DeviceID, func() error {
			return db.ReportThroughRunBatch(ctx, "acme", []fleet.StatusReport{later}, []fleet.StatusReport{first})
		}, "SET LOCAL deadlock_timeout = '60s'")
		// lockAhead holds d00 and waits for d05: asking for d00 closes the
		// circle, and the batch's backend breaks it.
		if _, err := other.ExecContext(ctx, lockDeviceAction, "acme", a.ID, first.DeviceID); err != nil {
			t.Fatalf("the other transaction was the deadlock's victim, not the batch: %v", err)
		}
		if err := other.Commit(); err != nil {
			t.Fatal(err)
		}
		if err := wait(); err != nil {
			t.Fatalf("the batch's callers were told %v; want the batch run again a job at a time", err)
		}
		mustApplied(t, db, a.ID, first, later)
	})
}
