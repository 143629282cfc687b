package sqlstore_test

import (
	"context"
	"encoding/base64"
	"errors"
	"log/slog"
	"math"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/internal/poll"
	"github.com/fleetd/fleet/internal/testclock"
	"github.com/fleetd/fleet/sqlstore"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// historyPoints are n points of stream env a second apart from start,
// each with a float, an integer and a text field.
func historyPoints(start time.Time, n int, received time.Time) []fleet.DataPoint {
	pts := make([]fleet.DataPoint, n)
	for i := range pts {
		pts[i] = fleet.DataPoint{Stream: "env", Timestamp: start.Add(time.Duration(i) * time.Second), Sequence: int64(i),
			Data:       map[string]any{"temp": 20 + float64(i%37)/4, "count": int64(i % 11), "state": "ok"},
			ReceivedAt: received}
	}
	return pts
}

// readAll pages through a stream's points with limit.
func readAll(t *testing.T, db *sqlstore.DB, tenant, device string, q fleet.PointQuery) []fleet.HistoryPoint {
	t.Helper()
	var all []fleet.HistoryPoint
	for pages := 0; ; pages++ {
		page, err := db.FindPoints(context.Background(), tenant, device, "env", q)
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Points) > q.Limit {
			t.Fatalf("a page of %d points; limit %d", len(page.Points), q.Limit)
		}
		all = append(all, page.Points...)
		if page.Next == "" {
			return all
		}
		if pages > 1000 {
			t.Fatal("no end of pages")
		}
		q.Cursor = page.Next
	}
}

func timestamps(pts []fleet.HistoryPoint) []int64 {
	out := make([]int64, len(pts))
	for i, p := range pts {
		out[i] = p.Timestamp.UnixMilli()
	}
	return out
}

