package action

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"
)

// TimeoutStore is what the sweeper needs of the database.
type TimeoutStore interface {
	// TimeOutDeviceActions fails up to limit device actions overdue at now
	// and returns how many.
	TimeOutDeviceActions(ctx context.Context, now time.Time, limit int) (int, error)
}

// Sweeper fails device actions whose timeout elapsed
// (docs/actions.md#timeouts). Any number of replicas may run one: the store
// claims rows so that each is failed once.
type Sweeper struct {
	Store    TimeoutStore
	Interval time.Duration    // between sweeps; default 1s
	Batch    int              // rows per transaction; default 1000
	Now      func() time.Time // default time.Now
	Logger   *slog.Logger

	timedOut, sweeps atomic.Uint64
}

// TimedOut counts the device actions this sweeper failed, for metrics.
func (s *Sweeper) TimedOut() uint64 { return s.timedOut.Load() }

// Sweeps counts the sweeps this sweeper finished, for metrics: once it has
// grown by two, a sweep began and ended since it was read.
func (s *Sweeper) Sweeps() uint64 { return s.sweeps.Load() }

func (s *Sweeper) defaults() {
	if s.Interval <= 0 {
		s.Interval = time.Second
	}
	if s.Batch <= 0 {
		s.Batch = 1000
	}
	if s.Now == nil {
		s.Now = time.Now
	}
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
}

// Sweep fails every device action overdue now, a batch per transaction so
// that a backlog never holds the writer for long, and returns how many.
func (s *Sweeper) Sweep(ctx context.Context) (int, error) {
	s.defaults()
	now := s.Now()
	total := 0
	defer s.sweeps.Add(1)
	for {
		n, err := s.Store.TimeOutDeviceActions(ctx, now, s.Batch)
		total += n
		s.timedOut.Add(uint64(n))
		if err != nil || n < s.Batch {
			return total, err
		}
	}
}

// Run sweeps every Interval until ctx ends.
func (s *Sweeper) Run(ctx context.Context) {
	s.defaults()
	t := time.NewTicker(s.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := s.Sweep(ctx)
		if err != nil && ctx.Err() == nil {
			s.Logger.Error("action timeout sweep", "err", err)
		}
		if n > 0 {
			s.Logger.Info("device actions timed out", "count", n)
		}
	}
}
