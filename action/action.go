// Package action is the action service: dispatch with the preparers of
// special actions, delivery of actions to connected devices, redelivery when
// a device subscribes again, cancellation, and the sweeper that fails device
// actions whose timeout elapsed. What a single store call can do, the store
// does; this package decides what is sent to whom and when.
//
// Delivery is at least once. An action is handed to every targeted device
// that is connected as soon as the dispatch commits; a device that was
// offline gets it when it next subscribes to its actions topic. A device
// action stays Queued until the device acknowledges the message (PUBACK),
// so a message lost with a connection is sent again, and a device may see
// an action twice: devices tell actions apart by id.
package action

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/internal/gather"
)

// Sender is the device channel as the action service sees it; *broker.Server
// is one.
type Sender interface {
	// SendAction hands payload, the message of action actionID, to a
	// connected, subscribed device, or reports false.
	SendAction(tenant, device string, actionID int64, payload []byte) bool
	// Online reports whether the device is connected.
	Online(tenant, device string) bool
}

// presenceUnknown is implemented by a Sender that cannot tell which devices
// are connected, such as *bridge.Client of an external broker: a dispatch is
// then offered to every targeted device whose action is Queued (the broker
// drops it for those not subscribed), rather than to the devices that
// subscribed through this process, which on a replica are only some.
type presenceUnknown interface{ PresenceUnknown() bool }

// Store is what the service needs of the database; *sqlstore.DB is one.
type Store interface {
	DispatchAction(ctx context.Context, tenant string, d *fleet.Dispatch) (*fleet.Action, error)
	FindActions(ctx context.Context, tenant string, f fleet.ActionFilter) ([]*fleet.Action, int, error)
	FindAction(ctx context.Context, tenant string, id int64) (*fleet.Action, error)
	FindDeviceActions(ctx context.Context, tenant string, f fleet.DeviceActionFilter) ([]*fleet.DeviceAction, int, error)
	FindDeviceAction(ctx context.Context, tenant string, actionID int64, deviceID string) (*fleet.DeviceAction, error)
	FindRecentFailures(ctx context.Context, tenant string, limit int) ([]*fleet.DeviceAction, error)
	CountRetriable(ctx context.Context, tenant string, id int64, statuses []fleet.ActionStatus) (int, error)
	// CancelAction cancels what is not final and dispatches tell, a
	// cancel_action, to the devices that have the action in flight.
	CancelAction(ctx context.Context, tenant string, id int64, tell *fleet.Dispatch) (*fleet.Cancellation, error)
	ReportStatus(ctx context.Context, tenant string, reports []fleet.StatusReport) ([]error, error)
	// PendingDevices returns the devices, among candidates (all when nil),
	// for which the action is Queued.
	PendingDevices(ctx context.Context, tenant string, actionID int64, candidates []string) ([]string, error)
	// PendingActions returns up to limit actions Queued for the device
	// above after, oldest first.
	PendingActions(ctx context.Context, tenant, device string, after int64, limit int) ([]fleet.PendingAction, error)
	MarkDelivered(ctx context.Context, receipts []fleet.ActionReceipt) error
	TimeOutDeviceActions(ctx context.Context, now time.Time, limit int) (int, error)
	// TouchDevices records that devices were seen at t.
	TouchDevices(ctx context.Context, tenant string, ids []string, t time.Time) error
	FindAlertRule(ctx context.Context, tenant, id string) (*fleet.AlertRule, error)
	RolloutStore
}

// Message is an action as a device receives it, in the shape of the uplink
// agent's Action: id as a string, the params as a JSON text. Kind is what
// uplink releases before 2.0 require; later ones ignore it.
type Message struct {
	ID      string `json:"id"`
	Kind    string `json:"kind"`
	Name    string `json:"name"`
	Payload string `json:"payload"`
}

// NewMessage returns the encoded message of action id.
func NewMessage(id int64, name, params string) []byte {
	b, _ := json.Marshal(Message{ID: strconv.FormatInt(id, 10), Kind: "process", Name: name, Payload: params})
	return b // a struct of strings always encodes
}