func TestStreamHistory(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, clk := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustTenant(t, db, "beta")
		mustAlertDevices(t, db, "acme", "d1", "d2")
		mustAlertDevices(t, db, "beta", "d1")
		now := clk.Now().Truncate(time.Millisecond)
		start := now.Add(-time.Hour).Truncate(time.Hour).Add(-100 * time.Second) // the batches cross an hour
		pts := historyPoints(start, 250, now)
		for i := 0; i < len(pts); i += 100 {
			if err := db.CommitStream(ctx, "acme", "d1", "env", pts[i:min(i+100, len(pts))], nil); err != nil {
				t.Fatal(err)
			}
		}
		// A batch sent again, as after a lost PUBACK or an HTTP retry, a
		// second later: its points are kept and rolled up once.
		resent := slices.Clone(pts[100:200])
		for i := range resent {
			resent[i].ReceivedAt = now.Add(time.Second)
		}
		if err := db.CommitStream(ctx, "acme", "d1", "env", resent, nil); err != nil {
			t.Fatal(err)
		}
		want := make([]int64, len(pts))
		for i, p := range pts {
			want[i] = p.Timestamp.UnixMilli()
		}

		t.Run("PagesInOrder", func(t *testing.T) {
			for _, limit := range []int{1, 7, 100, 1000} {
				got := timestamps(readAll(t, db, "acme", "d1", fleet.PointQuery{Limit: limit}))
				if !slices.Equal(got, want) {
					t.Fatalf("limit %d: %d points %v…, want %d", limit, len(got), got[:min(5, len(got))], len(want))
				}
				got = timestamps(readAll(t, db, "acme", "d1", fleet.PointQuery{Limit: limit, Desc: true}))
				rev := slices.Clone(want)
				slices.Reverse(rev)
				if !slices.Equal(got, rev) {
					t.Fatalf("desc, limit %d: %d points, want %d", limit, len(got), len(rev))
				}
			}
		})
		t.Run("Data", func(t *testing.T) {
			page, err := db.FindPoints(ctx, "acme", "d1", "env", fleet.PointQuery{Limit: 1, From: pts[5].Timestamp})
			if err != nil {
				t.Fatal(err)
			}
			got := page.Points[0]
			data, err := got.Values()
			if err != nil || !got.Timestamp.Equal(pts[5].Timestamp) || got.Sequence != 5 || !reflect.DeepEqual(data, pts[5].Data) || !got.ReceivedAt.Equal(now) {
				t.Fatalf("point = %+v, want %+v", got, pts[5])
			}
		})
		t.Run("Range", func(t *testing.T) {
			got := timestamps(readAll(t, db, "acme", "d1", fleet.PointQuery{Limit: 10, From: pts[10].Timestamp, To: pts[130].Timestamp}))
			if !slices.Equal(got, want[10:130]) {
				t.Fatalf("[10, 130): %d points", len(got))
			}
		})
		t.Run("CursorStableUnderIngest", func(t *testing.T) {
			page, err := db.FindPoints(ctx, "acme", "d2", "env", fleet.PointQuery{Limit: 2})
			if err != nil || len(page.Points) != 0 || page.Next != "" {
				t.Fatalf("empty stream: %+v %v", page, err)
			}
			same := historyPoints(start, 10, now)
			for i := range same {
				same[i].Sequence = 0 // ties on timestamp and sequence too
			}
			if err := db.CommitStream(ctx, "acme", "d2", "env", same[:6], nil); err != nil {
				t.Fatal(err)
			}
			page, err = db.FindPoints(ctx, "acme", "d2", "env", fleet.PointQuery{Limit: 4})
			if err != nil || len(page.Points) != 4 {
				t.Fatal(page, err)
			}
			// Arriving meanwhile: a point before the cursor, one equal to
			// the last read, and later ones.
			late := append([]fleet.DataPoint{same[0], same[3]}, same[6:]...)
			if err := db.CommitStream(ctx, "acme", "d2", "env", late, nil); err != nil {
				t.Fatal(err)
			}
			rest := readAll(t, db, "acme", "d2", fleet.PointQuery{Limit: 3, Cursor: page.Next})
			got := timestamps(append(page.Points, rest...))
			// The point equal to the last read (same[3] again) may come
			// after it, in chunk order; the one before the cursor never.
			if n := len(got); n != 10 && n != 11 {
				t.Fatalf("%d points read: %v", n, got)
			}
			if got[1] == got[0] {
				t.Fatalf("a point before the cursor was read: %v", got)
			}
			if !slices.IsSorted(got) {
				t.Fatalf("out of order: %v", got)
			}
		})
		t.Run("Cursor", func(t *testing.T) {
			page, err := db.FindPoints(ctx, "acme", "d1", "env", fleet.PointQuery{Limit: 2})
			if err != nil {
				t.Fatal(err)
			}
			_, err = db.FindPoints(ctx, "acme", "d1", "env", fleet.PointQuery{Limit: 2, Desc: true, Cursor: page.Next})
			wantCode(t, err, fleet.EINVALID)
			for _, c := range []string{"x", b64("1.a.1.2.3"), b64("1.a.x.2.3.4"), b64("2.a.1.2.3.4"), b64("1.a.1.2.3.4x"), b64("1.b.1.2.3.4")} {
				_, err = db.FindPoints(ctx, "acme", "d1", "env", fleet.PointQuery{Limit: 2, Cursor: c})
				wantCode(t, err, fleet.EINVALID)
			}
		})
		t.Run("Streams", func(t *testing.T) {
			got, err := db.FindStreams(ctx, "acme", "d1")
			if err != nil {
				t.Fatal(err)
			}
			wantInfo := []fleet.StreamInfo{{Name: "env", Points: 250, FirstTimestamp: pts[0].Timestamp, LastTimestamp: pts[249].Timestamp}}
			if !reflect.DeepEqual(got, wantInfo) {
				t.Fatalf("streams = %+v, want %+v", got, wantInfo)
			}
		})
		t.Run("TenantsApart", func(t *testing.T) {
			got, err := db.FindStreams(ctx, "beta", "d1")
			if err != nil || len(got) != 0 {
				t.Fatalf("beta's d1: %+v %v", got, err)
			}
			page, err := db.FindPoints(ctx, "beta", "d1", "env", fleet.PointQuery{Limit: 10})
			if err != nil || len(page.Points) != 0 {
				t.Fatalf("beta's d1 points: %+v %v", page, err)
			}
			q := fleet.AggregateQuery{Field: "temp", Fn: fleet.AggCount, Interval: time.Hour, From: start, To: now}
			if bs, err := db.Aggregate(ctx, "beta", "d1", "env", q); err != nil || len(bs) != 0 {
				t.Fatalf("beta's aggregate: %+v %v", bs, err)
			}
			if bs, _, err := db.AggregateFleet(ctx, "beta", "env", q); err != nil || len(bs) != 0 {
				t.Fatalf("beta's fleet aggregate: %+v %v", bs, err)
			}
			_, err = db.FindPoints(ctx, "beta", "d2", "env", fleet.PointQuery{Limit: 10})
			wantCode(t, err, fleet.ENOTFOUND)
			_, err = db.FindStreams(ctx, "acme", "ghost")
			wantCode(t, err, fleet.ENOTFOUND)
		})
		t.Run("RollupsEqualRaw", func(t *testing.T) {
			if n, err := db.RollUp(ctx); err != nil || n != 5 {
				t.Fatalf("rolled up %d chunks (%v), want 5: 3 of d1, 2 of d2", n, err)
			}
			for _, iv := range []time.Duration{time.Minute, 3 * time.Minute, 10 * time.Minute, 30 * time.Minute, time.Hour, 2 * time.Hour} {
				for _, fn := range fleet.AggregateFuncs {
					for _, field := range []string{"temp", "count", "state"} {
						q := fleet.AggregateQuery{Field: field, Fn: fn, Interval: iv, From: start.Add(-time.Hour), To: now}
						got, err := db.Aggregate(ctx, "acme", "d1", "env", q)
						if err != nil {
							t.Fatal(err)
						}
						raw, err := db.AggregateRaw(ctx, "acme", "d1", "env", q)
						if err != nil {
							t.Fatal(err)
						}
						if !equalBuckets(got, raw) {
							t.Fatalf("%s of %s by %s: rollups %+v, raw %+v", fn, field, iv, got, raw)
						}
						if field == "state" && len(got) != 0 {
							t.Fatalf("text field aggregated: %+v", got)
						}
					}
				}
			}
			q := fleet.AggregateQuery{Field: "count", Fn: fleet.AggSum, Interval: 24 * time.Hour, From: start, To: now}
			bs, err := db.Aggregate(ctx, "acme", "d1", "env", q)
			var sum float64
			for _, p := range pts {
				sum += float64(p.Data["count"].(int64))
			}
			if err != nil || len(bs) != 1 || bs[0].Value != sum || bs[0].Count != 250 || !bs[0].Start.Equal(now.Truncate(24*time.Hour)) {
				t.Fatalf("a day's sum = %+v %v, want %v of 250", bs, err, sum)
			}
		})
		t.Run("FleetWide", func(t *testing.T) {
			if _, err := db.UpdateDeviceMetadata(ctx, "acme", "d1", map[string]*string{"site": ptr("north")}); err != nil {
				t.Fatal(err)
			}
			q := fleet.AggregateQuery{Field: "temp", Fn: fleet.AggCount, Interval: 24 * time.Hour, From: start, To: now}
			all, _, err := db.AggregateFleet(ctx, "acme", "env", q)
			if err != nil || len(all) != 1 || all[0].Count != 250+12 {
				t.Fatalf("fleet count = %+v %v, want 262", all, err)
			}
			q.Metadata = map[string]string{"site": "north"}
			north, _, err := db.AggregateFleet(ctx, "acme", "env", q)
			if err != nil || len(north) != 1 || north[0].Count != 250 {
				t.Fatalf("site=north count = %+v %v, want 250", north, err)
			}
			q.Metadata, q.ByDevice = nil, true
			_, series, err := db.AggregateFleet(ctx, "acme", "env", q)
			if err != nil || len(series) != 2 || series[0].DeviceID != "d1" || series[1].Buckets[0].Count != 12 {
				t.Fatalf("by device = %+v %v", series, err)
			}
			// The series by device are held in memory until written: a
			// range of more buckets than allowed over all the devices is
			// refused, not gathered. d1's 250 points are a second apart.
			q.Interval = time.Second
			db.SetMaxSeriesBuckets(100)
			_, _, err = db.AggregateFleet(ctx, "acme", "env", q)
			db.SetMaxSeriesBuckets(fleet.MaxSeriesBuckets)
			wantCode(t, err, fleet.EINVALID)
			if _, series, err = db.AggregateFleet(ctx, "acme", "env", q); err != nil || len(series) != 2 || len(series[0].Buckets) != 250 {
				t.Fatalf("by device, by the second: %d series, %v", len(series), err)
			}
		})
		t.Run("FleetWideByGroup", func(t *testing.T) {
			// d1's site is north (FleetWide): the group of the north is d1,
			// beside any metadata filter; beta's group of the same name
			// is beta's, and a group only beta has is unknown to acme.
			for _, g := range []struct{ tenant, name, sel string }{
				{"acme", "north", "site=north"}, {"acme", "not-north", "site!=north"}, {"beta", "north", "site"}, {"beta", "beta-only", "site"},
			} {
				if _, err := db.CreateGroup(ctx, g.tenant, &fleet.Group{Name: g.name, Selector: g.sel}); err != nil {
					t.Fatal(err)
				}
			}
			q := fleet.AggregateQuery{Field: "temp", Fn: fleet.AggCount, Interval: 24 * time.Hour, From: start, To: now, Group: "north"}
			north, _, err := db.AggregateFleet(ctx, "acme", "env", q)
			if err != nil || len(north) != 1 || north[0].Count != 250 {
				t.Fatalf("group north count = %+v %v, want 250", north, err)
			}
			q.ByDevice = true
			_, series, err := db.AggregateFleet(ctx, "acme", "env", q)
			if err != nil || len(series) != 1 || series[0].DeviceID != "d1" {
				t.Fatalf("group north by device = %+v %v", series, err)
			}
			q.Group, q.ByDevice = "not-north", false
			rest, _, err := db.AggregateFleet(ctx, "acme", "env", q)
			if err != nil || len(rest) != 1 || rest[0].Count != 12 {
				t.Fatalf("group not-north count = %+v %v, want d2's 12", rest, err)
			}
			q.Metadata = map[string]string{"site": "north"}
			if none, _, err := db.AggregateFleet(ctx, "acme", "env", q); err != nil || len(none) != 0 {
				t.Fatalf("group not-north and site=north = %+v %v, want nothing", none, err)
			}
			q.Metadata, q.Group = nil, "north"
			if bs, _, err := db.AggregateFleet(ctx, "beta", "env", q); err != nil || len(bs) != 0 {
				t.Fatalf("beta's group north = %+v %v: acme's points", bs, err)
			}
			for _, name := range []string{"beta-only", "ghost"} {
				q.Group = name
				_, _, err = db.AggregateFleet(ctx, "acme", "env", q)
				var fe *fleet.Error
				if !errors.As(err, &fe) || fe.Code != fleet.EINVALID || fe.Fields["group"] == "" {
					t.Fatalf("acme's group %s: %v, want a problem with group", name, err)
				}
			}
		})
		t.Run("BadQueries", func(t *testing.T) {
			for _, q := range []fleet.AggregateQuery{
				{Field: "temp", Fn: "median", Interval: time.Minute, From: start, To: now},
				{Field: "temp", Fn: "avg", Interval: 90 * time.Second, From: start, To: now},
				{Field: "temp", Fn: "avg", Interval: 1500 * time.Millisecond, From: start, To: now},
				{Field: "temp", Fn: "avg", Interval: time.Second, From: now.Add(-24 * time.Hour), To: now},
				{Field: "temp", Fn: "avg", Interval: time.Minute, From: now.Add(-30 * 24 * time.Hour), To: now},
				{Field: "temp", Fn: "avg", Interval: time.Minute, From: now, To: now.Add(-time.Hour)},
			} {
				_, err := db.Aggregate(ctx, "acme", "d1", "env", q)
				wantCode(t, err, fleet.EINVALID)
			}
		})
		t.Run("Retention", func(t *testing.T) {
			before := db.HistoryStats()
			old := historyPoints(now.Add(-31*24*time.Hour), 3, now)
			future := historyPoints(now.Add(25*time.Hour), 2, now)
			if err := db.CommitStream(ctx, "acme", "d2", "other", append(old, future...), nil); err != nil {
				t.Fatal(err)
			}
			after := db.HistoryStats()
			if after.Expired-before.Expired != 3 || after.Future-before.Future != 2 || after.Kept != before.Kept {
				t.Fatalf("stats %+v, then %+v", before, after)
			}
			if _, err := db.FindLatestPoint(ctx, "acme", "d2", "other"); err != nil {
				t.Fatalf("the latest point is kept whatever history does: %v", err)
			}
			if err := db.SetStreamRetention(ctx, "acme", time.Hour); err == nil {
				t.Fatal("a retention of an hour was accepted")
			}
			if err := db.SetStreamRetention(ctx, "acme", 40*24*time.Hour); err != nil {
				t.Fatal(err)
			}
			if d, own, err := db.StreamRetention(ctx, "acme"); err != nil || d != 40*24*time.Hour || !own {
				t.Fatalf("retention = %v %v %v", d, own, err)
			}
			if err := db.CommitStream(ctx, "acme", "d2", "old", old, nil); err != nil {
				t.Fatal(err)
			}
			if got := db.HistoryStats().Kept - after.Kept; got != 3 {
				t.Fatalf("kept %d of 3 points within acme's 40 days", got)
			}
			if d, own, err := db.StreamRetention(ctx, "beta"); err != nil || d != fleet.DefaultStreamRetention || own {
				t.Fatalf("beta's retention = %v %v %v", d, own, err)
			}
			if err := db.SetStreamRetention(ctx, "acme", 0); err != nil {
				t.Fatal(err)
			}
		})
		t.Run("DeviceMadeAgain", func(t *testing.T) {
			if err := db.DeleteDevice(ctx, "acme", "d2"); err != nil {
				t.Fatal(err)
			}
			clk.Add(time.Millisecond)
			mustAlertDevices(t, db, "acme", "d2")
			page, err := db.FindPoints(ctx, "acme", "d2", "env", fleet.PointQuery{Limit: 10})
			if err != nil || len(page.Points) != 0 {
				t.Fatalf("a new d2 reads the old one's points: %d %v", len(page.Points), err)
			}
			if got, err := db.FindStreams(ctx, "acme", "d2"); err != nil || len(got) != 0 {
				t.Fatalf("a new d2 lists the old one's streams: %+v %v", got, err)
			}
			// An aggregate under a minute reads raw points: not the old
			// one's either (rollups, which are not, stay until they expire).
			raw := fleet.AggregateQuery{Field: "temp", Fn: fleet.AggCount, Interval: 10 * time.Second, From: start, To: start.Add(time.Minute)}
			if got, err := db.Aggregate(ctx, "acme", "d2", "env", raw); err != nil || len(got) != 0 {
				t.Fatalf("a new d2 aggregates the old one's points: %+v %v", got, err)
			}
			// The new d2 sends a batch byte for byte the old one sent
			// (the same timestamps, sequences and data): its points are
			// its own, not taken for the old chunk sent again; and sent
			// again, they are kept once.
			again := historyPoints(start, 10, now)[:6]
			for i := range again {
				again[i].Sequence, again[i].ReceivedAt = 0, clk.Now()
			}
			for range 2 {
				if err := db.CommitStream(ctx, "acme", "d2", "env", again, nil); err != nil {
					t.Fatal(err)
				}
				if got := timestamps(readAll(t, db, "acme", "d2", fleet.PointQuery{Limit: 10})); len(got) != 6 {
					t.Fatalf("the new d2 reads %d of the 6 points it sent", len(got))
				}
			}
		})
		t.Run("PartitionsDroppedWhole", func(t *testing.T) {
			if _, err := db.MaintainHistory(ctx); err != nil {
				t.Fatal(err)
			}
			clk.Add(31 * 24 * time.Hour)
			dropped, err := db.MaintainHistory(ctx)
			if err != nil {
				t.Fatal(err)
			}
			day := now.Format("20060102")
			if !slices.Contains(dropped, "stream_points_"+day) || slices.Contains(dropped, "stream_rollup_1m_"+day) {
				t.Fatalf("dropped %v", dropped)
			}
			page, err := db.FindPoints(ctx, "acme", "d1", "env", fleet.PointQuery{Limit: 10, From: start})
			if err != nil || len(page.Points) != 0 {
				t.Fatalf("points after their partition was dropped: %d %v", len(page.Points), err)
			}
			q := fleet.AggregateQuery{Field: "temp", Fn: fleet.AggCount, Interval: time.Hour, From: start, To: now}
			if bs, err := db.Aggregate(ctx, "acme", "d1", "env", q); err != nil || len(bs) == 0 {
				t.Fatalf("hour rollups outlive raw points: %+v %v", bs, err)
			}
			if dropped, err := db.MaintainHistory(ctx); err != nil || len(dropped) != 0 {
				t.Fatalf("dropped again: %v %v", dropped, err)
			}
		})
	})
}

