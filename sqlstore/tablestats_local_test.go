package sqlstore

import (
	"sync"
	"testing"
)

// TestTableStatsRunsOnceMore: a write that comes while a table's ANALYZE
// runs in the background asks for one more run, however many come; none
// starts once Close began.
func TestTableStatsRunsOnceMore(t *testing.T) {
	var s tableStats
	var wg sync.WaitGroup
	if !s.start("t", &wg) {
		t.Fatal("the first write started no ANALYZE")
	}
	for range 2 { // however many writes come meanwhile
		if s.start("t", &wg) {
			t.Fatal("a second ANALYZE of t started while one ran")
		}
	}
	if !s.start("u", &wg) {
		t.Fatal("another table's ANALYZE waited for t's")
	}
	if !s.again("t") {
		t.Fatal("the writes that came while t's ran asked for no further run")
	}
	if s.again("t") {
		t.Fatal("t ran more than once more")
	}
	if !s.start("t", &wg) {
		t.Fatal("a write after t's runs ended started none")
	}
	s.again("t")
	s.again("u")
	s.close()
	if s.start("t", &wg) {
		t.Fatal("an ANALYZE started after Close began")
	}
}
