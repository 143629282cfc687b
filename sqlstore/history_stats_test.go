package sqlstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestAggregateStats: one read of each bucket's count, average, minimum
// and maximum equals the aggregates of each function, from rollups and
// from raw points, for a device and over the tenant's devices (another
// tenant's points left out, its device not found).
func TestAggregateStats(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, clk := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustTenant(t, db, "beta")
		mustAlertDevices(t, db, "acme", "d1", "d2")
		mustAlertDevices(t, db, "beta", "b1")
		now := clk.Now().Truncate(time.Millisecond)
		start := now.Add(-2 * time.Hour).Truncate(time.Hour)
		for _, d := range []struct{ tenant, id string }{{"acme", "d1"}, {"acme", "d2"}, {"beta", "b1"}} {
			pts := historyPoints(start, 300, now)
			if d.tenant == "beta" {
				for i := range pts {
					pts[i].Data["temp"] = -1000.0 // would show in acme's minimum
				}
			}
			if err := db.CommitStream(ctx, d.tenant, d.id, "env", pts, nil); err != nil {
				t.Fatal(err)
			}
		}
		for {
			if n, err := db.RollUp(ctx); err != nil {
				t.Fatal(err)
			} else if n == 0 {
				break
			}
		}
		for _, iv := range []time.Duration{10 * time.Second, time.Minute, time.Hour} {
			for _, device := range []string{"d1", ""} {
				q := fleet.AggregateQuery{Field: "temp", Interval: iv, From: start, To: start.Add(time.Hour)}
				stats, err := db.AggregateStats(ctx, "acme", device, "env", q)
				if err != nil {
					t.Fatal(err)
				}
				each := map[string][]fleet.Bucket{}
				for _, fn := range []string{fleet.AggAvg, fleet.AggMin, fleet.AggMax} {
					q.Fn = fn
					if device == "" {
						each[fn], _, err = db.AggregateFleet(ctx, "acme", "env", q)
					} else {
						each[fn], err = db.Aggregate(ctx, "acme", device, "env", q)
					}
					if err != nil {
						t.Fatal(err)
					}
				}
				if len(stats) == 0 || len(stats) != len(each[fleet.AggAvg]) {
					t.Fatalf("interval %s, device %q: %d buckets, the aggregates %d", iv, device, len(stats), len(each[fleet.AggAvg]))
				}
				for i, s := range stats {
					avg, mn, mx := each[fleet.AggAvg][i], each[fleet.AggMin][i], each[fleet.AggMax][i]
					if !s.Start.Equal(avg.Start) || s.Count != avg.Count || s.Avg != avg.Value || s.Min != mn.Value || s.Max != mx.Value {
						t.Fatalf("interval %s, device %q, bucket %d: %+v, the aggregates %v %v %v", iv, device, i, s, avg, mn, mx)
					}
					if s.Min < 20 {
						t.Fatalf("another tenant's points are in acme's: %+v", s)
					}
				}
			}
		}
		if _, err := db.AggregateStats(ctx, "acme", "b1", "env", fleet.AggregateQuery{Field: "temp", Interval: time.Minute, From: start, To: now}); fleet.ErrorCode(err) != fleet.ENOTFOUND {
			t.Errorf("another tenant's device: %v, want ENOTFOUND", err)
		}
		if _, err := db.AggregateStats(ctx, "acme", "d1", "env", fleet.AggregateQuery{Field: "temp", Interval: 90 * time.Second, From: start, To: now}); fleet.ErrorCode(err) != fleet.EINVALID {
			t.Errorf("an interval of 90s: %v, want EINVALID", err)
		}
	})
}
