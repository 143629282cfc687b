package main

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	_ "modernc.org/sqlite" // registers "sqlite"
)

// baselineBatch is how many rows the update baseline commits at once: the
// most status reports fleetd applies in one store call.
const baselineBatch = 512

// storage is the database the storage baselines run on: the same engine
// and settings fleetd uses, in a scratch file or schema of their own.
type storage struct {
	dialect string
	db      *sql.DB
	writers int // concurrent committers, as fleetd's writer connections
	cleanup func() error
}

// openStorage opens the baseline database: a SQLite file in dir, with
// fleetd's pragmas (WAL, synchronous=FULL) and one connection, or a fresh
// schema in the PostgreSQL database of pgBase with four.
func openStorage(ctx context.Context, dialect, pgBase, dir string) (*storage, error) {
	if dialect == "postgres" {
		dsn, drop, err := freshSchema(ctx, pgBase, "fleetbench_base_")
		if err != nil {
			return nil, err
		}
		db, err := sql.Open("pgx", dsn)
		if err != nil {
			drop()
			return nil, err
		}
		db.SetMaxOpenConns(8)
		return &storage{dialect: dialect, db: db, writers: 4, cleanup: func() error { db.Close(); return drop() }}, nil
	}
	path := filepath.Join(dir, "baseline.db")
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=busy_timeout(10000)&_txlock=immediate")
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	return &storage{dialect: dialect, db: db, writers: 1, cleanup: db.Close}, nil
}

// updateRate measures single-row UPDATEs by primary key, committed in
// batches of baselineBatch, for d: rows per second.
func (s *storage) updateRate(ctx context.Context, d time.Duration) (float64, error) {
	const rows = 16_384
	for _, q := range []string{
		"DROP TABLE IF EXISTS upd",
		`CREATE TABLE upd (tenant TEXT NOT NULL, action_id BIGINT NOT NULL, device_id TEXT NOT NULL,
			status TEXT NOT NULL, progress INTEGER NOT NULL, last_seq BIGINT, updated_at BIGINT NOT NULL,
			PRIMARY KEY (tenant, action_id, device_id))`,
		s.fleet("INSERT INTO upd SELECT 'b', 1, %[1]s, 'Queued', 0, 0, 0 FROM %[3]s", "dev", rows),
	} {
		if _, err := s.db.ExecContext(ctx, q); err != nil {
			return 0, fmt.Errorf("update baseline: %w", err)
		}
	}
	update := s.rebind("UPDATE upd SET status = ?, progress = ?, last_seq = ?, updated_at = ? WHERE tenant = ? AND action_id = ? AND device_id = ?")
	var total atomic.Int64
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	errs := make(chan error, s.writers)
	per := rows / s.writers
	for w := range s.writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stmt, err := s.db.PrepareContext(ctx, update)
			if err != nil {
				errs <- err
				return
			}
			defer stmt.Close()
			seq := 0
			for time.Now().Before(end) {
				tx, err := s.db.BeginTx(ctx, nil)
				if err != nil {
					errs <- err
					return
				}
				st := tx.StmtContext(ctx, stmt)
				for range baselineBatch {
					seq++
					id := fmt.Sprintf("dev-%07d", w*per+seq%per)
					if _, err := st.ExecContext(ctx, "Downloading", seq%100, seq, seq, "b", 1, id); err != nil {
						tx.Rollback()
						errs <- err
						return
					}
				}
				if err := tx.Commit(); err != nil {
					errs <- err
					return
				}
				total.Add(baselineBatch)
			}
		}()
	}
	start := time.Now()
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, fmt.Errorf("update baseline: %w", err)
	}
	return float64(total.Load()) / time.Since(start).Seconds(), nil
}

