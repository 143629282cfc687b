package sqlstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// BenchmarkStreamHistoryDay keeps a day of one device's points at 1 Hz
// (one numeric field, batches of 100), then reports the bytes a point
// takes on disk, the time to read the day back in pages of 1000 and the
// time of a 30-day hourly aggregate (docs/operations.md, "Stream
// history"). Each iteration reads the day once.
func BenchmarkStreamHistoryDay(b *testing.B) {
	for _, be := range sqlstoretest.Backends() {
		b.Run(be.Name, func(b *testing.B) {
			ctx := context.Background()
			db, raw := openWithRaw(b, be)
			mustTenant(b, db, "acme")
			if _, err := db.CreateDevices(ctx, "acme", []fleet.NewDevice{{ID: "d1"}}); err != nil {
				b.Fatal(err)
			}
			now := time.Now()
			start := now.Add(-25 * time.Hour).Truncate(24 * time.Hour)
			for i := 0; i < 86400; i += 100 {
				pts := make([]fleet.DataPoint, 100)
				for j := range pts {
					pts[j] = fleet.DataPoint{Timestamp: start.Add(time.Duration(i+j) * time.Second), Sequence: int64(i + j),
						Data: map[string]any{"temp": 20 + float64((i+j)%1000)/7}, ReceivedAt: now}
				}
				if err := db.CommitStream(ctx, "acme", "d1", "env", pts, nil); err != nil {
					b.Fatal(err)
				}
			}
			for {
				n, err := db.RollUp(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if n == 0 {
					break
				}
			}
			size := "SELECT sum(pgsize) FROM dbstat WHERE name = ?"
			if be.Name == "postgres" {
				size = "SELECT pg_total_relation_size(CAST($1 AS regclass))"
			}
			var bytes int64
			if err := raw.QueryRow(size, "stream_points_"+start.Format("20060102")).Scan(&bytes); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for range b.N {
				n := 0
				q := fleet.PointQuery{Limit: 1000, From: start, To: start.Add(24 * time.Hour)}
				for {
					p, err := db.FindPoints(ctx, "acme", "d1", "env", q)
					if err != nil {
						b.Fatal(err)
					}
					n += len(p.Points)
					if p.Next == "" {
						break
					}
					q.Cursor = p.Next
				}
				if n != 86400 {
					b.Fatalf("read %d points of 86400", n)
				}
			}
			b.StopTimer()
			t0 := time.Now()
			bs, err := db.Aggregate(ctx, "acme", "d1", "env", fleet.AggregateQuery{Field: "temp", Fn: fleet.AggAvg, Interval: time.Hour, From: now.Add(-30 * 24 * time.Hour), To: now})
			if err != nil || len(bs) != 24 {
				b.Fatalf("aggregate: %d buckets, %v", len(bs), err)
			}
			b.ReportMetric(float64(time.Since(t0).Microseconds())/1000, "ms/30d-aggregate")
			b.ReportMetric(float64(bytes)/86400, "disk-B/point")
		})
	}
}
