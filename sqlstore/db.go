// Package sqlstore keeps fleetd's state in SQL: SQLite (modernc.org/sqlite,
// WAL, synchronous=FULL) by default and PostgreSQL (pgx) when the database is
// a postgres:// URL. One implementation serves both; the few places where the
// dialects differ are methods of dialect.
//
// Every write goes through a group commit: concurrent writers queue their
// work, one goroutine per writer connection runs a batch of it in a single
// transaction (each piece inside its own savepoint, so one failure does not
// spoil the others) and commits once. A caller returns only after the commit,
// so a 2xx is on disk, and the fsync is shared by the whole batch.
package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetd/fleet"
	"github.com/jackc/pgx/v5/stdlib" // registers "pgx"
	_ "modernc.org/sqlite"           // registers "sqlite"
)

// Options tune a DB; the zero value is the production default.
type Options struct {
	// Writers is the number of concurrent write transactions. SQLite has one
	// writer whatever this says; PostgreSQL defaults to 4.
	Writers int
	// MaxBatch caps the writes that share one transaction.
	MaxBatch int
	// Logger receives slow or failed batches; nil discards.
	Logger *slog.Logger
	// Now is the clock, injectable for tests.
	Now func() time.Time
	// CheckpointInterval is how often SQLite's WAL is checkpointed
	// (PASSIVE, off the writer); 0 is 200 ms.
	CheckpointInterval time.Duration
	// WALLimit is the size in bytes past which the WAL is restarted from
	// its beginning (a RESTART checkpoint while the writer waits between
	// two batches); 0 is 128 MiB, negative never. The file is kept up to
	// half again this size (journal_size_limit).
	WALLimit int64
	// StreamRetention is how long stream points are kept, for tenants
	// without a retention of their own; 0 is fleet.DefaultStreamRetention.
	StreamRetention time.Duration

	// checkpointTicks, when set, stands for the checkpoint loop's ticker,
	// for tests that run the loop a tick at a time.
	checkpointTicks <-chan time.Time
}

// DB is fleetd's SQL store. It implements the services of package fleet.
type DB struct {
	dialect dialect
	write   *sql.DB // SQLite: exactly one connection
	read    *sql.DB // SQLite: a pool of query-only connections; PostgreSQL: = write
	now     func() time.Time
	log     *slog.Logger

	jobs     chan *job
	maxBatch int
	// shadowCalls are single shadow writes for the shadow workers, which
	// batch them (shadow_batch.go); unbuffered: a sent call always has a
	// worker.
	shadowCalls chan *shadowCall
	shadowWG    sync.WaitGroup // the shadow workers: they end after the commit loops (Close)
	// shadowsGrown counts, on PostgreSQL, the shadows this process made
	// since it last refreshed the statistics of device_shadows.
	shadowsGrown growth
	// analyzed is what this process knows of PostgreSQL's statistics
	// (analyzeAfterWrite); analyzeWG its ANALYZEs in the background, which
	// Close cancels and waits for.
	analyzed  tableStats
	analyzeWG sync.WaitGroup
	stop      chan struct{}
	stopped   chan struct{} // closed once the loops have returned: no queued job runs after it
	wg        sync.WaitGroup

	// SQLite only: statements kept prepared (stmtcache.go), and the
	// connection that checkpoints the WAL off the writer's path, and the
	// database file, which the checkpoint loop syncs (checkpointLoop).
	// The file is closed only after every connection: closing a
	// descriptor of it drops the process's POSIX locks on it, SQLite's
	// too.
	writeStmts, readStmts *stmtCache
	checkpoint            *sql.DB
	file                  *os.File
	checkpointEvery       time.Duration
	checkpointTicks       <-chan time.Time // Options.checkpointTicks
	walLimit              int64            // frames
	// restart is how the checkpoint loop asks the commit loop to wait
	// between two batches: it sends a channel, which it closes once the
	// WAL was restarted.
	restart chan chan struct{}

	authCache authCache
	history   historyState
	local     localChanges // changes committed here, for Listen on SQLite
	stats     writeStats
	countSlot atomic.Uint32 // the last slot of device_action_counts written (Tx.flushCounts)
	// reportsReadFirst, set by tests, applies every status report
	// through the locking SELECT and Go's state machine (advanceReports).
	reportsReadFirst bool
}

