package alert

import (
	"context"
	"errors"

	"github.com/fleetd/fleet"
)

// Replicas evaluate one device stream in turn. A shared subscription or a
// load balancer hands a device's data to any replica, and each replica's
// timers fire for the streams it has seen, so the state one replica holds
// in memory may be older than what another committed. With a
// VersionedStore, each commit names the version of the stream its
// evaluation started from; a commit from an older version is refused
// (fleet.ErrStale), and the engine reads the stream again (its latest point
// and its rules' states) and evaluates again. A replica alone never sees
// ErrStale: the check costs one indexed UPDATE per commit.

// VersionedStore is a Store that keeps a version per device stream;
// *sqlstore.DB is one. Without it the engine assumes it is alone.
type VersionedStore interface {
	CommitStreamVersion(ctx context.Context, tenant, device, stream string, pts []fleet.DataPoint, changes []*fleet.AlertChange, expect int64) (int64, error)
	FindStreamSnapshot(ctx context.Context, tenant, device, stream string) (*fleet.StreamSnapshot, error)
}

// maxStaleRetries bounds how often one ingest evaluates again after another
// replica's commit; each retry reads the stream afresh, so more than a few
// means a device's data arrives through several replicas at once.
const maxStaleRetries = 8

func (e *Engine) versioned() (VersionedStore, bool) {
	vs, ok := e.Store.(VersionedStore)
	return vs, ok
}

// loadSnapshot reads the stream from the store and makes it what the
// engine holds: the latest point, the version, and the phase of every rule
// on the stream. Timers of the replaced phases become stale (gen moves on).
// ss.mu is held.
func (e *Engine) loadSnapshot(ctx context.Context, ss *streamState, vs VersionedStore) error {
	snap, err := vs.FindStreamSnapshot(ctx, ss.key.tenant, ss.key.device, ss.key.stream)
	if err != nil {
		return err
	}
	ss.version = snap.Version
	if snap.Latest != nil {
		ss.setLoaded(snap.Latest, e.started)
	} else {
		ss.loaded, ss.hasLast, ss.lastTS, ss.lastSeq, ss.lastPoint = true, false, 0, 0, nil
	}
	stored := map[string]*fleet.AlertState{}
	for _, s := range snap.States {
		stored[s.RuleID] = s
	}
	idx := e.rules.Load()
	for id := range stored {
		if _, ok := ss.states[id]; !ok {
			if r := idx.byID[id]; r != nil && r.Tenant == ss.key.tenant && r.Stream == ss.key.stream {
				ss.state(r)
			}
		}
	}
	for id, st := range ss.states {
		s := stored[id]
		st.gen++
		st.noDataDue = 0
		st.wins = nil // without the other replica's points: warmed again
		if s == nil {
			st.phase, st.sinceData, st.alertID, st.cond = fleet.PhaseNormal, -1, "", false
			continue
		}
		st.phase, st.sinceClock, st.alertID = s.Phase, s.SinceClock.UnixMilli(), s.AlertID
		st.sinceData = -1
		if !s.SinceData.IsZero() {
			st.sinceData = s.SinceData.UnixMilli()
		}
		st.cond = s.Phase == fleet.PhaseActivating || s.Phase == fleet.PhaseActive
	}
	return nil
}

// commitStream commits an evaluation of ss, from its version when the
// store keeps versions. ss.mu is held.
func (e *Engine) commitStream(ctx context.Context, ss *streamState, pts []fleet.DataPoint, changes []*fleet.AlertChange) error {
	k := ss.key
	vs, ok := e.versioned()
	if !ok {
		return e.Store.CommitStream(ctx, k.tenant, k.device, k.stream, pts, changes)
	}
	v, err := vs.CommitStreamVersion(ctx, k.tenant, k.device, k.stream, pts, changes, ss.version)
	if err != nil {
		return err
	}
	ss.version = v
	return nil
}

// reloadStale reads ss again after a commit refused as stale and puts the
// timers of its fresh phases on the heap. ss.mu is held.
func (e *Engine) reloadStale(ctx context.Context, ss *streamState) error {
	vs, ok := e.versioned()
	if !ok {
		return errors.New("alert engine: stale commit without a versioned store")
	}
	if err := e.loadSnapshot(ctx, ss, vs); err != nil {
		return err
	}
	for _, st := range ss.states {
		e.schedule(ss, st)
	}
	return nil
}
