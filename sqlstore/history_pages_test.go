package sqlstore_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestPointPagesAcrossChunks pages through a stream kept in chunks of
// every size, from one point to a thousand, across hours and a day's
// partition, some of them overlapping others in time, some with equal
// timestamps: every page of every
// size, in both orders and from and to inside chunks, holds the points of
// one read of them all, in order. A page reads a few chunks a statement
// and asks for more when it needs them: pages of 100 and 1000 points of
// one-point chunks need many statements.
func TestPointPagesAcrossChunks(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, clk := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustAlertDevices(t, db, "acme", "d1")
		now := clk.Now()
		midnight := now.Truncate(24 * time.Hour)
		start := midnight.Add(-40 * time.Minute)
		var all []int64
		point := func(ms int64, seq int) fleet.DataPoint {
			all = append(all, ms)
			return fleet.DataPoint{Stream: "env", Timestamp: time.UnixMilli(ms), Sequence: int64(seq), Data: map[string]any{"v": seq}, ReceivedAt: now}
		}
		// Batches of these sizes in turn, a point every 4 s, from 40
		// minutes before midnight to 40 after (1,200 points).
		sizes := []int{1, 1, 3, 1, 17, 1, 2, 1000, 1, 5, 1, 1, 120, 1, 40}
		ms, seq := start.UnixMilli(), 0
		end := midnight.Add(40 * time.Minute).UnixMilli()
		for i := 0; ms < end; i++ {
			var batch []fleet.DataPoint
			for range sizes[i%len(sizes)] {
				if ms >= end {
					break
				}
				batch = append(batch, point(ms, seq))
				ms, seq = ms+4000, seq+1
			}
			if err := db.CommitStream(ctx, "acme", "d1", "env", batch, nil); err != nil {
				t.Fatal(err)
			}
		}
		// Batches whose points fall between the others' (2 s after them):
		// their chunks overlap many others in time.
		for _, from := range []time.Time{start.Add(time.Minute), midnight.Add(-3 * time.Minute), midnight.Add(20 * time.Minute)} {
			var batch []fleet.DataPoint
			for i := range 90 {
				batch = append(batch, point(from.UnixMilli()+2000+int64(i)*8000, 10_000+i))
			}
			if err := db.CommitStream(ctx, "acme", "d1", "env", batch, nil); err != nil {
				t.Fatal(err)
			}
		}
		// One-point batches of one timestamp: chunks of equal ts_min,
		// which a statement's next chunks are after by their id.
		for i := range 30 {
			tie := midnight.Add(5 * time.Minute).UnixMilli()
			if err := db.CommitStream(ctx, "acme", "d1", "env", []fleet.DataPoint{point(tie, 20_000+i)}, nil); err != nil {
				t.Fatal(err)
			}
		}
		slices.Sort(all)
		between := func(lo, hi int64) []int64 {
			var out []int64
			for _, ts := range all {
				if ts >= lo && ts < hi {
					out = append(out, ts)
				}
			}
			return out
		}
		// Inside chunks of many points.
		mid, late := all[40], all[len(all)-200]
		for _, r := range []struct {
			name     string
			from, to int64
		}{
			{"All", 0, 0},
			{"FromMidChunk", mid + 1, 0},
			{"ToMidChunk", 0, late + 1},
			{"Both", mid, late},
			{"OneDay", midnight.UnixMilli(), midnight.Add(24 * time.Hour).UnixMilli()},
			{"Narrow", all[100] + 1, all[105]},
		} {
			want := between(r.from, r.to)
			if r.to == 0 {
				want = between(r.from, end)
			}
			for _, limit := range []int{7, 100, 1000} {
				for _, desc := range []bool{false, true} {
					t.Run(fmt.Sprintf("%s/limit%d/desc=%v", r.name, limit, desc), func(t *testing.T) {
						q := fleet.PointQuery{Limit: limit, Desc: desc}
						if r.from != 0 {
							q.From = time.UnixMilli(r.from)
						}
						if r.to != 0 {
							q.To = time.UnixMilli(r.to)
						}
						got := timestamps(readAll(t, db, "acme", "d1", q))
						w := slices.Clone(want)
						if desc {
							slices.Reverse(w)
						}
						if !slices.Equal(got, w) {
							t.Fatalf("%d points, want %d; first %v, want %v", len(got), len(w), got[:min(5, len(got))], w[:min(5, len(w))])
						}
					})
				}
			}
		}
	})
}

