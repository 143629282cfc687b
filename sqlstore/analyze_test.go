package sqlstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestDispatchAnalyzesAfterTheAnswer: on PostgreSQL a large dispatch into
// a device_actions table that has statistics answers without waiting for
// their refresh, which follows in the background; into one without any,
// the refresh comes before the answer (docs/benchmarks-notebook.md, "The
// dispatch's ANALYZE after the answer"). The test holds a lock that
// ANALYZE needs and a dispatch's INSERT does not: the second dispatch
// answers while it is held, and the statistics are refreshed once it is
// let go.
func TestDispatchAnalyzesAfterTheAnswer(t *testing.T) {
	b := sqlstoretest.Postgres(t, "PostgreSQL's statistics")
	db, raw := openWithRaw(t, b)
	ctx := context.Background()
	mustTenant(t, db, "acme")
	devs := make([]fleet.NewDevice, 10_000) // analyzeAfter
	for i := range devs {
		devs[i] = fleet.NewDevice{ID: fmt.Sprintf("d%05d", i)}
	}
	if _, err := db.CreateDevices(ctx, "acme", devs); err != nil {
		t.Fatal(err)
	}
	analyses := func() int {
		t.Helper()
		var n int
		if err := raw.QueryRow(`SELECT analyze_count FROM pg_stat_user_tables
			WHERE schemaname = current_schema() AND relname = 'device_actions'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	mustDispatch(t, db, "acme", dispatch("reboot", "all"))
	if n := analyses(); n != 1 {
		t.Fatalf("device_actions analyzed %d times after the first dispatch, want once, before its answer", n)
	}

	lock, err := raw.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback()
	if _, err := lock.Exec("LOCK TABLE device_actions IN SHARE UPDATE EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	answered := make(chan error, 1)
	go func() {
		_, err := db.DispatchAction(ctx, "acme", dispatch("reboot", "all"))
		answered <- err
	}()
	select {
	case err := <-answered:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the second dispatch waited a minute for its ANALYZE, which waits for the test's lock")
	}
	if n := analyses(); n != 1 {
		t.Fatalf("device_actions analyzed %d times while the test held ANALYZE off, want once", n)
	}
	if err := lock.Rollback(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); analyses() < 2; {
		if time.Now().After(deadline) {
			t.Fatal("device_actions not analyzed a minute after the lock was let go")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
