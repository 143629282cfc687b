package fleet

// This file is the device-action lifecycle of docs/actions.md, in one
// place: the statuses, the events that move a device action between them,
// and the table of transitions. Everything that changes a device action's
// status follows Lifecycle: ApplyReport for status reports, and the store,
// whose statements take their states from it (sqlstore/action_lifecycle.go).
// Below it, the table of a rollout's operations, which the store and the
// console ask.

import "slices"

// ActionStatus is where a device action is in its lifecycle
// (docs/actions.md#lifecycle): (Scheduled →) Queued → Initiated → Progress →
// Completed, Failed or Cancelled.
type ActionStatus string

// The action statuses.
const (
	// StatusScheduled: the device action's rollout phase has not been
	// released; nothing is sent to the device.
	StatusScheduled ActionStatus = "Scheduled"
	StatusQueued    ActionStatus = "Queued"    // stored, not yet handed to the device
	StatusInitiated ActionStatus = "Initiated" // the device acknowledged the message, or reported first
	StatusProgress  ActionStatus = "Progress"  // the device reported a state that is not final
	StatusCompleted ActionStatus = "Completed"
	StatusFailed    ActionStatus = "Failed"
	StatusCancelled ActionStatus = "Cancelled"
)

// ActionStatuses lists every status in lifecycle order.
var ActionStatuses = []ActionStatus{StatusScheduled, StatusQueued, StatusInitiated, StatusProgress, StatusCompleted, StatusFailed, StatusCancelled}

// Final reports whether s never changes again.
func (s ActionStatus) Final() bool {
	return s == StatusCompleted || s == StatusFailed || s == StatusCancelled
}

// Sent reports whether the device has been offered the action: a device
// reporting on an action not sent to it is told it has no such action.
func (s ActionStatus) Sent() bool { return s != StatusScheduled }

// Valid reports whether s is one of the statuses.
func (s ActionStatus) Valid() bool {
	for _, v := range ActionStatuses {
		if s == v {
			return true
		}
	}
	return false
}

// StateTimedOut is the status word of a device action that the timeout
// failed; StateCancelled that of one cancelled by an operator.
// StateCancelling is that of one in flight whose device has been asked to
// stop it and has not answered; StateCancelRejected that of one whose
// device refused to stop and goes on.
const (
	StateTimedOut       = "TimedOut"
	StateCancelled      = "Cancelled"
	StateCancelling     = "Cancelling"
	StateCancelRejected = "CancelRejected"
)

// Event is what moves a device action from one status to another: the
// device's word (delivered, progress, completed, failed) or the server's.
type Event string

// The events of the lifecycle.
const (
	// EventDelivered: the device acknowledged the action message (MQTT
	// PUBACK).
	EventDelivered Event = "delivered"
	// EventProgress: the device reported a state that is not final (any
	// word but Completed and Failed).
	EventProgress Event = "progress"
	// EventCompleted and EventFailed: the device reported Completed or
	// Failed.
	EventCompleted Event = "completed"
	EventFailed    Event = "failed"
	// EventRefused: at dispatch, the special action's preparer refused
	// the device (Dispatch.CheckDevice); nothing is sent to it.
	EventRefused Event = "refused"
	// EventCancel: an operator cancelled the action (cancel, or a
	// cancel_action that names it). A device that has the action is asked
	// to stop it, and the action stays in flight until it answers.
	EventCancel Event = "cancel"
	// EventCancelAccepted and EventCancelRejected: the device answered
	// the cancel_action sent for the action: Completed (it stopped) or
	// Failed (it goes on, and its later reports count).
	EventCancelAccepted Event = "cancel_accepted"
	EventCancelRejected Event = "cancel_rejected"
	// EventTimeout: the timeout elapsed before the device finished.
	EventTimeout Event = "timeout"
	// EventNothingToCancel: a cancel_action reached a device that does
	// not have the cancelled action in flight, so there is nothing to tell
	// it: the cancel_action's own record is done at once.
	EventNothingToCancel Event = "nothing_to_cancel"
	// EventRelease: the device action's rollout phase triggered.
	EventRelease Event = "release"
	// EventScheduleEnded: the rollout's end_timestamp passed before the
	// device action's phase triggered.
	EventScheduleEnded Event = "schedule_ended"
	// EventConfirmed and EventDenied: a DDI device answered an update
	// waiting for its confirmation (docs/hawkbit.md, Confirmation). It
	// stays Queued either way: confirmed, it is offered to the device;
	// denied, it waits for a later confirmation (or a cancel).
	EventConfirmed Event = "confirmed"
	EventDenied    Event = "denied"
)

