package sqlstore

import (
	"context"

	"github.com/fleetd/fleet"
)

// ShadowWrite is one single shadow write of a batch ApplyShadowBatch
// applies: a desired or a reported merge patch, with the context of its
// request (nil: ApplyShadowBatch's).
type ShadowWrite struct {
	Ctx     context.Context
	Device  string
	Desired bool
	Patch   map[string]any
	Version *int64
	// Fail, for a reported write, is a statement run once the shadows
	// are locked, which fails: the write fails in the database, and with
	// it, on PostgreSQL, its batch's transaction.
	Fail string
}

// ApplyShadowBatch applies ws as the shadow workers apply the writes of
// concurrent callers that one batch gathered, in their order, and returns
// each write's answer.
func (db *DB) ApplyShadowBatch(ctx context.Context, tenant string, ws []ShadowWrite) ([]*fleet.Shadow, []error) {
	calls := make([]*shadowCall, len(ws))
	for i, w := range ws {
		c := &shadowCall{ctx: ctx, tenant: tenant, device: w.Device, section: fleet.ShadowReported, patch: w.Patch,
			version: w.Version, done: make(chan struct{})}
		if w.Ctx != nil {
			c.ctx = w.Ctx
		}
		if w.Desired {
			c.section = fleet.ShadowDesired
		}
		if w.Fail != "" {
			c.current = func(ctx context.Context, tx *Tx) (bool, error) {
				_, err := tx.exec(ctx, w.Fail)
				return err == nil, err
			}
		}
		calls[i] = c
	}
	db.applyShadowCalls(calls)
	out, errs := make([]*fleet.Shadow, len(ws)), make([]error, len(ws))
	for i, c := range calls {
		<-c.done
		out[i], errs[i] = c.out, db.classify(c.err)
	}
	return out, errs
}