// TestPointPagesUnderIngest reads a stream a page at a time while points
// arrive after it in small batches (many chunks a page): the pages, then
// the rest read on from the last page's end once ingest stops, hold every
// point once, in order. Within one day (one statement a page on
// PostgreSQL) and over every partition (a transaction), both orders for
// the points kept before the read.
func TestPointPagesUnderIngest(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, clk := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		now := clk.Now()
		midnight := now.Truncate(24 * time.Hour)
		for _, r := range []struct {
			name     string
			from, to time.Time
		}{
			{"OneDay", midnight, midnight.Add(24 * time.Hour)},
			{"Unbounded", time.Time{}, time.Time{}},
		} {
			t.Run(r.name, func(t *testing.T) {
				dev := "d-" + r.name
				mustAlertDevices(t, db, "acme", dev)
				ts := midnight.Add(time.Hour).UnixMilli() // today, before the clock
				seq := 0
				var kept []int64
				keep := func(n int) error {
					batch := make([]fleet.DataPoint, n)
					for i := range batch {
						batch[i] = fleet.DataPoint{Stream: "env", Timestamp: time.UnixMilli(ts), Sequence: int64(seq), Data: map[string]any{"v": seq}, ReceivedAt: now}
						kept = append(kept, ts)
						ts, seq = ts+1000, seq+1
					}
					return db.CommitStream(ctx, "acme", dev, "env", batch, nil)
				}
				for i := range 60 {
					if err := keep(1 + i%4); err != nil {
						t.Fatal(err)
					}
				}
				before := slices.Clone(kept)
				desc := timestamps(readAll(t, db, "acme", dev, fleet.PointQuery{Limit: 9, Desc: true, From: r.from, To: r.to}))
				slices.Reverse(desc)
				if !slices.Equal(desc, before) {
					t.Fatalf("newest first: %d points, want %d", len(desc), len(before))
				}

				stop, first := make(chan struct{}), make(chan struct{})
				var once sync.Once
				var wg sync.WaitGroup
				var ingestErr error
				wg.Add(1)
				go func() { // kept, ts and seq are the goroutine's until wg.Wait
					defer wg.Done()
					defer once.Do(func() { close(first) })
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						if ingestErr = keep(1 + i%3); ingestErr != nil {
							return
						}
						once.Do(func() { close(first) })
					}
				}()
				<-first // the read starts while points arrive
				var got []int64
				q := fleet.PointQuery{Limit: 7, From: r.from, To: r.to}
				var end string
				for pages := 0; pages < 40; pages++ {
					page, err := db.FindPoints(ctx, "acme", dev, "env", q)
					if err != nil {
						t.Fatal(err)
					}
					got = append(got, timestamps(page.Points)...)
					if page.End != "" {
						end = page.End
					}
					if page.Next == "" {
						break
					}
					q.Cursor = page.Next
				}
				close(stop)
				wg.Wait()
				if ingestErr != nil {
					t.Fatal(ingestErr)
				}
				q.Cursor = end
				got = append(got, timestamps(readAll(t, db, "acme", dev, q))...)
				if !slices.Equal(got, kept) {
					t.Fatalf("%d points read, %d kept; first difference at %d", len(got), len(kept), firstDiff(got, kept))
				}
			})
		}
	})
}

func firstDiff(a, b []int64) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestPointPagesSeePartitionsChange reads a stream, then again once a
// day's partition is made and once one is dropped: each read sees the
// partitions there are (SQLite's reads keep the list of partitions while
// the schema stays the same).
func TestPointPagesSeePartitionsChange(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, clk := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustAlertDevices(t, db, "acme", "d1")
		now := clk.Now()
		today := now.Truncate(24 * time.Hour)
		count := func(want int) {
			t.Helper()
			for _, desc := range []bool{false, true} {
				if got := readAll(t, db, "acme", "d1", fleet.PointQuery{Limit: 4, Desc: desc}); len(got) != want {
					t.Fatalf("desc=%v: %d points, want %d", desc, len(got), want)
				}
			}
		}
		if err := db.CommitStream(ctx, "acme", "d1", "env", historyPoints(today, 10, now), nil); err != nil {
			t.Fatal(err)
		}
		count(10)
		older := today.AddDate(0, 0, -5)
		if err := db.CommitStream(ctx, "acme", "d1", "env", historyPoints(older, 7, now), nil); err != nil {
			t.Fatal(err)
		}
		count(17)
		if err := db.Exec(ctx, "DROP TABLE stream_points_"+older.Format("20060102")); err != nil {
			t.Fatal(err)
		}
		count(10)
	})
}

