package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/fleetd/fleet"
)

// Heartbeats (docs/agent.md, Several replicas): a session lives on the
// replica that relays it, so a replica that dies leaves its sessions open
// in the store, where they would count under the caps and could not be
// ended. Each replica records a heartbeat every third of
// Limits.ReplicaTimeout, on the database's clock; every replica, at each of
// its own, ends the open sessions of a replica silent for longer than the
// timeout, as an end request for such a session does at once: the reason
// says the replica was lost, the end is audited, and what of its
// recording reached the blob store is kept (recording.go). Meanwhile the
// caps do not count them. A replica whose own heartbeat has not been
// stored for the timeout (it lost the database) ends the sessions it
// relays itself, since the others may have ended them already.
//
// The bytes a session relayed live in its replica's memory until it ends;
// each heartbeat stores, in the same write, the counts of the sessions
// whose counts changed since the last one stored. A lost session is ended
// with what was stored: it misses what was relayed since its replica's
// last stored heartbeat, a third of the timeout at most while the beats
// get through.

// RunHeartbeat beats and sweeps until ctx ends.
func (h *Hub) RunHeartbeat(ctx context.Context) {
	t := time.NewTicker(h.Limits.ReplicaTimeout / 3)
	defer t.Stop()
	stored := time.Now()
	for {
		counts, storedCounts := h.byteCounts()
		if err := h.Sessions.BeatRemoteRelay(ctx, h.RelayURL(), h.Limits.ReplicaTimeout, counts); err == nil {
			stored = time.Now()
			storedCounts()
		} else if ctx.Err() == nil {
			if h.Logger != nil {
				h.Logger.Warn("this replica's remote-session heartbeat could not be stored", "err", err)
			}
			if time.Since(stored) > h.Limits.ReplicaTimeout {
				h.revokeAll(fmt.Sprintf("this replica could not reach the database for %s (--remote-replica-timeout)", h.Limits.ReplicaTimeout))
			}
		}
		if _, err := h.EndLost(ctx); err != nil && ctx.Err() == nil && h.Logger != nil {
			h.Logger.Warn("remote sessions of a lost replica could not be ended", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// byteCounts returns the counts of this replica's open sessions that
// changed since they were last stored, and a function that marks them
// stored, for RunHeartbeat alone (Session.storedTo and storedFrom are its).
func (h *Hub) byteCounts() ([]fleet.RemoteBytes, func()) {
	var counts []fleet.RemoteBytes
	var of []*Session
	h.mu.Lock()
	for _, s := range h.sessions {
		to, from := s.toDevice.Load(), s.fromDev.Load()
		if to != s.storedTo || from != s.storedFrom {
			counts = append(counts, fleet.RemoteBytes{ID: s.ID, ToDevice: to, FromDevice: from})
			of = append(of, s)
		}
	}
	h.mu.Unlock()
	return counts, func() {
		for i, s := range of {
			s.storedTo, s.storedFrom = counts[i].ToDevice, counts[i].FromDevice
		}
	}
}

// lostReason is the end of a session whose replica was lost.
func (h *Hub) lostReason(s *fleet.RemoteSession) string {
	return fmt.Sprintf("replica lost: %s, which relayed it, sent no heartbeat for %s (--remote-replica-timeout)", s.RelayURL, h.Limits.ReplicaTimeout)
}

// EndLost ends the open sessions of every replica silent for longer than
// Limits.ReplicaTimeout, and returns how many.
func (h *Hub) EndLost(ctx context.Context) (int, error) {
	lost, err := h.Sessions.FindLostRemoteSessions(ctx, fleet.RemoteLost{Silent: h.Limits.ReplicaTimeout})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, s := range lost {
		m, err := h.endLost(ctx, []*fleet.RemoteSession{s}, h.lostReason(s))
		if err != nil {
			return n, err
		}
		n += m
	}
	return n, nil
}

// Stop ends the open session id of tenant (audited), by names who asked.
// The replica that relays it hears of it and ends it; one of a replica
// that was lost is ended here and now. The store's errors are its:
// ENOTFOUND, ECONFLICT for a session that has ended.
func (h *Hub) Stop(ctx context.Context, tenant, id, by string) error {
	lost, err := h.Sessions.FindLostRemoteSessions(ctx, fleet.RemoteLost{Silent: h.Limits.ReplicaTimeout, Tenant: tenant, ID: id})
	if err != nil {
		return err
	}
	if len(lost) == 0 {
		return h.Sessions.StopRemoteSession(ctx, tenant, id, by)
	}
	_, err = h.endLost(ctx, lost, "ended by "+by+"; "+h.lostReason(lost[0]))
	return err
}

// endLost records the end of sessions whose replica is gone, with the
// bytes its heartbeats stored and what of their recordings reached the
// blob store, and returns how many it ended (another replica may have
// been first).
func (h *Hub) endLost(ctx context.Context, lost []*fleet.RemoteSession, reason string) (int, error) {
	n := 0
	for _, s := range lost {
		s.EndReason = reason
		s.RecordingSize = 0
		if s.Recorded {
			s.RecordingSize = h.partsSize(ctx, s.Tenant, s.ID)
		}
		if err := h.Sessions.EndRemoteSession(ctx, s); err != nil {
			return n, err
		}
		if s.EndedAt != nil {
			n++
		}
	}
	return n, nil
}

// revokeAll ends every session this replica relays, for reason.
func (h *Hub) revokeAll(reason string) {
	h.mu.Lock()
	all := make([]*Session, 0, len(h.sessions))
	for _, s := range h.sessions {
		all = append(all, s)
	}
	h.mu.Unlock()
	for _, s := range all {
		h.revoke(s, reason)
	}
}