func b64(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

// equalBuckets compares buckets, their sums to a rounding.
func equalBuckets(a, b []fleet.Bucket) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].Start.Equal(b[i].Start) || a[i].Count != b[i].Count || math.Abs(a[i].Value-b[i].Value) > 1e-9*math.Max(1, math.Abs(a[i].Value)) {
			return false
		}
	}
	return true
}

// TestStreamHistoryReplicas: replicas on one PostgreSQL ingest the same
// streams, each batch on both, and drain the rollup queue at once; every
// point is kept once and the rollups equal the raw points' aggregates.
func TestStreamHistoryReplicas(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		if b.Name != "postgres" {
			t.Skip("replicas share a PostgreSQL database")
		}
		ctx := context.Background()
		dbs := mustReplicas(t, b)
		mustTenant(t, dbs[0], "acme")
		mustAlertDevices(t, dbs[0], "acme", "d1", "d2")
		start := time.Now().Add(-2 * time.Hour).Truncate(time.Minute)
		var wg sync.WaitGroup
		errs := make(chan error, 512)
		for r, db := range dbs {
			wg.Add(2)
			go func() {
				defer wg.Done()
				// Each replica commits every batch: each is sent twice, at
				// about the same time, as a device's retry to another
				// replica would be.
				for i := range 40 {
					pts := historyPoints(start.Add(time.Duration((r*20+i)%40)*50*time.Second), 50, time.Now())
					for _, d := range []string{"d1", "d2"} {
						if err := db.CommitStream(ctx, "acme", d, "env", pts, nil); err != nil {
							errs <- err
						}
					}
				}
			}()
			go func() {
				defer wg.Done()
				for range 20 {
					if _, err := db.RollUp(ctx); err != nil {
						errs <- err
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		for {
			n, err := dbs[1].RollUp(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				break
			}
		}
		for _, d := range []string{"d1", "d2"} {
			streams, err := dbs[1].FindStreams(ctx, "acme", d)
			if err != nil || len(streams) != 1 || streams[0].Points != 2000 {
				t.Fatalf("%s: streams %+v %v, want 2000 points", d, streams, err)
			}
			for _, fn := range fleet.AggregateFuncs {
				q := fleet.AggregateQuery{Field: "temp", Fn: fn, Interval: 5 * time.Minute, From: start, To: time.Now()}
				got, err := dbs[0].Aggregate(ctx, "acme", d, "env", q)
				if err != nil {
					t.Fatal(err)
				}
				raw, err := dbs[1].AggregateRaw(ctx, "acme", d, "env", q)
				if err != nil {
					t.Fatal(err)
				}
				if !equalBuckets(got, raw) {
					t.Fatalf("%s of %s: rollups %+v, raw %+v", fn, d, got, raw)
				}
			}
		}
	})
}

// TestRollupLastTies: points of one timestamp and sequence, in one batch,
// in batches one after another and on two devices, have one last value,
// the greatest, whether it is read from the rollups or from the raw
// points, by device and fleet-wide (docs/telemetry.md).
func TestRollupLastTies(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, clk := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustAlertDevices(t, db, "acme", "d1", "d2")
		now := clk.Now().Truncate(time.Millisecond)
		ts := now.Add(-time.Hour).Truncate(time.Minute).Add(30 * time.Second)
		point := func(temp float64) fleet.DataPoint {
			return fleet.DataPoint{Stream: "env", Timestamp: ts, Sequence: 7, Data: map[string]any{"temp": temp}, ReceivedAt: now}
		}
		for _, c := range []struct {
			device string
			temps  []float64
		}{
			{"d1", []float64{5, 3}}, {"d1", []float64{9}}, {"d1", []float64{4}},
			{"d2", []float64{8, 2}}, {"d2", []float64{1}},
		} {
			var pts []fleet.DataPoint
			for _, v := range c.temps {
				pts = append(pts, point(v))
			}
			if err := db.CommitStream(ctx, "acme", c.device, "env", pts, nil); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := db.RollUp(ctx); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			device string
			want   float64
		}{{"d1", 9}, {"d2", 8}, {"", 9}} {
			for _, iv := range []time.Duration{time.Minute, time.Hour} {
				q := fleet.AggregateQuery{Field: "temp", Fn: fleet.AggLast, Interval: iv, From: ts.Add(-time.Hour), To: now}
				var got []fleet.Bucket
				var err error
				if c.device == "" {
					got, _, err = db.AggregateFleet(ctx, "acme", "env", q)
				} else {
					got, err = db.Aggregate(ctx, "acme", c.device, "env", q)
				}
				if err != nil {
					t.Fatal(err)
				}
				raw, err := db.AggregateRaw(ctx, "acme", c.device, "env", q)
				if err != nil {
					t.Fatal(err)
				}
				if len(got) != 1 || got[0].Value != c.want || !equalBuckets(got, raw) {
					t.Fatalf("last of %q by %s: rollups %+v, raw %+v, want %v", c.device, iv, got, raw, c.want)
				}
			}
		}
	})
}

