package sqlstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/internal/poll"
	"github.com/fleetd/fleet/sqlstore"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestWALRestartsUnderLoad writes to SQLite without a pause, as a steady
// stream of status reports does, and waits for the WAL to be reused from
// its start: a checkpoint that only ever runs beside the writer (PASSIVE)
// leaves the writer appending to a WAL that grows without end. The WAL
// must pass its limit (a restart happens only past it), be restarted, and
// be seen small again while the writes go on. And the writer must wait for little of the WAL at each
// restart: SQLite syncs the database file only when a checkpoint reaches
// the WAL's end, so a restart left to do it syncs every page copied since
// the last one, the whole WAL; the checkpoint loop syncs them beforehand.
func TestWALRestartsUnderLoad(t *testing.T) {
	b := sqlstoretest.Backends()[0] // SQLite
	const limit = 2 << 20
	db := sqlstoretest.MustOpen(t, b, sqlstoretest.Options{WALLimit: limit, CheckpointInterval: 5 * time.Millisecond})
	ctx := context.Background()
	mustTenant(t, db, "acme")
	devs := map[string]map[string]string{}
	var ids []string
	for i := range 2000 {
		id := fmt.Sprintf("dev-%04d", i)
		devs[id], ids = nil, append(ids, id)
	}
	mustDevices(t, db, "acme", devs)
	a := mustDispatch(t, db, "acme", dispatch("reboot", "all"))

	before := db.Stats() // the setup's own restarts aside
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var seq sync.Mutex
	next := int64(0)
	for range 8 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				seq.Lock()
				next++
				s := next
				seq.Unlock()
				r := fleet.StatusReport{DeviceID: ids[rand.IntN(len(ids))], ActionID: a.ID, State: "Downloading",
					Progress: intp(int(s % 100)), Timestamp: i64(s), Sequence: i64(s)}
				if _, err := db.ReportStatus(ctx, "acme", []fleet.StatusReport{r}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()

	frames := int64(limit / 4096)
	var st sqlstore.WriteStats
	poll.Until(t, time.Minute, "the WAL to be restarted under load and seen small again", func() bool {
		st = db.Stats()
		return st.WALRestarts-before.WALRestarts >= 3 && st.WALFrames < frames/2
	})
	restarts := st.WALRestarts - before.WALRestarts
	if got := (st.WALRestartFrames - before.WALRestartFrames) / restarts; got > uint64(frames/2) {
		t.Errorf("a restart copied or synced %d frames on average while the writer waited, with a limit of %d: %+v", got, frames, st)
	}
}
