package sqlstore_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestAggregateStats: one read of each bucket's count, average, minimum
// and maximum of several fields equals the aggregates of each function of
// each field, and the read of each field alone, from rollups and from raw
// points, for a device and over the tenant's devices (another tenant's
// points left out, its device not found); a field without numeric values
// has no buckets.
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
					// would show in acme's minimums
					pts[i].Data["temp"], pts[i].Data["count"] = -1000.0, int64(-1000)
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
		fields := []string{"temp", "count", "state", "absent"}
		for _, iv := range []time.Duration{10 * time.Second, time.Minute, 10 * time.Minute, time.Hour} {
			for _, device := range []string{"d1", ""} {
				q := fleet.AggregateQuery{Interval: iv, From: start, To: start.Add(time.Hour)}
				stats, err := db.AggregateStats(ctx, "acme", device, "env", fields, q)
				if err != nil {
					t.Fatal(err)
				}
				if len(stats) != len(fields) {
					t.Fatalf("interval %s, device %q: %d fields read, want %d", iv, device, len(stats), len(fields))
				}
				for _, f := range fields {
					alone, err := db.AggregateStats(ctx, "acme", device, "env", []string{f}, q)
					if err != nil {
						t.Fatal(err)
					}
					if !reflect.DeepEqual(alone[f], stats[f]) {
						t.Fatalf("interval %s, device %q, field %s: %+v read with the others, %+v alone", iv, device, f, stats[f], alone[f])
					}
					q := q
					q.Field = f
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
					numeric := f == "temp" || f == "count"
					if numeric == (len(stats[f]) == 0) || len(stats[f]) != len(each[fleet.AggAvg]) {
						t.Fatalf("interval %s, device %q, field %s: %d buckets, the aggregates %d", iv, device, f, len(stats[f]), len(each[fleet.AggAvg]))
					}
					for i, s := range stats[f] {
						avg, mn, mx := each[fleet.AggAvg][i], each[fleet.AggMin][i], each[fleet.AggMax][i]
						if !s.Start.Equal(avg.Start) || s.Count != avg.Count || s.Avg != avg.Value || s.Min != mn.Value || s.Max != mx.Value {
							t.Fatalf("interval %s, device %q, field %s, bucket %d: %+v, the aggregates %v %v %v", iv, device, f, i, s, avg, mn, mx)
						}
						if s.Min < 0 {
							t.Fatalf("another tenant's points are in acme's: %+v", s)
						}
					}
				}
			}
		}
		q := fleet.AggregateQuery{Interval: time.Minute, From: start, To: now}
		if _, err := db.AggregateStats(ctx, "acme", "b1", "env", fields, q); fleet.ErrorCode(err) != fleet.ENOTFOUND {
			t.Errorf("another tenant's device: %v, want ENOTFOUND", err)
		}
		if _, err := db.AggregateStats(ctx, "acme", "d1", "env", nil, q); fleet.ErrorCode(err) != fleet.EINVALID {
			t.Errorf("no field: %v, want EINVALID", err)
		}
		q.Interval = 90 * time.Second
		if _, err := db.AggregateStats(ctx, "acme", "d1", "env", fields, q); fleet.ErrorCode(err) != fleet.EINVALID {
			t.Errorf("an interval of 90s: %v, want EINVALID", err)
		}
	})
}
