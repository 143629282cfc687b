package sqlstore_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestChunksOfEitherCodec keeps a device's points in two chunks, which
// fleetd writes in Zstandard, rewrites one of them in DEFLATE as fleetd
// wrote chunks before (docs/telemetry.md, "How points are kept"), and
// reads every point back, in order, from both.
func TestChunksOfEitherCodec(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, raw := openWithRaw(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustAlertDevices(t, db, "acme", "d1")
		now := time.Now()
		start := now.Add(-2 * time.Hour).Truncate(time.Hour)
		for batch := range 2 {
			pts := make([]fleet.DataPoint, 500)
			for i := range pts {
				k := batch*500 + i
				pts[i] = fleet.DataPoint{Stream: "env", Timestamp: start.Add(time.Duration(k) * time.Second), Sequence: int64(k),
					Data: map[string]any{"temp": 20 + float64(k)/8, "s": fmt.Sprint("p", k)}, ReceivedAt: now}
			}
			if err := db.CommitStream(ctx, "acme", "d1", "env", pts, nil); err != nil {
				t.Fatal(err)
			}
		}
		table := "stream_points_" + start.UTC().Format("20060102")
		rows, err := raw.QueryContext(ctx, "SELECT id, points FROM "+table+" WHERE tenant = $1 AND device_id = $2 ORDER BY ts_min", "acme", "d1")
		if err != nil {
			t.Fatal(err)
		}
		type chunk struct {
			id     int64
			packed []byte
		}
		var chunks []chunk
		for rows.Next() {
			var c chunk
			if err := rows.Scan(&c.id, &c.packed); err != nil {
				t.Fatal(err)
			}
			chunks = append(chunks, c)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if len(chunks) != 2 {
			t.Fatalf("%d chunks, want 2", len(chunks))
		}
		for _, c := range chunks {
			if !bytes.HasPrefix(c.packed, []byte{0x28, 0xb5, 0x2f, 0xfd}) {
				t.Fatalf("chunk %d is not a Zstandard frame: % x", c.id, c.packed[:8])
			}
		}
		text, err := sqlstore.UnpackPoints(chunks[0].packed)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := raw.ExecContext(ctx, "UPDATE "+table+" SET points = $1 WHERE id = $2", sqlstore.PackDeflate(text), chunks[0].id); err != nil {
			t.Fatal(err)
		}
		got := readAll(t, db, "acme", "d1", fleet.PointQuery{Limit: 300})
		if len(got) != 1000 {
			t.Fatalf("read %d points, want 1000", len(got))
		}
		for k, p := range got {
			data, err := p.Values()
			if err != nil {
				t.Fatal(err)
			}
			if p.Sequence != int64(k) || !p.Timestamp.Equal(start.Add(time.Duration(k)*time.Second)) || data["s"] != fmt.Sprint("p", k) {
				t.Fatalf("point %d: %d at %v, %v", k, p.Sequence, p.Timestamp, data)
			}
		}
	})
}
