package sqlstore

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"math"
	"sort"
	"strconv"
	"strings"
)

//go:embed migrations/*.sql
var migrations embed.FS

// migration is one numbered schema change, "0001_foundation.sql".
type migration struct {
	version int
	name    string
	sql     string
}

func loadMigrations() ([]migration, error) {
	names, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	var ms []migration
	for _, path := range names {
		name := strings.TrimPrefix(path, "migrations/")
		num, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("migration %s: name must start with a number and _", name)
		}
		b, err := migrations.ReadFile(path)
		if err != nil {
			return nil, err
		}
		ms = append(ms, migration{version: v, name: name, sql: string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	for i := 1; i < len(ms); i++ {
		if ms[i].version == ms[i-1].version {
			return nil, fmt.Errorf("migrations %s and %s share a number", ms[i-1].name, ms[i].name)
		}
	}
	return ms, nil
}

// Migrate applies the migrations the database has not seen, each in its own
// transaction, and returns the names it applied. Replicas starting together
// on PostgreSQL serialise on an advisory lock, so each migration runs once.
func (db *DB) Migrate(ctx context.Context) ([]string, error) {
	return db.migrate(ctx, math.MaxInt)
}

// migrate is Migrate of the migrations numbered up to last.
func (db *DB) migrate(ctx context.Context, last int) ([]string, error) {
	ms, err := loadMigrations()
	if err != nil {
		return nil, err
	}
	conn, err := db.write.Conn(ctx)
	if err != nil {
		return nil, db.classify(err)
	}
	defer conn.Close()
	if db.dialect == postgres {
		// 0x666c656574 is "fleet": one lock id for every fleetd.
		if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_lock(439788553588)"); err != nil {
			return nil, fmt.Errorf("lock for migrations: %w", err)
		}
		defer conn.ExecContext(context.Background(), "SELECT pg_advisory_unlock(439788553588)")
	}
	if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version INTEGER PRIMARY KEY,
		name TEXT NOT NULL,
		applied_at BIGINT NOT NULL)`); err != nil {
		return nil, fmt.Errorf("create schema_migrations: %w", err)
	}
	applied := map[int]string{}
	rows, err := conn.QueryContext(ctx, "SELECT version, name FROM schema_migrations ORDER BY version")
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var v int
		var name string
		if err := rows.Scan(&v, &name); err != nil {
			rows.Close()
			return nil, err
		}
		applied[v] = name
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if err := unknownMigrations(ms, applied); err != nil {
		return nil, err
	}
	var done []string
	for _, m := range ms {
		if _, ok := applied[m.version]; ok || m.version > last {
			continue
		}
		tx, err := conn.BeginTx(ctx, nil)
		if err != nil {
			return done, err
		}
		if _, err := tx.ExecContext(ctx, db.dialect.ddl(m.sql)); err != nil {
			tx.Rollback()
			return done, fmt.Errorf("migration %s: %w", m.name, err)
		}
		if _, err := tx.ExecContext(ctx, db.dialect.rebind("INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)"),
			m.version, m.name, millis(db.now())); err != nil {
			tx.Rollback()
			return done, fmt.Errorf("migration %s: %w", m.name, err)
		}
		if err := tx.Commit(); err != nil {
			return done, fmt.Errorf("migration %s: %w", m.name, err)
		}
		done = append(done, m.name)
	}
	return done, nil
}

// unknownMigrations refuses a database that a newer fleetd migrated: one
// whose schema_migrations names migrations this binary does not have. Its
// code would run on tables whose rules it does not know, and write rows
// the newer code's invariants no longer hold for (migrations 0018, 0019
// and 0021 each made an older binary's writes wrong).
func unknownMigrations(ms []migration, applied map[int]string) error {
	known := make(map[int]bool, len(ms))
	for _, m := range ms {
		known[m.version] = true
	}
	var unknown []string
	for v, name := range applied {
		if !known[v] {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	sort.Strings(unknown)
	newest := "none"
	if len(ms) > 0 {
		newest = ms[len(ms)-1].name
	}
	return fmt.Errorf("the database has %d migration(s) this fleetd does not know (%s; the newest it knows is %s): "+
		"a newer fleetd migrated it, and this one would not keep its rules. Run that newer fleetd, "+
		"or restore a backup taken before it migrated the database", len(unknown), strings.Join(unknown, ", "), newest)
}

// CreateExtensions creates the PostgreSQL extensions the migrations use
// (pg_trgm, migration 0019) in admin's first schema, for a database whose
// fleetd schemas come and go, as those of tests and fleetbench do: created
// by a migration, an extension lives in the schema of the fleetd that made
// it and is dropped with that schema, and with it every other schema's
// index that uses it.
func CreateExtensions(ctx context.Context, admin *sql.DB) error {
	_, err := admin.ExecContext(ctx, "CREATE EXTENSION IF NOT EXISTS pg_trgm")
	if err != nil {
		// Concurrent creators race on the catalog's unique index; the
		// loser's error comes once the winner committed.
		var n int
		if admin.QueryRowContext(ctx, "SELECT count(*) FROM pg_extension WHERE extname = 'pg_trgm'").Scan(&n) == nil && n == 1 {
			return nil
		}
	}
	return err
}
