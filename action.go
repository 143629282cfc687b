package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"
)

// The search types of a dispatch: how it chooses its devices.
const (
	SearchDefault  = "default"  // exactly device_ids
	SearchAll      = "all"      // every device of the tenant
	SearchMetadata = "metadata" // metadata[search_key] == search_query
	SearchSearch   = "search"   // id or metadata value contains search_query, ignoring case
	SearchGroup    = "group"    // the devices of the group (docs/twin.md) at dispatch
)

// Special actions (docs/actions.md#special-actions): the server does more
// than deliver them.
const (
	ActionUpdateFirmware = "update_firmware"
	ActionCancel         = "cancel_action"
	// ActionUpdateConfig carries a device's whole desired state, for
	// devices that take their configuration as an action (docs/twin.md).
	ActionUpdateConfig = "update_config"
	// ActionDesired is a fleet-wide desired change rolled out in phases
	// (docs/twin.md): a phase's release merges params.desired into its
	// devices' desired state, and a device action is Completed when the
	// device reports what it asks (DesiredMet). Devices never receive it.
	ActionDesired = "desired_state"
	// ActionRemoteSession asks a device to dial back for a remote session
	// (docs/agent.md). Only fleetd sends it, when a session is opened: one
	// dispatched otherwise could name another person's waiting session and
	// have the device serve it a command or path of the sender's choosing.
	ActionRemoteSession = "remote_session"
)

// Limits of actions and status reports.
const (
	MaxActionTimeout     = 31_536_000 // seconds: a year
	DefaultActionTimeout = 86_400     // seconds, when a dispatch names none
	MaxActionNameLen     = 128
	MaxStateLen          = 64
	MaxReportErrors      = 100
	MaxReportErrorLen    = 4096
)

// Action is one dispatch: what was asked of which devices, by whom, and
// how the devices are doing (Statuses counts device actions per status).
type Action struct {
	ID          int64           `json:"id"`
	Action      string          `json:"action"`
	Params      json.RawMessage `json:"params"`
	SearchType  string          `json:"search_type"`
	SearchKey   string          `json:"search_key"`
	SearchQuery string          `json:"search_query"`
	Metadata    json.RawMessage `json:"metadata"`
	Timeout     int64           `json:"timeout"`
	UserEmail   string          `json:"user_email"`
	UserName    string          `json:"user_name"`
	CreatedAt   time.Time       `json:"created_at"`
	Targeted    int             `json:"targeted"`
	Statuses    map[string]int  `json:"statuses"`
	// RetryOf is the action a retry retried, nil for any other action.
	RetryOf *int64 `json:"retry_of,omitempty" doc:"the action this one retried (POST /api/v1/actions/{id}/retry): its devices whose device actions ended in the statuses asked for"`
	// StatusesPhased counts the device actions per status by the index of
	// the phase that releases them, "-1" for all of an action without a
	// schedule.
	StatusesPhased map[string]map[string]int `json:"statuses_phased"`

	// A rollout's schedule and state; absent for an action without one.
	Schedule        *Schedule     `json:"schedule,omitempty"`
	PhasesTriggered []bool        `json:"phases_triggered,omitempty" doc:"one per phase: whether it triggered"`
	NextPhaseIndex  *int          `json:"next_phase_index,omitempty" doc:"the next phase to trigger; the number of phases once all did"`
	Status          RolloutStatus `json:"status,omitempty" doc:"the rollout's: scheduled, running, paused, completed or aborted"`
	PauseReason     string        `json:"pause_reason,omitempty" doc:"why the rollout is paused"`
	WaitingReason   string        `json:"waiting_reason,omitempty" doc:"what a rollout neither paused nor done waits for: the next phase's trigger or gate, naming a few of the devices not finished, whether each is online (as far as the answering server can tell) and when it was last seen, then how many more; absent when it waits for nothing"`
	// rollout is what the rules of the rollout's operations look at.
	rollout *RolloutState

	// DeviceParams is what devices receive as the payload, when a special
	// action's preparer replaced Params; nil otherwise.
	DeviceParams json.RawMessage `json:"-"`
}

// SentParams is the params text devices receive.
func (a *Action) SentParams() string {
	if a.DeviceParams != nil {
		return string(a.DeviceParams)
	}
	return string(a.Params)
}

