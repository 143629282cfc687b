package fleet

// This file is the device-action lifecycle of docs/actions.md, in one
// place: the statuses, the events that move a device action between them,
// and the table of transitions. Everything that changes a device action's
// status follows Lifecycle: ApplyReport for status reports, and the store,
// whose statements take their states from it (sqlstore/action_lifecycle.go).

// ActionStatus is where a device action is in its lifecycle (DESIGN §4):
// (Scheduled →) Queued → Initiated → Progress → Completed, Failed or
// Cancelled.
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
const (
	StateTimedOut  = "TimedOut"
	StateCancelled = "Cancelled"
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
	// cancel_action that names it).
	EventCancel Event = "cancel"
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
)

// Events lists every event.
var Events = []Event{EventDelivered, EventProgress, EventCompleted, EventFailed, EventRefused, EventCancel, EventTimeout, EventNothingToCancel,
	EventRelease, EventScheduleEnded}

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
	{From: StatusInitiated, Event: EventCancel, To: StatusCancelled, Status: StateCancelled, Deadline: DeadlineCleared, TellDevice: true},
	{From: StatusProgress, Event: EventCancel, To: StatusCancelled, Status: StateCancelled, Deadline: DeadlineCleared, TellDevice: true},

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