// Events lists every event.
var Events = []Event{EventDelivered, EventProgress, EventCompleted, EventFailed, EventRefused, EventCancel, EventCancelAccepted,
	EventCancelRejected, EventTimeout, EventNothingToCancel, EventRelease, EventScheduleEnded, EventConfirmed, EventDenied}

// DeadlineChange is what a transition does to the device action's timeout
// deadline.
type DeadlineChange int

// The deadline changes. The deadline exists exactly while the device has
// the action and has not finished it (Initiated, Progress).
const (
	DeadlineKept    DeadlineChange = iota
	DeadlineStarted                // the timeout starts counting: deadline = now + timeout
	DeadlineCleared                // the device action has no deadline after it
)

// Transition is one row of the lifecycle: Event moves a device action in
// status From to status To.
type Transition struct {
	From  ActionStatus
	Event Event
	To    ActionStatus
	// Status is the status word the transition writes. Empty for the
	// device's own reports, whose state word is kept verbatim.
	Status   string
	Deadline DeadlineChange
	// TellDevice: the device has the action, so ending it must be said to
	// the device (a cancel_action is dispatched to it).
	TellDevice bool
}

// Lifecycle is every transition a device action can make; an event not
// listed for a status changes nothing (a report after a final state, a
// second acknowledgement). A server transition into Completed sets the
// progress to 100, as a Completed report without a progress does.
var Lifecycle = []Transition{
	{From: StatusScheduled, Event: EventRelease, To: StatusQueued, Status: string(StatusQueued), Deadline: DeadlineCleared},
	{From: StatusScheduled, Event: EventScheduleEnded, To: StatusCancelled, Status: StateScheduleEnded, Deadline: DeadlineCleared},

	{From: StatusQueued, Event: EventDelivered, To: StatusInitiated, Status: string(StatusInitiated), Deadline: DeadlineStarted},
	{From: StatusQueued, Event: EventConfirmed, To: StatusQueued, Status: StateConfirmed, Deadline: DeadlineCleared},
	{From: StatusQueued, Event: EventDenied, To: StatusQueued, Status: StateConfirmationDenied, Deadline: DeadlineCleared},

	{From: StatusQueued, Event: EventProgress, To: StatusProgress, Deadline: DeadlineStarted},
	{From: StatusInitiated, Event: EventProgress, To: StatusProgress, Deadline: DeadlineKept},
	{From: StatusProgress, Event: EventProgress, To: StatusProgress, Deadline: DeadlineKept},

	{From: StatusQueued, Event: EventCompleted, To: StatusCompleted, Deadline: DeadlineCleared},
	{From: StatusInitiated, Event: EventCompleted, To: StatusCompleted, Deadline: DeadlineCleared},
	{From: StatusProgress, Event: EventCompleted, To: StatusCompleted, Deadline: DeadlineCleared},

	{From: StatusQueued, Event: EventFailed, To: StatusFailed, Deadline: DeadlineCleared},
	{From: StatusInitiated, Event: EventFailed, To: StatusFailed, Deadline: DeadlineCleared},
	{From: StatusProgress, Event: EventFailed, To: StatusFailed, Deadline: DeadlineCleared},

	{From: StatusScheduled, Event: EventRefused, To: StatusFailed, Status: string(StatusFailed), Deadline: DeadlineCleared},
	{From: StatusQueued, Event: EventRefused, To: StatusFailed, Status: string(StatusFailed), Deadline: DeadlineCleared},

	{From: StatusScheduled, Event: EventCancel, To: StatusCancelled, Status: StateCancelled, Deadline: DeadlineCleared},
	{From: StatusQueued, Event: EventCancel, To: StatusCancelled, Status: StateCancelled, Deadline: DeadlineCleared},
	{From: StatusInitiated, Event: EventCancel, To: StatusInitiated, Status: StateCancelling, Deadline: DeadlineKept, TellDevice: true},
	{From: StatusProgress, Event: EventCancel, To: StatusProgress, Status: StateCancelling, Deadline: DeadlineKept, TellDevice: true},

	{From: StatusInitiated, Event: EventCancelAccepted, To: StatusCancelled, Status: StateCancelled, Deadline: DeadlineCleared},
	{From: StatusProgress, Event: EventCancelAccepted, To: StatusCancelled, Status: StateCancelled, Deadline: DeadlineCleared},
	{From: StatusInitiated, Event: EventCancelRejected, To: StatusInitiated, Status: StateCancelRejected, Deadline: DeadlineKept},
	{From: StatusProgress, Event: EventCancelRejected, To: StatusProgress, Status: StateCancelRejected, Deadline: DeadlineKept},

	{From: StatusInitiated, Event: EventTimeout, To: StatusFailed, Status: StateTimedOut, Deadline: DeadlineCleared},
	{From: StatusProgress, Event: EventTimeout, To: StatusFailed, Status: StateTimedOut, Deadline: DeadlineCleared},

	{From: StatusQueued, Event: EventNothingToCancel, To: StatusCompleted, Status: string(StatusCompleted), Deadline: DeadlineCleared},
}