// Open connects to the database named by dsn: a postgres:// (or
// postgresql://) URL, or else a SQLite file path. It does not migrate.
func Open(ctx context.Context, dsn string, opt Options) (*DB, error) {
	db := &DB{now: opt.Now, log: opt.Logger, maxBatch: opt.MaxBatch, stop: make(chan struct{}), stopped: make(chan struct{})}
	if db.now == nil {
		db.now = time.Now
	}
	if db.log == nil {
		db.log = slog.New(slog.DiscardHandler)
	}
	if db.maxBatch <= 0 {
		db.maxBatch = 512
	}
	db.history.retention, db.history.tenants = opt.StreamRetention, map[string]tenantRetention{}
	db.history.maxSeries = fleet.MaxSeriesBuckets
	db.history.tenMinutesFrom.Store(-1)
	db.history.wake = make(chan struct{}, 1)
	if db.history.retention <= 0 {
		db.history.retention = fleet.DefaultStreamRetention
	}
	db.checkpointEvery, db.walLimit = opt.CheckpointInterval, opt.WALLimit/sqlitePage
	db.checkpointTicks = opt.checkpointTicks
	if db.checkpointEvery <= 0 {
		db.checkpointEvery = 200 * time.Millisecond
	}
	switch {
	case opt.WALLimit == 0:
		// Each restart syncs the database file first, and the writer's
		// commits wait behind that sync's writes: the fewer restarts, the
		// fewer such stalls (docs/benchmarks-notebook.md, "The WAL's
		// restarts and S10's random tail").
		db.walLimit = 128 << 20 / sqlitePage
	case opt.WALLimit < 0:
		db.walLimit = -1
	}
	writers := opt.Writers
	var err error
	if isPostgres(dsn) {
		db.dialect = postgres
		if writers <= 0 {
			writers = 4
		}
		connector, err := newPGConnector(dsn)
		if err != nil {
			return nil, fmt.Errorf("open postgres: %w", err)
		}
		db.write = sql.OpenDB(connector)
		db.write.SetMaxOpenConns(writers + 16)
		db.write.SetMaxIdleConns(writers + 16)
		db.read = db.write
	} else {
		db.dialect = sqlite
		writers = 1
		if err := registerSQLiteFunctions(); err != nil {
			return nil, fmt.Errorf("sqlite functions: %w", err)
		}
		if err := os.MkdirAll(filepath.Dir(dsn), 0o755); err != nil {
			return nil, fmt.Errorf("create database directory: %w", err)
		}
		pragmas := "_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=busy_timeout(10000)&_pragma=foreign_keys(1)"
		// The writer does not checkpoint: a checkpoint in a commit holds
		// up every writer of the batch behind it (a dispatch to a million
		// devices leaves a WAL that takes seconds to copy back). The
		// checkpoint loop does it on a connection of its own instead.
		// Statement journals stay in memory (temp_store): a multi-row
		// UPDATE of a batch keeps one of the pages it changes, and past
		// 64 KiB SQLite would spill it to a temporary file, a write
		// system call per page.
		// journal_size_limit: a WAL restarted from its beginning is cut
		// back to half again the limit, so that what a large write left
		// (a dispatch to a million devices: 240 MB) is bounded, while the
		// WAL of a steady load, which passes the limit by what is written
		// until the checkpoint loop restarts it, is reused as it is: cut
		// and grown again, each restart's first commits waited for the
		// file system to free and allocate its blocks.
		db.write, err = sql.Open("sqlite", "file:"+dsn+"?"+pragmas+"&_pragma=wal_autocheckpoint(0)&_pragma=temp_store(MEMORY)&_txlock=immediate"+
			fmt.Sprintf("&_pragma=journal_size_limit(%d)", max(db.walLimit*sqlitePage*3/2, -1)))
		if err != nil {
			return nil, fmt.Errorf("open sqlite: %w", err)
		}
		db.write.SetMaxOpenConns(1)
		db.write.SetMaxIdleConns(1)
		db.write.SetConnMaxLifetime(0)
		db.read, err = sql.Open("sqlite", "file:"+dsn+"?"+pragmas+"&_pragma=query_only(1)")
		if err != nil {
			db.write.Close()
			return nil, fmt.Errorf("open sqlite: %w", err)
		}
		db.read.SetMaxOpenConns(4)
		db.read.SetMaxIdleConns(4)
		// The checkpointer waits at most 100 ms for readers to move off
		// the WAL (a RESTART); past that it gives up until the next time.
		db.checkpoint, err = sql.Open("sqlite", "file:"+dsn+"?"+strings.Replace(pragmas, "busy_timeout(10000)", "busy_timeout(100)", 1))
		if err != nil {
			db.closeConns()
			return nil, fmt.Errorf("open sqlite: %w", err)
		}
		db.checkpoint.SetMaxOpenConns(1)
		db.writeStmts = newStmtCache(db.write, 256, true)
		db.readStmts = newStmtCache(db.read, 256, false)
	}
	if err := db.write.PingContext(ctx); err != nil {
		db.closeConns()
		return nil, fmt.Errorf("connect to %s database: %w", db.dialect, err)
	}
	if db.dialect == sqlite {
		if db.file, err = os.Open(dsn); err != nil {
			db.closeConns()
			return nil, fmt.Errorf("open sqlite: %w", err)
		}
	}
	db.jobs = make(chan *job, 4*db.maxBatch)
	db.restart = make(chan chan struct{})
	for range writers {
		db.wg.Add(1)
		go db.commitLoop()
	}
	db.shadowCalls = make(chan *shadowCall)
	for range shadowWorkers {
		db.shadowWG.Add(1)
		go db.shadowWorker()
	}
	if db.checkpoint != nil {
		db.wg.Add(1)
		go db.checkpointLoop()
	}
	return db, nil
}