// TestStreamHistoryPartitionDropped: a partition one replica took to exist
// and another dropped (its maintenance, or an operator, or fleetbench)
// is made again at the next write to it, which is kept, not a 500.
func TestStreamHistoryPartitionDropped(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		ctx := context.Background()
		dbs := mustReplicas(t, b)
		mustTenant(t, dbs[0], "acme")
		mustAlertDevices(t, dbs[0], "acme", "d1")
		day := time.Now().UTC().AddDate(0, 0, -3).Truncate(24 * time.Hour)
		for i, db := range dbs {
			if err := db.CommitStream(ctx, "acme", "d1", "env", historyPoints(day.Add(time.Duration(i)*time.Hour), 10, time.Now()), nil); err != nil {
				t.Fatal(err)
			}
		}
		if err := dbs[0].Exec(ctx, "DROP TABLE stream_points_"+day.Format("20060102")); err != nil {
			t.Fatal(err)
		}
		if err := dbs[1].CommitStream(ctx, "acme", "d1", "env", historyPoints(day.Add(2*time.Hour), 10, time.Now()), nil); err != nil {
			t.Fatalf("a write to a partition dropped by another: %v", err)
		}
		streams, err := dbs[0].FindStreams(ctx, "acme", "d1")
		if err != nil || len(streams) != 1 || streams[0].Points != 10 {
			t.Fatalf("streams %+v %v, want the 10 points written after the drop", streams, err)
		}
	})
}

