package console

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/fleetd/fleet"
)

// Live pages follow the database, not this replica's memory: a device's
// report may be applied by any replica. Each open event stream reads what it
// shows every LiveInterval and sends it when it changed, so a page moves
// within LiveInterval (plus a query) of a report's commit.

// liveMaxAge ends an event stream after a while; the browser reconnects
// (EventSource does by itself), and a session that ended meanwhile is
// refused then.
const liveMaxAge = 10 * time.Minute

// heartbeat keeps idle streams open through proxies.
const heartbeat = 15 * time.Second

// actionLive is what an action page's stream sends.
type actionLive struct {
	Statuses    map[string]int            `json:"statuses"`
	Phased      map[string]map[string]int `json:"phased"`
	Status      fleet.RolloutStatus       `json:"status,omitempty"`
	PauseReason string                    `json:"pause_reason,omitempty"`
	NextPhase   *int                      `json:"next_phase,omitempty"`
	Triggered   []bool                    `json:"triggered,omitempty"`
}

func (c *Console) handleActionEvents(w http.ResponseWriter, r *http.Request, v *view) error {
	id, err := actionID(r)
	if err != nil {
		return err
	}
	tenant := v.Actor.Tenant
	// A first read answers an unknown action with a 404 before the stream
	// starts.
	if _, err := c.Actions.FindAction(r.Context(), tenant, id); err != nil {
		return err
	}
	return c.stream(w, r, "action", func() (any, error) {
		a, err := c.Actions.FindAction(r.Context(), tenant, id)
		if err != nil {
			return nil, err
		}
		return actionLive{Statuses: a.Statuses, Phased: a.StatusesPhased, Status: a.Status, PauseReason: a.PauseReason,
			NextPhase: a.NextPhaseIndex, Triggered: a.PhasesTriggered}, nil
	})
}

// overviewLive is what the overview's stream sends.
type overviewLive struct {
	Devices  int                       `json:"devices"`
	InFlight int                       `json:"in_flight"`
	Alerts   int                       `json:"alerts"`
	Actions  map[string]map[string]int `json:"actions"` // by action id: statuses
}

func (c *Console) handleOverviewEvents(w http.ResponseWriter, r *http.Request, v *view) error {
	ctx, tenant := r.Context(), v.Actor.Tenant
	return c.stream(w, r, "overview", func() (any, error) {
		var o overviewLive
		var err error
		if _, o.Devices, err = c.Devices.FindDevices(ctx, tenant, fleet.DeviceFilter{Page: fleet.Page{Page: 1, Limit: 1}}); err != nil {
			return nil, err
		}
		acts, n, err := c.Actions.FindActions(ctx, tenant, fleet.ActionFilter{Incomplete: true, Page: fleet.Page{Page: 1, Limit: 10}})
		if err != nil {
			return nil, err
		}
		o.InFlight, o.Actions = n, map[string]map[string]int{}
		for _, a := range acts {
			o.Actions[strconv.FormatInt(a.ID, 10)] = a.Statuses
		}
		if _, o.Alerts, err = c.Alerts.FindAlerts(ctx, tenant, fleet.AlertFilter{State: fleet.AlertActive, Page: fleet.Page{Page: 1, Limit: 1}}); err != nil {
			return nil, err
		}
		return o, nil
	})
}

// stream sends read's value as the event named event whenever it
// changes, until the client goes, the stream is liveMaxAge old or read
// fails.
func (c *Console) stream(w http.ResponseWriter, r *http.Request, event string, read func() (any, error)) error {
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	tick := time.NewTicker(c.LiveInterval)
	defer tick.Stop()
	end := time.After(liveMaxAge)
	var last []byte
	lastWrite := time.Now()
	for {
		val, err := read()
		if err != nil {
			if r.Context().Err() == nil {
				c.Logger.Warn("console event stream", "err", err, "request_id", fleet.RequestIDFromContext(r.Context()))
			}
			return nil // the browser reconnects
		}
		b, err := json.Marshal(val)
		if err != nil {
			return nil
		}
		var msg []byte
		switch {
		case !bytes.Equal(b, last):
			msg = fmt.Appendf(nil, "event: %s\ndata: %s\n\n", event, b)
			last = b
		case time.Since(lastWrite) >= heartbeat:
			msg = []byte(": heartbeat\n\n")
		}
		if msg != nil {
			_ = rc.SetWriteDeadline(time.Now().Add(30 * time.Second))
			if _, err := w.Write(msg); err != nil {
				return nil
			}
			if err := rc.Flush(); err != nil {
				return nil
			}
			lastWrite = time.Now()
		}
		select {
		case <-r.Context().Done():
			return nil
		case <-end:
			return nil
		case <-tick.C:
		}
	}
}
