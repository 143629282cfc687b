package sqlstore_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/internal/poll"
	"github.com/fleetd/fleet/sqlstore"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestWriteRacingClose writes while the store closes, and then after it
// closed. Every write answers: committed, or the store's unavailable error
// (a 503) for one that did not run; none waits forever, and none runs
// after Close. A write whose job is queued after the commit loops drained
// the queue and returned (a retry queued again after its pause, say) is
// the one that waited forever before f642b9c: past Close, a write's select
// between queueing and the stop is a coin toss, so the test writes until
// Stats().Queued shows it took the queue several times.
func TestWriteRacingClose(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		ctx := context.Background()
		dsn := b.DSN(t)
		db, err := sqlstore.Open(ctx, dsn, sqlstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Migrate(ctx); err != nil {
			db.Close()
			t.Fatal(err)
		}
		created := map[string]bool{} // the tenants whose write answered nil
		var mu sync.Mutex
		write := func(name string) error {
			_, _, err := db.CreateTenant(ctx, name)
			switch {
			case err == nil:
				mu.Lock()
				created[name] = true
				mu.Unlock()
			case fleet.ErrorCode(err) != fleet.EUNAVAILABLE:
				t.Errorf("CreateTenant(%s) as the store closes: %v, want %s", name, err, fleet.EUNAVAILABLE)
			}
			return err
		}
		// answered waits for a write to answer, failing the test if it
		// waits forever.
		answered := func(what string, res <-chan error) error {
			t.Helper()
			var err error
			poll.Until(t, 30*time.Second, what+" to answer", func() bool {
				select {
				case err = <-res:
					return true
				default:
					return false
				}
			})
			return err
		}

		// Writers racing Close.
		var wg sync.WaitGroup
		started := make(chan struct{}, 8)
		for w := range 8 {
			wg.Go(func() {
				started <- struct{}{}
				for i := range 1000 {
					if err := write(fmt.Sprintf("race-%d-%d", w, i)); err != nil {
						return
					}
				}
			})
		}
		for range 8 {
			<-started
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		writersDone := make(chan error, 1)
		go func() { wg.Wait(); writersDone <- nil }()
		answered("the writers racing Close", writersDone)

		// Writes after Close, until several were queued.
		for queued := 0; queued < 3; {
			before := db.Stats().Queued
			res := make(chan error, 1)
			name := fmt.Sprintf("after-%d", queued)
			go func() { res <- write(name) }()
			if err := answered("a write after Close", res); fleet.ErrorCode(err) != fleet.EUNAVAILABLE {
				t.Fatalf("CreateTenant after Close: %v, want %s", err, fleet.EUNAVAILABLE)
			}
			if db.Stats().Queued > before {
				queued++
			}
		}

		// What answered nil committed; nothing else ran.
		db, err = sqlstore.Open(ctx, dsn, sqlstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		tenants, err := db.FindTenants(ctx)
		if err != nil {
			t.Fatal(err)
		}
		found := map[string]bool{}
		for _, tn := range tenants {
			if strings.HasPrefix(tn.Name, "race-") || strings.HasPrefix(tn.Name, "after-") {
				found[tn.Name] = true
				if !created[tn.Name] {
					t.Errorf("tenant %s exists, but its write answered unavailable", tn.Name)
				}
			}
		}
		for name := range created {
			if !found[name] {
				t.Errorf("tenant %s's write answered nil, but it is not there", name)
			}
		}
		t.Logf("%d writes committed before Close", len(created))
	})
}
