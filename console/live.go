package console

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleet"
)

// Live pages follow the database, not this replica's memory: a device's
// report may be applied by any replica. A feed reads what a live page shows
// every LiveInterval and tells its pages when it changed, so a page moves
// within LiveInterval (plus a query) of a report's commit. Every page open
// on the same thing (a tenant's overview, an action) shares one feed: the
// database is asked once an interval however many browsers watch.

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
	Waiting     string                    `json:"waiting_reason,omitempty"`
	NextPhase   *int                      `json:"next_phase,omitempty"`
	Triggered   []bool                    `json:"triggered,omitempty"`
	// Ops are the rollout's operations allowed now, whose buttons show.
	Ops []fleet.RolloutOp `json:"ops,omitempty"`
	// Confirm is what abort and cancel ask first, with today's counts.
	Confirm map[string]string `json:"confirm"`
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
	return c.stream(w, r, "action", "action/"+tenant+"/"+strconv.FormatInt(id, 10), c.LiveInterval, func(ctx context.Context) (any, error) {
		a, err := c.Actions.FindAction(ctx, tenant, id)
		if err != nil {
			return nil, err
		}
		return actionLive{Statuses: a.Statuses, Phased: a.StatusesPhased, Status: a.Status, PauseReason: a.PauseReason, Waiting: a.WaitingReason,
			NextPhase: a.NextPhaseIndex, Triggered: a.PhasesTriggered, Ops: a.RolloutOps(),
			Confirm: map[string]string{"abort": confirmOp(a, "abort"), "cancel": confirmOp(a, "cancel")}}, nil
	})
}

// overviewLive is what the overview's stream sends: the whole of what the
// page shows, so that a new action, alert or failure appears on it.
type overviewLive struct {
	Devices int  `json:"devices"`
	Online  *int `json:"online,omitempty"` // nil: unknown
	// InSync and OutOfSync count the devices whose shadow has no delta
	// (or who have no shadow) and the others (docs/twin.md).
	InSync    int               `json:"in_sync"`
	OutOfSync int               `json:"out_of_sync"`
	InFlight  int               `json:"in_flight"`
	AlertsN   int               `json:"alerts"`
	Actions   []overviewAction  `json:"actions"`
	Alerts    []overviewAlert   `json:"active_alerts"`
	Failures  []overviewFailure `json:"failures"`
}

type overviewAction struct {
	ID       int64          `json:"id"`
	Action   string         `json:"action"`
	Rollout  string         `json:"rollout,omitempty"`
	Statuses map[string]int `json:"statuses"`
	Started  string         `json:"started"`
}

type overviewAlert struct {
	Rule   string `json:"rule"`
	Device string `json:"device"`
	Stream string `json:"stream"`
	Since  string `json:"since"`
}

type overviewFailure struct {
	ActionID int64  `json:"action_id"`
	Type     string `json:"type"`
	Device   string `json:"device"`
	Errors   string `json:"errors"`
	At       string `json:"at"`
}

// overviewRows is how many actions, alerts and failures the overview lists.
const overviewRows = 10

// readOverview reads the overview of a tenant: a fixed number of queries,
// whatever the size of the fleet or the number of rows shown.
func (c *Console) readOverview(ctx context.Context, tenant string) (*overviewLive, error) {
	var o overviewLive
	var err error
	if _, o.Devices, err = c.Devices.FindDevices(ctx, tenant, fleet.DeviceFilter{Page: fleet.Page{Page: 1, Limit: 1}}); err != nil {
		return nil, err
	}
	// The devices out of sync are read from the shadows' in_sync index;
	// the others are in sync.
	if _, o.OutOfSync, err = c.Devices.FindDevices(ctx, tenant, fleet.DeviceFilter{Shadow: fleet.ShadowOutOfSync, Page: fleet.Page{Page: 1, Limit: 1}}); err != nil {
		return nil, err
	}
	o.InSync = max(0, o.Devices-o.OutOfSync)
	if c.Online != nil {
		n := c.Online.OnlineCount(tenant)
		o.Online = &n
	}
	acts, n, err := c.Actions.FindActions(ctx, tenant, fleet.ActionFilter{Incomplete: true, Page: fleet.Page{Page: 1, Limit: overviewRows}})
	if err != nil {
		return nil, err
	}
	o.InFlight, o.Actions = n, make([]overviewAction, 0, len(acts))
	for _, a := range acts {
		o.Actions = append(o.Actions, overviewAction{ID: a.ID, Action: a.Action, Rollout: string(a.Status), Statuses: a.Statuses, Started: when(a.CreatedAt)})
	}
	alerts, n, err := c.Alerts.FindAlerts(ctx, tenant, fleet.AlertFilter{State: fleet.AlertActive, Page: fleet.Page{Page: 1, Limit: overviewRows}})
	if err != nil {
		return nil, err
	}
	o.AlertsN, o.Alerts = n, make([]overviewAlert, 0, len(alerts))
	for _, a := range alerts {
		o.Alerts = append(o.Alerts, overviewAlert{Rule: a.RuleName, Device: a.DeviceID, Stream: a.Stream, Since: when(a.StartedAt)})
	}
	fails, err := c.Actions.FindRecentFailures(ctx, tenant, overviewRows)
	if err != nil {
		return nil, err
	}
	o.Failures = make([]overviewFailure, 0, len(fails))
	for _, f := range fails {
		o.Failures = append(o.Failures, overviewFailure{ActionID: f.ActionID, Type: f.Type, Device: f.DeviceID, Errors: failureText(f), At: when(f.UpdatedAt)})
	}
	return &o, nil
}

