package sqlstore

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/fleetd/fleet"
)

// listenLocal starts a listener of l and returns what it hears; it is
// registered when listenLocal returns.
func listenLocal(t *testing.T, l *localChanges, f func(fleet.Change)) {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.listen(ctx, f); close(done) }()
	t.Cleanup(func() { stop(); <-done })
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		l.mu.Lock()
		n := len(l.subs)
		l.mu.Unlock()
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the listener did not register")
		}
	}
}

func hear(t *testing.T, heard chan fleet.Change) fleet.Change {
	t.Helper()
	select {
	case c := <-heard:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("nothing heard")
	}
	panic("unreachable")
}

func quietFor(t *testing.T, heard chan fleet.Change) {
	t.Helper()
	select {
	case c := <-heard:
		t.Fatalf("heard %+v more", c)
	case <-time.After(50 * time.Millisecond):
	}
}

// TestLocalChangesSlowListener checks that a listener that falls more than
// maxPendingChanges behind is told to drop everything, once, rather than
// hold the commit loop or grow without bound.
func TestLocalChangesSlowListener(t *testing.T) {
	var l localChanges
	heard := make(chan fleet.Change, 2*maxPendingChanges) // never blocks the listener
	release := make(chan struct{})
	first := true
	listenLocal(t, &l, func(c fleet.Change) {
		heard <- c
		if first {
			first = false
			<-release // busy while the others are published
		}
	})
	l.publish([]fleet.Change{{Kind: fleet.ChangeDevice, Key: "first"}})
	if c := hear(t, heard); c.Key != "first" {
		t.Fatalf("heard %+v, want the first change", c)
	}
	many := make([]fleet.Change, maxPendingChanges)
	for i := range many {
		many[i] = fleet.Change{Kind: fleet.ChangeDevice, Key: "many"}
	}
	l.publish(many)
	l.publish([]fleet.Change{{Kind: fleet.ChangeDevice, Key: "one too many"}})
	close(release)
	if c := hear(t, heard); c.Kind != fleet.ChangeAll {
		t.Fatalf("heard %+v, want %s after the queue overflowed", c, fleet.ChangeAll)
	}
	quietFor(t, heard)
}

// TestLocalChangesRolledBack checks that on SQLite a job rolled back to its
// savepoint announces nothing, while its neighbour in the batch does.
func TestLocalChangesRolledBack(t *testing.T) {
	ctx := context.Background()
	db := openLocal(t, 0)
	heard := make(chan fleet.Change, 10)
	listenLocal(t, &db.local, func(c fleet.Change) { heard <- c })

	newJob := func(key string, fail bool) *job {
		return &job{ctx: ctx, done: make(chan error, 1), fn: func(ctx context.Context, tx *Tx) error {
			if err := tx.changed(ctx, fleet.Change{Kind: fleet.ChangeDevice, Key: key}); err != nil {
				return err
			}
			if fail {
				return errors.New("the job fails after announcing")
			}
			return nil
		}}
	}
	errs, err := db.tryBatch(nil, []*job{newJob("rolled back", true), newJob("committed", false)})
	if err != nil || errs[0] == nil || errs[1] != nil {
		t.Fatalf("tryBatch = %v, %v; want the first job alone to fail", errs, err)
	}
	if c := hear(t, heard); c.Key != "committed" {
		t.Fatalf("heard %+v, want only the committed job's change", c)
	}
	quietFor(t, heard)
}

// openLocal opens a SQLite store in the test's directory, closed when the
// test ends, with its migrations applied up to number last (0: none).
func openLocal(t *testing.T, last int) *DB {
	t.Helper()
	db, err := Open(context.Background(), filepath.Join(t.TempDir(), "fleetd.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.migrate(context.Background(), last); err != nil {
		t.Fatal(err)
	}
	return db
}