// Service implements fleet.ActionService and fleet.ActionDelivery. Set
// the fields, then Open; Close before closing the store.
type Service struct {
	Store  Store
	Sender Sender // nil: nothing is sent, actions wait in the database
	// Shadows tells the devices whose desired state a desired rollout's
	// phase changed (fleet.ActionDesired); nil tells none.
	Shadows interface {
		DesiredReleased(tenant string, shadows map[string]*fleet.Shadow)
	}
	Logger *slog.Logger
	// Preparers of special actions by name; cancel_action's is built in.
	Preparers map[string]fleet.ActionPreparer
	// SendWorkers is how many goroutines hand one dispatch to devices;
	// default 4.
	SendWorkers int
	// ReportWorkers is how many store calls apply status reports at once;
	// default 4. Concurrent reports (S10 requests, MQTT payloads) share a
	// store call, so they cost one transaction job, not one each.
	ReportWorkers int
	// MaxReportBatch bounds the reports of one store call; default 512.
	MaxReportBatch int
	// Now is the clock of last_seen_at and of rollouts; default time.Now.
	Now func() time.Time
	// Notified, when set, is called when a rollout's change wrote
	// notifications to the outbox: the notifier delivers them.
	Notified func()
	// EmailEnabled says whether the server can send email (--smtp-addr);
	// rollout notification rules by email are refused without it.
	EmailEnabled bool

	online   onlineSet
	receipts chan fleet.ActionReceipt
	flushes  chan chan struct{} // PendingMessages waiting for the receipts before it
	reports  chan *reportCall   // unbuffered: a sent call always has a worker
	sightMu  sync.Mutex
	sighted  map[string]map[string]struct{} // tenant -> devices heard from
	ctx      context.Context                // ends with Close
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	mu       sync.RWMutex
	closed   bool
	stats    struct{ dispatches, targeted, reports, rejected, rolloutEvents atomic.Uint64 }
	// delivering counts the dispatches being handed to connected devices
	// in the background.
	delivering atomic.Int64

	sendMu  sync.Mutex
	sending map[string]chan struct{} // tenant -> closed when its last send is done

	rolloutMu    sync.Mutex
	rolloutUntil map[fleet.RolloutRef]time.Time // rollouts that wait for a time, and until when
}

// Stats counts what the service did since it opened, for metrics.
type Stats struct {
	Dispatches uint64 // actions dispatched
	Targeted   uint64 // device actions they made
	Reports    uint64 // status reports received, over HTTP and MQTT
	Rejected   uint64 // of those, refused (unknown action or device, invalid)
	// RolloutEvents counts rollouts' changes of state: phases triggered,
	// pauses, resumptions, completions, aborts.
	RolloutEvents uint64
	// Delivering is the number of dispatches being handed to their
	// connected devices now, in the background; at 0 every dispatch made
	// so far has been sent to every device connected when it was made.
	Delivering int64
}

// Stats returns the service's counters.
func (s *Service) Stats() Stats {
	return Stats{
		Dispatches: s.stats.dispatches.Load(),
		Targeted:   s.stats.targeted.Load(),
		Reports:    s.stats.reports.Load(),
		Rejected:   s.stats.rejected.Load(),

		RolloutEvents: s.stats.rolloutEvents.Load(),
		Delivering:    s.delivering.Load(),
	}
}

// reportCall is one caller's reports, waiting for a worker.
type reportCall struct {
	ctx     context.Context
	tenant  string
	reports []fleet.StatusReport
	errs    []error
	err     error
	done    chan struct{} // the answer, sent once (buffered: the worker never waits)
}

// reportCalls are the calls not in use: a call and its channel are made
// once for many reports rather than for each (two allocations of every
// S10 request and MQTT status report, docs/benchmarks-notebook.md).
var reportCalls = sync.Pool{New: func() any { return &reportCall{done: make(chan struct{}, 1)} }}

var (
	_ fleet.ActionService  = (*Service)(nil)
	_ fleet.ActionDelivery = (*Service)(nil)
)

// maxReceiptBatch bounds the acknowledgements recorded in one transaction.
const maxReceiptBatch = 1024

