package sqlstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/fleetd/fleet/sqlstore"
)

// BenchmarkSightingOrder writes a second's last_seen_at of 10,000 devices
// drawn at random from 100,000, as the action service does under S10 over
// random devices: 256 devices to a transaction (TouchDevices), the devices
// in random order or sorted. It reports the SQLite WAL frames (pages) the
// writes appended per sighting, and the longest transaction. SQLite only.
//
//	go test ./sqlstore -run '^$' -bench SightingOrder -benchtime 3x
func BenchmarkSightingOrder(b *testing.B) {
	ctx := context.Background()
	path := filepath.Join(b.TempDir(), "fleetd.db")
	// No checkpoint: the WAL only grows, so its size counts the frames.
	db, err := sqlstore.Open(ctx, path, sqlstore.Options{CheckpointInterval: time.Hour, WALLimit: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	const devices, sighted = 100_000, 10_000
	benchTenant(b, db, devices)
	walSize := func() int64 {
		fi, err := os.Stat(path + "-wal")
		if err != nil {
			b.Fatal(err)
		}
		return fi.Size()
	}
	start, tick := time.Now(), 0
	for _, order := range []string{"random", "sorted"} {
		b.Run(order, func(b *testing.B) {
			var frames int64
			var longest time.Duration
			for b.Loop() {
				seen := map[string]bool{}
				for len(seen) < sighted {
					seen[fmt.Sprintf("dev-%07d", rand.IntN(devices))] = true
				}
				var ids []string
				for id := range seen {
					ids = append(ids, id)
				}
				if order == "sorted" {
					slices.Sort(ids)
				}
				tick++
				at := start.Add(time.Duration(tick) * time.Second) // later than any before: every row changes
				before := walSize()
				for s := 0; s < len(ids); s += 256 {
					t0 := time.Now()
					if err := db.TouchDevices(ctx, "bench", ids[s:min(s+256, len(ids))], at); err != nil {
						b.Fatal(err)
					}
					longest = max(longest, time.Since(t0))
				}
				frames += (walSize() - before) / (4096 + 24)
			}
			b.ReportMetric(float64(frames)/float64(b.N*sighted), "frames/sighting")
			b.ReportMetric(float64(longest.Microseconds())/1000, "longest-ms")
		})
	}
}