// TestPointPagesScope reads a device's points of a day within the day
// (From and To: on PostgreSQL a page's one statement, which reads the
// device's scope beside the chunks) and unbounded (the device's scope
// read first), in pages of every size and both orders: each read shows
// the points from the floor of the tenant's retention on (its own, and the
// server's), none of a device of the same id deleted before, and a device
// that is not there is not found.
func TestPointPagesScope(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, clk := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustTenant(t, db, "beta")
		mustAlertDevices(t, db, "acme", "d1")
		day := clk.Now().Truncate(24*time.Hour).AddDate(0, 0, -1)
		var pts []fleet.DataPoint
		for i := range 480 { // a point a minute, 08:00 to 16:00
			pts = append(pts, fleet.DataPoint{Stream: "env", Timestamp: day.Add(8*time.Hour + time.Duration(i)*time.Minute), Sequence: int64(i),
				Data: map[string]any{"v": i}, ReceivedAt: clk.Now()})
		}
		for i := 0; i < len(pts); i += 100 { // batches across hours
			if err := db.CommitStream(ctx, "acme", "d1", "env", pts[i:min(i+100, len(pts))], nil); err != nil {
				t.Fatal(err)
			}
		}
		check := func(t *testing.T, tenant, device string, from int) {
			t.Helper()
			var want []int64
			for _, p := range pts[from:] {
				want = append(want, p.Timestamp.UnixMilli())
			}
			for _, bounded := range []bool{true, false} {
				for _, limit := range []int{7, 100, 1000} {
					for _, desc := range []bool{false, true} {
						q := fleet.PointQuery{Limit: limit, Desc: desc}
						if bounded {
							q.From, q.To = day, day.Add(24*time.Hour)
						}
						got := timestamps(readAll(t, db, tenant, device, q))
						if desc {
							slices.Reverse(got)
						}
						if !slices.Equal(got, want) {
							t.Fatalf("bounded %v, limit %d, desc %v: %d points from %v, want %d from %v", bounded, limit, desc,
								len(got), got[:min(1, len(got))], len(want), want[:min(1, len(want))])
						}
					}
				}
			}
		}
		t.Run("All", func(t *testing.T) { check(t, "acme", "d1", 0) })
		t.Run("OwnRetention", func(t *testing.T) {
			if err := db.SetStreamRetention(ctx, "acme", 24*time.Hour); err != nil {
				t.Fatal(err)
			}
			// A day ago is 12:30: the floor is 12:00, and the points
			// before it are not shown (their partition is still there).
			clk.Set(day.Add(24*time.Hour + 12*time.Hour + 30*time.Minute))
			check(t, "acme", "d1", 4*60)
		})
		t.Run("ServerRetention", func(t *testing.T) {
			if err := db.SetStreamRetention(ctx, "acme", 0); err != nil {
				t.Fatal(err)
			}
			clk.Set(day.Add(fleet.DefaultStreamRetention + 14*time.Hour + 59*time.Minute))
			check(t, "acme", "d1", 6*60)
		})
		t.Run("NotFound", func(t *testing.T) {
			for _, q := range []fleet.PointQuery{{Limit: 10, From: day, To: day.Add(24 * time.Hour)}, {Limit: 10}} {
				_, err := db.FindPoints(ctx, "acme", "ghost", "env", q)
				wantCode(t, err, fleet.ENOTFOUND)
				_, err = db.FindPoints(ctx, "beta", "d1", "env", q)
				wantCode(t, err, fleet.ENOTFOUND)
			}
		})
		t.Run("DeviceMadeAgain", func(t *testing.T) {
			if err := db.DeleteDevice(ctx, "acme", "d1"); err != nil {
				t.Fatal(err)
			}
			clk.Add(time.Millisecond)
			mustAlertDevices(t, db, "acme", "d1")
			check(t, "acme", "d1", len(pts))
		})
	})
}