func isPostgres(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

// Dialect names the database in use: "sqlite" or "postgres".
func (db *DB) Dialect() string { return db.dialect.String() }

// Close waits for queued writes to commit, then closes the connections.
func (db *DB) Close() error {
	close(db.stop)
	db.wg.Wait()
	close(db.stopped)
	// A shadow worker may wait for a job queued as the loops drained;
	// stopped has answered it.
	db.shadowWG.Wait()
	db.analyzed.close()
	db.analyzeWG.Wait()
	db.writeStmts.close()
	db.readStmts.close()
	return db.closeConns()
}

func (db *DB) closeConns() error {
	err := db.write.Close()
	if db.read != db.write && db.read != nil {
		err = errors.Join(err, db.read.Close())
	}
	if db.checkpoint != nil {
		err = errors.Join(err, db.checkpoint.Close())
	}
	if db.file != nil {
		err = errors.Join(err, db.file.Close())
	}
	return err
}

// sqlitePage is SQLite's page size, and so the size of a WAL frame (its
// 24-byte header aside).
const sqlitePage = 4096

// checkpointLoop checkpoints SQLite's WAL until Close, and once more at
// the end, on a connection of its own: the writer never checkpoints.
//
// PASSIVE never waits for readers or the writer: it copies back what it
// can, while the writer goes on appending. But a WAL is reused from its
// start only by a writer that begins when every frame has been copied
// back and no reader still reads from it, and under a steady load the
// writer has always appended again while the checkpoint ran: the WAL then
// grows without end (900 MB in 10 s of random reports on 100,000 device
// actions, BenchmarkReportRandom), every commit extends the file, and every
// page lookup searches a longer WAL index. So past WALLimit the loop asks the commit
// loop to wait after its current batch, runs a RESTART checkpoint (which
// copies only what was committed since the PASSIVE one just before, waits
// at most busy_timeout for readers to leave the WAL, and leaves it to be
// reused), and lets the commit loop go on.
//
// SQLite syncs the database file only in a checkpoint that copies the WAL
// to its end, which under load is the RESTART alone: it would sync every
// page the PASSIVE checkpoints copied since the last restart while the
// writer waits (53 ms a restart in fleetbench's s10-random, a few hundred
// frames left to copy). So the loop first syncs the database file itself
// and copies what was appended meanwhile, until that is little: the
// RESTART then copies and syncs only what the last batch appended.
func (db *DB) checkpointLoop() {
	defer db.wg.Done()
	ticks := db.checkpointTicks
	if ticks == nil {
		t := time.NewTicker(db.checkpointEvery)
		defer t.Stop()
		ticks = t.C
	}
	var restarted int64 // the WAL's frames at the last RESTART
	run := func() {
		frames, copied := db.checkpointWAL("PASSIVE")
		if db.walLimit < 0 || frames <= db.walLimit || frames == restarted {
			// Under the limit; or nothing was written since the last
			// restart, whose WAL the next writer will reuse.
			return
		}
		// Sync what was copied, and copy what was appended meanwhile,
		// until that is little; then sync that too.
		var synced int64 // frames copied back and synced
		for round := 0; copied > synced; round++ {
			if err := db.file.Sync(); err != nil {
				db.log.Warn("sync the SQLite database", "err", err)
				return
			}
			small := copied-synced < restartBacklog
			synced = copied
			if small || round == 3 {
				break
			}
			_, copied = db.checkpointWAL("PASSIVE")
		}
		paused := make(chan struct{})
		asked := db.now()
		select {
		case db.restart <- paused:
		case <-db.stop:
			return
		}
		if db.now().Sub(asked) > db.checkpointEvery {
			// The commit loop was in a long batch (a dispatch to a
			// million devices writes 240 MB of WAL): what it committed
			// meanwhile is more than a RESTART should copy and sync
			// while every write waits. Let it go on, and copy that
			// back off its path first, at the next tick.
			close(paused)
			return
		}
		t0 := time.Now()
		restarted, _ = db.checkpointWAL("RESTART")
		close(paused)
		db.stats.restarts.Add(1)
		db.stats.restartNanos.Add(uint64(time.Since(t0)))
		db.stats.restartFrames.Add(uint64(max(restarted-synced, 0)))
	}
	for {
		select {
		case <-ticks:
			run()
		case <-db.stop:
			db.checkpointWAL("PASSIVE")
			return
		}
	}
}

// restartBacklog is how few frames a PASSIVE checkpoint must have copied
// for the checkpoint loop to sync them and restart the WAL, rather than
// sync and copy once more.
const restartBacklog = 256

// checkpointWAL runs a checkpoint of mode and returns the frames the WAL
// held and those copied back into the database.
func (db *DB) checkpointWAL(mode string) (frames, done int64) {
	t0 := time.Now()
	var busy int64
	if err := db.checkpoint.QueryRow("PRAGMA wal_checkpoint("+mode+")").Scan(&busy, &frames, &done); err != nil {
		db.log.Warn("checkpoint the SQLite WAL", "mode", mode, "err", err)
		return 0, 0
	}
	db.stats.walFrames.Store(frames)
	for {
		m := db.stats.walMaxFrames.Load()
		if frames <= m || db.stats.walMaxFrames.CompareAndSwap(m, frames) {
			break
		}
	}
	db.log.Debug("checkpoint", "start", t0, "took", time.Since(t0), "mode", mode, "busy", busy, "frames", frames, "done", done)
	return frames, done
}

// Ping reports whether the database answers; readiness probes call it.
func (db *DB) Ping(ctx context.Context) error {
	if err := db.write.PingContext(ctx); err != nil {
		return fleet.Errorf(fleet.EUNAVAILABLE, "database unreachable")
	}
	return nil
}

// Tx is a write transaction's view for one piece of work in a batch.
type Tx struct {
	tx      txConn
	db      *DB
	now     time.Time      // the batch's clock reading, shared by all its writes
	changes []fleet.Change // announced in-process after the commit (SQLite)
	counts  []countDelta   // written to device_action_counts before the commit
	start   time.Time      // when the transaction began, for WriteStats
}

// stmt returns query prepared for this transaction, or nil when it is not
// kept prepared (PostgreSQL; or not yet). On SQLite it also drops the
// context's cancellation: a job runs to its end once started (see update),
// and the driver would watch a cancellable context with a goroutine per
// statement.
func (tx *Tx) stmt(ctx context.Context, query string) (context.Context, *sql.Stmt) {
	if tx.db.writeStmts == nil {
		return ctx, nil
	}
	ctx = context.WithoutCancel(ctx)
	if st := tx.db.writeStmts.get(ctx, query, true); st != nil {
		return ctx, tx.tx.(*sql.Tx).StmtContext(ctx, st) // SQLite's writer is a *sql.Tx
	}
	return ctx, nil
}

func (tx *Tx) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return tx.execBound(ctx, tx.db.dialect.rebind(query), args...)
}

