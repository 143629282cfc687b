package fleethttp

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/codec"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/semaphore"
)

// bodyWait bounds how long a request waits for room in the body budget
// before it is refused with 503.
const bodyWait = 2 * time.Second

// firstChunk is the buffer a body starts in when it announces no length,
// or a larger one; it doubles from there.
const firstChunk = 64 << 10

// bodies is the budget of bytes held by request bodies being read into
// memory, over all requests (Limits.Held): without it, every connection
// sending a large body slowly holds what it sent so far, and memory grows
// with the connections (docs/reliability.md). A body takes from the budget
// as its buffer grows, never its announced Content-Length up front; a
// request that finds no room waits bodyWait, then is refused with 503 and
// Retry-After. Streams (firmware uploads) hold nothing and take nothing.
//
// One tenant holds at most the budget less two ordinary bodies (twice
// Limits.Body): a tenant's bodies that arrive slowly, bulk ones above all,
// whose read deadline moves with each read, cannot hold all of it and
// refuse every other tenant's requests.
type bodies struct {
	max     int64
	sem     *semaphore.Weighted
	tenants *codec.Shares
	held    atomic.Int64
	// growing is set while a body that holds part of the budget waits
	// for more (take).
	growing atomic.Bool
	refused prometheus.Counter
}

// newBodies returns a budget of size bytes, of which a tenant holds at most
// size less twice body, with its metrics in reg.
func newBodies(size, body int64, reg *prometheus.Registry) *bodies {
	b := &bodies{max: size, sem: semaphore.NewWeighted(size), tenants: codec.NewShares(max(size-2*body, size/2)),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleetd_http_body_refused_total",
			Help: "Requests refused with 503 because the budget of request body bytes held at once (--max-held-body-bytes) had no room for them.",
		})}
	reg.MustRegister(b.refused,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fleetd_http_body_bytes_held",
			Help: "Bytes of request bodies held in memory while they arrive, over all requests.",
		}, func() float64 { return float64(b.held.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fleetd_http_body_bytes_max",
			Help: "The budget of request body bytes held at once (--max-held-body-bytes).",
		}, func() float64 { return float64(b.max) }))
	return b
}

// errNoRoom is take's answer when a body that holds part of the budget
// cannot have more at once and another such body already waits.
var errNoRoom = errors.New("no room in the budget of request bodies")

// taken is what a body holds of the budget: n bytes of it, and as much
// of its tenant's share.
type taken struct {
	n     int64
	share *codec.Hold
}

// take waits for n bytes of tenant's share, then of the budget, at most
// bodyWait in all. A body that holds part of the budget already (holding)
// waits only while no other such body waits: two that wait for each
// other's bytes would both time out, and so would every body of a flood
// of large ones, none finishing; the second is refused at once and gives
// its bytes back to the first.
func (b *bodies) take(ctx context.Context, tenant string, n int64, holding bool) (taken, error) {
	start := time.Now()
	wait := bodyWait
	if holding {
		wait = time.Nanosecond // the share at once, or wait as the one grower
	}
	share, err := b.tenants.Acquire(ctx, tenant, n, wait)
	if err != nil && holding && ctx.Err() == nil {
		if !b.growing.CompareAndSwap(false, true) {
			return taken{}, errNoRoom
		}
		defer b.growing.Store(false)
		holding = false // this body is the one that waits
		share, err = b.tenants.Acquire(ctx, tenant, n, bodyWait)
	}
	if err != nil {
		return taken{}, err
	}
	if !b.sem.TryAcquire(n) {
		if holding {
			if !b.growing.CompareAndSwap(false, true) {
				share.Release()
				return taken{}, errNoRoom
			}
			defer b.growing.Store(false)
		}
		ctx, cancel := context.WithTimeout(ctx, max(bodyWait-time.Since(start), time.Millisecond))
		defer cancel()
		if err := b.sem.Acquire(ctx, n); err != nil {
			share.Release()
			return taken{}, err
		}
	}
	b.held.Add(n)
	return taken{n: n, share: &share}, nil
}

func (b *bodies) give(t taken) {
	if t.share == nil {
		return
	}
	b.held.Add(-t.n)
	b.sem.Release(t.n)
	t.share.Release()
}

// read reads a request's body, at most limit bytes (more is ETOOLARGE),
// into memory within the budget. The buffer grows by doubling up to the
// announced length or limit; each new buffer is taken from the budget
// before the old one is given back, so the budget counts both while one is
// copied into the other, and one body needs at most twice its size of it
// (Limits.Held is at least twice Limits.Bulk). What it took goes back when
// the request ends.
func (b *bodies) read(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, tooLarge(limit)
	}
	end := limit // the largest the buffer needs to be
	if r.ContentLength >= 0 {
		end = r.ContentLength
	}
	body := http.MaxBytesReader(w, r.Body, limit)
	tenant := bodyTenant(r)
	var buf []byte
	var has taken
	held := func() { // from the end of the request on, the buffer is the handler's garbage
		context.AfterFunc(r.Context(), func() { b.give(has) })
	}
	for {
		if len(buf) == cap(buf) {
			if int64(len(buf)) == end {
				// Full: read one byte more to see the end (or that
				// the body is larger than limit).
				var one [1]byte
				n, err := body.Read(one[:])
				if n == 0 && err == io.EOF {
					held()
					return buf, nil
				}
				if n > 0 || err == nil {
					err = &http.MaxBytesError{Limit: limit}
				}
				b.give(has)
				return nil, readError(err, limit)
			}
			size := min(max(2*int64(cap(buf)), firstChunk), end)
			more, err := b.take(r.Context(), tenant, size, has.n > 0)
			if err != nil {
				b.give(has)
				if r.Context().Err() != nil {
					return nil, r.Context().Err()
				}
				b.refused.Inc()
				w.Header().Set("Retry-After", "1")
				return nil, fleet.Errorf(fleet.EUNAVAILABLE, "fleetd holds as many request bodies as it may (%s at once, %s of it for one tenant); retry", byteSize(b.max), byteSize(b.tenants.Size()))
			}
			grown := make([]byte, len(buf), size)
			copy(grown, buf)
			b.give(has)
			buf, has = grown, more
		}
		n, err := body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			held()
			return buf, nil
		} else if err != nil {
			b.give(has)
			return nil, readError(err, limit)
		}
	}
}

// bodyTenant is whose share of the budget a request's body takes: the
// actor's tenant (an API key's, an end user's, a console session's, which
// the console sets before it reads a form), else the tenant in a hawkBit
// DDI path, whose handlers read a body only once the device or gateway of
// that tenant is authenticated; "" for the rest (the console's sign-in).
func bodyTenant(r *http.Request) string {
	if a := fleet.ActorFromContext(r.Context()); a != nil {
		return a.Tenant
	}
	return strings.ToLower(r.PathValue("tenant"))
}

func readError(err error, limit int64) error {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return tooLarge(limit)
	}
	return fleet.Errorf(fleet.EINVALID, "reading the request body failed: %v", err)
}

// ReadBody reads a request's body, at most limit bytes, within the budget
// of bodies held at once (Limits.Held): the console's forms take from the
// same budget as the API's bodies.
func (s *Server) ReadBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	return s.bodies.read(w, r, limit)
}