// DeviceAction is one device's record of an action: S7's item, field for
// field. The device actions of one read may share their Errors and
// SerialMetadata maps: they are read-only.
type DeviceAction struct {
	ActionID     int64               `json:"action_id"`
	DeviceID     string              `json:"device_id"`
	Type         string              `json:"type"`
	Status       string              `json:"status"`
	ActionStatus ActionStatus        `json:"action_status"`
	Phase        int                 `json:"phase"`
	Progress     int                 `json:"progress"`
	Params       string              `json:"params"`
	Errors       map[string][]string `json:"errors"`
	UserEmail    string              `json:"user_email"`
	UserName     string              `json:"user_name"`
	// SerialMetadata is the device's metadata at dispatch time.
	SerialMetadata map[string]string `json:"-serial_metadata"`
	CreatedAt      time.Time         `json:"created_at"`
	UpdatedAt      time.Time         `json:"updated_at"`
}

// Dispatch is a validated request to dispatch an action.
type Dispatch struct {
	Action      string
	Params      json.RawMessage // a JSON object
	SearchType  string
	DeviceIDs   []string // SearchDefault only; distinct
	SearchKey   string
	SearchQuery string
	Group       string          // SearchGroup only: the group's name
	Metadata    json.RawMessage // a JSON object, or nil
	Timeout     int64           // seconds
	UserEmail   string
	UserName    string

	// What the preparer of a special action (ActionPreparer) may set.

	// DeviceParams replaces Params in what devices receive.
	DeviceParams json.RawMessage
	// CheckDevice, when set, is asked about each targeted device that has
	// recorded component versions (component name → version). A non-empty
	// answer is the reason the device cannot take the action: its record is
	// Failed with that error at once, and nothing is sent to it.
	CheckDevice func(components map[string]string) (reason string)
	// CancelActionID, for cancel_action, is the action cancelled on the
	// targeted devices.
	CancelActionID int64

	// Schedule, when set, makes the dispatch a rollout: its targets are
	// released phase by phase (POST /api/v1/actions only).
	Schedule *Schedule

	// RetryOf, when set, is the action a retry retries: the targets are
	// its devices whose device actions are in RetryStatuses, and it must
	// be finished (RetryAction).
	RetryOf       int64
	RetryStatuses []ActionStatus
}

