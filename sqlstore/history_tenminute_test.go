package sqlstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestTenMinuteRollups: aggregates in whole multiples of 10 minutes equal
// the raw points' on a database that migration 0048 found with rollups:
// the chunks queued before it are rolled up into 10-minute partitions the
// rollup job makes, buckets before the 10-minute rollups are whole read
// the minute rollups, and a bucket across that boundary both.
func TestTenMinuteRollups(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, clk := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustAlertDevices(t, db, "acme", "d1", "d2")
		now := clk.Now().Truncate(time.Millisecond)
		// Yesterday's points and today's, queued, not rolled up.
		var pts []fleet.DataPoint
		for _, start := range []time.Time{now.Add(-27 * time.Hour), now.Add(-3 * time.Hour)} {
			for i := range 900 {
				pts = append(pts, fleet.DataPoint{Stream: "env", Timestamp: start.Add(time.Duration(i) * 11 * time.Second), Sequence: int64(i),
					Data: map[string]any{"temp": 20 + float64(i%37)/4, "count": int64(i % 11)}, ReceivedAt: now})
			}
		}
		for _, d := range []string{"d1", "d2"} {
			for i := 0; i < len(pts); i += 100 {
				if err := db.CommitStream(ctx, "acme", d, "env", pts[i:i+100], nil); err != nil {
					t.Fatal(err)
				}
			}
		}
		from := now.Add(-2*time.Hour - 5*time.Minute) // 07:55
		if err := db.MigratedAt(ctx, from); err != nil {
			t.Fatal(err)
		}
		drainRollups(t, db) // makes yesterday's 10-minute partition again
		// The 10-minute rollups before the boundary as if partial: gone.
		if err := db.MigratedAt(ctx, from); err != nil {
			t.Fatal(err)
		}
		for _, iv := range []time.Duration{10 * time.Minute, 20 * time.Minute, 30 * time.Minute} {
			for _, span := range [][2]time.Time{{now.Add(-28 * time.Hour), now}, {from.Add(-time.Hour), now}, {from, now}, {now.Add(-28 * time.Hour), from}} {
				q := fleet.AggregateQuery{Interval: iv, From: span[0], To: span[1]}
				what := fmt.Sprintf("by %s from %s to %s", iv, span[0].Format("02 15:04"), span[1].Format("02 15:04"))
				for _, fn := range fleet.AggregateFuncs {
					q.Field, q.Fn = "temp", fn
					got, err := db.Aggregate(ctx, "acme", "d1", "env", q)
					if err != nil {
						t.Fatal(err)
					}
					raw, err := db.AggregateRaw(ctx, "acme", "d1", "env", q)
					if err != nil {
						t.Fatal(err)
					}
					if len(raw) == 0 || !equalBuckets(got, raw) {
						t.Fatalf("%s of temp %s: rollups %+v, raw %+v", fn, what, got, raw)
					}
				}
				for _, device := range []string{"d1", ""} {
					stats, err := db.AggregateStats(ctx, "acme", device, "env", []string{"temp", "count"}, q)
					if err != nil {
						t.Fatal(err)
					}
					q.Field, q.Fn = "count", fleet.AggSum
					sums, _, err := db.AggregateFleet(ctx, "acme", "env", q)
					if device == "d1" {
						sums, err = db.AggregateRaw(ctx, "acme", "d1", "env", q)
					}
					if err != nil {
						t.Fatal(err)
					}
					if len(stats["count"]) != len(sums) {
						t.Fatalf("stats of count %s, device %q: %d buckets, want %d", what, device, len(stats["count"]), len(sums))
					}
					for i, s := range stats["count"] {
						if !s.Start.Equal(sums[i].Start) || s.Count != sums[i].Count || s.Avg*float64(s.Count) != sums[i].Value {
							t.Fatalf("stats of count %s, device %q, bucket %d: %+v, want %+v", what, device, i, s, sums[i])
						}
					}
				}
			}
		}
	})
}

// TestTenMinuteRollupsMigration: migration 0048 has 10-minute rollups
// whole from the start on a database without rollups, and from over a
// day ahead of its clock on one with minute rollups.
func TestTenMinuteRollupsMigration(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		ctx := context.Background()
		for _, rollups := range []bool{false, true} {
			db, err := sqlstore.Open(ctx, b.DSN(t), sqlstore.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if err := db.MigrateTo(ctx, 47); err != nil {
				t.Fatal(err)
			}
			if rollups {
				table := "stream_rollup_1m_20261121 (bucket BIGINT)"
				if b.Name == "postgres" {
					table = "stream_rollup_1m_20261121 PARTITION OF stream_rollup_1m FOR VALUES FROM (0) TO (1000)"
				}
				if err := db.Exec(ctx, "CREATE TABLE "+table); err != nil {
					t.Fatal(err)
				}
				if b.Name == "postgres" {
					if err := db.Exec(ctx, "INSERT INTO stream_rollup_1m VALUES ('acme', 'd1', 'env', 'temp', 0, 1, 1, 1, 1, 1, 0, 0)"); err != nil {
						t.Fatal(err)
					}
				}
			}
			t0 := time.Now()
			if err := db.MigrateTo(ctx, 48); err != nil {
				t.Fatal(err)
			}
			from, err := db.TenMinuteRollupsFrom(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if rollups && (from < t0.Add(fleet.FutureHorizon).UnixMilli() || from > t0.Add(fleet.FutureHorizon+time.Hour).UnixMilli() || from%600_000 != 0) ||
				!rollups && from != 0 {
				t.Errorf("with rollups %v: 10-minute rollups whole from %s", rollups, time.UnixMilli(from).UTC())
			}
		}
	})
}
