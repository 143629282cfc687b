// Package sqlstoretest gives tests a fresh, isolated database of each kind
// fleetd supports: a SQLite file always, and a PostgreSQL schema of its own
// when FLEETD_TEST_POSTGRES names a database (CI sets it).
package sqlstoretest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fleetd/fleet/sqlstore"
)

// Backend is one kind of database a test runs against.
type Backend struct {
	Name string // "sqlite" or "postgres", for subtest names
	// DSN returns the connection string of a new, empty database that is
	// removed when the test ends.
	DSN func(t testing.TB) string
}

// Backends lists SQLite and, when configured, PostgreSQL.
func Backends() []Backend {
	bs := []Backend{{Name: "sqlite", DSN: sqliteDSN}}
	if os.Getenv("FLEETD_TEST_POSTGRES") != "" {
		bs = append(bs, Backend{Name: "postgres", DSN: postgresDSN})
	}
	return bs
}

// Postgres is the PostgreSQL backend, for tests that need it alone (several
// replicas share one database); without one configured the test is
// skipped, saying why.
func Postgres(t testing.TB, why string) Backend {
	t.Helper()
	if os.Getenv("FLEETD_TEST_POSTGRES") == "" {
		t.Skip(why + ": set FLEETD_TEST_POSTGRES")
	}
	return Backend{Name: "postgres", DSN: postgresDSN}
}

// Run runs f as a subtest for each backend.
func Run(t *testing.T, f func(t *testing.T, b Backend)) {
	t.Helper()
	for _, b := range Backends() {
		t.Run(b.Name, func(t *testing.T) { f(t, b) })
	}
}

func sqliteDSN(t testing.TB) string {
	return filepath.Join(t.TempDir(), "fleetd.db")
}

// postgresDSN makes a schema of the test's own and points search_path at it.
func postgresDSN(t testing.TB) string {
	t.Helper()
	base := os.Getenv("FLEETD_TEST_POSTGRES")
	b := make([]byte, 6)
	rand.Read(b)
	schema := "test_" + hex.EncodeToString(b)
	admin, err := sql.Open("pgx", base)
	if err != nil {
		t.Fatalf("open FLEETD_TEST_POSTGRES: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := sqlstore.CreateExtensions(ctx, admin); err != nil {
		admin.Close()
		t.Fatalf("create extensions in FLEETD_TEST_POSTGRES (%s): %v", base, err)
	}
	if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
		admin.Close()
		t.Fatalf("create schema in FLEETD_TEST_POSTGRES (%s): %v", base, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Logf("drop schema %s: %v", schema, err)
		}
		admin.Close()
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("FLEETD_TEST_POSTGRES is not a URL: %v", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// Options lets a test adjust how MustOpen opens the store.
type Options = sqlstore.Options

// MustOpen opens and migrates a fresh store of backend b, closed when the
// test ends. When the test ends, before the store closes, the device
// actions' counts must match its device actions (CountDrift): so every
// test drives the write paths it covers through that check.
func MustOpen(t testing.TB, b Backend, opt Options) *sqlstore.DB {
	t.Helper()
	ctx := context.Background()
	dsn := b.DSN(t)
	db, err := sqlstore.Open(ctx, dsn, opt)
	if err != nil {
		t.Fatalf("open %s: %v", b.Name, err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Errorf("close %s: %v", b.Name, err)
		}
	})
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatalf("migrate %s: %v", b.Name, err)
	}
	t.Cleanup(func() {
		drift, err := CountDrift(b, dsn)
		if err != nil {
			t.Errorf("device action counts of %s: %v", b.Name, err)
		}
		for _, d := range drift {
			t.Errorf("device action counts of %s: %s", b.Name, d)
		}
	})
	return db
}

// CountDrift compares, in the database of backend b at dsn, the device
// actions' counts (device_action_counts, summed over its slots) with a
// count of the device actions, and describes each that differs. A
// statement reads one snapshot of committed transactions on either
// database, so it may run while the store writes.
func CountDrift(b Backend, dsn string) ([]string, error) {
	driver := "pgx"
	if b.Name == "sqlite" {
		driver, dsn = "sqlite", "file:"+dsn+"?_pragma=busy_timeout(10000)&_pragma=query_only(1)"
	}
	raw, err := sql.Open(driver, dsn)
	if err != nil {
		return nil, err
	}
	defer raw.Close()
	rows, err := raw.Query(`SELECT tenant, action_id, phase, action_status, CAST(sum(kept) AS BIGINT), CAST(sum(counted) AS BIGINT) FROM (
			SELECT tenant, action_id, phase, action_status, n AS kept, 0 AS counted FROM device_action_counts
			UNION ALL
			SELECT tenant, action_id, phase, action_status, 0, 1 FROM device_actions) c
		GROUP BY tenant, action_id, phase, action_status HAVING sum(kept) <> sum(counted)
		ORDER BY tenant, action_id, phase, action_status`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var tenant, status string
		var action, phase, kept, counted int64
		if err := rows.Scan(&tenant, &action, &phase, &status, &kept, &counted); err != nil {
			return nil, err
		}
		out = append(out, fmt.Sprintf("tenant %s action %d phase %d %s: kept %d, counted %d", tenant, action, phase, status, kept, counted))
	}
	return out, rows.Err()
}
