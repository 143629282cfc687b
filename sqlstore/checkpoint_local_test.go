package sqlstore

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/poll"
)

// checkpointLog keeps the checkpoints the store logs: their modes and the
// frames the WAL held.
type checkpointLog struct {
	mu          sync.Mutex
	checkpoints []checkpointEntry
}

type checkpointEntry struct {
	mode   string
	frames int64
}

func (l *checkpointLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *checkpointLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *checkpointLog) WithGroup(string) slog.Handler            { return l }
func (l *checkpointLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "checkpoint" {
		return nil
	}
	var e checkpointEntry
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "mode":
			e.mode = a.Value.String()
		case "frames":
			e.frames = a.Value.Int64()
		}
		return true
	})
	l.mu.Lock()
	l.checkpoints = append(l.checkpoints, e)
	l.mu.Unlock()
	return nil
}

func (l *checkpointLog) all() []checkpointEntry {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.checkpoints)
}

// TestCheckpointLetsGoOfALatePause asks the commit loop to pause for a
// RESTART of the WAL while it runs a long batch (a dispatch to a million
// devices, here a job the test holds open), and lets the batch end more
// than a tick after the ask. The checkpoint loop must let the commit loop
// go on at once without restarting the WAL, which would copy and sync the
// batch's whole WAL while every write waited (4ed3eb8), and restart it
// only at the next tick, after a PASSIVE checkpoint copied the WAL back off
// the writer's path. The test sends the loop's ticks itself, and its clock
// moves two ticks on after the checkpoint loop reads it to ask.
func TestCheckpointLetsGoOfALatePause(t *testing.T) {
	ctx := context.Background()
	const every = time.Second
	base := time.Now()
	var armed atomic.Bool     // the next reading of the clock is the ask's
	var readings atomic.Int32 // readings of the clock since it was armed
	now := func() time.Time {
		if armed.Load() && readings.Add(1) > 1 {
			return base.Add(2 * every)
		}
		return base
	}
	ticks := make(chan time.Time)
	log := &checkpointLog{}
	db, err := Open(ctx, filepath.Join(t.TempDir(), "fleetd.db"), Options{
		Now: now, Logger: slog.New(log), CheckpointInterval: every,
		WALLimit: 8 * sqlitePage, checkpointTicks: ticks})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// The migrations leave a WAL of far more than 8 frames, and nothing
	// checkpoints until the first tick.
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}

	holding, release, held := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		held <- db.update(ctx, func(ctx context.Context, tx *Tx) error {
			close(holding)
			<-release
			return nil
		})
	}()
	<-holding
	armed.Store(true) // the batch has read the clock; the loop reads it next
	ticks <- base
	// The loop asks for a pause and waits for it, while the batch is held
	// or once it ended: either way the pause comes two ticks after the ask.
	close(release)
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	// Once the loop had its pause, it read the clock again, or restarted.
	poll.Until(t, 10*time.Second, "the checkpoint loop to have the pause", func() bool {
		return readings.Load() >= 2 || db.stats.restarts.Load() > 0
	})
	armed.Store(false)

	// The commit loop goes on; at the next tick the pause comes at once.
	if _, _, err := db.CreateTenant(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	late := db.stats.restarts.Load()
	if late != 0 {
		t.Errorf("%d restarts after the pause that came late, want 0", late)
	}
	ticks <- base
	poll.Until(t, 10*time.Second, "the WAL's restart at the next tick", func() bool { return db.stats.restarts.Load() > late })
	// The first tick's checkpoints saw the migrations' WAL; the next
	// one's, the tenant's writes appended to it.
	cps := log.all()
	if len(cps) == 0 {
		t.Fatal("no checkpoints logged")
	}
	tick1 := cps[0].frames
	var first, next []string
	for _, c := range cps {
		if c.frames == tick1 && next == nil {
			first = append(first, c.mode)
		} else {
			next = append(next, c.mode)
		}
	}
	if first[0] != "PASSIVE" || slices.Contains(first, "RESTART") {
		t.Errorf("the tick whose pause came late checkpointed %q, want PASSIVE and no RESTART", first)
	}
	if len(next) < 2 || next[0] != "PASSIVE" || !slices.Contains(next, "RESTART") {
		t.Errorf("the next tick checkpointed %q, want PASSIVE first, then a RESTART", next)
	}
}

// TestWALCutBackAtRestart restarts a WAL far longer than its limit and
// checks that the next commit cuts the file back to half again the limit,
// not to the limit: under a steady load the WAL passes its limit by what is
// written until the checkpoint loop restarts it, and a file cut back below
// that is grown again after every restart, the file system freeing and
// allocating its blocks under the commits that wait (journal_size_limit).
func TestWALCutBackAtRestart(t *testing.T) {
	ctx := context.Background()
	ticks := make(chan time.Time)
	path := filepath.Join(t.TempDir(), "fleetd.db")
	const limit = 16 * sqlitePage
	db, err := Open(ctx, path, Options{CheckpointInterval: time.Hour, WALLimit: limit, checkpointTicks: ticks})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Migrate(ctx); err != nil { // far more than 16 pages
		t.Fatal(err)
	}
	walSize := func() int64 {
		fi, err := os.Stat(path + "-wal")
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	if s := walSize(); s <= limit*3/2 {
		t.Fatalf("the migrations left a WAL of %d bytes, want more than %d for this test", s, limit*3/2)
	}
	ticks <- time.Now()
	poll.Until(t, 10*time.Second, "the WAL's restart", func() bool { return db.stats.restarts.Load() > 0 })
	if _, _, err := db.CreateTenant(ctx, "acme"); err != nil { // the first commit after it
		t.Fatal(err)
	}
	if s := walSize(); s != limit*3/2 {
		t.Errorf("the WAL is %d bytes after the restart and a commit, want %d (half again the limit of %d)", s, limit*3/2, limit)
	}
}
