package sqlstore_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestSightingsReadOnlyTheirDevices guards the plan of TouchDevices on
// PostgreSQL: after a provisioning of 10,000 devices, writing the
// last_seen_at of a chunk of them reads those devices by primary key, not
// every device of the tenant, with the statement's generic plan, the one
// PostgreSQL keeps after five runs on a connection. Autovacuum cannot be
// waited for: it runs a minute later at best, and not at all where it is
// off (as on the server fleetbench and these tests use). With an IN list
// of parameters on a table never analyzed, each chunk of sightings read
// all the tenant's devices and, once generic, built the list's array
// again for each: half of PostgreSQL's CPU per S10 report, 197–256 µs
// against 96–100 with the change (docs/benchmarks-notebook.md, 2026-11-26).
// Since migration 0046 a device's first sighting inserts its row of
// device_sightings, whose foreign key reads the device once more: each
// round here sights devices not seen before, two reads a device, then
// sights them again a second later, one read a device.
func TestSightingsReadOnlyTheirDevices(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, clk := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		const devices = 10_000
		var all []fleet.NewDevice
		for i := range devices {
			all = append(all, fleet.NewDevice{ID: fmt.Sprintf("dev-%05d", i), Metadata: map[string]string{"site": fmt.Sprint("s", i%40)}})
		}
		if _, err := db.CreateDevices(ctx, "acme", all); err != nil {
			t.Fatal(err)
		}
		for round := range 10 {
			clk.Add(time.Second)
			// A chunk as the action service writes them: 256 devices, in
			// order, spread over the tenant.
			var ids []string
			for i := range 256 {
				ids = append(ids, fmt.Sprintf("dev-%05d", (round+i*39)%devices))
			}
			slices.Sort(ids)
			read, err := db.TouchDevicesCountingReads(ctx, "acme", ids, clk.Now())
			if err != nil {
				t.Fatal(err)
			}
			if read > 2*int64(len(ids)) {
				t.Fatalf("round %d: TouchDevices of %d devices read %d rows of devices, want at most %d", round, len(ids), read, 2*len(ids))
			}
			clk.Add(time.Second)
			if read, err = db.TouchDevicesCountingReads(ctx, "acme", ids, clk.Now()); err != nil {
				t.Fatal(err)
			}
			if read > int64(len(ids)) {
				t.Fatalf("round %d, again: TouchDevices of %d devices read %d rows of devices, want at most %d", round, len(ids), read, len(ids))
			}
			for _, id := range []string{ids[0], ids[len(ids)-1]} {
				d, err := db.FindDevice(ctx, "acme", id)
				if err != nil {
					t.Fatal(err)
				}
				if d.LastSeenAt == nil || !d.LastSeenAt.Equal(clk.Now()) {
					t.Fatalf("round %d: %s last seen at %v, want %v", round, id, d.LastSeenAt, clk.Now())
				}
			}
		}
	})
}

// TestReportsLockOnlyTheirDeviceActions guards the plan of the reports'
// locking SELECT on PostgreSQL after a dispatch to fewer devices than
// analyzeAfter, into a device_actions table never analyzed: a batch's
// SELECT reads the device actions it names by primary key, not every
// device action of the action. Without statistics its generic plan read
// the action's 2,000 device actions for a batch of 100, the IN list's
// array built again for each (11 ms against 0.7 ms), most of PostgreSQL's
// CPU per MQTT report (docs/benchmarks-notebook.md, 2026-11-26).
func TestReportsLockOnlyTheirDeviceActions(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, _ := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		const devices = 2000
		var all []fleet.NewDevice
		var ids []string
		for i := range devices {
			id := fmt.Sprintf("dev-%05d", i)
			all = append(all, fleet.NewDevice{ID: id})
			ids = append(ids, id)
		}
		if _, err := db.CreateDevices(ctx, "acme", all); err != nil {
			t.Fatal(err)
		}
		a := mustDispatch(t, db, "acme", dispatch("update", "default", ids...))
		for round := range 3 {
			// A batch's devices of one action, in order, as applyReports
			// reads them.
			var devs []string
			for i := range 100 {
				devs = append(devs, ids[(round+i*19)%devices])
			}
			slices.Sort(devs)
			read, err := db.LockReportRowsCountingReads(ctx, "acme", a.ID, devs)
			if err != nil {
				t.Fatal(err)
			}
			if read > int64(len(devs)) {
				t.Errorf("round %d: locking %d device actions read %d rows of device_actions, want at most %d", round, len(devs), read, len(devs))
			}
		}
	})
}
