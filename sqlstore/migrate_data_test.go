package sqlstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestMigrationsOnExistingData migrates a database at migration 23, the
// schema of the release before stream history, shadows and groups, that
// holds tenants, devices and device actions, and uses each table the later
// migrations made on those rows.
func TestMigrationsOnExistingData(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		ctx := context.Background()
		db, raw, _ := openAtMigration(t, b, 23)
		// Tenants and devices as the store writes them (devices with their
		// rows of device_metadata, migration 0021); device actions as
		// TestCountsMigration writes them.
		for _, tenant := range []string{"acme", "beta"} {
			if _, _, err := db.CreateTenant(ctx, tenant); err != nil {
				t.Fatal(err)
			}
			var devs []fleet.NewDevice
			for i := range 3 {
				devs = append(devs, fleet.NewDevice{ID: fmt.Sprintf("d%d", i), Metadata: map[string]string{"site": fmt.Sprintf("s%d", i%2)}})
			}
			if _, err := db.CreateDevices(ctx, tenant, devs); err != nil {
				t.Fatal(err)
			}
			for i := range 3 {
				if _, err := raw.Exec(`INSERT INTO device_actions (tenant, action_id, device_id, type, status, action_status, progress, errors,
					error_count, user_email, user_name, serial_metadata, created_at, updated_at, phase)
					VALUES ($1, 1, $2, 'reboot', 'x', 'Initiated', 0, '{}', 0, '', '', '{}', 0, 0, 0)`, tenant, fmt.Sprintf("d%d", i)); err != nil {
					t.Fatal(err)
				}
			}
		}
		if _, err := db.Migrate(ctx); err != nil {
			t.Fatal(err)
		}

		if _, err := db.UpdateDesired(ctx, "acme", "d0", map[string]any{"interval": int64(10)}, nil); err != nil {
			t.Fatal(err)
		}
		sh, err := db.UpdateReported(ctx, "acme", "d0", map[string]any{"interval": 10.0})
		if err != nil || !sh.InSync {
			t.Fatalf("shadow of a device made before migration 31: %+v, %v", sh, err)
		}
		g, err := db.CreateGroup(ctx, "acme", &fleet.Group{Name: "s1", Selector: "site=s1"})
		if err != nil || g.Count != 1 {
			t.Fatalf("group over devices made before migration 32: %+v, %v", g, err)
		}
		if d, own, err := db.StreamRetention(ctx, "beta"); err != nil || own || d <= 0 {
			t.Fatalf("retention of a tenant made before migration 27: %v %v %v", d, own, err)
		}
		if _, err := db.MaintainHistory(ctx); err != nil {
			t.Fatal(err)
		}
		now := time.Now().UTC().Truncate(time.Millisecond)
		pts := []fleet.DataPoint{{DeviceID: "d1", Stream: "env", Timestamp: now, Sequence: 1, Data: map[string]any{"t": 20.5}, ReceivedAt: now}}
		if err := db.CommitStream(ctx, "beta", "d1", "env", pts, nil); err != nil {
			t.Fatalf("points of a device made before migration 27: %v", err)
		}
		page, err := db.FindPoints(ctx, "beta", "d1", "env", fleet.PointQuery{})
		if err != nil || len(page.Points) != 1 {
			t.Fatalf("points read back: %+v, %v", page, err)
		}
	})
}
