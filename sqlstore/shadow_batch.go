package sqlstore

// Single shadow writes (a desired change through the API, a device's
// reported state), applied in batches across requests as status reports
// are: one transaction job, and a handful of statements, for the writes
// of many concurrent callers (docs/twin.md).

import (
	"bytes"
	"context"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/internal/gather"
)

// shadowCall is one caller's write of a shadow's section, and its answer.
type shadowCall struct {
	ctx            context.Context
	tenant, device string
	section        string // fleet.ShadowDesired or fleet.ShadowReported
	patch          map[string]any
	// version is, for a desired change, the version the writer read; nil
	// for any.
	version *int64
	// current, for a reported change, says whether the patch is still
	// current once the shadow is locked; nil: it is.
	current func(ctx context.Context, tx *Tx) (bool, error)

	out  *fleet.Shadow
	err  error
	done chan struct{}
}

// maxShadowBatch bounds the writes of one batch.
const maxShadowBatch = 256

// shadowWorkers is how many batches of shadow writes are in the commit
// loops' queue at once: while one commits, the next gathers the writes
// that arrive meanwhile.
const shadowWorkers = 4

// queueShadow hands c to a shadow worker and returns its answer once the
// batch it joined committed (or failed, or c failed alone).
func (db *DB) queueShadow(ctx context.Context, c *shadowCall) (*fleet.Shadow, error) {
	c.ctx, c.done = ctx, make(chan struct{})
	select {
	case db.shadowCalls <- c:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-db.stop:
		return nil, fleet.Errorf(fleet.EUNAVAILABLE, "the server is shutting down")
	}
	<-c.done // a worker that took it answers it, even at Close
	return c.out, db.classify(c.err)
}

// shadowWorker applies batches of shadow writes until Close.
func (db *DB) shadowWorker() {
	defer db.shadowWG.Done()
	for {
		select {
		case c := <-db.shadowCalls:
			db.applyShadowCalls(gather.Waiting(db.shadowCalls, c, maxShadowBatch, nil))
		case <-db.stop:
			return
		}
	}
}

// applyShadowCalls applies the calls, a transaction job per tenant, and
// answers each. A job that fails as a whole (a statement failed) is run
// again a call at a time, so that one bad write cannot fail the others.
func (db *DB) applyShadowCalls(batch []*shadowCall) {
	gather.Apply(batch, func(c *shadowCall) context.Context { return c.ctx }, func(c *shadowCall) string { return c.tenant },
		db.applyTenantShadows, func(c *shadowCall, gone error) {
			if gone != nil {
				c.err = gone // the caller went away before its turn
			}
			close(c.done)
		})
}

// applyTenantShadows applies one tenant's calls in one transaction job
// and sets each call's answer; the job's own error says it failed as a
// whole.
func (db *DB) applyTenantShadows(tenant string, calls []*shadowCall) error {
	// Once queued, a transaction job runs to its end whoever is waiting;
	// no single caller's cancellation may fail the others.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var made int
	err := db.update(ctx, func(ctx context.Context, tx *Tx) error {
		var err error
		made, err = tx.writeShadows(ctx, tenant, calls)
		return err
	})
	if err != nil {
		for _, c := range calls {
			c.out, c.err = nil, err
		}
		return err
	}
	// A batch's statements name many shadows at once (= ANY, unnest):
	// planned from the statistics of an empty device_shadows, they read
	// all of it for each batch (a quiet PostgreSQL served a third of the
	// writes it served with fresh statistics: docs/benchmarks-notebook.md,
	// "Shadow batches and stale statistics"). SQLite plans without
	// statistics: it keeps no count.
	if db.dialect == postgres && db.shadowsGrown.add(made) {
		db.analyzeAfterWrite(ctx, "device_shadows", analyzeAfter)
	}
	return nil
}

