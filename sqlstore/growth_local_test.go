package sqlstore

import "testing"

// TestGrowth: statistics go stale every analyzeGrowth rows while a table
// is small, then once it gained a tenth of all it gained, as autovacuum's
// analyze threshold judges.
func TestGrowth(t *testing.T) {
	var g growth
	if g.add(0) {
		t.Fatal("no rows made the statistics stale")
	}
	last := 0
	for total := 1; total <= 100_000; total++ {
		if !g.add(1) {
			continue
		}
		gap, want := total-last, max(analyzeGrowth, total/10)
		if gap != want && gap != want+1 {
			t.Fatalf("stale at %d rows, %d after the last; want %d after", total, gap, want)
		}
		last = total
	}
	if last < 90_000 {
		t.Fatalf("last stale at %d of 100,000 rows", last)
	}
}
