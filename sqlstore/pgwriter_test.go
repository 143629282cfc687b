package sqlstore_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/poll"
	"github.com/fleetd/fleet/sqlstore"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestPostgresWriterLosesItsConnection ends the commit loop's connection
// between two batches, while it waits for the next one in the transaction
// its last COMMIT began: killed by an operator (pg_terminate_backend), or
// by the server's idle_in_transaction_session_timeout. The next writes,
// one alone and then several together, must commit, on a connection of
// their own, each exactly once.
func TestPostgresWriterLosesItsConnection(t *testing.T) {
	pg := sqlstoretest.Postgres(t, "a test of the PostgreSQL writer")
	admin, err := sql.Open("pgx", os.Getenv("FLEETD_TEST_POSTGRES"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()

	for _, tc := range []struct {
		name    string
		timeout string // the store's sessions' idle_in_transaction_session_timeout
		kill    bool   // whether to terminate the commit loop's connection
	}{
		{"terminated", "", true},
		{"idle timeout", "250ms", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			// The store's sessions carry a name of the test's own, by which
			// the commit loop's is found among other tests'.
			b := make([]byte, 6)
			rand.Read(b)
			app := "fleetd-test-" + hex.EncodeToString(b)
			dsn := pg.DSN(t)
			// Migrated first, without the timeout: a migration's
			// transaction waits between its statements.
			db, err := sqlstore.Open(ctx, dsn, sqlstore.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := db.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			db.Close()
			u, err := url.Parse(dsn)
			if err != nil {
				t.Fatal(err)
			}
			q := u.Query()
			q.Set("application_name", app)
			if tc.timeout != "" {
				q.Set("idle_in_transaction_session_timeout", tc.timeout)
			}
			u.RawQuery = q.Encode()
			db, err = sqlstore.Open(ctx, u.String(), sqlstore.Options{Writers: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			want := []string{}
			write := func(name string) error {
				_, _, err := db.CreateTenant(ctx, name)
				return err
			}
			for round := range 3 {
				if err := write(fmt.Sprintf("before-%d", round)); err != nil {
					t.Fatal(err)
				}
				want = append(want, fmt.Sprintf("before-%d", round))
				// The commit loop's connection waits in the transaction
				// its COMMIT began, until it is ended.
				const waiting = "FROM pg_stat_activity WHERE application_name = $1 AND state = 'idle in transaction' AND query = 'COMMIT; BEGIN'"
				if tc.kill {
					var pid int
					if err := admin.QueryRow("SELECT pid "+waiting, app).Scan(&pid); err != nil {
						t.Fatalf("the commit loop's connection in its transaction: %v", err)
					}
					if _, err := admin.Exec("SELECT pg_terminate_backend($1)", pid); err != nil {
						t.Fatal(err)
					}
				}
				poll.Until(t, 10*time.Second, "the commit loop's connection to end", func() bool {
					var n int
					return admin.QueryRow("SELECT count(*) "+waiting, app).Scan(&n) == nil && n == 0
				})
				if round%2 == 0 {
					// One write alone.
					name := fmt.Sprintf("alone-%d", round)
					if err := write(name); err != nil {
						t.Errorf("a write after the commit loop's connection ended: %v", err)
					} else {
						want = append(want, name)
					}
					continue
				}
				// Several at once, which may share a batch.
				var wg sync.WaitGroup
				var mu sync.Mutex
				for i := range 8 {
					name := fmt.Sprintf("together-%d-%d", round, i)
					wg.Go(func() {
						if err := write(name); err != nil {
							t.Errorf("a write after the commit loop's connection ended: %v", err)
							return
						}
						mu.Lock()
						want = append(want, name)
						mu.Unlock()
					})
				}
				wg.Wait()
			}
			tenants, err := db.FindTenants(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, tn := range tenants {
				got = append(got, tn.Name)
			}
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("tenants %q, want %q", got, want)
			}
		})
	}
}

// TestPostgresWritersReportTheirStatistics keeps the commit loop busy,
// never idle for a second, and waits for PostgreSQL's statistics of the
// table it writes to count its writes: autovacuum and autoanalyze act on
// nothing else. A backend reports them only when it goes idle outside a
// transaction, and a commit loop whose every COMMIT began the next
// transaction never did while there was work.
func TestPostgresWritersReportTheirStatistics(t *testing.T) {
	pg := sqlstoretest.Postgres(t, "a test of the PostgreSQL writer")
	ctx := context.Background()
	dsn := pg.DSN(t)
	db, err := sqlstore.Open(ctx, dsn, sqlstore.Options{Writers: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	stats := openRaw(t, pg, dsn) // the test's schema, whose tenants table is the store's

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, _, err := db.CreateTenant(ctx, fmt.Sprintf("busy-%d", i)); err != nil {
				t.Error(err)
				return
			}
		}
	})
	defer wg.Wait()
	defer close(stop)
	poll.Until(t, 10*time.Second, "PostgreSQL's statistics to count the busy commit loop's inserts", func() bool {
		var n int64
		err := stats.QueryRow("SELECT n_tup_ins FROM pg_stat_user_tables WHERE relid = 'tenants'::regclass").Scan(&n)
		return err == nil && n > 0
	})
}
