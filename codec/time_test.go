package codec_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/fleetd/fleet/codec"
)

// TestAppendTime writes times as the layout does, from year 0 to 9999,
// in any zone, and beyond through the layout itself.
func TestAppendTime(t *testing.T) {
	zone := time.FixedZone("x", -7*3600-1800)
	times := []time.Time{time.Time{}, time.Unix(0, 0), time.Date(9999, 12, 31, 23, 59, 59, 999_999_999, time.UTC),
		time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 11, 29, 1, 2, 3, 4_000_000, zone)}
	r := rand.New(rand.NewPCG(1, 2))
	for range 10_000 {
		times = append(times, time.Unix(r.Int64N(253402300800), r.Int64N(1e9)).In(zone))
	}
	for _, tm := range times {
		if got, want := string(codec.AppendTime([]byte("x"), tm)), "x"+tm.UTC().Format(codec.TimeLayout); got != want {
			t.Fatalf("%v: %s, want %s", tm, got, want)
		}
	}
}
