package sqlstore

import (
	"container/list"
	"context"
	"database/sql"
	"sync"
)

// stmtCache keeps statements prepared on one *sql.DB, by query text, the
// most recently used ones up to a bound. SQLite parses and plans a
// statement every time it runs one that is not prepared, and for the small
// statements of the hot paths (a status report, a delivery receipt, a
// stream's latest point) that costs more than running it. PostgreSQL does
// not need it: pgx prepares and caches statements per connection itself.
//
// database/sql prepares a cached statement once per connection it runs
// on, and keeps it until the statement is closed; a statement evicted
// while a transaction uses it is closed when that transaction ends.
//
// Preparing takes a free connection of the pool, so a caller that holds one
// (a transaction) must never wait for it: when every connection is held by
// a transaction that waits to prepare, none is ever freed. Such a caller's
// miss runs unprepared and is noted, and is prepared by someone who holds
// nothing. The writer's cache (SQLite's writer is one connection, always
// held by the transaction that asks) leaves that to the commit loop, between
// transactions (prepareWanted); the read cache to a goroutine of its own
// (prepareAside).
type stmtCache struct {
	db   *sql.DB
	max  int
	late bool // every caller holds a connection; prepareWanted prepares

	mu        sync.Mutex
	m         map[string]*list.Element // of *cachedStmt
	lru       list.List                // front: most recently used
	wanted    map[string]bool
	preparing bool // prepareAside runs
}

type cachedStmt struct {
	query string
	stmt  *sql.Stmt
}

// maxCachedQuery bounds the length of the queries kept prepared: longer
// ones are the rare, large statements (a bulk insert of 200 devices) that
// are not worth the memory.
const maxCachedQuery = 8 << 10

func newStmtCache(db *sql.DB, max int, late bool) *stmtCache {
	return &stmtCache{db: db, max: max, late: late, m: map[string]*list.Element{}, wanted: map[string]bool{}}
}

// get returns query prepared, or nil if it is not (yet): the caller then
// runs it unprepared and sees the error, if any. held says the caller holds
// one of the pool's connections: a miss is then prepared later, by another.
func (c *stmtCache) get(ctx context.Context, query string, held bool) *sql.Stmt {
	if c == nil || len(query) > maxCachedQuery {
		return nil
	}
	c.mu.Lock()
	if e, ok := c.m[query]; ok {
		c.lru.MoveToFront(e)
		st := e.Value.(*cachedStmt).stmt
		c.mu.Unlock()
		return st
	}
	if c.late || held {
		if len(c.wanted) < c.max {
			c.wanted[query] = true
		}
		aside := !c.late && !c.preparing
		c.preparing = c.preparing || aside
		c.mu.Unlock()
		if aside {
			go c.prepareAside()
		}
		return nil
	}
	c.mu.Unlock()
	return c.prepare(ctx, query)
}

// prepareAside prepares the queries that callers holding a connection
// missed, until none is left; it holds no connection while it waits for
// one.
func (c *stmtCache) prepareAside() {
	for {
		c.mu.Lock()
		if len(c.wanted) == 0 {
			c.preparing = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		c.prepareWanted(context.Background())
	}
}

// prepareWanted prepares the queries get missed since the last call; the
// writer's commit loop calls it while it holds no transaction.
func (c *stmtCache) prepareWanted(ctx context.Context) {
	if c == nil {
		return
	}
	c.mu.Lock()
	if len(c.wanted) == 0 {
		c.mu.Unlock()
		return
	}
	wanted := c.wanted
	c.wanted = map[string]bool{}
	c.mu.Unlock()
	for q := range wanted {
		c.prepare(ctx, q)
	}
}

// prepare prepares query, outside the lock (it may wait for a
// connection), and keeps it.
func (c *stmtCache) prepare(ctx context.Context, query string) *sql.Stmt {
	st, err := c.db.PrepareContext(ctx, query)
	if err != nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[query]; ok { // prepared meanwhile by another caller
		st.Close()
		c.lru.MoveToFront(e)
		return e.Value.(*cachedStmt).stmt
	}
	c.m[query] = c.lru.PushFront(&cachedStmt{query: query, stmt: st})
	for c.lru.Len() > c.max {
		old := c.lru.Remove(c.lru.Back()).(*cachedStmt)
		delete(c.m, old.query)
		old.stmt.Close()
	}
	return st
}

// close closes every cached statement.
func (c *stmtCache) close() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for e := c.lru.Front(); e != nil; e = e.Next() {
		e.Value.(*cachedStmt).stmt.Close()
	}
	c.m = map[string]*list.Element{}
	c.lru.Init()
}