// TestFleetAggregateReadsTheStream checks that a fleet-wide aggregate's
// read of the rollups is served by migration 0043's index on (tenant,
// stream, field, bucket), not by the primary key on its tenant prefix
// (every rollup of the tenant in the range, of every stream and field),
// and that it still sums the stream's rollups of every device, and no
// other stream's or tenant's.
func TestFleetAggregateReadsTheStream(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, clk := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustTenant(t, db, "globex")
		devices := []string{"d1", "d2", "d3"}
		mustAlertDevices(t, db, "acme", devices...)
		mustAlertDevices(t, db, "globex", "d1")
		now := clk.Now().Truncate(time.Millisecond)
		start := now.Add(-2 * time.Hour).Truncate(time.Hour)
		keep := func(tenant, device, stream string, temp float64) {
			pts := make([]fleet.DataPoint, 60)
			for i := range pts {
				pts[i] = fleet.DataPoint{Stream: stream, Timestamp: start.Add(time.Duration(i) * time.Minute), Sequence: int64(i),
					Data: map[string]any{"temp": temp, "other": 1000.0}, ReceivedAt: now}
			}
			if err := db.CommitStream(ctx, tenant, device, stream, pts, nil); err != nil {
				t.Fatal(err)
			}
		}
		for i, d := range devices {
			keep("acme", d, "env", float64(i+1))
			keep("acme", d, "power", 500)
		}
		keep("globex", "d1", "env", 700)
		drainRollups(t, db)
		for _, iv := range []time.Duration{time.Minute, 10 * time.Minute, time.Hour} {
			bs, _, err := db.AggregateFleet(ctx, "acme", "env", fleet.AggregateQuery{Field: "temp", Fn: fleet.AggSum, Interval: iv, From: start, To: now})
			var sum float64
			var n int64
			for _, b := range bs {
				sum, n = sum+b.Value, n+b.Count
			}
			if err != nil || len(bs) != int(time.Hour/iv) || sum != 60*(1+2+3) || n != 180 {
				t.Fatalf("the fleet's sums by %s = %+v %v, want 360 of 180", iv, bs, err)
			}
		}
		if b.Name == "sqlite" {
			// A partition made before migration 0043 gains the index
			// from the maintenance.
			if err := db.Exec(ctx, "DROP INDEX stream_rollup_1m_"+start.Format("20060102")+"_by_stream"); err != nil {
				t.Fatal(err)
			}
			if _, err := db.MaintainHistory(ctx); err != nil {
				t.Fatal(err)
			}
		}
		for _, kind := range []string{"1m", "10m", "1h"} {
			plan, err := db.ExplainFleetRollups(ctx, kind, start)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(plan, "_by_stream") && !strings.Contains(plan, "tenant_stream_field_bucket_idx") {
				t.Errorf("a fleet-wide read of the %s rollups does not use their index by stream:\n%s", kind, plan)
			}
		}
	})
}