// insertTime measures one INSERT … SELECT of the n rows a dispatch to the
// fleet writes: device actions of the fleet's tenant and device ids (ids
// made as fleetbench's ids(prefix, n) makes them) and metadata, read from a
// table with the columns of fleetd's devices, into a table with the columns
// of a device action and its primary key only, committed. That is what the
// dispatch costs the database at the least: the same keys in the same
// B-trees, without fleetd's other indexes, counts and audit. On SQLite the
// commit copies nothing into the database file (wal_autocheckpoint off, as
// fleetd's writer, whose checkpoints run apart from its commits); the WAL is
// checkpointed after the measurement. The meter measures the insert and its
// commit alone (on SQLite, fleetbench's CPU is the database's).
func (s *storage) insertTime(ctx context.Context, n int, tenant, prefix, metadata string) (time.Duration, *cpuMeter, error) {
	json := "TEXT"
	if s.dialect == "postgres" {
		json = "JSONB"
	}
	for _, q := range []string{
		"DROP TABLE IF EXISTS ins_src",
		"DROP TABLE IF EXISTS ins_dst",
		`CREATE TABLE ins_src (tenant TEXT NOT NULL, id TEXT NOT NULL, token_hash TEXT NOT NULL, metadata ` + json + ` NOT NULL,
			components ` + json + ` NOT NULL, created_at BIGINT NOT NULL, last_seen_at BIGINT, PRIMARY KEY (tenant, id))`,
		s.fleet("INSERT INTO ins_src SELECT "+inFormat(literal(tenant))+", %[1]s, %[2]s, "+inFormat(literal(metadata))+", '{}', 0, NULL FROM %[3]s", prefix, n),
		`CREATE TABLE ins_dst (tenant TEXT NOT NULL, action_id BIGINT NOT NULL, device_id TEXT NOT NULL, type TEXT NOT NULL,
			status TEXT NOT NULL, action_status TEXT NOT NULL, progress INTEGER NOT NULL, errors ` + json + ` NOT NULL,
			error_count INTEGER NOT NULL, user_email TEXT NOT NULL, user_name TEXT NOT NULL, serial_metadata ` + json + ` NOT NULL,
			created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL, PRIMARY KEY (tenant, action_id, device_id))`,
	} {
		if _, err := s.db.ExecContext(ctx, q); err != nil {
			return 0, nil, fmt.Errorf("insert baseline: %w", err)
		}
	}
	if s.dialect != "postgres" {
		// The source's rows out of the WAL, so that the insert reads the
		// database file as fleetd's reads its devices, and no checkpoint in
		// the timed commit (the baseline's one connection keeps the
		// setting until it is restored).
		defer s.db.ExecContext(ctx, "PRAGMA wal_autocheckpoint = 1000")
		for _, q := range []string{"PRAGMA wal_checkpoint(TRUNCATE)", "PRAGMA wal_autocheckpoint = 0"} {
			if _, err := s.db.ExecContext(ctx, q); err != nil {
				return 0, nil, fmt.Errorf("insert baseline: %w", err)
			}
		}
	}
	cpu := startCPU(0)
	start := time.Now()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, nil, err
	}
	res, err := tx.ExecContext(ctx, s.rebind(`INSERT INTO ins_dst SELECT tenant, 1, id, 'reboot', 'Queued', 'Queued', 0, '{}', 0,
		'', 'admin', metadata, 0, 0 FROM ins_src WHERE tenant = ?`), tenant)
	if err != nil {
		tx.Rollback()
		return 0, nil, fmt.Errorf("insert baseline: %w", err)
	}
	if got, err := res.RowsAffected(); err != nil || got != int64(n) {
		tx.Rollback()
		return 0, nil, fmt.Errorf("insert baseline: inserted %d rows, want %d (%v)", got, n, err)
	}
	if err := tx.Commit(); err != nil {
		return 0, nil, fmt.Errorf("insert baseline: %w", err)
	}
	elapsed := time.Since(start)
	cpu.stop()
	for _, q := range []string{"DROP TABLE ins_dst", "DROP TABLE ins_src"} {
		if _, err := s.db.ExecContext(ctx, q); err != nil {
			return 0, nil, fmt.Errorf("insert baseline: %w", err)
		}
	}
	if s.dialect != "postgres" {
		if _, err := s.db.ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
			return 0, nil, fmt.Errorf("insert baseline: %w", err)
		}
	}
	return elapsed, cpu, nil
}

// fleet fills q's %[1]s with the id expression of ids(prefix, n), its
// %[2]s with a token hash's (64 hexadecimal digits, as fleetd keeps a
// device's) and its %[3]s with a row source of n numbered rows, in the
// dialect's way.
func (s *storage) fleet(q, prefix string, n int) string {
	if s.dialect == "postgres" {
		return fmt.Sprintf(q, literal(prefix+"-")+" || lpad(i::text, 7, '0')", "md5(i::text) || md5((-i)::text)",
			fmt.Sprintf("generate_series(0, %d) AS g(i)", n-1))
	}
	return fmt.Sprintf("WITH RECURSIVE c(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM c WHERE i + 1 < %d) ", n) +
		fmt.Sprintf(q, "printf('%s-%07d', "+literal(prefix)+", i)", "lower(hex(randomblob(32)))", "c")
}

// literal is s as an SQL string literal.
func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// inFormat is s written into a format of fmt's: its per cents doubled.
func inFormat(s string) string { return strings.ReplaceAll(s, "%", "%%") }

func (s *storage) rebind(q string) string {
	if s.dialect != "postgres" {
		return q
	}
	out := make([]byte, 0, len(q)+16)
	n := 0
	for i := 0; i < len(q); i++ {
		if q[i] == '?' {
			n++
			out = fmt.Appendf(out, "$%d", n)
			continue
		}
		out = append(out, q[i])
	}
	return string(out)
}

func (s *storage) close() error { return s.cleanup() }