// Open starts the service's background work.
func (s *Service) Open() {
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	if s.SendWorkers <= 0 {
		s.SendWorkers = 4
	}
	if s.ReportWorkers <= 0 {
		s.ReportWorkers = 4
	}
	if s.MaxReportBatch <= 0 {
		s.MaxReportBatch = 512
	}
	if s.Now == nil {
		s.Now = time.Now
	}
	if s.Preparers == nil {
		s.Preparers = map[string]fleet.ActionPreparer{}
	}
	if _, ok := s.Preparers[fleet.ActionCancel]; !ok {
		s.Preparers[fleet.ActionCancel] = fleet.ActionPreparerFunc(s.prepareCancel)
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.receipts = make(chan fleet.ActionReceipt, 64*maxReceiptBatch)
	s.flushes = make(chan chan struct{})
	s.reports = make(chan *reportCall)
	s.sighted = map[string]map[string]struct{}{}
	s.rolloutUntil = map[fleet.RolloutRef]time.Time{}
	s.wg.Add(2 + s.ReportWorkers)
	go s.recordReceipts()
	go s.recordSightings()
	for range s.ReportWorkers {
		go s.applyReports()
	}
}

// Close stops sending, records the acknowledgements received so far and
// waits for the service's goroutines.
func (s *Service) Close() error {
	s.mu.Lock()
	if s.closed || s.cancel == nil {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	return nil
}

// goTracked runs f on a goroutine Close waits for, unless closed.
func (s *Service) goTracked(f func()) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f()
	}()
	return true
}

// prepareCancel reads the action a cancel_action dispatch cancels; the
// devices receive its id and name.
func (s *Service) prepareCancel(ctx context.Context, tenant string, d *fleet.Dispatch) error {
	var p map[string]any
	_ = json.Unmarshal(d.Params, &p) // an object: ReadDispatch made it
	var id int64
	var ok bool
	switch v := p["action_id"].(type) {
	case string:
		id, ok = fleet.ParseActionID(v)
	case float64:
		id, ok = int64(v), v == float64(int64(v)) && v >= 1
	default:
		ok = false
	}
	if !ok {
		return fleet.FieldErrors(map[string]string{"params.action_id": fleet.ActionIDRule})
	}
	a, err := s.Store.FindAction(ctx, tenant, id)
	if fleet.ErrorCode(err) == fleet.ENOTFOUND {
		return fleet.FieldErrors(map[string]string{"params.action_id": fmt.Sprintf("there is no action %d to cancel", id)})
	} else if err != nil {
		return err
	}
	d.CancelActionID = id
	d.DeviceParams = cancelParams(a)
	return nil
}

// cancelParams is what a device receives in a cancel_action of action a:
// the id and name of the action to stop, as the uplink agent reads them.
func cancelParams(a *fleet.Action) json.RawMessage {
	b, _ := json.Marshal(map[string]string{"action_id": strconv.FormatInt(a.ID, 10), "name": a.Action})
	return b // strings always encode
}

// cancelDispatch is the cancel_action that tells the devices that have
// action a in flight to stop it. It has a's timeout.
func cancelDispatch(ctx context.Context, a *fleet.Action) *fleet.Dispatch {
	d := &fleet.Dispatch{
		Action:         fleet.ActionCancel,
		Params:         json.RawMessage(`{"action_id":"` + strconv.FormatInt(a.ID, 10) + `"}`),
		SearchType:     fleet.SearchDefault,
		Timeout:        a.Timeout,
		CancelActionID: a.ID,
		DeviceParams:   cancelParams(a),
	}
	if actor := fleet.ActorFromContext(ctx); actor != nil {
		d.UserEmail, d.UserName = actor.UserEmail, actor.UserName
	}
	return d
}

// DispatchAction prepares a special action, stores the dispatch and hands
// the action to the targeted devices that are connected, in the
// background: the caller has its answer as soon as the dispatch commits.
func (s *Service) DispatchAction(ctx context.Context, tenant string, d *fleet.Dispatch) (*fleet.Action, error) {
	if a := fleet.ActorFromContext(ctx); a != nil {
		d.UserEmail, d.UserName = a.UserEmail, a.UserName
	}
	if d.Schedule != nil {
		if err := s.checkSchedule(ctx, tenant, d.Schedule); err != nil {
			return nil, err
		}
	}
	if p, ok := s.Preparers[d.Action]; ok {
		if err := p.PrepareDispatch(ctx, tenant, d); err != nil {
			return nil, err
		}
	}
	a, err := s.Store.DispatchAction(ctx, tenant, d)
	if err != nil {
		return nil, err
	}
	s.stats.dispatches.Add(1)
	s.stats.targeted.Add(uint64(a.Targeted))
	if d.Schedule != nil {
		// What is due at once (a first phase triggered now) is released
		// before the answer; the driver does the rest.
		s.advance(ctx, tenant, a.ID, true)
		return a, nil
	}
	s.send(tenant, a)
	return a, nil
}