// execBound is exec of a query already in the dialect's placeholders
// (dialect.rebind), which it does not look up again.
func (tx *Tx) execBound(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if ctx, st := tx.stmt(ctx, query); st != nil {
		return st.ExecContext(ctx, args...)
	}
	return tx.tx.ExecContext(ctx, query, args...)
}

func (tx *Tx) query(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	query = tx.db.dialect.rebind(query)
	if ctx, st := tx.stmt(ctx, query); st != nil {
		return st.QueryContext(ctx, args...)
	}
	return tx.tx.QueryContext(ctx, query, args...)
}

func (tx *Tx) queryRow(ctx context.Context, query string, args ...any) *sql.Row {
	query = tx.db.dialect.rebind(query)
	if ctx, st := tx.stmt(ctx, query); st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	return tx.tx.QueryRowContext(ctx, query, args...)
}

func (db *DB) query(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	query = db.dialect.rebind(query)
	if st := db.readStmts.get(ctx, query, false); st != nil {
		return st.QueryContext(ctx, args...)
	}
	return db.read.QueryContext(ctx, query, args...)
}

func (db *DB) queryRow(ctx context.Context, query string, args ...any) *sql.Row {
	query = db.dialect.rebind(query)
	if st := db.readStmts.get(ctx, query, false); st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	return db.read.QueryRowContext(ctx, query, args...)
}

// queryRowAside runs a one-row query on a read connection of its own while
// the caller goes on with its next read; wait returns the row's Scan error
// and must be called before dest is read or the caller returns. A list's
// count and its page take the time of the longer instead of the sum, at
// the price of holding two of the read pool's connections at once.
func (db *DB) queryRowAside(ctx context.Context, query string, args []any, dest ...any) (wait func() error) {
	done := make(chan error, 1)
	go func() { done <- db.queryRow(ctx, query, args...).Scan(dest...) }()
	return func() error { return <-done }
}

// readTx is a read-only transaction that sees the database at one moment
// (SQLite's read transaction; REPEATABLE READ on PostgreSQL). Its queries
// use the read pool's prepared statements, as DB.query does, but never
// prepare one themselves: the transaction holds one of the pool's
// connections, and preparing would wait for another (see stmtCache).
type readTx struct {
	*sql.Tx
	db *DB
}

func (db *DB) readTx(ctx context.Context) (readTx, error) {
	opts := &sql.TxOptions{ReadOnly: true}
	if db.dialect == postgres {
		opts.Isolation = sql.LevelRepeatableRead
	}
	tx, err := db.read.BeginTx(ctx, opts)
	return readTx{tx, db}, db.classify(err)
}