// Next returns the transition event makes from status from, or false when
// the event changes nothing there.
func Next(from ActionStatus, event Event) (Transition, bool) {
	for _, t := range Lifecycle {
		if t.From == from && t.Event == event {
			return t, true
		}
	}
	return Transition{}, false
}

// Sources returns the statuses event moves a device action from, in
// lifecycle order, keeping those whose transition keep accepts (all when
// keep is nil).
func Sources(event Event, keep func(Transition) bool) []ActionStatus {
	var out []ActionStatus
	for _, s := range ActionStatuses {
		if t, ok := Next(s, event); ok && (keep == nil || keep(t)) {
			out = append(out, s)
		}
	}
	return out
}

// InFlight are the statuses in which the device has the action and has not
// finished it: a cancellation must tell the device, and the timeout runs.
var InFlight = Sources(EventCancel, func(t Transition) bool { return t.TellDevice })

// CancelAnswer is the event a device's final report on a cancel_action
// applies to the action it cancels: Completed accepts the cancellation,
// Failed rejects it.
func CancelAnswer(to ActionStatus) (Event, bool) {
	switch to {
	case StatusCompleted:
		return EventCancelAccepted, true
	case StatusFailed:
		return EventCancelRejected, true
	}
	return "", false
}

// ReportEvent is the event of a device's report of state: Completed and
// Failed are final, any other word is progress.
func ReportEvent(state string) Event {
	switch state {
	case string(StatusCompleted):
		return EventCompleted
	case string(StatusFailed):
		return EventFailed
	}
	return EventProgress
}

// The rollout's operations (docs/actions.md, "Rollouts"): what an operator
// may do to a rollout in each of its states, in one table. The store
// refuses what the table refuses, and the console shows only the
// operations the table allows.

// RolloutOp is an operator's operation on a rollout.
type RolloutOp string

// The operations on a rollout.
const (
	OpPause            RolloutOp = "pause"
	OpResume           RolloutOp = "resume"
	OpTriggerNextPhase RolloutOp = "trigger_next_phase"
	OpAppendPhase      RolloutOp = "append_phase"
	OpAbort            RolloutOp = "abort"
	// OpCancel is the action's cancel: on a rollout not done it is an
	// abort, and it stays idempotent after that.
	OpCancel RolloutOp = "cancel"
)

// RolloutOperation is one row of RolloutOperations: Op applies to a
// rollout whose status is one of From and, when Releases, whose schedule
// can still release devices.
type RolloutOperation struct {
	Op   RolloutOp
	From []RolloutStatus
	// Releases: the operation releases devices or adds devices to
	// release, so the schedule must not have ended.
	Releases bool
	// Instead is what a person can do when the status forbids the
	// operation, by the status it is in.
	Instead map[RolloutStatus]string
}