// failureText is a failed device action's errors on one line.
func failureText(da *fleet.DeviceAction) string {
	var parts []string
	for _, state := range sortedKeys(da.Errors) {
		parts = append(parts, state+": "+strings.Join(da.Errors[state], "; "))
	}
	return strings.Join(parts, " · ")
}

func (c *Console) handleOverviewEvents(w http.ResponseWriter, r *http.Request, v *view) error {
	tenant := v.Actor.Tenant
	return c.stream(w, r, "overview", "overview/"+tenant, c.LiveInterval, func(ctx context.Context) (any, error) {
		return c.readOverview(ctx, tenant)
	})
}

// feeds are the live reads in progress, by what they read.
type feeds struct {
	mu sync.Mutex
	m  map[string]*feed
}

// feed reads one thing every interval (LiveInterval; a chart's,
// chartLiveInterval) for as long as a page watches it.
type feed struct {
	subs    int
	stop    context.CancelFunc
	last    []byte        // the latest value, as JSON; nil before the first read
	err     error         // set when a read failed: the feed has ended
	changed chan struct{} // closed, and replaced, when last or err changes
}

// join returns the feed of key, started with read every interval if no
// page watches it yet, and the function that leaves it; the last to leave
// stops it.
func (c *Console) join(key string, every time.Duration, read func(context.Context) (any, error)) (*feed, func()) {
	fs := &c.feeds
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.m == nil {
		fs.m = map[string]*feed{}
	}
	f := fs.m[key]
	if f == nil {
		ctx, cancel := context.WithCancel(context.Background())
		f = &feed{stop: cancel, changed: make(chan struct{})}
		fs.m[key] = f
		go c.run(ctx, key, f, every, read)
	}
	f.subs++
	return f, func() {
		fs.mu.Lock()
		defer fs.mu.Unlock()
		if f.subs--; f.subs == 0 {
			f.stop()
			if fs.m[key] == f {
				delete(fs.m, key)
			}
		}
	}
}

// run reads the feed's value every interval until its last page left or
// a read fails.
func (c *Console) run(ctx context.Context, key string, f *feed, every time.Duration, read func(context.Context) (any, error)) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		val, err := read(ctx)
		var b []byte
		if err == nil {
			b, err = json.Marshal(val)
		}
		if err != nil && ctx.Err() == nil {
			c.Logger.Warn("console live read", "feed", key, "err", err)
		}
		c.feeds.mu.Lock()
		if err != nil || !bytes.Equal(b, f.last) {
			f.last, f.err = b, err
			close(f.changed)
			f.changed = make(chan struct{})
		}
		if err != nil && c.feeds.m[key] == f {
			delete(c.feeds.m, key) // the next page to come starts afresh
		}
		c.feeds.mu.Unlock()
		if err != nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// current is the feed's latest value, what is closed when it or its error
// changes, and its error.
func (f *feed) current(mu *sync.Mutex) ([]byte, <-chan struct{}, error) {
	mu.Lock()
	defer mu.Unlock()
	return f.last, f.changed, f.err
}

// stream sends the feed of key (started with read every interval if need
// be) as the event named event whenever it changes, until the client goes,
// the stream is liveMaxAge old or a read fails.
func (c *Console) stream(w http.ResponseWriter, r *http.Request, event, key string, every time.Duration, read func(context.Context) (any, error)) error {
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	f, leave := c.join(key, every, read)
	defer leave()
	end := time.After(liveMaxAge)
	beat := time.NewTicker(heartbeat)
	defer beat.Stop()
	send := func(msg []byte) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(30 * time.Second))
		if _, err := w.Write(msg); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	var sent []byte
	for {
		b, changed, err := f.current(&c.feeds.mu)
		if err != nil {
			return nil // the browser reconnects
		}
		if b != nil && !bytes.Equal(b, sent) {
			if !send(fmt.Appendf(nil, "event: %s\ndata: %s\n\n", event, b)) {
				return nil
			}
			sent = b
		}
		select {
		case <-r.Context().Done():
			return nil
		case <-end:
			return nil
		case <-changed:
		case <-beat.C:
			if !send([]byte(": heartbeat\n\n")) {
				return nil
			}
		}
	}
}
