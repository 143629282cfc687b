package sqlstore_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// BenchmarkDropDay fills an expired day's partition of raw points with
// copies of a day of one device's points at 1 Hz (batches of 1000, as
// fleetbench's history scenario keeps them) under other device ids, then
// expires it while four goroutines keep a device's points of today
// (batches of 10): the drop's time, and ingest's p99 while it runs ÷ its
// p99 in the second before. "whole" is one DROP TABLE in a write job (the
// maintenance before it dropped in slices on SQLite), "maintain" is
// MaintainHistory. FLEETD_BENCH_DROP_POINTS sets the day's points
// (default 1,000,000; fleetbench drops 10,000,000).
func BenchmarkDropDay(b *testing.B) {
	points := 1_000_000
	if n, err := strconv.Atoi(os.Getenv("FLEETD_BENCH_DROP_POINTS")); err == nil && n > 0 {
		points = n
	}
	for _, be := range sqlstoretest.Backends() {
		for _, mode := range []string{"whole", "maintain"} {
			b.Run(be.Name+"/"+mode, func(b *testing.B) {
				ctx := context.Background()
				db, raw := openWithRaw(b, be)
				mustTenant(b, db, "acme")
				mustAlertDevices(b, db, "acme", "d1", "ing")
				now := time.Now().UTC()
				day := now.Truncate(24*time.Hour).AddDate(0, 0, -1)
				for i := 0; i < 86400; i += 1000 {
					pts := make([]fleet.DataPoint, 1000)
					for j := range pts {
						pts[j] = fleet.DataPoint{Timestamp: day.Add(time.Duration(i+j) * time.Second), Sequence: int64(i + j),
							Data: map[string]any{"temp": 20 + float64((i+j)%1000)/8}, ReceivedAt: now}
					}
					if err := db.CommitStream(ctx, "acme", "d1", "env", pts, nil); err != nil {
						b.Fatal(err)
					}
				}
				src := "stream_points_" + day.Format("20060102")
				b.ResetTimer()
				for i := range b.N {
					old := day.AddDate(0, 0, -40-i)
					part := "stream_points_" + old.Format("20060102")
					shift := day.Sub(old).Milliseconds()
					copies := (points + 86399) / 86400
					ddl := fmt.Sprintf("CREATE TABLE %s PARTITION OF stream_points FOR VALUES FROM (%d) TO (%d)", part, old.UnixMilli(), old.AddDate(0, 0, 1).UnixMilli())
					fill := fmt.Sprintf(`INSERT INTO %s SELECT tenant, device_id || '-' || c.k, stream, ts_min - %d, ts_max - %d, id, n, received_at, points
						FROM %s, generate_series(1, %d) AS c(k)`, part, shift, shift, src, copies)
					if be.Name == "sqlite" {
						var orig string
						if err := raw.QueryRow("SELECT sql FROM sqlite_master WHERE name = ?", src).Scan(&orig); err != nil {
							b.Fatal(err)
						}
						ddl = strings.Replace(orig, src, part, 1)
						fill = fmt.Sprintf(`WITH RECURSIVE c(k) AS (SELECT 1 UNION ALL SELECT k + 1 FROM c WHERE k < %d)
							INSERT INTO %s SELECT tenant, device_id || '-' || c.k, stream, ts_min - %d, ts_max - %d, id, n, received_at, points FROM %s, c`,
							copies, part, shift, shift, src)
					}
					b.StopTimer()
					for _, q := range []string{ddl, fill} {
						if _, err := raw.Exec(q); err != nil {
							b.Fatal(err)
						}
					}
					type call struct{ start, end time.Time }
					var (
						mu    sync.Mutex
						calls []call
						wg    sync.WaitGroup
					)
					stop := make(chan struct{})
					for w := range 4 {
						wg.Add(1)
						go func() {
							defer wg.Done()
							for k := 0; ; k++ {
								select {
								case <-stop:
									return
								default:
								}
								t0 := time.Now()
								pts := make([]fleet.DataPoint, 10)
								for j := range pts {
									pts[j] = fleet.DataPoint{Timestamp: t0, Sequence: int64((w*1_000_000+k)*10 + j), Data: map[string]any{"temp": 20.5}, ReceivedAt: t0}
								}
								if err := db.CommitStream(ctx, "acme", "ing", "env", pts, nil); err != nil {
									b.Error(err)
									return
								}
								mu.Lock()
								calls = append(calls, call{t0, time.Now()})
								mu.Unlock()
							}
						}()
					}
					time.Sleep(1500 * time.Millisecond)
					b.StartTimer()
					t0 := time.Now()
					var err error
					if mode == "whole" {
						err = db.DropPartitionWhole(ctx, part)
					} else {
						var dropped []string
						dropped, err = db.MaintainHistory(ctx)
						if err == nil && !slices.Contains(dropped, part) {
							err = fmt.Errorf("dropped %v, not %s", dropped, part)
						}
					}
					t1 := time.Now()
					b.StopTimer()
					time.Sleep(300 * time.Millisecond)
					close(stop)
					wg.Wait()
					if err != nil {
						b.Fatal(err)
					}
					var before, during []time.Duration
					for _, c := range calls {
						switch {
						case c.start.After(t0.Add(-time.Second)) && c.end.Before(t0):
							before = append(before, c.end.Sub(c.start))
						case c.start.Before(t1) && c.end.After(t0):
							during = append(during, c.end.Sub(c.start))
						}
					}
					slices.Sort(before)
					slices.Sort(during)
					p99 := func(l []time.Duration) time.Duration { return l[(len(l)*99+99)/100-1] }
					b.Logf("%s %s: %d points dropped in %v; ingest p99 %v (%d requests, longest %v) ÷ %v before (%d): %.2fx",
						be.Name, mode, copies*86400, t1.Sub(t0).Round(time.Millisecond), p99(during), len(during), during[len(during)-1],
						p99(before), len(before), float64(p99(during))/float64(p99(before)))
					b.StartTimer()
				}
			})
		}
	}
}
