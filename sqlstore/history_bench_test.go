package sqlstore_test

import (
	"context"
	"fmt"
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
			drainRollups(b, db)
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

// BenchmarkIngestRollups keeps batches of 100 points (1 Hz, one numeric
// field) of 1000 devices and adds up their rollups as the background job
// does, every 100 batches: with the rollups' index by stream (migration
// 0043, which fleet-wide aggregates read through) and, on another
// database, without it. The ratio of the two is what the index costs
// ingest with history.
func BenchmarkIngestRollups(b *testing.B) {
	for _, be := range sqlstoretest.Backends() {
		for _, index := range []bool{true, false} {
			name := be.Name + "/by_stream_index"
			if !index {
				name = be.Name + "/without_index"
			}
			b.Run(name, func(b *testing.B) {
				ctx := context.Background()
				now := time.Date(2026, 11, 21, 23, 0, 0, 0, time.UTC)
				db := sqlstoretest.MustOpen(b, be, sqlstoretest.Options{Now: func() time.Time { return now }})
				mustTenant(b, db, "acme")
				const devices = 1000
				var devs []fleet.NewDevice
				for i := range devices {
					devs = append(devs, fleet.NewDevice{ID: fmt.Sprintf("d%d", i)})
				}
				if _, err := db.CreateDevices(ctx, "acme", devs); err != nil {
					b.Fatal(err)
				}
				start := now.Add(-20 * time.Hour)
				keep := func(n int) {
					d, k := n%devices, n/devices
					pts := make([]fleet.DataPoint, 100)
					for j := range pts {
						pts[j] = fleet.DataPoint{Timestamp: start.Add(time.Duration(k*100+j) * time.Second), Sequence: int64(k*100 + j),
							Data: map[string]any{"temp": 20 + float64(j)/8}, ReceivedAt: now}
					}
					if err := db.CommitStream(ctx, "acme", fmt.Sprintf("d%d", d), "env", pts, nil); err != nil {
						b.Fatal(err)
					}
				}
				keep(0) // makes the partitions
				drainRollups(b, db)
				if !index {
					drop := []string{"stream_rollup_1m_by_stream", "stream_rollup_1h_by_stream"}
					if be.Name == "sqlite" {
						drop = []string{"stream_rollup_1m_" + start.Format("20060102") + "_by_stream", "stream_rollup_1h_" + start.Format("200601") + "_by_stream"}
					}
					for _, ix := range drop {
						if err := db.Exec(ctx, "DROP INDEX "+ix); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.ResetTimer()
				t0 := time.Now()
				for i := range b.N {
					keep(devices + i)
					if i%100 == 99 {
						drainRollups(b, db)
					}
				}
				drainRollups(b, db)
				b.ReportMetric(float64(b.N*100)/time.Since(t0).Seconds(), "points/s")
			})
		}
	}
}

// BenchmarkChartDay reads what a console chart of the last day reads (a
// field in 10-minute buckets, from minute rollups) of a device that sent a
// point a minute with three numeric fields for a week: AggregateStats,
// which the database adds up by bucket, of one field and of the three (a
// device page's charts of the stream, one statement), beside Aggregate of
// the average, which merges the 1440 minute rollups itself.
func BenchmarkChartDay(b *testing.B) {
	for _, be := range sqlstoretest.Backends() {
		b.Run(be.Name, func(b *testing.B) {
			ctx := context.Background()
			now := time.Date(2026, 11, 21, 23, 0, 0, 0, time.UTC)
			db := sqlstoretest.MustOpen(b, be, sqlstoretest.Options{Now: func() time.Time { return now }})
			mustTenant(b, db, "acme")
			if _, err := db.CreateDevices(ctx, "acme", []fleet.NewDevice{{ID: "d1"}}); err != nil {
				b.Fatal(err)
			}
			start := now.Add(-7 * 24 * time.Hour)
			for i := 0; i < 7*24*60; i += 1000 {
				var pts []fleet.DataPoint
				for j := i; j < min(i+1000, 7*24*60); j++ {
					pts = append(pts, fleet.DataPoint{Timestamp: start.Add(time.Duration(j) * time.Minute), Sequence: int64(j),
						Data: map[string]any{"f0": float64(j%60) / 6, "f1": 10.5, "f2": 20.25}, ReceivedAt: now})
				}
				if err := db.CommitStream(ctx, "acme", "d1", "env", pts, nil); err != nil {
					b.Fatal(err)
				}
			}
			drainRollups(b, db)
			q := fleet.AggregateQuery{Field: "f0", Fn: fleet.AggAvg, Interval: 10 * time.Minute, From: now.Add(-24 * time.Hour), To: now}
			b.Run("stats", func(b *testing.B) {
				for b.Loop() {
					if s, err := db.AggregateStats(ctx, "acme", "d1", "env", []string{"f0"}, q); err != nil || len(s["f0"]) != 144 {
						b.Fatalf("%d buckets, %v", len(s["f0"]), err)
					}
				}
			})
			b.Run("page", func(b *testing.B) { // the three fields' charts of a device page
				for b.Loop() {
					if s, err := db.AggregateStats(ctx, "acme", "d1", "env", []string{"f0", "f1", "f2"}, q); err != nil || len(s["f2"]) != 144 {
						b.Fatalf("%d buckets, %v", len(s["f2"]), err)
					}
				}
			})
			b.Run("merged_in_go", func(b *testing.B) {
				for b.Loop() {
					if s, err := db.Aggregate(ctx, "acme", "d1", "env", q); err != nil || len(s) != 144 {
						b.Fatalf("%d buckets, %v", len(s), err)
					}
				}
			})
		})
	}
}