// RetryAction dispatches action id again, its params and timeout, to its
// devices whose device actions are in statuses, as DispatchAction does (a
// special action is prepared again, for the devices it goes to now). A
// rollout is retried without its schedule: the devices retried are those
// it released and that ended so; a desired rollout's retry has a schedule of
// one phase that releases them at once. A cancel_action is not retried:
// cancel the action again.
func (s *Service) RetryAction(ctx context.Context, tenant string, id int64, statuses []fleet.ActionStatus) (*fleet.Action, error) {
	a, err := s.Store.FindAction(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	if a.Action == fleet.ActionCancel {
		return nil, fleet.Errorf(fleet.ECONFLICT, "action %d is a cancel_action, which is not retried: cancel the action it cancelled again instead", id)
	}
	d := &fleet.Dispatch{Action: a.Action, Params: a.Params, SearchType: fleet.SearchDefault,
		Timeout: a.Timeout, RetryOf: id, RetryStatuses: statuses}
	if a.Action == fleet.ActionDesired {
		// A desired change is never sent, only rolled out (docs/twin.md):
		// its retry is a rollout of one phase, released at once.
		d.Schedule = &fleet.Schedule{Phases: []fleet.Phase{{Name: "retry", TriggerOn: fleet.Trigger{Type: fleet.TriggerNow},
			Info: fleet.PhaseInfo{Type: fleet.PhasePercentage, Percentage: 100}}}}
	}
	return s.DispatchAction(ctx, tenant, d)
}

// CancelAction cancels what is not final. The cancel_action the store
// dispatched to the devices that have the action is sent like any action:
// now to those connected, to the others when they next subscribe.
func (s *Service) CancelAction(ctx context.Context, tenant string, id int64) error {
	a, err := s.Store.FindAction(ctx, tenant, id)
	if err != nil {
		return err
	}
	c, err := s.Store.CancelAction(ctx, tenant, id, cancelDispatch(ctx, a))
	if err != nil {
		return err
	}
	s.forgetRollout(tenant, id)
	s.changed(tenant, &fleet.RolloutChange{Event: c.Aborted, Sent: c.Sent})
	return nil
}

// Dispatched hands an action that the store dispatched in another
// service's transaction (a shadow's update_config) to its targeted devices
// that are connected, as DispatchAction does its own.
func (s *Service) Dispatched(tenant string, a *fleet.Action) {
	s.stats.dispatches.Add(1)
	s.stats.targeted.Add(uint64(a.Targeted))
	s.send(tenant, a)
}

// send hands an action just dispatched (nil: none) to the targeted devices
// that are connected, in the background, once the tenant's earlier sends
// are done. A device whose window is full keeps what it is handed in action
// id order, but it can order only what it holds: handed over concurrently,
// a later action could reach it first, while an earlier one was still
// being looked up, and take the slot the earlier one was waiting for.
func (s *Service) send(tenant string, a *fleet.Action) {
	if a == nil {
		return
	}
	payload := NewMessage(a.ID, a.Action, a.SentParams())
	done := make(chan struct{})
	s.sendMu.Lock()
	if s.sending == nil {
		s.sending = map[string]chan struct{}{}
	}
	prev := s.sending[tenant]
	s.sending[tenant] = done
	s.sendMu.Unlock()
	sent := func() {
		close(done)
		s.sendMu.Lock()
		if s.sending[tenant] == done {
			delete(s.sending, tenant)
		}
		s.sendMu.Unlock()
		s.delivering.Add(-1)
	}
	s.delivering.Add(1) // before the caller returns: Stats never misses it
	if !s.goTracked(func() {
		defer sent()
		if prev != nil {
			select {
			case <-prev:
			case <-s.ctx.Done():
				return
			}
		}
		s.deliver(tenant, a.ID, a.Targeted, payload)
	}) {
		sent()
	}
}

// deliver sends payload to the connected devices for which action id is
// Queued. It asks the broker who is connected rather
// than reading every target: a million targets with ten thousand online
// cost ten thousand lookups.
func (s *Service) deliver(tenant string, id int64, targeted int, payload []byte) {
	if s.Sender == nil {
		return
	}
	var candidates []string
	if !s.presenceUnknown() {
		online := s.online.list(tenant, s.Sender)
		if len(online) == 0 {
			return
		}
		if len(online) < targeted {
			candidates = online
		}
	}
	devices, err := s.Store.PendingDevices(s.ctx, tenant, id, candidates)
	if err != nil {
		if s.ctx.Err() == nil {
			s.Logger.Error("action delivery: find the devices to send to; they get the action when they next subscribe",
				"tenant", tenant, "action_id", id, "err", err)
		}
		return
	}
	var wg sync.WaitGroup
	work := make(chan string)
	for range min(s.SendWorkers, len(devices)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for dev := range work {
				s.Sender.SendAction(tenant, dev, id, payload) // false: it stays pending
			}
		}()
	}
	for _, dev := range devices {
		if s.ctx.Err() != nil {
			break
		}
		work <- dev
	}
	close(work)
	wg.Wait()
}