// drainRollups adds up every rollup queued, as the background job does.
func drainRollups(t testing.TB, db *sqlstore.DB) {
	t.Helper()
	for {
		n, err := db.RollUp(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
	}
}

// TestStreamHistoryExpiredDayDropped checks the maintenance's drop of an
// expired day of many chunks (on SQLite emptied in slices of rows before
// it is dropped, docs/telemetry.md): the day's points are gone, the next
// day's, written after, and the expired day's rollups are kept, and a
// maintenance after it drops nothing.
func TestStreamHistoryExpiredDayDropped(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, clk := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		devices := []string{"d1", "d2", "d3"}
		mustAlertDevices(t, db, "acme", devices...)
		keep := func(day time.Time) {
			t.Helper()
			// 70 ingest calls of a point each a device: 210 chunks,
			// more than a slice on SQLite (the first is 64 rows).
			for i := range 70 {
				for _, d := range devices {
					pts := historyPoints(day.Add(time.Duration(i)*time.Minute), 1, clk.Now())
					if err := db.CommitStream(ctx, "acme", d, "env", pts, nil); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		day := clk.Now().Truncate(24 * time.Hour)
		keep(day)
		clk.Add(2 * 24 * time.Hour)
		next := day.AddDate(0, 0, 2)
		keep(next)
		drainRollups(t, db)
		clk.Set(day.Add(31*24*time.Hour + 12*time.Hour)) // day expired, next not
		dropped, err := db.MaintainHistory(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if want := "stream_points_" + day.Format("20060102"); !slices.Contains(dropped, want) || len(dropped) != 1 {
			t.Fatalf("dropped %v, want %s alone", dropped, want)
		}
		for _, d := range devices {
			if got := readAll(t, db, "acme", d, fleet.PointQuery{Limit: 1000, From: day}); len(got) != 70 || !got[0].Timestamp.Equal(next) {
				t.Fatalf("%s: %d points from %v after the drop, want the 70 of %v", d, len(got), got[0].Timestamp, next)
			}
		}
		q := fleet.AggregateQuery{Field: "temp", Fn: fleet.AggCount, Interval: 24 * time.Hour, From: day, To: next}
		if bs, err := db.Aggregate(ctx, "acme", "d1", "env", q); err != nil || len(bs) != 1 || bs[0].Count != 70 {
			t.Fatalf("the expired day's rollups: %+v %v, want a bucket of 70", bs, err)
		}
		if dropped, err := db.MaintainHistory(ctx); err != nil || len(dropped) != 0 {
			t.Fatalf("dropped again: %v %v", dropped, err)
		}
		// A point of the expired day, older than the retention, is not
		// kept (nor its partition made again).
		if err := db.CommitStream(ctx, "acme", "d1", "env", historyPoints(day.Add(time.Hour), 1, clk.Now()), nil); err != nil {
			t.Fatal(err)
		}
		if got := readAll(t, db, "acme", "d1", fleet.PointQuery{Limit: 1000, From: day}); len(got) != 70 {
			t.Fatalf("%d points after a write to the expired day, want 70", len(got))
		}
	})
}

// droppedLog keeps the partitions the maintenance's log says it dropped.
type droppedLog struct {
	mu      sync.Mutex
	dropped []string
}

func (l *droppedLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *droppedLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *droppedLog) WithGroup(string) slog.Handler            { return l }
func (l *droppedLog) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "partitions" {
			if names, ok := a.Value.Any().([]string); ok {
				l.mu.Lock()
				l.dropped = append(l.dropped, names...)
				l.mu.Unlock()
			}
		}
		return true
	})
	return nil
}