func (tx readTx) query(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	query = tx.db.dialect.rebind(query)
	if st := tx.db.readStmts.get(ctx, query, true); st != nil {
		return tx.StmtContext(ctx, st).QueryContext(ctx, args...)
	}
	return tx.QueryContext(ctx, query, args...)
}

func (tx readTx) queryRow(ctx context.Context, query string, args ...any) *sql.Row {
	query = tx.db.dialect.rebind(query)
	if st := tx.db.readStmts.get(ctx, query, true); st != nil {
		return tx.StmtContext(ctx, st).QueryRowContext(ctx, args...)
	}
	return tx.QueryRowContext(ctx, query, args...)
}

// scanner is a row to scan: *sql.Row or *sql.Rows.
type scanner = interface{ Scan(...any) error }

// scanAll reads every row of rows with scan and closes rows; an empty
// result is an empty slice, never nil.
func scanAll[T any](rows *sql.Rows, scan func(scanner) (T, error)) ([]T, error) {
	return scanPage(rows, math.MaxInt, scan)
}

// scanPage reads the first n rows of rows with scan, as scanAll does: a
// page read with pageLimit's LIMIT may have more.
func scanPage[T any](rows *sql.Rows, n int, scan func(scanner) (T, error)) ([]T, error) {
	defer rows.Close()
	items := []T{}
	for len(items) < n && rows.Next() {
		it, err := scan(rows)
		if err != nil {
			return nil, err
		}
		items = append(items, it)
	}
	return items, rows.Err()
}

// findPage reads one page of a list and the number of all its items:
// count is a query of count(*), list one of the items in their order, to
// which findPage adds the page's LIMIT (pageLimit's) and OFFSET; both take
// args. The two
// are read in one transaction, so that the count is of the list the page
// is from. An empty page is an empty slice, never nil.
func findPage[T any](ctx context.Context, db *DB, count, list string, args []any, p fleet.Page,
	scan func(scanner) (T, error)) ([]T, int, error) {
	tx, err := db.readTx(ctx)
	if err != nil {
		return nil, 0, err
	}
	defer tx.Rollback()
	var n int
	if err := tx.queryRow(ctx, count, args...).Scan(&n); err != nil {
		return nil, 0, db.classify(err)
	}
	rows, err := tx.query(ctx, list+limitClause(pageLimit(p.Limit))+" OFFSET ?", append(args[:len(args):len(args)], p.Offset())...)
	if err != nil {
		return nil, 0, db.classify(err)
	}
	items, err := scanPage(rows, p.Limit, scan)
	return items, n, err
}

// job is one caller's piece of a batch.
type job struct {
	ctx  context.Context
	fn   func(ctx context.Context, tx *Tx) error
	done chan error
	// locks are the device actions fn locks, known before it runs (nil:
	// not known; noLocks: none): a batch of such jobs alone, two or more
	// with some, on PostgreSQL locks them all first (lockAhead), and a
	// batch of this one alone if ahead.
	locks []lockKey
	ahead bool
}

// updateAlone runs fn in a write transaction of its own on PostgreSQL, for
// the rare writes that must not share one (a deletion, lockTargets; a
// cancel, lockAhead); on SQLite,
// whose one writer serialises everything, it is update.
func (db *DB) updateAlone(ctx context.Context, fn func(ctx context.Context, tx *Tx) error) error {
	if db.dialect != postgres {
		return db.update(ctx, fn)
	}
	return db.retry(ctx, func() error {
		sqlTx, err := db.write.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		tx := &Tx{tx: sqlTx, db: db, now: db.now(), start: time.Now()}
		err = fn(ctx, tx)
		if err == nil {
			err = tx.flushCounts(ctx)
		}
		if err != nil {
			sqlTx.Rollback()
			return err
		}
		return db.commit(sqlTx, tx.start, 1)
	})
}

// commit commits a write transaction of jobs writes begun at start, and
// counts it in the write path's metrics (Stats) whichever way it ran: the
// commit loop's batch or a transaction of its own (updateAlone).
func (db *DB) commit(sqlTx writeTx, start time.Time, jobs int) error {
	if err := sqlTx.Commit(); err != nil {
		db.stats.failures.Add(1)
		db.log.Error("commit failed", "jobs", jobs, "err", err)
		return err
	}
	db.stats.commits.Add(1)
	db.stats.jobs.Add(uint64(jobs))
	db.stats.nanos.Add(uint64(time.Since(start)))
	return nil
}

// update runs fn inside a write transaction shared with other concurrent
// writers and returns once the transaction committed (or fn failed, in which
// case nothing fn did remains). fn may run more than once: if the batch's
// commit fails, the batch is retried piece by piece, and a piece the
// database chose to abort (retryable) is queued again.
func (db *DB) update(ctx context.Context, fn func(ctx context.Context, tx *Tx) error) error {
	return db.updateLocking(ctx, nil, false, fn)
}

