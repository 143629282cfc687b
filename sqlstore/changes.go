package sqlstore

import (
	"context"
	"database/sql/driver"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleet"
	"github.com/jackc/pgx/v5/stdlib"
)

// Changes travel on one PostgreSQL notification channel per schema,
// "fleetd_{schema}", so that databases shared by several installations (or
// tests, each in its own schema) do not hear each other. A payload is
// "kind\ttenant\tkey": none of the three contains a tab.

// changed announces c to every replica when the transaction commits; a
// job rolled back to its savepoint announces nothing. SQLite has no other
// process to tell, but this process's listeners hear it all the same.
func (tx *Tx) changed(ctx context.Context, c fleet.Change) error {
	if tx.db.dialect != postgres {
		tx.changes = append(tx.changes, c)
		return nil
	}
	_, err := tx.exec(ctx, "SELECT pg_notify('fleetd_' || current_schema(), CAST(? AS TEXT))", c.Kind+"\t"+c.Tenant+"\t"+c.Key)
	return err
}

// Listen calls f with every change any replica commits until ctx ends, and
// with fleet.ChangeAll whenever it (re)connects, since changes made while it
// was not listening are lost. The store drops its own caches first. On
// SQLite the only replica is this process, so f hears what it commits.
func (db *DB) Listen(ctx context.Context, f func(fleet.Change)) {
	if db.dialect != postgres {
		db.local.listen(ctx, f)
		return
	}
	var wait time.Duration
	for ctx.Err() == nil {
		err := db.listenOnce(ctx, func(c fleet.Change) {
			db.applyChange(c)
			f(c)
		})
		if ctx.Err() != nil {
			return
		}
		wait = min(max(2*wait, 100*time.Millisecond), 10*time.Second)
		db.log.Warn("listening for other replicas' changes failed; caches fall back on their TTLs until it resumes", "err", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// listenOnce holds one connection with LISTEN until it fails or ctx ends.
func (db *DB) listenOnce(ctx context.Context, f func(fleet.Change)) error {
	conn, err := db.write.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Raw(func(dc any) error {
		pc := dc.(*stdlib.Conn).Conn()
		var schema string
		if err := pc.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
			return err
		}
		channel := "fleetd_" + schema
		if _, err := pc.Exec(ctx, "LISTEN "+quoteIdent(channel)); err != nil {
			return err
		}
		// The connection goes back to the pool when this returns; it must
		// not keep listening there.
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			pc.Exec(ctx, "UNLISTEN *")
		}()
		f(fleet.Change{Kind: fleet.ChangeAll})
		for {
			n, err := pc.WaitForNotification(ctx)
			if err != nil {
				if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
					// The connection is in an unknown state after an
					// interrupted wait; do not pool it.
					return errors.Join(err, driver.ErrBadConn)
				}
				return err
			}
			kind, rest, _ := strings.Cut(n.Payload, "\t")
			tenant, key, _ := strings.Cut(rest, "\t")
			f(fleet.Change{Kind: kind, Tenant: tenant, Key: key})
		}
	})
}

// applyChange drops what this store caches of c.
func (db *DB) applyChange(c fleet.Change) {
	switch c.Kind {
	case fleet.ChangeAPIKey:
		db.authCache.forget(c.Key)
	case fleet.ChangeAll:
		db.authCache.clear()
	}
}

// clear forgets every cached key.
func (c *authCache) clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	c.m = nil
}

func quoteIdent(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// localChanges hands the changes this process commits to its listeners,
// on SQLite. The commit loop must never wait for a listener, so each has a
// queue; one that falls far behind is told to drop everything instead.
type localChanges struct {
	mu   sync.Mutex
	subs map[*changeQueue]bool
}

type changeQueue struct {
	mu      sync.Mutex
	pending []fleet.Change
	ready   chan struct{} // signalled when pending grows
}

// maxPendingChanges bounds a slow listener's queue.
const maxPendingChanges = 10_000

func (l *localChanges) publish(cs []fleet.Change) {
	if len(cs) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for q := range l.subs {
		q.mu.Lock()
		if len(q.pending)+len(cs) > maxPendingChanges {
			q.pending = append(q.pending[:0], fleet.Change{Kind: fleet.ChangeAll})
		} else {
			q.pending = append(q.pending, cs...)
		}
		q.mu.Unlock()
		select {
		case q.ready <- struct{}{}:
		default:
		}
	}
}

func (l *localChanges) listen(ctx context.Context, f func(fleet.Change)) {
	q := &changeQueue{ready: make(chan struct{}, 1)}
	l.mu.Lock()
	if l.subs == nil {
		l.subs = map[*changeQueue]bool{}
	}
	l.subs[q] = true
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		delete(l.subs, q)
		l.mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-q.ready:
		}
		q.mu.Lock()
		cs := q.pending
		q.pending = nil
		q.mu.Unlock()
		for _, c := range cs {
			f(c)
		}
	}
}