func (l *droppedLog) has(name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Contains(l.dropped, name)
}

// TestSetStreamRetentionRunsTheMaintenance checks that the hourly
// maintenance runs at once when a tenant's retention is set: a day that
// expired after its first run is dropped then, not an hour later.
func TestSetStreamRetentionRunsTheMaintenance(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		clk := testclock.New(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC))
		logs := &droppedLog{}
		db := sqlstoretest.MustOpen(t, b, sqlstoretest.Options{Now: clk.Now, Logger: slog.New(logs)})
		ctx, stop := context.WithCancel(context.Background())
		mustTenant(t, db, "acme")
		mustAlertDevices(t, db, "acme", "d1")
		day := clk.Now().Truncate(24 * time.Hour)
		for _, d := range []time.Time{day, day.AddDate(0, 0, 2)} {
			clk.Set(d.Add(time.Hour))
			if err := db.CommitStream(ctx, "acme", "d1", "env", historyPoints(d, 10, clk.Now()), nil); err != nil {
				t.Fatal(err)
			}
		}
		clk.Set(day.Add(31*24*time.Hour + 12*time.Hour)) // day expired
		done := make(chan struct{})
		go func() { defer close(done); db.RunHistoryMaintenance(ctx, time.Hour) }()
		t.Cleanup(func() { stop(); <-done }) // before the store closes
		first, second := "stream_points_"+day.Format("20060102"), "stream_points_"+day.AddDate(0, 0, 2).Format("20060102")
		poll.Until(t, 15*time.Second, "the first run's drop of "+first, func() bool { return logs.has(first) })
		clk.Set(day.Add(33*24*time.Hour + 12*time.Hour)) // the second expired
		if err := db.SetStreamRetention(ctx, "acme", 0); err != nil {
			t.Fatal(err)
		}
		poll.Until(t, 15*time.Second, "the drop of "+second+" after the retention's setting", func() bool { return logs.has(second) })
	})
}
