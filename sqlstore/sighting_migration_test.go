package sqlstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestSightingsMigration fills a database at migration 45 with devices of
// two tenants, some seen (devices.last_seen_at) and some never, and
// migrates it: migration 0046 moves each time to device_sightings, which
// the devices' reads show as before; a sighting moves a device's time only
// forward, for a device seen before the migration or never; and deleting a
// device deletes its sighting.
func TestSightingsMigration(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		ctx := context.Background()
		db, raw, _ := openAtMigration(t, b, 45)
		t0 := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
		for _, tenant := range []string{"acme", "beta"} {
			mustTenant(t, db, tenant)
			mustDevices(t, db, tenant, map[string]map[string]string{"d1": nil, "d2": nil, "d3": nil})
		}
		// acme's d1 and d2 and beta's d1 seen, each at its own time.
		seen := map[[2]string]time.Time{
			{"acme", "d1"}: t0,
			{"acme", "d2"}: t0.Add(time.Minute),
			{"beta", "d1"}: t0.Add(2 * time.Minute),
		}
		for k, at := range seen {
			if _, err := raw.Exec("UPDATE devices SET last_seen_at = $1 WHERE tenant = $2 AND id = $3", at.UnixMilli(), k[0], k[1]); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := db.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		check := func(when string) {
			t.Helper()
			for _, tenant := range []string{"acme", "beta"} {
				for _, id := range []string{"d1", "d2", "d3"} {
					d, err := db.FindDevice(ctx, tenant, id)
					if err != nil {
						t.Fatal(err)
					}
					want, ok := seen[[2]string{tenant, id}]
					if ok != (d.LastSeenAt != nil) || ok && !d.LastSeenAt.Equal(want) {
						t.Errorf("%s: %s/%s last seen at %v, want %v (seen: %v)", when, tenant, id, d.LastSeenAt, want, ok)
					}
				}
			}
		}
		check("after the migration")

		// Earlier than acme's d2 and later than its d1; d3 never seen.
		at := t0.Add(30 * time.Second)
		if err := db.TouchDevices(ctx, "acme", []string{"d1", "d2", "d3", "gone"}, at); err != nil {
			t.Fatal(err)
		}
		seen[[2]string{"acme", "d1"}] = at
		seen[[2]string{"acme", "d3"}] = at
		check("after a sighting")
		if err := db.TouchDevice(ctx, "beta", "d1", t0); err != nil {
			t.Fatal(err)
		}
		check("after an earlier connection")

		if err := db.DeleteDevice(ctx, "acme", "d1"); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := raw.QueryRow("SELECT count(*) FROM device_sightings WHERE tenant = 'acme'").Scan(&n); err != nil || n != 2 {
			t.Errorf("acme's sightings after a device's deletion: %d (%v), want 2", n, err)
		}
		if err := raw.QueryRow("SELECT count(*) FROM device_sightings").Scan(&n); err != nil || n != 3 {
			t.Errorf("sightings: %d (%v), want 3 (none of the device that does not exist)", n, err)
		}
		// SQLite drops the column; PostgreSQL keeps it for replicas older
		// than the migration, still running while they are replaced.
		_, err := raw.Exec("SELECT last_seen_at FROM devices")
		if b.Name == "sqlite" && err == nil {
			t.Error("devices on SQLite still has last_seen_at")
		}
		if b.Name == "postgres" && err != nil {
			t.Errorf("devices on PostgreSQL lost last_seen_at, which older replicas read: %v", err)
		}
	})
}