// updateLocking is update for an fn that locks the device actions locks
// (none if empty) and, but for rare rows (a cancel's answer, answerCancel),
// no others (see lockAhead), which it should lock first even alone if
// ahead.
func (db *DB) updateLocking(ctx context.Context, locks []lockKey, ahead bool, fn func(ctx context.Context, tx *Tx) error) error {
	return db.retry(ctx, func() error {
		j := &job{ctx: ctx, fn: fn, done: make(chan error, 1), locks: locks, ahead: ahead}
		select {
		case db.jobs <- j:
		case <-ctx.Done():
			return ctx.Err()
		case <-db.stop:
			return fleet.Errorf(fleet.EUNAVAILABLE, "the server is shutting down")
		}
		// Once queued, the job runs to its end: a caller that went away must not
		// leave half a decision behind, and the loop never blocks on done.
		// Only a job queued as the loops drained for Close (a retry, after
		// its pause) may never run.
		select {
		case err := <-j.done:
			return err
		case <-db.stopped:
			select {
			case err := <-j.done: // it ran before the loops returned
				return err
			default:
				return fleet.Errorf(fleet.EUNAVAILABLE, "the server is shutting down")
			}
		}
	})
}

// A write the database aborted to break a deadlock, or as not
// serialisable, is tried again until it has been tried writeAttempts times
// and writeRetryFor has passed since its first try. A deadlock costs its
// victim PostgreSQL's deadlock_timeout (a second by default) before the
// abort, so a count alone gave up after some eight seconds: a cancel,
// which locks every device action of its action in turn, is the usual
// victim beside heavy reporting, and failed with 503 now and then
// (docs/benchmarks-notebook.md, "A cancel beside heavy reporting").
const (
	writeAttempts = 8
	writeRetryFor = 30 * time.Second
)

// retry runs attempt, a write transaction or a job of one, until it
// succeeds, fails for a reason other than the database's choice of a
// victim (retryable), or has been tried as often and as long as
// writeAttempts and writeRetryFor allow, and returns its error classified.
// PostgreSQL's writers commit in parallel, and a group commit's
// transaction locks rows for several callers one after another, in no
// order common to all transactions: two of them may wait for each other,
// and PostgreSQL then aborts one. Nothing of an aborted attempt remains,
// so it is run again, after a pause drawn at random, so that the two do
// not meet again at once.
func (db *DB) retry(ctx context.Context, attempt func() error) error {
	first := time.Now()
	for n := 1; ; n++ {
		err := attempt()
		if !retryable(err) || n >= writeAttempts && time.Since(first) >= writeRetryFor {
			return db.classify(err)
		}
		db.stats.retries.Add(1)
		pause := time.NewTimer(retryPause(n))
		select {
		case <-pause.C:
		case <-ctx.Done():
			pause.Stop()
			return ctx.Err()
		}
	}
}

// retryPause is the pause before the try after the n-th: drawn at random
// below a bound that doubles from 4 ms to 100 ms, and stays there however
// many tries writeRetryFor allows.
func retryPause(n int) time.Duration {
	return rand.N(min(2*time.Millisecond<<min(n, 6), 100*time.Millisecond))
}

func (db *DB) commitLoop() {
	defer db.wg.Done()
	var w *pgWriter
	if db.dialect == postgres {
		w = &pgWriter{db: db}
		defer w.drop()
	}
	batch := make([]*job, 0, db.maxBatch)
	for {
		var first *job
		select {
		case first = <-db.jobs:
		case paused := <-db.restart:
			<-paused
			continue
		case <-db.stop:
			// Drain what was queued before the stop.
			for {
				select {
				case first = <-db.jobs:
					db.runBatch(w, []*job{first})
				default:
					return
				}
			}
		}
		batch = append(batch[:0], first)
	fill:
		for len(batch) < db.maxBatch {
			select {
			case j := <-db.jobs:
				batch = append(batch, j)
			default:
				break fill
			}
		}
		db.runBatch(w, batch)
		// Between transactions the writer connection is free to prepare
		// what the batch ran unprepared, and the WAL to be restarted.
		db.writeStmts.prepareWanted(context.Background())
		select {
		case paused := <-db.restart:
			<-paused
		default:
		}
	}
}

// runBatch runs batch on w, PostgreSQL's connection of the commit loop
// (nil on SQLite).
func (db *DB) runBatch(w *pgWriter, batch []*job) {
	errs, err := db.tryBatch(w, batch)
	var lost *writerLost
	if errors.As(err, &lost) {
		// Nothing of it committed: once more, on a new connection.
		db.log.Warn("the commit loop's connection was lost before its commit; running the batch again", "jobs", len(batch), "err", lost.err)
		errs, err = db.tryBatch(w, batch)
	}
	if err != nil && len(batch) > 1 {
		// The commit failed as a whole; run each piece alone so one bad
		// piece cannot fail its neighbours.
		for _, j := range batch {
			db.runBatch(w, []*job{j})
		}
		return
	}
	for i, j := range batch {
		if err != nil {
			j.done <- err
		} else {
			j.done <- errs[i]
		}
	}
}

