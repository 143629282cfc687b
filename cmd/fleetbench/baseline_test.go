package main

import (
	"context"
	"os"
	"slices"
	"testing"
)

// TestInsertBaselineRows checks that the dispatch's baseline inserts the
// rows the dispatch does: the fleet's device ids as fleetbench provisions
// them (ids), a tenant and metadata with quotes and per cents in them,
// every row once.
func TestInsertBaselineRows(t *testing.T) {
	dbs := map[string]string{"sqlite": ""}
	if dsn := os.Getenv("FLEETD_TEST_POSTGRES"); dsn != "" {
		dbs["postgres"] = dsn
	}
	for dialect, dsn := range dbs {
		t.Run(dialect, func(t *testing.T) {
			ctx := context.Background()
			s, err := openStorage(ctx, dialect, dsn, t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			defer s.close()
			const prefix, n = "dp0-1f'2e%d", 1500
			if _, err := s.db.ExecContext(ctx, "CREATE TABLE fleet_ids (id TEXT NOT NULL, token_hash TEXT NOT NULL)"); err != nil {
				t.Fatal(err)
			}
			if _, err := s.db.ExecContext(ctx, s.fleet("INSERT INTO fleet_ids SELECT %[1]s, %[2]s FROM %[3]s", prefix, n)); err != nil {
				t.Fatal(err)
			}
			rows, err := s.db.QueryContext(ctx, "SELECT id, token_hash FROM fleet_ids ORDER BY id")
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for rows.Next() {
				var id, hash string
				if err := rows.Scan(&id, &hash); err != nil {
					t.Fatal(err)
				}
				if len(hash) != 64 {
					t.Fatalf("token hash %q: %d characters, want 64 as fleetd keeps", hash, len(hash))
				}
				got = append(got, id)
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			if want := ids(prefix, n); !slices.Equal(got, want) {
				t.Fatalf("ids %v … (%d), want %v … (%d)", got[:2], len(got), want[:2], len(want))
			}
			// insertTime fails unless it inserted exactly n rows.
			if _, _, err := s.insertTime(ctx, n, "o'ten%sant", prefix, `{"fleetbench": "it's 100%"}`); err != nil {
				t.Fatal(err)
			}
			if _, _, err := s.insertTime(ctx, n, "o'ten%sant", prefix, `{}`); err != nil {
				t.Fatalf("a second baseline in the same database: %v", err)
			}
		})
	}
}