// RolloutOperations is every operation on a rollout. An operation's
// further conditions (a phase left to trigger, room for one more phase)
// are in RolloutState.Allows.
var RolloutOperations = []RolloutOperation{
	{Op: OpPause, From: []RolloutStatus{RolloutScheduled, RolloutRunning}, Instead: map[RolloutStatus]string{
		RolloutPaused: "it is paused already; resume it or abort it", RolloutCompleted: "nothing is left to pause", RolloutAborted: "nothing is left to pause"}},
	{Op: OpResume, From: []RolloutStatus{RolloutPaused}, Instead: map[RolloutStatus]string{
		RolloutScheduled: "it is not paused", RolloutRunning: "it is not paused",
		RolloutCompleted: "nothing is left to resume", RolloutAborted: "nothing is left to resume; dispatch a new action instead"}},
	{Op: OpTriggerNextPhase, From: []RolloutStatus{RolloutScheduled, RolloutRunning}, Releases: true, Instead: map[RolloutStatus]string{
		RolloutPaused: "resume it first", RolloutCompleted: "every phase was released; dispatch a new action to reach more devices",
		RolloutAborted: "nothing more is released; dispatch a new action instead"}},
	{Op: OpAppendPhase, From: []RolloutStatus{RolloutScheduled, RolloutRunning, RolloutPaused}, Releases: true, Instead: map[RolloutStatus]string{
		RolloutCompleted: "dispatch a new action instead", RolloutAborted: "dispatch a new action instead"}},
	{Op: OpAbort, From: []RolloutStatus{RolloutScheduled, RolloutRunning, RolloutPaused}, Instead: map[RolloutStatus]string{
		RolloutCompleted: "nothing is left to abort", RolloutAborted: "it was aborted already"}},
	{Op: OpCancel, From: RolloutStatuses},
}

// RolloutState is what the rules of the operations look at.
type RolloutState struct {
	Status      RolloutStatus
	PauseReason string
	// Ended: the schedule's end_timestamp passed; nothing more is
	// released.
	Ended bool
	// NextPhase is the next phase to trigger, Phases how many the
	// schedule has.
	NextPhase, Phases int
}

// State is what the operations' rules look at of r.
func (r *Rollout) State() RolloutState {
	return RolloutState{Status: r.Status, PauseReason: r.PauseReason, Ended: r.Ended, NextPhase: r.NextPhase, Phases: len(r.Schedule.Phases)}
}

// Allows reports whether op may be done in s: nil, or ECONFLICT saying
// why not and what to do instead.
func (s RolloutState) Allows(op RolloutOp) error {
	var row *RolloutOperation
	for i := range RolloutOperations {
		if RolloutOperations[i].Op == op {
			row = &RolloutOperations[i]
		}
	}
	if row == nil {
		return Errorf(EINVALID, "%s is not an operation on a rollout", op)
	}
	if !slices.Contains(row.From, s.Status) {
		status := string(s.Status)
		if s.Status == RolloutPaused && s.PauseReason != "" {
			status += " (" + s.PauseReason + ")"
		}
		return Errorf(ECONFLICT, "cannot %s: the rollout is %s; %s", op.verb(), status, row.Instead[s.Status])
	}
	switch {
	case row.Releases && s.Ended:
		return Errorf(ECONFLICT, "cannot %s: the schedule ended, so nothing more is released; dispatch a new action instead", op.verb())
	case op == OpTriggerNextPhase && s.NextPhase >= s.Phases:
		return Errorf(ECONFLICT, "cannot %s: every phase has triggered; append a phase to release more devices", op.verb())
	case op == OpAppendPhase && s.Phases >= MaxPhases:
		return Errorf(ECONFLICT, "cannot %s: the schedule has %d phases, the most it may have; dispatch a new action instead", op.verb(), MaxPhases)
	}
	return nil
}

// Allowed lists the operations s allows, in the table's order.
func (s RolloutState) Allowed() []RolloutOp {
	var out []RolloutOp
	for _, o := range RolloutOperations {
		if s.Allows(o.Op) == nil {
			out = append(out, o.Op)
		}
	}
	return out
}

// verb is the operation as a person says it.
func (op RolloutOp) verb() string {
	switch op {
	case OpTriggerNextPhase:
		return "trigger the next phase"
	case OpAppendPhase:
		return "append a phase"
	}
	return string(op)
}