// ReadRetry is the typed decode of a retry's body, nil for none: the
// statuses whose devices are retried, final ones, Failed by default.
func ReadRetry(f *Fields) []ActionStatus {
	out := []ActionStatus{StatusFailed}
	if f == nil {
		return out
	}
	if f.Has("statuses") {
		words := f.Strings("statuses", false)
		if len(words) == 0 {
			f.Fail("statuses", "must list at least one status, such as Failed")
		}
		out = out[:0]
		for i, w := range words {
			s := ActionStatus(w)
			if !s.Final() {
				f.Fail(fmt.Sprintf("statuses[%d]", i), "must be a final status: Completed, Failed or Cancelled (devices still busy cannot be retried)")
			} else if !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
	}
	f.Unknown()
	return out
}

// ActionPreparer prepares the dispatch of one special action, such as
// update_firmware: it checks what only it knows (an EINVALID error rejects
// the dispatch), and may set d.DeviceParams and d.CheckDevice. The action
// service looks preparers up by action name.
type ActionPreparer interface {
	PrepareDispatch(ctx context.Context, tenant string, d *Dispatch) error
}

// ActionPreparerFunc adapts a function to ActionPreparer.
type ActionPreparerFunc func(ctx context.Context, tenant string, d *Dispatch) error

// PrepareDispatch calls f.
func (f ActionPreparerFunc) PrepareDispatch(ctx context.Context, tenant string, d *Dispatch) error {
	return f(ctx, tenant, d)
}

// ReadDispatch is the typed decode of a dispatch body (S1 and the modern
// endpoint): exactly the fields of docs/actions.md#dispatch, and, when
// withSchedule (the modern endpoint), a schedule.
func ReadDispatch(f *Fields, withSchedule bool) Dispatch {
	d := Dispatch{Action: f.NonEmptyString("action", true, MaxActionNameLen), Timeout: DefaultActionTimeout}
	if params := f.Object("params", true); params != nil {
		d.Params = mustJSON(params)
	}
	if m := f.Object("metadata", false); m != nil {
		d.Metadata = mustJSON(m)
	}
	if f.Has("timeout") {
		d.Timeout = f.Int("timeout", false, 1, MaxActionTimeout)
	}
	if d.Action == ActionRemoteSession {
		f.Fail("action", "remote_session is fleetd's own: open a remote session with POST /api/v1/devices/{id}/remote-sessions")
	}
	if withSchedule {
		d.Schedule = ReadSchedule(f.Nested("schedule", false))
		if d.Schedule != nil && d.Action == ActionCancel {
			f.Fail("schedule", "a cancel_action is not rolled out: it goes to its devices at once")
		}
	}
	readSelection(f, &d)
	return d
}

// readSelection reads the fields that choose devices, as a dispatch has
// them (search_type and what it needs), into d.
func readSelection(f *Fields, d *Dispatch) {
	d.SearchType, d.SearchKey, d.SearchQuery = f.String("search_type", true), f.String("search_key", false), f.String("search_query", false)
	ids := f.Strings("device_ids", false)
	switch d.SearchType {
	case SearchDefault:
		if !f.Has("device_ids") {
			f.Fail("device_ids", "is required when search_type is default")
		} else if len(ids) == 0 {
			f.Fail("device_ids", "must list at least one device")
		}
		seen := make(map[string]bool, len(ids))
		for i, id := range ids {
			if !ValidDeviceID(id) {
				f.Fail(fmt.Sprintf("device_ids[%d]", i), DeviceIDRule)
				continue
			}
			if !seen[id] {
				seen[id] = true
				d.DeviceIDs = append(d.DeviceIDs, id)
			}
		}
	case SearchAll:
	case SearchMetadata:
		if !f.Has("search_key") {
			f.Fail("search_key", "is required when search_type is metadata")
		} else if d.SearchKey == "" {
			f.Fail("search_key", "must not be empty")
		}
		if !f.Has("search_query") {
			f.Fail("search_query", "is required when search_type is metadata")
		}
	case SearchSearch:
		if !f.Has("search_query") {
			f.Fail("search_query", "is required when search_type is search")
		} else if d.SearchQuery == "" {
			f.Fail("search_query", "must not be empty")
		}
	case SearchGroup:
		if !f.Has("group") {
			f.Fail("group", "is required when search_type is group")
		} else if d.Group = f.String("group", false); !ValidGroupName(d.Group) {
			f.Fail("group", GroupNameRule)
		}
		// The action shows its group as its search_query.
		d.SearchKey, d.SearchQuery = "", d.Group
	case "":
		// String has recorded the problem, or it is an empty string.
		if f.Has("search_type") {
			f.Fail("search_type", SearchTypeRule)
		}
	default:
		f.Fail("search_type", SearchTypeRule)
	}
	if f.Has("group") && d.SearchType != SearchGroup {
		f.String("group", false)
		f.Fail("group", "is only for search_type group")
	}
}

// ReadSelection is the typed decode of the fields that choose devices in a
// body that is not a dispatch (a fleet-wide desired change): a Dispatch
// with no action.
func ReadSelection(f *Fields) *Dispatch {
	d := &Dispatch{}
	readSelection(f, d)
	return d
}

// SearchTypeRule says what search_type may be, for error messages.
const SearchTypeRule = "must be one of default, all, metadata, search, group"

// mustJSON encodes a canonical value, which always encodes.
func mustJSON(v any) json.RawMessage {
	b, err := MarshalCanonical(v)
	if err != nil {
		panic(fmt.Sprintf("fleet: canonical value does not encode: %v", err))
	}
	return b
}

// StatusReport is one device's report on one action (S10 and MQTT).
type StatusReport struct {
	DeviceID  string
	ActionID  int64
	State     string
	Progress  *int
	Errors    []string
	Timestamp *int64 // epoch milliseconds
	Sequence  *int64
}

// ReadStatusReport is the typed decode of a status report. HTTP reports
// name their device (needDevice); over MQTT the topic does.
func ReadStatusReport(f *Fields, needDevice bool) StatusReport {
	var r StatusReport
	if needDevice {
		r.DeviceID = f.String("device_id", true)
		if f.Has("device_id") && !ValidDeviceID(r.DeviceID) {
			f.Fail("device_id", DeviceIDRule)
		}
	}
	id, hasID := readActionID(f, "id")
	aid, hasAID := readActionID(f, "action_id")
	switch {
	case hasID && hasAID && id != aid:
		f.Fail("id", "differs from action_id; send one of them")
	case hasAID:
		r.ActionID = aid
	case hasID:
		r.ActionID = id
	case !f.Has("id") && !f.Has("action_id"):
		f.Fail("action_id", "is required (or id)")
	}
	r.State = f.NonEmptyString("state", true, MaxStateLen)
	if v, ok := f.Value("progress", false); ok {
		n, ok := AsInt(v)
		if s, isString := v.(string); isString {
			n, ok = digits(s)
		}
		if !ok || n < 0 || n > 100 {
			f.Fail("progress", "must be an integer between 0 and 100")
		} else {
			p := int(n)
			r.Progress = &p
		}
	}
	r.Errors = f.Strings("errors", false)
	if len(r.Errors) > MaxReportErrors {
		f.Fail("errors", fmt.Sprintf("must list at most %d errors", MaxReportErrors))
	}
	for i, e := range r.Errors {
		if utf8.RuneCountInString(e) > MaxReportErrorLen {
			f.Fail(fmt.Sprintf("errors[%d]", i), fmt.Sprintf("must be at most %d characters", MaxReportErrorLen))
		}
	}
	if f.Has("timestamp") {
		ts := f.Int("timestamp", false, 0, 1<<62)
		r.Timestamp = &ts
	}
	if f.Has("sequence") {
		seq := f.Int("sequence", false, 0, 1<<62)
		r.Sequence = &seq
	}
	return r
}

// ActionIDRule says what an action id may be, for error messages.
const ActionIDRule = "must be an action id: a positive integer, or a string of its digits"

// readActionID reads an action id given as an integer or a string of digits.
func readActionID(f *Fields, field string) (int64, bool) {
	v, ok := f.Value(field, false)
	if !ok {
		return 0, false
	}
	n, ok := AsInt(v)
	if s, isString := v.(string); isString {
		n, ok = digits(s)
	}
	if !ok || n < 1 {
		f.Fail(field, ActionIDRule)
		return 0, false
	}
	return n, true
}

// ParseActionID parses an action id from a path or a device message.
func ParseActionID(s string) (int64, bool) {
	n, ok := digits(s)
	return n, ok && n >= 1
}

// digits parses a non-empty string of ASCII digits that fits an int64.
func digits(s string) (int64, bool) {
	if s == "" || len(s) > 19 {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// ReportKey orders the reports of one device action: by timestamp, then
// sequence.
type ReportKey struct {
	Timestamp int64
	Sequence  int64
}

// After reports whether k comes strictly after o.
func (k ReportKey) After(o ReportKey) bool {
	return k.Timestamp > o.Timestamp || k.Timestamp == o.Timestamp && k.Sequence > o.Sequence
}

// Key places r in its device action's history, after last (nil before any
// report). A report without a timestamp is stamped with now, never earlier
// than the last one applied; one without a sequence has sequence 0, or, when
// it has no timestamp either, the next sequence after the last applied at
// the same instant. So reports that carry neither are applied in the order
// they arrive, and a report that repeats the key of the last one applied is
// a duplicate.
func (r StatusReport) Key(now time.Time, last *ReportKey) ReportKey {
	var k ReportKey
	if r.Timestamp != nil {
		k.Timestamp = *r.Timestamp
	} else {
		k.Timestamp = now.UnixMilli()
		if last != nil && last.Timestamp > k.Timestamp {
			k.Timestamp = last.Timestamp
		}
	}
	switch {
	case r.Sequence != nil:
		k.Sequence = *r.Sequence
	case r.Timestamp == nil && last != nil && last.Timestamp == k.Timestamp:
		k.Sequence = last.Sequence + 1
	}
	return k
}

// ReportState is the part of a device action that status reports change.
type ReportState struct {
	ActionStatus ActionStatus
	Status       string
	Progress     int
	Errors       map[string][]string
	Last         *ReportKey // of the last report applied; nil before any
}

// ApplyReport returns the state after report r, and whether r changed
// anything: the transition of ReportEvent(r.State) in Lifecycle. Reports
// after a final state, older than the last one applied, or repeating it,
// change nothing (they are acknowledged all the same).
//
// A device action a device has been asked to stop (StateCancelling) keeps
// that word through the device's progress until the device answers, and
// a Failed report on it is the device stopping it (cancel_accepted): the
// uplink agent reports the stopped action Failed, before or after its
// answer to the cancel_action (docs/actions.md, Cancel).
func ApplyReport(cur ReportState, r StatusReport, now time.Time) (ReportState, bool) {
	event := ReportEvent(r.State)
	cancelling := cur.Status == StateCancelling
	if cancelling && event == EventFailed {
		event = EventCancelAccepted
	}
	t, ok := Next(cur.ActionStatus, event)
	if !ok {
		return cur, false
	}
	key := r.Key(now, cur.Last)
	if cur.Last != nil && !key.After(*cur.Last) {
		return cur, false
	}
	next := cur
	next.Last = &key
	next.Status = r.State
	switch {
	case t.Status != "":
		next.Status = t.Status
	case cancelling && event == EventProgress:
		next.Status = StateCancelling
	}
	next.ActionStatus = t.To
	if r.Progress != nil {
		next.Progress = *r.Progress
	} else if next.ActionStatus == StatusCompleted {
		next.Progress = 100
	}
	if len(r.Errors) > 0 {
		errs := make(map[string][]string, len(cur.Errors)+1)
		for k, v := range cur.Errors {
			errs[k] = v
		}
		errs[r.State] = r.Errors
		next.Errors = errs
	}
	return next, true
}

// ErrorCount is the number of error messages in errs; S7 sorts by it.
func ErrorCount(errs map[string][]string) int {
	n := 0
	for _, e := range errs {
		n += len(e)
	}
	return n
}

// CancelledActionID returns the id of the action a cancel_action cancels,
// from the params its devices receive ({"action_id": "42", …}).
func CancelledActionID(deviceParams []byte) (int64, bool) {
	var p struct {
		ActionID string `json:"action_id"`
	}
	if json.Unmarshal(deviceParams, &p) != nil {
		return 0, false
	}
	return ParseActionID(p.ActionID)
}

// CompletedComponents returns the component versions a device runs once it
// completed an action with these params: for update_firmware, each of
// params.components[] as component_name → version_number; nil for every
// other action.
func CompletedComponents(action string, params []byte) map[string]string {
	if action != ActionUpdateFirmware {
		return nil
	}
	var p struct {
		Components []struct {
			Name    string `json:"component_name"`
			Version string `json:"version_number"`
		} `json:"components"`
	}
	if json.Unmarshal(params, &p) != nil || len(p.Components) == 0 {
		return nil
	}
	out := make(map[string]string, len(p.Components))
	for _, c := range p.Components {
		if c.Name != "" && c.Version != "" {
			out[c.Name] = c.Version
		}
	}
	return out
}

// ActionFilter selects actions: by name when Action is set, and with
// Incomplete those that have device actions not final.
type ActionFilter struct {
	Action     string
	Incomplete bool
	// ExceptAction leaves out the actions of that name: the console's
	// list leaves out the cancel_actions that cancels and aborts send,
	// which its action's page tells of.
	ExceptAction string
	Page
}

// SetRollout shows r's schedule and state on a.
func (a *Action) SetRollout(r *Rollout) {
	s := r.Schedule
	next := r.NextPhase
	a.Schedule, a.PhasesTriggered, a.NextPhaseIndex, a.Status, a.PauseReason = &s, r.PhasesTriggered(), &next, r.Status, r.PauseReason
	st := r.State()
	a.rollout = &st
}

// RolloutAllows reports whether the operation op may be done on the
// action's rollout (RolloutState.Allows); ECONFLICT for an action without
// a schedule.
func (a *Action) RolloutAllows(op RolloutOp) error {
	if a.rollout == nil {
		return Errorf(ECONFLICT, "action %d has no schedule: it went to all its devices at dispatch", a.ID)
	}
	return a.rollout.Allows(op)
}

// RolloutOps lists the operations the action's rollout allows now; none
// for an action without a schedule.
func (a *Action) RolloutOps() []RolloutOp {
	if a.rollout == nil {
		return nil
	}
	return a.rollout.Allowed()
}

// DeviceActionSorts are the fields S7 sorts by; the first is the default.
var DeviceActionSorts = []string{"action_id", "type", "status", "user_email", "user_name", "updated_at", "errors"}

// DeviceActionFilter selects device actions: those of one device (S7) or
// of one action, optionally with one status and of one type. S7 sorts by
// SortBy (one of DeviceActionSorts; "errors" counts the messages), ties
// broken by action id; an action's device actions are in device id order.
type DeviceActionFilter struct {
	DeviceID     string
	ActionID     int64
	ActionStatus ActionStatus
	Type         string
	SortBy       string
	Ascending    bool
	Page
}

// ActionService dispatches actions and follows the devices' progress.
type ActionService interface {
	// DispatchAction stores the action and a device action for each device
	// it targets, atomically, and sends it to those that are connected.
	DispatchAction(ctx context.Context, tenant string, d *Dispatch) (*Action, error)
	FindActions(ctx context.Context, tenant string, f ActionFilter) ([]*Action, int, error)
	FindAction(ctx context.Context, tenant string, id int64) (*Action, error)
	// FindDeviceActions is ENOTFOUND for an unknown device or action.
	FindDeviceActions(ctx context.Context, tenant string, f DeviceActionFilter) ([]*DeviceAction, int, error)
	FindDeviceAction(ctx context.Context, tenant string, actionID int64, deviceID string) (*DeviceAction, error)
	// FindRecentFailures returns the tenant's limit latest Failed device
	// actions, of any action, newest first.
	FindRecentFailures(ctx context.Context, tenant string, limit int) ([]*DeviceAction, error)
	// CancelAction cancels every device action of the action that is not
	// final. Devices that have the action are told by a cancel_action
	// dispatched to them. An action with nothing left to cancel is not an
	// error.
	CancelAction(ctx context.Context, tenant string, id int64) error
	// RetryAction dispatches the action again, with its params and
	// timeout and without a schedule, to its devices whose device actions
	// are in statuses (final ones): ECONFLICT when the action has device
	// actions not final, or none in statuses; ENOTFOUND for an unknown
	// action.
	RetryAction(ctx context.Context, tenant string, id int64, statuses []ActionStatus) (*Action, error)
	// CountRetriable counts the action's device actions in statuses that
	// no retry has taken yet: those a RetryAction would target.
	CountRetriable(ctx context.Context, tenant string, id int64, statuses []ActionStatus) (int, error)
	// ReportStatus applies reports in one transaction and returns once it
	// committed. Each report's own problem (ENOTFOUND: unknown device, or
	// an action not sent to it) is in its slot of the first result; reports
	// that change nothing (old, duplicate, after a final state) are not
	// problems.
	ReportStatus(ctx context.Context, tenant string, reports []StatusReport) ([]error, error)
	RolloutService
}

// ActionDelivery is what the device channel tells the action service, and
// asks of it.
type ActionDelivery interface {
	// DeviceSubscribed is called when a device subscribed to its actions:
	// it can be sent dispatches now. The channel then reads what is queued
	// for it with PendingMessages.
	DeviceSubscribed(tenant, device string)
	// PendingMessages returns the messages of up to limit actions Queued
	// for the device whose ids are above after, oldest first. The
	// acknowledgements ActionDelivered was given before the call are
	// recorded first, so an action the device acknowledged is not among
	// them.
	PendingMessages(ctx context.Context, tenant, device string, after int64, limit int) ([]ActionMessage, error)
	// ActionDelivered is called when a device acknowledged an action
	// message; it must not block for long.
	ActionDelivered(tenant, device string, actionID int64)
	// DeviceSeen records that the device was heard from (a data point, a
	// poll): its last_seen_at is written with the status reports'
	// sightings, in batches, not a write per message. It does not block.
	DeviceSeen(tenant, device string)
}

// ActionMessage is an action as the device channel sends it: its id, and
// the message the device receives.
type ActionMessage struct {
	ActionID int64
	Payload  []byte
}

// ActionReceipt is a device's acknowledgement of an action message.
type ActionReceipt struct {
	Tenant   string
	DeviceID string
	ActionID int64
}

// PendingAction is an action still Queued for a device: it has yet to
// acknowledge the message.
type PendingAction struct {
	ActionID int64
	Name     string
	Params   string // as sent
	// Window, for a rollout with a maintenance window, is when the action
	// may be handed to the device.
	Window *MaintenanceWindow
}