// DeviceSubscribed records that the device is connected, so that
// dispatches are handed to it; the channel reads its backlog with
// PendingMessages.
func (s *Service) DeviceSubscribed(tenant, device string) {
	if !s.presenceUnknown() {
		s.online.add(tenant, device)
	}
}

// PendingMessages returns the messages of up to limit actions Queued for
// the device above after, oldest first. The acknowledgements received so
// far are recorded first: the store then no longer lists what the device
// acknowledged, and nothing is sent to it twice for want of a commit.
func (s *Service) PendingMessages(ctx context.Context, tenant, device string, after int64, limit int) ([]fleet.ActionMessage, error) {
	if err := s.flushReceipts(ctx); err != nil {
		return nil, err
	}
	// Actions whose rollout's maintenance window is closed are left out
	// (the rollout sends them when it opens); a page short of limit means
	// the backlog ends, so the store is read on past them.
	var out []fleet.ActionMessage
	now := s.Now()
	for len(out) < limit {
		want := limit - len(out)
		pending, err := s.Store.PendingActions(ctx, tenant, device, after, want)
		if err != nil {
			return nil, err
		}
		for _, p := range pending {
			after = p.ActionID
			if p.Window != nil {
				if open, _ := p.Window.Open(now); !open {
					continue
				}
			}
			out = append(out, fleet.ActionMessage{ActionID: p.ActionID, Payload: NewMessage(p.ActionID, p.Name, p.Params)})
		}
		if len(pending) < want {
			break // the backlog ends
		}
	}
	return out, nil
}