// tryBatch runs the batch in one transaction. It returns each job's own error
// and an error for the transaction as a whole, unclassified (see retry).
func (db *DB) tryBatch(w *pgWriter, batch []*job) ([]error, error) {
	ctx := context.Background()
	var sqlTx writeTx = w
	var err error
	if w == nil {
		sqlTx, err = db.write.BeginTx(ctx, nil)
	} else {
		err = w.begin(ctx)
	}
	if err != nil {
		return nil, err
	}
	tx := &Tx{tx: sqlTx, db: db, now: db.now(), start: time.Now()}
	// fail ends the transaction after err, before its COMMIT.
	fail := func(err error) ([]error, error) {
		if w != nil && w.lost() {
			w.drop()
			return nil, &writerLost{err}
		}
		sqlTx.Rollback()
		return nil, err
	}
	if err := tx.lockAhead(ctx, batch); err != nil {
		return fail(err)
	}
	errs := make([]error, len(batch))
	single := len(batch) == 1
	for i, j := range batch {
		if err := j.ctx.Err(); err != nil {
			errs[i] = err
			continue
		}
		if single {
			errs[i] = j.fn(j.ctx, tx)
			continue
		}
		if _, err := tx.exec(ctx, "SAVEPOINT job"); err != nil {
			return fail(err)
		}
		mark, counted := len(tx.changes), len(tx.counts)
		if errs[i] = j.fn(j.ctx, tx); errs[i] != nil {
			// What was rolled back did not change.
			tx.changes, tx.counts = tx.changes[:mark], tx.counts[:counted]
			if _, err := tx.exec(ctx, "ROLLBACK TO SAVEPOINT job"); err != nil {
				return fail(err)
			}
		}
		if _, err := tx.exec(ctx, "RELEASE SAVEPOINT job"); err != nil {
			return fail(err)
		}
	}
	if single && errs[0] != nil {
		if w != nil && w.lost() {
			return fail(errs[0])
		}
		sqlTx.Rollback()
		return errs, nil
	}
	if err := tx.flushCounts(ctx); err != nil {
		return fail(err)
	}
	tc := time.Now()
	if err := db.commit(sqlTx, tx.start, len(batch)); err != nil {
		return nil, err
	}
	if took := time.Since(tx.start); took > 20*time.Millisecond {
		db.log.Debug("slow batch", "start", tx.start, "took", took, "commit", time.Since(tc), "jobs", len(batch))
	}
	db.local.publish(tx.changes)
	return errs, nil
}

// txConn is what a write transaction's statements run on.
type txConn interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// writeTx is a group commit's transaction: a *sql.Tx, or a pgWriter.
type writeTx interface {
	txConn
	Commit() error
	Rollback() error
}

// pgWriter is a PostgreSQL commit loop's connection, kept between its
// batches, whose COMMIT begins the next transaction in the same round trip
// ("COMMIT; BEGIN", one simple query): a batch of status reports is a
// handful of round trips (the locking SELECT, the UPDATE, the COMMIT), and
// a BEGIN of its own would be one more. The connection waits for its next
// batch in a transaction that holds no locks and, at READ COMMITTED, no
// snapshot. Once a second its COMMIT is a COMMIT alone, and the next
// batch sends its own BEGIN: a PostgreSQL backend reports its table
// statistics (the rows it inserted, updated and deleted) only when it
// goes idle outside a transaction, and autovacuum and autoanalyze act on
// those reports; a connection that never left its transaction kept them
// from ever seeing the commit loops' writes (docs/benchmarks-notebook.md,
// "PostgreSQL's CPU per S10 report"). It is given back to the pool after any failure of BEGIN,
// COMMIT or ROLLBACK, and pgx's stdlib discards a connection given back
// inside a transaction. If the server ended it while it waited
// (pg_terminate_backend, idle_in_transaction_session_timeout), the next
// batch's first statement fails; nothing of that batch committed, and it
// runs once more on a new connection (runBatch).
type pgWriter struct {
	*sql.Conn
	db         *DB
	begun      bool      // the last COMMIT began the transaction of the next batch
	begunAt    time.Time // when
	reportedAt time.Time // when the connection last went idle outside a transaction
}

// pgStatsEvery is how often a commit loop's connection goes idle outside a
// transaction, so that its backend reports its table statistics: as often
// as a backend reports them at most (PostgreSQL's PGSTAT_MIN_INTERVAL).
const pgStatsEvery = time.Second

// begin starts a batch's transaction, unless the last commit did it
// lately. One begun more than a second ago is ended and begun again: a
// server's idle_in_transaction_session_timeout may have ended it, and the
// connection with it.
func (w *pgWriter) begin(ctx context.Context) error {
	if w.begun {
		w.begun = false
		if time.Since(w.begunAt) < time.Second {
			return nil
		}
		if _, err := w.ExecContext(ctx, "ROLLBACK"); err != nil {
			w.drop()
		}
	}
	if w.Conn == nil {
		c, err := w.db.write.Conn(ctx)
		if err != nil {
			return err
		}
		w.Conn, w.reportedAt = c, time.Now()
	}
	if _, err := w.ExecContext(ctx, "BEGIN"); err != nil {
		w.drop()
		return err
	}
	return nil
}

