package fleethttp

import (
	"context"
	"sync"
	"time"

	"github.com/fleetd/fleet"
	"github.com/prometheus/client_golang/prometheus"
)

// readAhead reads the page after the one a client paging through a
// stream's points is answered (docs/api.md, Lists): while the client takes
// in a page, fleetd reads the next, and answers the client's request for
// it from that read. A client reading a day of points in pages waits, a
// page, for the slower of its own decoding and fleetd's reading rather
// than for both (docs/benchmarks-notebook.md, "Reading the next page
// ahead").
//
// A page read ahead is as fresh as the page before it: it is read the
// moment that page is answered, as if the client had asked for it then.
// Only a client that pages (its request has a cursor) gets a page read
// ahead of it, and only when its page was full and has a next: a single
// page's reader costs nothing more, and one that stops paging, at most one
// page. An unclaimed page is dropped after aheadTTL.
type readAhead struct {
	now     func() time.Time
	mu      sync.Mutex
	pending map[aheadKey]*aheadPage
	closed  bool // wait was called: no read starts
	running sync.WaitGroup
	outcome *prometheus.CounterVec
}

// Bounds of the pages read ahead: those held at once, in all and of one
// tenant (one tenant's readers cannot take every other's), and how long
// one waits for its client.
const (
	maxAheadPages       = 64
	maxAheadTenantPages = 8
	aheadTTL            = 2 * time.Second
	aheadTimeout        = 10 * time.Second
)

// aheadKey names a page: the reader's tenant, the stream and the query,
// its times as seconds and nanoseconds (a query's time.Time carries a
// location, which == would compare).
type aheadKey struct {
	tenant, device, stream string
	from, to               [2]int64
	desc                   bool
	limit                  int
	cursor                 string
}

func newAheadKey(tenant, device, stream string, q fleet.PointQuery) aheadKey {
	instant := func(t time.Time) [2]int64 { return [2]int64{t.Unix(), int64(t.Nanosecond())} }
	return aheadKey{tenant: tenant, device: device, stream: stream, from: instant(q.From), to: instant(q.To),
		desc: q.Desc, limit: q.Limit, cursor: q.Cursor}
}

// aheadPage is a page being read, or read: done is closed once page or
// err is set.
type aheadPage struct {
	done    chan struct{}
	page    *fleet.PointPage
	err     error
	started time.Time
}

func newReadAhead(now func() time.Time, reg *prometheus.Registry) *readAhead {
	a := &readAhead{now: now, pending: map[aheadKey]*aheadPage{},
		outcome: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetd_history_pages_read_ahead_total",
			Help: "Pages of stream points read ahead of a client paging through them, by outcome: used (the client asked for it), unused (not asked for in time, or read in error), or skipped (too many pages held).",
		}, []string{"outcome"}),
	}
	reg.MustRegister(a.outcome)
	return a
}

// find returns the page of q, from a read ahead when one is held for it,
// and reads the next page ahead when q is a paging client's.
func (a *readAhead) find(ctx context.Context, h fleet.HistoryService, tenant, device, stream string, q fleet.PointQuery) (*fleet.PointPage, error) {
	if q.Cursor == "" {
		return h.FindPoints(ctx, tenant, device, stream, q)
	}
	page := a.claim(ctx, newAheadKey(tenant, device, stream, q))
	if page == nil {
		var err error
		if page, err = h.FindPoints(ctx, tenant, device, stream, q); err != nil {
			return nil, err
		}
	}
	if page.Next != "" && len(page.Points) == q.Limit {
		next := q
		next.Cursor = page.Next
		a.start(h, newAheadKey(tenant, device, stream, next), next)
	}
	return page, nil
}

// claim takes the page read ahead under k, waiting for its read if it is
// under way; nil if none is held, or it failed, or the client asked for it
// past aheadTTL. Whether the client is late is judged when it asks, not
// once the read ends (docs/api.md, Lists): a client that asked in time
// and waited for a read slower than aheadTTL would otherwise read the
// page again, twice the reads when the database is slow.
func (a *readAhead) claim(ctx context.Context, k aheadKey) *fleet.PointPage {
	now := a.now()
	a.mu.Lock()
	e := a.pending[k]
	delete(a.pending, k)
	a.mu.Unlock()
	if e == nil {
		return nil
	}
	if now.Sub(e.started) > aheadTTL {
		go a.discard(e)
		return nil
	}
	select {
	case <-e.done:
	case <-ctx.Done():
		go a.discard(e)
		return nil
	}
	if e.err != nil {
		a.discard(e)
		return nil
	}
	a.outcome.WithLabelValues("used").Inc()
	return e.page
}

// start reads the page of q under k in a goroutine of its own, unless
// the bounds are reached.
func (a *readAhead) start(h fleet.HistoryService, k aheadKey, q fleet.PointQuery) {
	now := a.now()
	e := &aheadPage{done: make(chan struct{}), started: now}
	a.mu.Lock()
	a.expire(now)
	if a.closed {
		a.mu.Unlock()
		return
	}
	if _, ok := a.pending[k]; ok || len(a.pending) >= maxAheadPages || a.held(k.tenant) >= maxAheadTenantPages {
		a.mu.Unlock()
		a.outcome.WithLabelValues("skipped").Inc()
		return
	}
	a.pending[k] = e
	a.running.Add(1)
	a.mu.Unlock()
	go func() {
		defer a.running.Done()
		ctx, cancel := context.WithTimeout(context.Background(), aheadTimeout)
		defer cancel()
		e.page, e.err = h.FindPoints(ctx, k.tenant, k.device, k.stream, q)
		close(e.done)
	}()
}

// expire drops the pages held past aheadTTL whose reads ended; a.mu is
// held. A page still being read stays, and counts against the bounds:
// dropping it would start another read while it goes on (up to
// aheadTimeout), more reads at once than the bounds say when the database
// is slowest. claim refuses it once past aheadTTL.
func (a *readAhead) expire(now time.Time) {
	for k, e := range a.pending {
		select {
		case <-e.done:
		default:
			continue
		}
		if now.Sub(e.started) > aheadTTL {
			delete(a.pending, k)
			go a.discard(e)
		}
	}
}

// held counts the pages held for tenant, at most maxAheadPages to look
// at; a.mu is held.
func (a *readAhead) held(tenant string) int {
	n := 0
	for k := range a.pending {
		if k.tenant == tenant {
			n++
		}
	}
	return n
}

// discard releases a page nobody claimed (or read in error), once it is
// read.
func (a *readAhead) discard(e *aheadPage) {
	<-e.done
	a.outcome.WithLabelValues("unused").Inc()
	e.page.Release()
}

// wait returns once no page is being read ahead, and starts no other
// read: Server.Shutdown calls it once the server's requests are done, or
// its context ended with some still in flight, whose reads ahead would
// run against a store being closed (and Add to running while it is
// waited on, which sync.WaitGroup forbids).
func (a *readAhead) wait() {
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
	a.running.Wait()
}
