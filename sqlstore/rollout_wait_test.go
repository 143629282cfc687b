package sqlstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/internal/poll"
	"github.com/fleetd/fleet/internal/testclock"
	"github.com/fleetd/fleet/sqlstore"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestAdvanceRolloutWaits: while another transaction holds a rollout (the
// driver of this replica or another taking a step), the driver's advance
// skips it, but one that waits (a dispatch's release of its first phase,
// what follows an operator's operation) takes the step once that
// transaction ends. Before, both skipped: `fleetctl actions dispatch` could
// answer with a rollout still scheduled, its first phase not released.
func TestAdvanceRolloutWaits(t *testing.T) {
	b := sqlstoretest.Postgres(t, "a row lock held by another transaction (SQLite has one writer)")
	ctx := context.Background()
	clk := testclock.New(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC))
	dsn := b.DSN(t)
	db, err := sqlstore.Open(ctx, dsn, sqlstore.Options{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	mustTenant(t, db, "acme")
	mustDevices(t, db, "acme", map[string]map[string]string{"a": nil, "b": nil})
	d := dispatch("update", "default", "a", "b")
	d.Schedule = &fleet.Schedule{Phases: []fleet.Phase{fixed("canary", fleet.TriggerNow, "a"), fixed("rest", fleet.TriggerManual, "b")}}
	a := mustDispatch(t, db, "acme", d)

	raw := openRaw(t, b, dsn)
	hold, err := raw.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback()
	var holder int
	if err := hold.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&holder); err != nil {
		t.Fatal(err)
	}
	if _, err := hold.ExecContext(ctx, "SELECT 1 FROM rollouts WHERE tenant = 'acme' AND action_id = $1 FOR UPDATE", a.ID); err != nil {
		t.Fatal(err)
	}

	if c, err := db.AdvanceRollout(ctx, "acme", a.ID, clk.Now(), false); err != nil || c.Step.Kind != fleet.StepWait || c.Event != nil {
		t.Fatalf("the driver's advance of a rollout held elsewhere: %+v, %v; want it skipped", c, err)
	}
	type result struct {
		c   *fleet.RolloutChange
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := db.AdvanceRollout(ctx, "acme", a.ID, clk.Now(), true)
		done <- result{c, err}
	}()
	poll.Until(t, 15*time.Second, "the waiting advance to wait for the holder", func() bool {
		var n int
		err := raw.QueryRowContext(ctx, "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))", holder).Scan(&n)
		return err == nil && n > 0
	})
	select {
	case r := <-done:
		t.Fatalf("the waiting advance returned while the rollout was held: %+v, %v", r.c, r.err)
	default:
	}
	if err := hold.Rollback(); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("the waiting advance did not return once the rollout was let go")
	}
	if r.err != nil || r.c.Step.Kind != fleet.StepTrigger || r.c.Event == nil || r.c.Event.Released != 1 {
		t.Fatalf("the waiting advance: %+v, %v; want phase 0 released", r.c, r.err)
	}
	got, err := db.FindAction(ctx, "acme", a.ID)
	if err != nil || got.Status != fleet.RolloutRunning {
		t.Fatalf("after the waiting advance the rollout is %+v, %v; want running", got, err)
	}
}