// Commit commits the batch's transaction and begins the next one, except
// once every pgStatsEvery, when it leaves the connection idle outside a
// transaction. A transaction in which a statement failed outside a
// savepoint would "commit" as a rollback: that is an error.
func (w *pgWriter) Commit() error {
	now := time.Now()
	report := now.Sub(w.reportedAt) >= pgStatsEvery
	stmt := "COMMIT; BEGIN"
	if report {
		stmt = "COMMIT"
	}
	err := w.Raw(func(dc any) error {
		pc := dc.(*stdlib.Conn).Conn().PgConn()
		if pc.TxStatus() != 'T' {
			return errors.New("sqlstore: the transaction failed; not committed")
		}
		_, err := pc.Exec(context.Background(), stmt).ReadAll()
		return err
	})
	if err != nil {
		w.drop()
		return err
	}
	if report {
		w.reportedAt = now
		return nil
	}
	w.begun, w.begunAt = true, now
	return nil
}

// Rollback rolls the batch's transaction back.
func (w *pgWriter) Rollback() error {
	_, err := w.ExecContext(context.Background(), "ROLLBACK")
	if err != nil {
		w.drop()
	}
	return err
}

// lost reports whether the connection has gone: the server ended it
// (pg_terminate_backend, idle_in_transaction_session_timeout), or it broke.
// The transaction on it went with it, uncommitted.
func (w *pgWriter) lost() bool {
	if w.Conn == nil {
		return true
	}
	closed := true
	w.Raw(func(dc any) error {
		closed = dc.(*stdlib.Conn).Conn().PgConn().IsClosed()
		return nil
	})
	return closed
}

// writerLost is the error of a batch whose connection went before its
// COMMIT was sent: the server rolled the batch back, so it may run again.
// One lost during the COMMIT may have committed, and is not one of these.
type writerLost struct{ err error }

func (e *writerLost) Error() string {
	return "the commit loop's connection was lost before the commit: " + e.err.Error()
}

func (e *writerLost) Unwrap() error { return e.err }

// drop gives the connection back to the pool.
func (w *pgWriter) drop() {
	if w.Conn != nil {
		w.Conn.Close()
	}
	w.Conn, w.begun = nil, false
}

// writeStats counts the group commits.
type writeStats struct {
	commits, jobs, failures, nanos atomic.Uint64
	retries                        atomic.Uint64
	restarts, restartNanos         atomic.Uint64
	restartFrames                  atomic.Uint64
	walFrames, walMaxFrames        atomic.Int64
}

// WriteStats describes the write path since the store opened.
type WriteStats struct {
	Commits       uint64  // transactions committed
	Jobs          uint64  // writes they carried: Jobs/Commits is the batching
	Failures      uint64  // commits that failed
	Retries       uint64  // writes run again after PostgreSQL aborted them (retry)
	CommitSeconds float64 // time from BEGIN to the end of COMMIT, summed
	Queued        int     // writes waiting for the commit loop now
	// SQLite's WAL: its frames at the last checkpoint and the most it
	// held; the RESTART checkpoints that reset it, the time the commit
	// loop waited for them and the frames they copied or synced while it
	// waited, summed.
	WALFrames, WALMaxFrames int64
	WALRestarts             uint64
	WALRestartSeconds       float64
	WALRestartFrames        uint64
}

// Stats returns the write path's counters, for metrics.
func (db *DB) Stats() WriteStats {
	return WriteStats{
		Commits:       db.stats.commits.Load(),
		Jobs:          db.stats.jobs.Load(),
		Failures:      db.stats.failures.Load(),
		Retries:       db.stats.retries.Load(),
		CommitSeconds: float64(db.stats.nanos.Load()) / 1e9,
		Queued:        len(db.jobs),

		WALFrames:         db.stats.walFrames.Load(),
		WALMaxFrames:      db.stats.walMaxFrames.Load(),
		WALRestarts:       db.stats.restarts.Load(),
		WALRestartSeconds: float64(db.stats.restartNanos.Load()) / 1e9,
		WALRestartFrames:  db.stats.restartFrames.Load(),
	}
}

// idChunk is how many ids one IN list carries.
const idChunk = 500

func (tx *Tx) execCount(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := tx.exec(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func placeholders(n int) string {
	return "?" + strings.Repeat(", ?", n-1)
}

func anys(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

func (db *DB) strings(ctx context.Context, query string, args ...any) ([]string, error) {
	out, err := queryStrings(ctx, db, query, args...)
	return out, db.classify(err)
}

// queryStrings reads the one text column of the rows query selects.
func queryStrings(ctx context.Context, q querier, query string, args ...any) ([]string, error) {
	rows, err := q.query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}
