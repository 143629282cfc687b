package alert_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/alert"
	"github.com/fleetd/fleet/internal/testclock"
	"github.com/fleetd/fleet/sqlstore"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestReplicaEngines runs two engines, as two replicas do, on one store:
// a device's points go to either, and each engine's timers fire for what it
// has seen. The alerts follow the data as one engine alone would make them.
func TestReplicaEngines(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		ctx := context.Background()
		clk := testclock.New(t0)
		db := storeWithDevice(t, b, clk)
		hot := &fleet.AlertRule{Name: "hot", Stream: "env", Condition: map[string]any{"field": "temp", "operator": ">", "value": 80.0}}
		slow := &fleet.AlertRule{Name: "slow", Stream: "env", Condition: map[string]any{"field": "temp", "operator": ">", "value": 80.0},
			ActivationThresholdSeconds: 10}
		for _, r := range []*fleet.AlertRule{hot, slow} {
			if err := db.CreateAlertRule(ctx, "acme", r); err != nil {
				t.Fatal(err)
			}
		}
		a, bb := loadedEngine(t, db, clk), loadedEngine(t, db, clk)
		seq := 0
		ingest := func(e *alert.Engine, sec int, temp float64) {
			t.Helper()
			seq++
			clk.Set(t0.Add(time.Duration(sec) * time.Second))
			p := fleet.DataPoint{DeviceID: "d1", Stream: "env", Timestamp: t0.Add(time.Duration(sec) * time.Second), Sequence: int64(seq),
				ReceivedAt: clk.Now(), Data: map[string]any{"temp": temp}}
			if err := e.IngestPoints(ctx, "acme", "d1", "env", []fleet.DataPoint{p}); err != nil {
				t.Fatal(err)
			}
		}
		alerts := func(r *fleet.AlertRule) string {
			t.Helper()
			as, _, err := db.FindAlerts(ctx, "acme", fleet.AlertFilter{RuleID: r.ID, Page: fleet.Page{Page: 1, Limit: 100}})
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, al := range as {
				out = append(out, string(al.State))
			}
			return fmt.Sprint(out)
		}
		tick := func(sec int) {
			t.Helper()
			clk.Set(t0.Add(time.Duration(sec) * time.Second))
			for _, e := range []*alert.Engine{a, bb} {
				if err := e.CheckTimers(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}

		ingest(bb, 1, 90) // hot opens at once; slow starts activating, on B
		if got := alerts(hot); got != "[active]" {
			t.Fatalf("after a hot point through B: %s", got)
		}
		ingest(a, 2, 20) // A never saw the stream: it must close hot
		if got := alerts(hot); got != "[ended]" {
			t.Fatalf("after a cool point through A: hot %s", got)
		}
		// B's activation timer of slow fires at 11s: the condition has been
		// false since 2s, through A, so nothing opens.
		tick(12)
		if got := alerts(slow); got != "[]" {
			t.Fatalf("B's stale timer opened slow: %s", got)
		}
		// Hot through A at 20s, then 31s on the clock: slow opens once,
		// whichever engine's timer fires first.
		ingest(a, 20, 95)
		ingest(bb, 21, 96)
		tick(31)
		tick(32)
		if got := alerts(slow); got != "[active]" {
			t.Fatalf("slow after 11s hot: %s", got)
		}
		ingest(bb, 33, 10)
		ingest(a, 34, 11)
		if got := alerts(slow) + alerts(hot); got != "[ended][ended ended]" {
			t.Fatalf("after cool points through both: slow and hot %s", got)
		}
	})
}

var _ alert.VersionedStore = (*sqlstore.DB)(nil)

// storeWithDevice opens a store of b on clk's time, with the tenant acme
// and its device d1.
func storeWithDevice(t *testing.T, b sqlstoretest.Backend, clk *testclock.Clock) *sqlstore.DB {
	t.Helper()
	ctx := context.Background()
	db := sqlstoretest.MustOpen(t, b, sqlstoretest.Options{Now: clk.Now})
	if _, _, err := db.CreateTenant(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.CreateDevices(ctx, "acme", []fleet.NewDevice{{ID: "d1"}}); err != nil {
		t.Fatal(err)
	}
	return db
}

// loadedEngine is an engine on db, loaded: a replica, or a restart.
func loadedEngine(t *testing.T, db *sqlstore.DB, clk *testclock.Clock) *alert.Engine {
	t.Helper()
	e := &alert.Engine{Store: db, Devices: db, Now: clk.Now}
	if err := e.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	return e
}