// flushReceipts returns once the acknowledgements queued before the call
// are committed (or their commit failed, in which case those actions stay
// Queued and may be sent again).
func (s *Service) flushReceipts(ctx context.Context) error {
	done := make(chan struct{})
	select {
	case s.flushes <- done:
	case <-ctx.Done():
		return ctx.Err()
	case <-s.ctx.Done():
		return fleet.Errorf(fleet.EUNAVAILABLE, "the server is shutting down")
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ActionDelivered queues a device's acknowledgement; a goroutine records
// them in batches, so the device's connection never waits for a commit.
func (s *Service) ActionDelivered(tenant, device string, actionID int64) {
	r := fleet.ActionReceipt{Tenant: tenant, DeviceID: device, ActionID: actionID}
	select {
	case s.receipts <- r:
	case <-s.ctx.Done():
		// Not recorded: the device action stays pending and is sent again
		// when the device next subscribes, or the device's first report
		// initiates it.
	}
}

// recordReceipts writes acknowledgements until Close, then what is left.
func (s *Service) recordReceipts() {
	defer s.wg.Done()
	batch := make([]fleet.ActionReceipt, 0, maxReceiptBatch)
	flush := func() {
		if len(batch) == 0 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.Store.MarkDelivered(ctx, batch); err != nil {
			s.Logger.Error("record action deliveries; those device actions stay Queued and are sent again",
				"count", len(batch), "err", err)
		}
		batch = batch[:0]
	}
	// drain records every receipt queued now.
	drain := func() {
		for {
			select {
			case r := <-s.receipts:
				batch = append(batch, r)
				if len(batch) == maxReceiptBatch {
					flush()
				}
			default:
				flush()
				return
			}
		}
	}
	for {
		select {
		case r := <-s.receipts:
			batch = append(batch, r)
		case done := <-s.flushes:
			drain()
			close(done)
			continue
		case <-s.ctx.Done():
			drain()
			return
		}
	fill:
		for len(batch) < maxReceiptBatch {
			select {
			case r := <-s.receipts:
				batch = append(batch, r)
			default:
				break fill
			}
		}
		flush()
	}
}

// FindActions lists actions; see fleet.ActionService.
func (s *Service) FindActions(ctx context.Context, tenant string, f fleet.ActionFilter) ([]*fleet.Action, int, error) {
	return s.Store.FindActions(ctx, tenant, f)
}

// FindAction reads an action; a rollout that waits says for what (waitingReason).
func (s *Service) FindAction(ctx context.Context, tenant string, id int64) (*fleet.Action, error) {
	a, err := s.Store.FindAction(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	return a, s.waitingReason(ctx, tenant, a)
}

// FindDeviceActions lists device actions.
func (s *Service) FindDeviceActions(ctx context.Context, tenant string, f fleet.DeviceActionFilter) ([]*fleet.DeviceAction, int, error) {
	return s.Store.FindDeviceActions(ctx, tenant, f)
}

// FindDeviceAction reads one device action.
func (s *Service) FindDeviceAction(ctx context.Context, tenant string, actionID int64, deviceID string) (*fleet.DeviceAction, error) {
	return s.Store.FindDeviceAction(ctx, tenant, actionID, deviceID)
}

// CountRetriable counts what a retry of the action would still take.
func (s *Service) CountRetriable(ctx context.Context, tenant string, id int64, statuses []fleet.ActionStatus) (int, error) {
	return s.Store.CountRetriable(ctx, tenant, id, statuses)
}

// FindRecentFailures reads the tenant's latest failures.
func (s *Service) FindRecentFailures(ctx context.Context, tenant string, limit int) ([]*fleet.DeviceAction, error) {
	return s.Store.FindRecentFailures(ctx, tenant, limit)
}

// ReportStatus applies status reports and returns once they committed.
// Reports of concurrent callers are applied by one store call, and the
// reporting devices' last_seen_at is recorded within a second, in a batch.
func (s *Service) ReportStatus(ctx context.Context, tenant string, reports []fleet.StatusReport) ([]error, error) {
	if len(reports) == 0 {
		return nil, nil
	}
	c := reportCalls.Get().(*reportCall)
	c.ctx, c.tenant, c.reports = ctx, tenant, reports
	select {
	case s.reports <- c:
	case <-ctx.Done():
		c.release()
		return nil, ctx.Err()
	case <-s.ctx.Done():
		c.release()
		return nil, fleet.Errorf(fleet.EUNAVAILABLE, "the server is shutting down")
	}
	// Answered once (gather.Apply); the worker no longer looks at c.
	<-c.done
	errs, err := c.errs, c.err
	c.release()
	s.stats.reports.Add(uint64(len(reports)))
	for _, err := range errs {
		if err != nil {
			s.stats.rejected.Add(1)
		}
	}
	return errs, err
}

// release gives an answered (or never sent) call back to reportCalls.
func (c *reportCall) release() {
	c.ctx, c.tenant, c.reports, c.errs, c.err = nil, "", nil, nil, nil
	reportCalls.Put(c)
}

// applyReports is a report worker: it takes a call and whatever others are
// waiting, applies them, and answers each. At Close it finishes the calls
// it has; later callers are told the server is shutting down.
func (s *Service) applyReports() {
	defer s.wg.Done()
	for {
		select {
		case c := <-s.reports:
			s.applyBatch(s.collectReports(c))
		case <-s.ctx.Done():
			return
		}
	}
}

// collectReports adds to first the calls already waiting, up to
// MaxReportBatch reports (gather.Waiting).
func (s *Service) collectReports(first *reportCall) []*reportCall {
	return gather.Waiting(s.reports, first, s.MaxReportBatch, func(c *reportCall) int { return len(c.reports) })
}

// applyBatch applies the calls' reports, one store call per tenant. If a
// shared store call fails, each call is tried alone, so that one bad
// report cannot fail its neighbours.
func (s *Service) applyBatch(batch []*reportCall) {
	gather.Apply(batch, func(c *reportCall) context.Context { return c.ctx }, func(c *reportCall) string { return c.tenant },
		s.applyCalls, func(c *reportCall, gone error) {
			if gone != nil {
				c.err = gone // the caller went away before its turn
			}
			c.done <- struct{}{}
		})
}

// applyCalls applies the calls' reports in one store call and sets each
// call's answer.
func (s *Service) applyCalls(tenant string, calls []*reportCall) error {
	var reports []fleet.StatusReport
	for _, c := range calls {
		reports = append(reports, c.reports...)
	}
	// Once queued, a transaction job runs to its end whoever is waiting;
	// no single caller's cancellation may fail the others.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs, err := s.Store.ReportStatus(ctx, tenant, reports)
	for _, c := range calls {
		c.errs, c.err = nil, err
		if err == nil {
			c.errs, errs = errs[:len(c.reports):len(c.reports)], errs[len(c.reports):]
		}
	}
	if err != nil {
		return err
	}
	var seen []string
	for _, c := range calls {
		for i, r := range c.reports {
			if c.errs[i] == nil {
				seen = append(seen, r.DeviceID)
			}
		}
	}
	s.sight(tenant, seen...)
	return nil
}

// DeviceSeen adds the device to the next second's sightings.
func (s *Service) DeviceSeen(tenant, device string) { s.sight(tenant, device) }

// sight adds devices to the next second's sightings (recordSightings).
func (s *Service) sight(tenant string, devices ...string) {
	s.sightMu.Lock()
	defer s.sightMu.Unlock()
	seen := s.sighted[tenant]
	if seen == nil {
		seen = map[string]struct{}{}
		s.sighted[tenant] = seen
	}
	for _, d := range devices {
		seen[d] = struct{}{}
	}
}

// recordSightings writes the last_seen_at of the devices heard from (their
// reports, data points and polls) every second,
// one store call per tenant, and once more at Close.
func (s *Service) recordSightings() {
	defer s.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			s.flushSightings()
		case <-s.ctx.Done():
			s.flushSightings()
			return
		}
	}
}

func (s *Service) flushSightings() {
	s.sightMu.Lock()
	sighted := s.sighted
	s.sighted = map[string]map[string]struct{}{}
	s.sightMu.Unlock()
	now := s.Now()
	for tenant, devs := range sighted {
		ids := make([]string, 0, len(devs))
		for id := range devs {
			ids = append(ids, id)
		}
		// In order, a chunk's devices are neighbours in the table: a
		// second's 10,000 sightings of random devices among 100,000 then
		// write each page of the table once, not a page per device in
		// every chunk (SQLite appends each page a transaction changes to
		// its WAL).
		slices.Sort(ids)
		// One store call per chunk, each waiting for its commit, so the
		// chunks take turns with the reports' batches: a second's
		// sightings of 5,000 random devices in one transaction held every
		// report behind it for 200-500 ms, once a second.
		for start := 0; start < len(ids); start += sightingChunk {
			chunk := ids[start:min(start+sightingChunk, len(ids))]
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			if err := s.Store.TouchDevices(ctx, tenant, chunk, now); err != nil {
				s.Logger.Warn("record devices' last_seen_at", "tenant", tenant, "devices", len(chunk), "err", err)
			}
			cancel()
		}
	}
}

// sightingChunk bounds the devices whose last_seen_at one transaction
// writes.
const sightingChunk = 256

func (s *Service) presenceUnknown() bool {
	p, ok := s.Sender.(presenceUnknown)
	return ok && p.PresenceUnknown()
}

// onlineSet remembers the devices that subscribed to their actions, per
// tenant, so a dispatch asks the broker about those rather than reading
// every target. Entries of devices that left are dropped when listed.
type onlineSet struct {
	mu sync.Mutex
	m  map[string]map[string]struct{}
}

func (o *onlineSet) add(tenant, device string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = map[string]map[string]struct{}{}
	}
	if o.m[tenant] == nil {
		o.m[tenant] = map[string]struct{}{}
	}
	o.m[tenant][device] = struct{}{}
}

// list returns the tenant's devices that are online now.
func (o *onlineSet) list(tenant string, s Sender) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []string
	for dev := range o.m[tenant] {
		if s.Online(tenant, dev) {
			out = append(out, dev)
		} else {
			delete(o.m[tenant], dev)
		}
	}
	return out
}