// writeShadows applies calls, writes of the tenant's shadows, in their
// order, with the statements of one: the shadows are locked and read
// together, the tenant's update_config setting read once, the rows
// written and the desired changes audited a statement each. A call's own
// failure that comes before any statement of its own (its device not
// found, a stale version, a patch beyond the limits) is its answer and
// leaves the others be; any other failure is the whole job's.
//
// Two calls on one device apply one after the other, the second to what
// the first left; the device's row is written once, as the last left it.
// Each call's shadow is as it left it, but only the device's last call
// says whether the delta changed, from what it was before the batch to
// what it is after: the device is told once, the delta that committed.
func (tx *Tx) writeShadows(ctx context.Context, tenant string, calls []*shadowCall) (made int, err error) {
	devices := make([]string, 0, len(calls))
	for _, c := range calls {
		c.out, c.err = nil, nil
		devices = append(devices, c.device)
	}
	shadows, err := tx.lockShadows(ctx, tenant, devices)
	if err != nil {
		return 0, err
	}
	setting := tx.updateConfigSetting(tenant)
	type touched struct {
		before []byte // the delta before the batch
		last   int    // the device's last call that changed its row
		calls  int
	}
	var order []string
	seen := map[string]*touched{}
	var audits []auditEntry
	for i, c := range calls {
		s, ok := shadows[c.device]
		if !ok {
			c.err = fleet.Errorf(fleet.ENOTFOUND, "device %q not found", c.device)
			continue
		}
		s.DeltaChanged, s.DesiredChanged, s.Dispatched = false, false, nil
		t := seen[c.device]
		if t == nil {
			before, err := fleet.MarshalCanonical(s.Delta)
			if err != nil {
				return 0, err
			}
			t = &touched{before: before, last: -1}
			seen[c.device] = t
		}
		t.calls++
		wrote, err := tx.applyShadowCall(ctx, tenant, c, s, setting, &audits)
		if err != nil {
			return 0, err
		}
		if wrote {
			if t.last < 0 {
				order = append(order, c.device)
			}
			t.last = i
		}
		if c.err == nil {
			out := s.Shadow // a copy: a later call on the device changes s
			c.out = &out
		}
	}
	writes := make([]shadowWrite, 0, len(order))
	for _, dev := range order {
		t, s := seen[dev], shadows[dev]
		writes = append(writes, tx.rowOf(dev, s))
		if !s.exists {
			made++
		}
		if t.calls == 1 {
			continue
		}
		after, err := fleet.MarshalCanonical(s.Delta)
		if err != nil {
			return 0, err
		}
		for _, c := range calls[:t.last] {
			if c.device == dev && c.out != nil {
				c.out.DeltaChanged = false
			}
		}
		calls[t.last].out.DeltaChanged = !bytes.Equal(t.before, after)
	}
	if err := tx.upsertShadows(ctx, tenant, writes); err != nil {
		return 0, err
	}
	return made, tx.auditMany(ctx, tenant, audits)
}

// applyShadowCall applies c to s, its device's shadow, in memory (but for
// a dispatch of update_config), and reports whether s's row is to be
// written. c.err is c's own failure; the error returned is the job's.
func (tx *Tx) applyShadowCall(ctx context.Context, tenant string, c *shadowCall, s *storedShadow,
	setting func(context.Context) (bool, error), audits *[]auditEntry) (bool, error) {
	by := context.WithoutCancel(c.ctx)
	if c.section == fleet.ShadowDesired {
		if c.version != nil && *c.version != s.Version {
			c.err = fleet.Errorf(fleet.ECONFLICT, "the shadow of device %q is at version %d, not %d: read it again and reapply the change", c.device, s.Version, *c.version)
			return false, nil
		}
		previous := s.Desired
		text, changed, err := mergeSection(fleet.ShadowDesired, &s.Desired, s.desired, c.patch)
		if err != nil || !changed {
			c.err = err
			return false, nil
		}
		a, err := tx.desiredMerged(by, tenant, c.device, s, text, previous, c.patch, setting)
		if err != nil {
			return false, err
		}
		a.by = by
		*audits = append(*audits, *a)
		return true, nil
	}
	if c.current != nil {
		if ok, err := c.current(ctx, tx); err != nil || !ok {
			return false, err
		}
	}
	text, changed, err := mergeSection(fleet.ShadowReported, &s.Reported, s.reported, c.patch)
	if err != nil {
		c.err = err
		return false, nil
	}
	s.reported = text
	now := fromMillis(millis(tx.now))
	s.ReportedUpdatedAt = &now
	if changed {
		if err := s.recompute(); err != nil {
			return false, err
		}
	}
	// Unchanged, the time still moves: a device that reports the same
	// state says it is still in it.
	return true, nil
}
