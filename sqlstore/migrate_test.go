package sqlstore_test

import (
	"context"
	"strings"
	"testing"

	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestMigrateRefusesNewerDatabase starts, as an older fleetd would, on a
// database that a newer one migrated: it must refuse, naming the
// migrations it does not know and what to do, rather than run on a
// schema whose rules it does not know.
func TestMigrateRefusesNewerDatabase(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		ctx := context.Background()
		db := sqlstoretest.MustOpen(t, b, sqlstoretest.Options{})
		if applied, err := db.Migrate(ctx); err != nil || len(applied) != 0 {
			t.Fatalf("migrating a migrated database again: applied %q, %v", applied, err)
		}
		// What a newer fleetd leaves in schema_migrations.
		if err := db.Exec(ctx, "INSERT INTO schema_migrations (version, name, applied_at) VALUES (9998, '9998_later.sql', 0), (9999, '9999_latest.sql', 0)"); err != nil {
			t.Fatal(err)
		}
		_, err := db.Migrate(ctx)
		if err == nil {
			t.Fatal("migrated a database with migrations 9998 and 9999, which this fleetd does not have")
		}
		for _, want := range []string{"9998_later.sql, 9999_latest.sql", "newer fleetd", "restore"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}
		}
	})
}
