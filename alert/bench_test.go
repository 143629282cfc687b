package alert_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/alert"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// nopStore commits nothing: it measures evaluation alone.
type nopStore struct{ memStore }

func (*nopStore) CommitStream(context.Context, string, string, string, []fleet.DataPoint, []*fleet.AlertChange) error {
	return nil
}

// benchRules are three rules on one stream, as a tenant might have: a
// threshold, a compound condition with an activation threshold, and a
// no_data watch.
func benchRules(b *testing.B) []*fleet.AlertRule {
	return []*fleet.AlertRule{
		mustRule(b, "hot", `{"field": "temp", "operator": ">", "value": 80}`, 0, 0, nil),
		mustRule(b, "humid-and-warm", `{"all": [{"field": "humidity", "operator": ">=", "value": 90}, {"not": {"field": "temp", "operator": "<", "value": 30}}]}`, 60, 30, nil),
		mustRule(b, "silent", `{"no_data_seconds": 300}`, 0, 0, nil),
	}
}

// batch is a device's batch of n points starting at the i-th second; the
// temperature crosses the threshold once in 500 points, so alerts open and
// close now and then, as in a healthy fleet.
func batch(device string, i, n int) []fleet.DataPoint {
	pts := make([]fleet.DataPoint, n)
	for j := range pts {
		k := i + j
		pts[j] = fleet.DataPoint{DeviceID: device, Stream: "env", Timestamp: t0.Add(time.Duration(k) * time.Second), Sequence: int64(k),
			Data: map[string]any{"temp": float64(70 + k%500/40), "humidity": int64(85 + k%1000/100), "status": "ok"}}
	}
	return pts
}

// BenchmarkEvaluate measures points per second through rule evaluation in
// process (no store): batches of 100 points from 1,000 devices, 3 rules.
func BenchmarkEvaluate(b *testing.B) {
	store := &nopStore{*newMemStore()}
	store.rules = benchRules(b)
	e := &alert.Engine{Store: store, Devices: store, Now: func() time.Time { return t0 }}
	if err := e.Load(context.Background()); err != nil {
		b.Fatal(err)
	}
	const devices, perBatch = 1000, 100
	var next atomic.Int64
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			n := next.Add(1)
			d := fmt.Sprintf("d%d", n%devices)
			if err := e.IngestPoints(ctx, "acme", d, "env", batch(d, int(n/devices)*perBatch, perBatch)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.ReportMetric(float64(b.N*perBatch)/time.Since(start).Seconds(), "points/s")
}

// BenchmarkIngestStore measures points per second through evaluation and
// the store, with every ingest call committed before it returns (every
// point kept in history, and the stream's latest): batches of 100 points
// from 1,000 devices, 3 rules, on each database.
func BenchmarkIngestStore(b *testing.B) {
	for _, be := range sqlstoretest.Backends() {
		b.Run(be.Name, func(b *testing.B) {
			db := sqlstoretest.MustOpen(b, be, sqlstoretest.Options{Now: func() time.Time { return t0 }})
			ctx := context.Background()
			if _, _, err := db.CreateTenant(ctx, "acme"); err != nil {
				b.Fatal(err)
			}
			const devices, perBatch = 1000, 100
			var devs []fleet.NewDevice
			for i := range devices {
				devs = append(devs, fleet.NewDevice{ID: fmt.Sprintf("d%d", i)})
			}
			if _, err := db.CreateDevices(ctx, "acme", devs); err != nil {
				b.Fatal(err)
			}
			for _, r := range benchRules(b) {
				r.ID, r.Compiled = "", nil
				if err := db.CreateAlertRule(ctx, "acme", r); err != nil {
					b.Fatal(err)
				}
			}
			e := &alert.Engine{Store: db, Devices: db}
			if err := e.Load(ctx); err != nil {
				b.Fatal(err)
			}
			var next atomic.Int64
			b.SetParallelism(32) // concurrent devices, as over MQTT
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					n := next.Add(1)
					d := fmt.Sprintf("d%d", n%devices)
					if err := e.IngestPoints(ctx, "acme", d, "env", batch(d, int(n/devices)*perBatch, perBatch)); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.ReportMetric(float64(b.N*perBatch)/time.Since(start).Seconds(), "points/s")
			if kept := db.HistoryStats().Kept; kept != uint64(b.N*perBatch) {
				b.Fatalf("history kept %d points of %d", kept, b.N*perBatch)
			}
		})
	}
}
