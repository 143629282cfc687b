package fleethttp

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/prometheus/client_golang/prometheus"
)

// slowPages is a HistoryService whose reads of the page under cursor
// "slow" wait for release, and whose first read under "flaky" fails;
// every read is counted by cursor.
type slowPages struct {
	fleet.HistoryService
	release chan struct{}
	mu      sync.Mutex
	reads   map[string]int
}

func (h *slowPages) FindPoints(ctx context.Context, tenant, device, stream string, q fleet.PointQuery) (*fleet.PointPage, error) {
	h.mu.Lock()
	h.reads[q.Cursor]++
	n := h.reads[q.Cursor]
	h.mu.Unlock()
	if q.Cursor == "flaky" && n == 1 {
		return nil, errors.New("the database is unavailable")
	}
	if q.Cursor == "slow" {
		<-h.release
	}
	page := &fleet.PointPage{Next: q.Cursor + "+"}
	for range q.Limit {
		page.Points = append(page.Points, fleet.HistoryPoint{})
	}
	return page, nil
}

// newTestReadAhead returns a readAhead counting in reg on a clock the
// test moves, and slowPages to read from.
func newTestReadAhead(reg *prometheus.Registry) (*readAhead, *atomic.Int64, *slowPages) {
	clock := new(atomic.Int64)
	clock.Store(time.Now().UnixNano())
	a := newReadAhead(func() time.Time { return time.Unix(0, clock.Load()) }, reg)
	return a, clock, &slowPages{release: make(chan struct{}), reads: map[string]int{}}
}

// TestReadAheadSlowRead: a client that asks for the page read ahead
// within aheadTTL is answered from that read even when the read itself
// takes longer than aheadTTL (docs/api.md, Lists), not made to wait for
// it and then read the page again.
func TestReadAheadSlowRead(t *testing.T) {
	a, clock, h := newTestReadAhead(prometheus.NewRegistry())
	ctx := context.Background()
	q := fleet.PointQuery{Limit: 2, Cursor: "slow"}
	q2 := q
	q2.Cursor = "pre"
	// A page whose next is "slow" starts the slow read ahead.
	h2 := &nextIs{h, "slow"}
	page, err := a.find(ctx, h2, "acme", "d1", "env", q2)
	if err != nil {
		t.Fatal(err)
	}
	page.Release()
	clock.Add(int64(time.Second)) // the client asks in time
	got := make(chan *fleet.PointPage)
	go func() {
		p, err := a.find(ctx, h, "acme", "d1", "env", q)
		if err != nil {
			t.Error(err)
		}
		got <- p
	}()
	// Wait until the client waits on the read ahead, then let the read
	// take past aheadTTL.
	for {
		a.mu.Lock()
		_, held := a.pending[newAheadKey("acme", "d1", "env", q)]
		a.mu.Unlock()
		if !held {
			break
		}
		time.Sleep(time.Millisecond)
	}
	clock.Add(int64(2 * time.Second))
	close(h.release)
	(<-got).Release()
	a.wait()
	h.mu.Lock()
	defer h.mu.Unlock()
	if n := h.reads["slow"]; n != 1 {
		t.Errorf("the page read ahead was read %d times, want once (answered from the read ahead)", n)
	}
}

// nextIs answers the page under cursor "pre" with next as its next
// cursor.
type nextIs struct {
	*slowPages
	next string
}

func (h *nextIs) FindPoints(ctx context.Context, tenant, device, stream string, q fleet.PointQuery) (*fleet.PointPage, error) {
	page, err := h.slowPages.FindPoints(ctx, tenant, device, stream, q)
	if page != nil && q.Cursor == "pre" {
		page.Next = h.next
	}
	return page, err
}

// TestReadAheadBoundsReads: pages whose reads are under way count
// against the bounds past aheadTTL, until their reads end: the reads
// under way at once stay within maxAheadTenantPages of a tenant however
// slow the database (docs/api.md, Lists).
func TestReadAheadBoundsReads(t *testing.T) {
	a, clock, h := newTestReadAhead(prometheus.NewRegistry())
	q := fleet.PointQuery{Limit: 2, Cursor: "slow"}
	for i := range maxAheadTenantPages {
		a.start(h, newAheadKey("acme", string(rune('a'+i)), "env", q), q)
	}
	clock.Add(int64(3 * time.Second)) // every read is past aheadTTL, and still under way
	a.start(h, newAheadKey("acme", "late", "env", q), q)
	a.mu.Lock()
	_, started := a.pending[newAheadKey("acme", "late", "env", q)]
	a.mu.Unlock()
	close(h.release)
	a.wait()
	if started {
		t.Errorf("a page was read ahead while %d reads of the tenant were under way", maxAheadTenantPages)
	}
}

// TestReadAheadAfterWait: once Shutdown waits for the reads ahead, no
// other starts: a request still in flight when Shutdown's context ended
// would otherwise start a read against a store being closed, and Add to
// the WaitGroup being waited on.
func TestReadAheadAfterWait(t *testing.T) {
	a, _, h := newTestReadAhead(prometheus.NewRegistry())
	close(h.release)
	a.wait()
	q := fleet.PointQuery{Limit: 2, Cursor: "c"}
	page, err := a.find(context.Background(), h, "acme", "d1", "env", q)
	if err != nil {
		t.Fatal(err)
	}
	page.Release()
	a.running.Wait()
	h.mu.Lock()
	defer h.mu.Unlock()
	if n := h.reads["c+"]; n != 0 {
		t.Errorf("a page was read ahead after wait: %d reads", n)
	}
}

// TestReadAheadFailedRead: a read ahead that failed is not the client's
// answer: the client's request reads the page itself.
func TestReadAheadFailedRead(t *testing.T) {
	reg := prometheus.NewRegistry()
	a, _, h := newTestReadAhead(reg)
	close(h.release)
	ctx := context.Background()
	page, err := a.find(ctx, &nextIs{h, "flaky"}, "acme", "d1", "env", fleet.PointQuery{Limit: 2, Cursor: "pre"})
	if err != nil {
		t.Fatal(err)
	}
	page.Release()
	page, err = a.find(ctx, h, "acme", "d1", "env", fleet.PointQuery{Limit: 2, Cursor: "flaky"})
	if err != nil {
		t.Fatalf("the page whose read ahead failed: %v", err)
	}
	page.Release()
	a.wait()
	h.mu.Lock()
	defer h.mu.Unlock()
	if n := h.reads["flaky"]; n != 2 {
		t.Errorf("the page was read %d times, want twice (ahead, failing, then for the client)", n)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			n[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	if n["used"] != 0 || n["unused"] != 1 {
		t.Errorf("pages read ahead: %v; want the failed one unused, none used", n)
	}
}
