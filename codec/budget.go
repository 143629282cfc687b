package codec

import (
	"context"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"
)

// Budget bounds the bytes of bodies being read and decoded at once, over
// everything that shares it. Decoding costs up to ~35 times a body's size
// (an array of empty objects: a map, an interface and a slot each), so
// bounding the bytes bounds the memory that decoding holds, however many
// clients send at once. Waiting is first come, first served: a large body
// is not starved by a stream of small ones.
type Budget struct {
	max int64
	sem *semaphore.Weighted
}

// NewBudget returns a Budget of max bytes.
func NewBudget(max int64) *Budget {
	return &Budget{max: max, sem: semaphore.NewWeighted(max)}
}

// Max returns the budget's size in bytes.
func (b *Budget) Max() int64 { return b.max }

// Acquire waits until n bytes of the budget are free, but no longer than
// wait (0: until ctx ends), and returns what it took, which goes back with
// Release. A body larger than the whole budget takes all of it: it is
// decoded alone. The error is ctx's, or context.DeadlineExceeded when
// wait passed.
func (b *Budget) Acquire(ctx context.Context, n int64, wait time.Duration) (int64, error) {
	n = min(max(n, 0), b.max)
	if b.sem.TryAcquire(n) {
		return n, nil // the common case, without a timer
	}
	if wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, wait)
		defer cancel()
	}
	if err := b.sem.Acquire(ctx, n); err != nil {
		return 0, err
	}
	return n, nil
}

// DecodingWeight is what decoding a body of size bytes in format f takes
// of a Budget. Transit and EDN are read in full fidelity and then narrowed,
// holding both trees for a while: an array of arrays of empty maps
// allocates 52 times its size in EDN, 22 times in JSON. So they weigh
// double.
func DecodingWeight(f Format, size int) int64 {
	if f == JSON {
		return int64(size)
	}
	return 2 * int64(size)
}

// Release gives back what Acquire took.
func (b *Budget) Release(n int64) { b.sem.Release(n) }

// Shares gives each client (an API key, an end user) a budget of its own,
// which it must hold before it takes from the shared one: so one client
// sending many large bodies at once holds at most its share of the shared
// budget, and the others find the rest free rather than queueing behind
// it. A client's share exists while it has a body waiting or decoding.
type Shares struct {
	size int64
	mu   sync.Mutex
	of   map[string]*share
}

type share struct {
	sem   *semaphore.Weighted
	users int
}

// NewShares returns Shares of size bytes each.
func NewShares(size int64) *Shares {
	return &Shares{size: size, of: map[string]*share{}}
}

// Size is the size of each share.
func (s *Shares) Size() int64 { return s.size }

// A Hold is what Shares.Acquire took; Release gives it back.
type Hold struct {
	s   *Shares
	who string
	sh  *share
	n   int64
}

// Acquire waits until n bytes (at most the share) of who's share are
// free, but no longer than wait, as Budget.Acquire does.
func (s *Shares) Acquire(ctx context.Context, who string, n int64, wait time.Duration) (Hold, error) {
	n = min(max(n, 0), s.size)
	s.mu.Lock()
	sh := s.of[who]
	if sh == nil {
		sh = &share{sem: semaphore.NewWeighted(s.size)}
		s.of[who] = sh
	}
	sh.users++
	s.mu.Unlock()
	h := Hold{s: s, who: who, sh: sh}
	if !sh.sem.TryAcquire(n) {
		if wait > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, wait)
			defer cancel()
		}
		if err := sh.sem.Acquire(ctx, n); err != nil {
			h.Release()
			return Hold{}, err
		}
	}
	h.n = n
	return h, nil
}

// Release gives back what Acquire took.
func (h Hold) Release() {
	h.sh.sem.Release(h.n)
	h.s.mu.Lock()
	if h.sh.users--; h.sh.users == 0 {
		delete(h.s.of, h.who)
	}
	h.s.mu.Unlock()
}
