package sqlstore_test

import (
	"context"
	"database/sql"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/internal/testclock"
	"github.com/fleetd/fleet/sqlstore"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// clockedReplicas opens two stores on one database, both on clk, and a
// connection of database/sql alone.
func clockedReplicas(t *testing.T, b sqlstoretest.Backend, clk *testclock.Clock) ([2]*sqlstore.DB, *sql.DB) {
	t.Helper()
	ctx := context.Background()
	dsn := b.DSN(t)
	var dbs [2]*sqlstore.DB
	for i := range dbs {
		db, err := sqlstore.Open(ctx, dsn, sqlstore.Options{Now: clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		if _, err := db.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		dbs[i] = db
	}
	return dbs, openRaw(t, b, dsn)
}

// attached reports whether PostgreSQL's table name is a partition of
// parent, not being detached.
func attached(t *testing.T, raw *sql.DB, name, parent string) bool {
	t.Helper()
	var n int
	err := raw.QueryRow(`SELECT count(*) FROM pg_inherits WHERE inhrelid = to_regclass($1) AND inhparent = to_regclass($2)
		AND NOT inhdetachpending`, name, parent).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// tableExists reports whether PostgreSQL's table name exists.
func tableExists(t *testing.T, raw *sql.DB, name string) bool {
	t.Helper()
	var ok bool
	if err := raw.QueryRow("SELECT to_regclass($1) IS NOT NULL", name).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

// TestHistoryMaintenanceReplicas: two replicas run the maintenance at
// once, three times each, while both keep points: neither fails, each
// expired partition is dropped once, by one of them, the partitions ahead
// are made and attached, and an unexpired day keeps its points.
func TestHistoryMaintenanceReplicas(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		if b.Name != "postgres" {
			t.Skip("replicas share a PostgreSQL database")
		}
		ctx := context.Background()
		clk := testclock.New(time.Date(2026, 10, 1, 10, 0, 0, 0, time.UTC))
		dbs, raw := clockedReplicas(t, b, clk)
		mustTenant(t, dbs[0], "acme")
		mustAlertDevices(t, dbs[0], "acme", "d1", "d2")
		day := clk.Now().Truncate(24 * time.Hour)
		for i, n := range []int{0, 1, 2, 4} {
			d := day.AddDate(0, 0, n)
			clk.Set(d.Add(time.Hour))
			if err := dbs[i%2].CommitStream(ctx, "acme", "d1", "env", historyPoints(d, 10, clk.Now()), nil); err != nil {
				t.Fatal(err)
			}
		}
		now := day.AddDate(0, 0, 33).Add(12 * time.Hour) // days 0-2 expired, day 4 not
		clk.Set(now)
		var (
			mu      sync.Mutex
			dropped []string
			wg      sync.WaitGroup
		)
		errs := make(chan error, 64)
		for _, db := range dbs {
			wg.Add(2)
			go func() {
				defer wg.Done()
				for range 3 {
					names, err := db.MaintainHistory(ctx)
					if err != nil {
						errs <- err
					}
					mu.Lock()
					dropped = append(dropped, names...)
					mu.Unlock()
				}
			}()
			go func() {
				defer wg.Done()
				for i := range 20 {
					pts := historyPoints(now.Add(time.Duration(i-30)*time.Minute), 5, now)
					if err := db.CommitStream(ctx, "acme", "d2", "env", pts, nil); err != nil {
						errs <- err
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		var want []string
		for n := range 3 {
			want = append(want, "stream_points_"+day.AddDate(0, 0, n).Format("20060102"))
		}
		slices.Sort(dropped)
		if !slices.Equal(dropped, want) {
			t.Fatalf("the replicas dropped %v, want %v, each once", dropped, want)
		}
		for _, name := range want {
			if tableExists(t, raw, name) {
				t.Errorf("%s is left", name)
			}
		}
		for _, p := range []struct{ parent, name string }{
			{"stream_points", "stream_points_" + now.Format("20060102")},
			{"stream_points", "stream_points_" + now.AddDate(0, 0, 2).Format("20060102")},
			{"stream_rollup_1m", "stream_rollup_1m_" + now.AddDate(0, 0, 1).Format("20060102")},
			{"stream_rollup_10m", "stream_rollup_10m_" + now.AddDate(0, 0, 2).Format("20060102")},
			{"stream_rollup_1h", "stream_rollup_1h_" + now.AddDate(0, 2, 0).Format("200601")},
		} {
			if !attached(t, raw, p.name, p.parent) {
				t.Errorf("%s is not a partition of %s", p.name, p.parent)
			}
		}
		if got := readAll(t, dbs[1], "acme", "d1", fleet.PointQuery{Limit: 100, From: day}); len(got) != 10 {
			t.Fatalf("%d points of the unexpired day, want 10", len(got))
		}
		if got := readAll(t, dbs[0], "acme", "d2", fleet.PointQuery{Limit: 1000, From: day}); len(got) != 100 {
			t.Fatalf("%d points kept during the maintenance, want 100", len(got))
		}
	})
}

// TestHistoryDropKeepsUnexpired: a partition the maintenance found
// expired is not dropped if, before its drop, a tenant's retention was
// made long enough to keep it; it is once the retention is short again.
func TestHistoryDropKeepsUnexpired(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, clk := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustAlertDevices(t, db, "acme", "d1")
		day := clk.Now().Truncate(24 * time.Hour)
		if err := db.CommitStream(ctx, "acme", "d1", "env", historyPoints(day, 10, clk.Now()), nil); err != nil {
			t.Fatal(err)
		}
		clk.Set(day.AddDate(0, 0, 31).Add(12 * time.Hour)) // expired under the default 30 days
		if err := db.SetStreamRetention(ctx, "acme", 60*24*time.Hour); err != nil {
			t.Fatal(err)
		}
		if ok, err := db.DropIfExpired(ctx, "stream_points", day); ok || err != nil {
			t.Fatalf("DropIfExpired = %v, %v; want the partition kept under the longer retention", ok, err)
		}
		if got := readAll(t, db, "acme", "d1", fleet.PointQuery{Limit: 100, From: day}); len(got) != 10 {
			t.Fatalf("%d points after the drop was refused, want 10", len(got))
		}
		if err := db.SetStreamRetention(ctx, "acme", 0); err != nil {
			t.Fatal(err)
		}
		if ok, err := db.DropIfExpired(ctx, "stream_points", day); !ok || err != nil {
			t.Fatalf("DropIfExpired = %v, %v; want the expired partition dropped", ok, err)
		}
		if dropped, err := db.MaintainHistory(ctx); err != nil || slices.Contains(dropped, "stream_points_"+day.Format("20060102")) {
			t.Fatalf("the maintenance after the drop dropped %v, %v", dropped, err)
		}
	})
}

// TestHistoryDropBesideALongRead: on PostgreSQL the maintenance makes
// partitions and drops an expired one while a transaction reads the
// points' table and holds its lock to its end, as a long read does; ingest
// and reads of the table go on meanwhile, where a DROP TABLE of an attached
// partition (or a CREATE TABLE … PARTITION OF) would wait for the reader
// and they behind it. The drop ends once the reader does.
func TestHistoryDropBesideALongRead(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		if b.Name != "postgres" {
			t.Skip("SQLite's maintenance runs in the one writer's jobs")
		}
		ctx := context.Background()
		clk := testclock.New(time.Date(2026, 10, 1, 10, 0, 0, 0, time.UTC))
		dbs, raw := clockedReplicas(t, b, clk)
		db := dbs[0]
		mustTenant(t, db, "acme")
		mustAlertDevices(t, db, "acme", "d1")
		day := clk.Now().Truncate(24 * time.Hour)
		if err := db.CommitStream(ctx, "acme", "d1", "env", historyPoints(day, 10, clk.Now()), nil); err != nil {
			t.Fatal(err)
		}
		now := day.AddDate(0, 0, 31).Add(12 * time.Hour)
		clk.Set(now)
		if err := db.CommitStream(ctx, "acme", "d1", "env", historyPoints(now.Add(-time.Hour), 10, now), nil); err != nil {
			t.Fatal(err)
		}
		reader, err := raw.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer reader.Rollback()
		var n int
		if err := reader.QueryRow("SELECT count(*) FROM stream_points").Scan(&n); err != nil || n != 2 {
			t.Fatalf("the reader counts %d chunks, %v; want 2", n, err)
		}
		type result struct {
			dropped []string
			err     error
		}
		done := make(chan result, 1)
		go func() {
			dropped, err := db.MaintainHistory(ctx)
			done <- result{dropped, err}
		}()
		name := "stream_points_" + day.Format("20060102")
		// The detach waits for the reader once it marked the partition.
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			var pending bool
			err := raw.QueryRow("SELECT EXISTS (SELECT 1 FROM pg_inherits WHERE inhrelid = to_regclass($1) AND inhdetachpending)", name).Scan(&pending)
			if err != nil {
				t.Fatal(err)
			}
			if pending {
				break
			}
			select {
			case r := <-done:
				t.Fatalf("the maintenance ended beside the reader: %v %v", r.dropped, r.err)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatal("the maintenance did not begin to detach the expired partition")
			}
		}
		for _, ahead := range []string{"stream_points_" + now.AddDate(0, 0, 2).Format("20060102"), "stream_rollup_1m_" + now.AddDate(0, 0, 2).Format("20060102")} {
			if !attached(t, raw, ahead, ahead[:len(ahead)-9]) {
				t.Errorf("%s was not made beside the reader", ahead)
			}
		}
		other, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if err := dbs[1].CommitStream(other, "acme", "d1", "env", historyPoints(now.Add(-30*time.Minute), 10, now), nil); err != nil {
			t.Fatalf("ingest beside the drop: %v", err)
		}
		page, err := dbs[1].FindPoints(other, "acme", "d1", "env", fleet.PointQuery{Limit: 100, From: now.Add(-2 * time.Hour)})
		if err != nil || len(page.Points) != 20 {
			t.Fatalf("a read beside the drop: %d points, %v; want 20", len(page.Points), err)
		}
		select {
		case r := <-done:
			t.Fatalf("the maintenance ended before the reader: %v %v", r.dropped, r.err)
		default:
		}
		reader.Rollback()
		r := <-done
		if r.err != nil || !slices.Equal(r.dropped, []string{name}) {
			t.Fatalf("the maintenance dropped %v, %v; want %s", r.dropped, r.err, name)
		}
		if tableExists(t, raw, name) {
			t.Fatalf("%s is left", name)
		}
	})
}

// TestHistoryDetachCutShort: a detach of an expired partition cut short
// after it marked the partition (its second transaction waited for a
// reader and was cancelled) is finished and the partition dropped by the
// next maintenance.
func TestHistoryDetachCutShort(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		if b.Name != "postgres" {
			t.Skip("a detach is PostgreSQL's")
		}
		ctx := context.Background()
		clk := testclock.New(time.Date(2026, 10, 1, 10, 0, 0, 0, time.UTC))
		dbs, raw := clockedReplicas(t, b, clk)
		db := dbs[0]
		mustTenant(t, db, "acme")
		mustAlertDevices(t, db, "acme", "d1")
		day := clk.Now().Truncate(24 * time.Hour)
		if err := db.CommitStream(ctx, "acme", "d1", "env", historyPoints(day, 10, clk.Now()), nil); err != nil {
			t.Fatal(err)
		}
		clk.Set(day.AddDate(0, 0, 31).Add(12 * time.Hour))
		name := "stream_points_" + day.Format("20060102")
		reader, err := raw.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer reader.Rollback()
		if _, err := reader.Exec("SELECT count(*) FROM stream_points"); err != nil {
			t.Fatal(err)
		}
		detach, cancel := context.WithCancel(ctx)
		failed := make(chan error, 1)
		go func() {
			_, err := raw.ExecContext(detach, "ALTER TABLE stream_points DETACH PARTITION "+name+" CONCURRENTLY")
			failed <- err
		}()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			var pending bool
			err := raw.QueryRow("SELECT EXISTS (SELECT 1 FROM pg_inherits WHERE inhrelid = to_regclass($1) AND inhdetachpending)", name).Scan(&pending)
			if err != nil {
				t.Fatal(err)
			}
			if pending {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the detach did not mark the partition")
			}
		}
		cancel()
		if err := <-failed; err == nil {
			t.Fatal("the detach ended beside the reader")
		}
		reader.Rollback()
		dropped, err := db.MaintainHistory(ctx)
		if err != nil || !slices.Contains(dropped, name) {
			t.Fatalf("the maintenance dropped %v, %v; want %s", dropped, err, name)
		}
		if tableExists(t, raw, name) {
			t.Fatalf("%s is left", name)
		}
	})
}
