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
// again for each: half of PostgreSQL's CPU per S10 report, 197–229 µs
// against 96–100 with the change (BENCHMARKS.md, issue 20, 2026-11-26).
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
			if read > int64(len(ids)) {
				t.Fatalf("round %d: TouchDevices of %d devices read %d rows of devices, want at most %d", round, len(ids), read, len(ids))
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
