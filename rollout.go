package fleet

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	_ "time/tzdata" // maintenance windows name IANA zones on any machine

	"github.com/google/uuid"
)

// A rollout is an action dispatched with a Schedule (docs/actions.md,
// "Rollouts"): its targets are chosen at dispatch and partitioned into
// phases, released one after another as their triggers come, each first
// checked by its gate. This file holds the schedule's shape and rules and
// the decisions a rollout makes; the store applies them.

// Schedule is how a rollout releases its targets: the original API's
// shape.
type Schedule struct {
	ReleaseNotes string `json:"release_notes,omitempty" doc:"shown with the action; fleetd does not interpret it"`
	// EndTimestamp is in epoch milliseconds, 0 when none.
	EndTimestamp      int64              `json:"end_timestamp,omitempty" doc:"epoch milliseconds: no phase triggers after it, and devices never released are cancelled with status ScheduleEnded"`
	MaintenanceWindow *MaintenanceWindow `json:"maintenance_window,omitempty" doc:"released device actions are handed to devices only inside this daily window"`
	Phases            []Phase            `json:"phases" openapi:"required" doc:"released in order; they partition the targets"`
}

// Phase is one step of a schedule.
type Phase struct {
	Name      string    `json:"name" openapi:"required" doc:"1-128 characters"`
	TriggerOn Trigger   `json:"trigger_on" openapi:"required"`
	Info      PhaseInfo `json:"info" openapi:"required"`
	Gate      *Gate     `json:"gate,omitempty" doc:"checked before the phase triggers, over the devices of all earlier phases; a gate that does not hold pauses the schedule"`
}

// The trigger types of a phase.
const (
	TriggerNow           = "now"            // as soon as the phase is next
	TriggerTimestamp     = "timestamp"      // at Timestamp
	TriggerAfterPrevious = "after_previous" // WaitSeconds after FinishedRatio of the earlier phases' devices are final
	TriggerManual        = "manual"         // when an operator triggers it
)

// Trigger says when a phase is released.
type Trigger struct {
	Type        string `json:"type" openapi:"required" doc:"now, timestamp, after_previous or manual"`
	Timestamp   int64  `json:"timestamp,omitempty" doc:"type timestamp: epoch milliseconds"`
	WaitSeconds int64  `json:"wait_seconds,omitempty" doc:"type after_previous: seconds to wait once finished_ratio of the earlier phases' devices are final (default 0)"`
	// FinishedRatio is 0 when not given, which is 1 (Ratio).
	FinishedRatio float64 `json:"finished_ratio,omitempty" doc:"type after_previous: the share of the earlier phases' devices that must be final (Completed, Failed or Cancelled), more than 0 and at most 1 (default 1: every one)"`
}

// Ratio is the share of the earlier phases' devices an after_previous
// trigger waits for: FinishedRatio, 1 when not given.
func (t Trigger) Ratio() float64 {
	if t.FinishedRatio == 0 {
		return 1
	}
	return t.FinishedRatio
}

// FinalNeeded is how many of total devices must be final for ratio r: the
// share rounded up, so that 0.9 of 15 devices is 14 and any share of one
// device is that device.
func FinalNeeded(r float64, total int) int {
	return int(math.Ceil(r*float64(total) - 1e-9))
}

// The kinds of phase.
const (
	PhaseFixedList  = "fixed_list" // exactly DeviceIDs
	PhasePercentage = "percentage" // until Percentage of all targets are released
	PhaseMetadata   = "metadata"   // the targets not released yet whose metadata match, when it triggers
	PhaseGroup      = "group"      // the targets not released yet that are in the group, when it triggers
)

// PhaseInfo says which devices a phase releases.
type PhaseInfo struct {
	Type       string   `json:"type" openapi:"required" doc:"fixed_list, percentage, metadata or group"`
	DeviceIDs  []string `json:"device_ids,omitempty" doc:"fixed_list: the devices, each a target of the action"`
	Percentage int      `json:"percentage,omitempty" doc:"percentage: 1 to 100, cumulative: devices are released until this share of all targets is, in a stable order (100: everyone left)"`
	// Metadata is matched when the phase triggers (docs/actions.md).
	Metadata map[string]string `json:"metadata,omitempty" doc:"metadata: KEY: VALUE pairs; when the phase triggers it takes, from the later phases, the targets not released yet whose device metadata has every one of them, and releases them"`
	// Group's membership is evaluated when the phase triggers (docs/twin.md).
	Group string `json:"group,omitempty" doc:"group: a group's name; when the phase triggers it takes, from the later phases, the targets not released yet that are in the group then, and releases them"`
}

// Gate is what must hold before a phase triggers, over the devices of all
// earlier phases.
type Gate struct {
	MaxFailureRate *float64 `json:"max_failure_rate,omitempty" doc:"0 to 1: the largest share of finished devices (Completed or Failed) that may have Failed"`
	MinFinished    int      `json:"min_finished,omitempty" doc:"with max_failure_rate: how many devices must have finished before the rate is judged (default 1); until then the phase waits"`
	AlertRules     []string `json:"alert_rules,omitempty" codec:"uuid" doc:"alert rule ids: an alert of one of them opened on a device within watch_seconds after its device action Completed stops the rollout"`
	WatchSeconds   int64    `json:"watch_seconds,omitempty" doc:"with alert_rules: how long each device is watched after it Completed; the phase waits until every device of earlier phases is final and each that Completed has been watched so long"`
}

// MaintenanceWindow is a daily window of wall-clock time in a time zone.
type MaintenanceWindow struct {
	Start    string `json:"start" openapi:"required" doc:"HH:MM, wall-clock time in timezone"`
	End      string `json:"end" openapi:"required" doc:"HH:MM; before start, the window spans midnight"`
	Timezone string `json:"timezone" openapi:"required" doc:"IANA time zone name; daylight saving time is followed"`
}

// Limits of schedules.
const (
	MaxPhases       = 100
	MaxPhaseNameLen = 128
	MaxReleaseNotes = 65536
	MaxWaitSeconds  = 31_536_000 // a year
)

// ReadSchedule is the typed decode of a dispatch's schedule.
func ReadSchedule(f *Fields) *Schedule {
	if f == nil {
		return nil
	}
	s := &Schedule{ReleaseNotes: f.String("release_notes", false)}
	if len(s.ReleaseNotes) > MaxReleaseNotes {
		f.Fail("release_notes", fmt.Sprintf("must be at most %d bytes", MaxReleaseNotes))
	}
	if f.Has("end_timestamp") {
		s.EndTimestamp = f.Int("end_timestamp", false, 1, math.MaxInt64/2)
	}
	if w := f.Nested("maintenance_window", false); w != nil {
		s.MaintenanceWindow = readWindow(w)
		w.Unknown()
	}
	items := f.Array("phases", true)
	switch {
	case f.Has("phases") && len(items) == 0:
		f.Fail("phases", "must list at least one phase")
	case len(items) > MaxPhases:
		f.Fail("phases", fmt.Sprintf("must list at most %d phases", MaxPhases))
	}
	for i, v := range items {
		pf := f.Element("phases", i, v)
		if pf == nil {
			continue
		}
		s.Phases = append(s.Phases, readPhase(pf, i))
		pf.Unknown()
	}
	if len(items) == len(s.Phases) {
		s.checkPhases(f)
	}
	f.Unknown()
	return s
}

// ReadAppendedPhase is the typed decode of a phase appended to a running
// schedule: a fixed_list phase, which will have index index.
func ReadAppendedPhase(f *Fields, index int) Phase {
	p := readPhase(f, index)
	if p.Info.Type != "" && p.Info.Type != PhaseFixedList {
		f.Fail("info.type", "must be fixed_list: an appended phase names its devices")
	}
	return p
}

func readPhase(f *Fields, index int) Phase {
	p := Phase{Name: f.NonEmptyString("name", true, MaxPhaseNameLen)}
	if t := f.Nested("trigger_on", true); t != nil {
		p.TriggerOn.Type = t.String("type", true)
		switch p.TriggerOn.Type {
		case TriggerNow, TriggerManual:
		case TriggerTimestamp:
			p.TriggerOn.Timestamp = t.Int("timestamp", true, 0, math.MaxInt64/2)
		case TriggerAfterPrevious:
			if t.Has("wait_seconds") {
				p.TriggerOn.WaitSeconds = t.Int("wait_seconds", false, 0, MaxWaitSeconds)
			}
			if t.Has("finished_ratio") {
				p.TriggerOn.FinishedRatio = t.Float("finished_ratio", false, 0, 1)
				if p.TriggerOn.FinishedRatio == 0 {
					t.Fail("finished_ratio", "must be more than 0 and at most 1: the share of the earlier phases' devices that must be final")
				}
			}
			if index == 0 {
				t.Fail("type", "after_previous needs a previous phase; the first phase cannot have it")
			}
		default:
			if t.Has("type") {
				t.Fail("type", "must be one of now, timestamp, after_previous, manual")
			}
		}
		t.Unknown()
	}
	if in := f.Nested("info", true); in != nil {
		p.Info.Type = in.String("type", true)
		switch p.Info.Type {
		case PhaseFixedList:
			ids := in.Strings("device_ids", true)
			if in.Has("device_ids") && len(ids) == 0 {
				in.Fail("device_ids", "must list at least one device")
			}
			seen := make(map[string]bool, len(ids))
			for i, id := range ids {
				if !ValidDeviceID(id) {
					in.Fail(fmt.Sprintf("device_ids[%d]", i), DeviceIDRule)
				} else if seen[id] {
					in.Fail(fmt.Sprintf("device_ids[%d]", i), fmt.Sprintf("repeats device %q", id))
				}
				seen[id] = true
			}
			p.Info.DeviceIDs = ids
		case PhasePercentage:
			p.Info.Percentage = int(in.Int("percentage", true, 1, 100))
		case PhaseMetadata:
			p.Info.Metadata = in.StringMap("metadata", true)
			if in.Has("metadata") && len(p.Info.Metadata) == 0 {
				in.Fail("metadata", "must have at least one KEY: VALUE pair, such as {\"ring\": \"lab\"}")
			} else if problem := ValidateMetadata(p.Info.Metadata); problem != "" {
				in.Fail("metadata", problem)
			}
		case PhaseGroup:
			if p.Info.Group = in.String("group", true); in.Has("group") && !ValidGroupName(p.Info.Group) {
				in.Fail("group", GroupNameRule)
			}
		default:
			if in.Has("type") {
				in.Fail("type", "must be fixed_list, percentage, metadata or group")
			}
		}
		in.Unknown()
	}
	if g := f.Nested("gate", false); g != nil {
		p.Gate = readGate(g)
		if index == 0 {
			f.Fail("gate", "the first phase has no earlier phases to judge")
		}
		g.Unknown()
	}
	return p
}

func readGate(f *Fields) *Gate {
	g := &Gate{}
	if f.Has("max_failure_rate") {
		r := f.Float("max_failure_rate", false, 0, 1)
		g.MaxFailureRate = &r
		g.MinFinished = 1
		if f.Has("min_finished") {
			g.MinFinished = int(f.Int("min_finished", false, 1, math.MaxInt32))
		}
	} else if f.Has("min_finished") {
		f.Fail("min_finished", "goes with max_failure_rate")
	}
	if f.Has("alert_rules") {
		g.AlertRules = f.Strings("alert_rules", false)
		if len(g.AlertRules) == 0 {
			f.Fail("alert_rules", "must list at least one alert rule id")
		}
		for i, id := range g.AlertRules {
			if _, err := uuid.Parse(id); err != nil {
				f.Fail(fmt.Sprintf("alert_rules[%d]", i), "must be an alert rule id (a UUID)")
			}
		}
		g.WatchSeconds = f.Int("watch_seconds", true, 1, MaxWaitSeconds)
	} else if f.Has("watch_seconds") {
		f.Fail("watch_seconds", "goes with alert_rules")
	}
	if g.MaxFailureRate == nil && g.AlertRules == nil && !f.Has("min_finished") && !f.Has("watch_seconds") {
		f.Fail("max_failure_rate", "a gate needs max_failure_rate, alert_rules or both")
	}
	return g
}

func readWindow(f *Fields) *MaintenanceWindow {
	w := &MaintenanceWindow{
		Start:    f.String("start", true),
		End:      f.String("end", true),
		Timezone: f.String("timezone", true),
	}
	start, okStart := clockMinutes(w.Start)
	end, okEnd := clockMinutes(w.End)
	if f.Has("start") && !okStart {
		f.Fail("start", "must be a time of day HH:MM, 00:00 to 23:59")
	}
	if f.Has("end") && !okEnd {
		f.Fail("end", "must be a time of day HH:MM, 00:00 to 23:59")
	}
	if okStart && okEnd && start == end {
		f.Fail("end", "must differ from start")
	}
	if f.Has("timezone") {
		if _, err := LoadZone(w.Timezone); err != nil {
			f.Fail("timezone", "must be an IANA time zone name such as Europe/Berlin or UTC")
		}
	}
	return w
}

// LoadZone loads an IANA time zone by name; "Local" and "" are refused: the
// server's own zone is nobody's business.
func LoadZone(name string) (*time.Location, error) {
	if name == "" || name == "Local" {
		return nil, fmt.Errorf("unknown time zone %q", name)
	}
	return time.LoadLocation(name)
}

// clockMinutes parses "HH:MM" into minutes after midnight.
func clockMinutes(s string) (int, bool) {
	h, m, ok := strings.Cut(s, ":")
	if !ok || len(h) != 2 || len(m) != 2 {
		return 0, false
	}
	hh, err1 := strconv.Atoi(h)
	mm, err2 := strconv.Atoi(m)
	if err1 != nil || err2 != nil || hh < 0 || hh > 23 || mm < 0 || mm > 59 || h[0] == '+' || m[0] == '+' {
		return 0, false
	}
	return hh*60 + mm, true
}

// checkPhases checks the rules that span phases: a device in one fixed
// list only, percentages that grow.
func (s *Schedule) checkPhases(f *Fields) {
	owner := map[string]int{}
	last := 0
	for i, p := range s.Phases {
		for _, id := range p.Info.DeviceIDs {
			if j, ok := owner[id]; ok {
				f.Fail(fmt.Sprintf("phases[%d].info.device_ids", i), fmt.Sprintf("device %q is in phase %d already", id, j))
				break
			}
			owner[id] = i
		}
		if p.Info.Type == PhasePercentage {
			if p.Info.Percentage <= last {
				f.Fail(fmt.Sprintf("phases[%d].info.percentage", i), fmt.Sprintf("must be more than the %d%% of an earlier phase: percentages are cumulative", last))
			}
			last = max(last, p.Info.Percentage)
		}
	}
}

// CheckAt checks what depends on the time of dispatch: an end in the past
// would end the schedule before it starts.
func (s *Schedule) CheckAt(now time.Time) error {
	if s.EndTimestamp != 0 && s.EndTimestamp <= now.UnixMilli() {
		return FieldErrors(map[string]string{"schedule.end_timestamp": "is in the past"})
	}
	return nil
}

// AlertRuleIDs lists the alert rules the gates name, each once.
func (s *Schedule) AlertRuleIDs() []string {
	var out []string
	seen := map[string]bool{}
	for _, p := range s.Phases {
		if p.Gate == nil {
			continue
		}
		for _, id := range p.Gate.AlertRules {
			if !seen[id] {
				seen[id] = true
				out = append(out, id)
			}
		}
	}
	return out
}

// PhaseQuota is how many targets a percentage phase releases in all, it
// and the phases before it together, of total: the share rounded up, so
// that a canary of 1% of 50 devices is one device.
func PhaseQuota(percentage, total int) int {
	return (percentage*total + 99) / 100
}

// Open reports whether t is inside the window, and the occurrence it is
// inside: the local date, as yyyymmdd, of the window's start. The window is
// wall-clock time in its zone, so it follows daylight saving time: on the
// night the clocks go forward a 02:00-05:00 window is two hours long, on
// the night they go back four.
func (w *MaintenanceWindow) Open(t time.Time) (bool, int64) {
	loc, err := LoadZone(w.Timezone)
	if err != nil {
		return false, 0 // validated at dispatch; a zone that vanished keeps devices waiting
	}
	start, _ := clockMinutes(w.Start)
	end, _ := clockMinutes(w.End)
	local := t.In(loc)
	now := local.Hour()*60 + local.Minute()
	day := local
	var open bool
	if start < end {
		open = start <= now && now < end
	} else { // spans midnight
		open = now >= start || now < end
		if now < end {
			day = local.AddDate(0, 0, -1)
		}
	}
	if !open {
		return false, 0
	}
	return true, int64(day.Year()*10000 + int(day.Month())*100 + day.Day())
}

// RolloutStatus is where a rollout is.
type RolloutStatus string

// The rollout statuses.
const (
	RolloutScheduled RolloutStatus = "scheduled" // no phase released yet
	RolloutRunning   RolloutStatus = "running"   // a phase released, more to come or devices not final
	RolloutPaused    RolloutStatus = "paused"    // a gate did not hold, or an operator paused it
	RolloutCompleted RolloutStatus = "completed" // every phase released (or the schedule ended) and every device action final
	RolloutAborted   RolloutStatus = "aborted"   // an operator aborted or cancelled it
)

// RolloutStatuses lists the rollout statuses.
var RolloutStatuses = []RolloutStatus{RolloutScheduled, RolloutRunning, RolloutPaused, RolloutCompleted, RolloutAborted}

// Done reports whether the rollout will change no more.
func (s RolloutStatus) Done() bool { return s == RolloutCompleted || s == RolloutAborted }

// StateScheduleEnded is the status word of a device action its schedule's
// end_timestamp cancelled before it was released.
const StateScheduleEnded = "ScheduleEnded"

// Rollout is the state of an action's schedule.
type Rollout struct {
	ActionID  int64
	Action    string // the action's name
	CreatedAt time.Time
	Schedule  Schedule
	Status    RolloutStatus
	// NextPhase is the index of the next phase to trigger; len(Phases)
	// when every phase triggered.
	NextPhase int
	// TriggeredAt holds when each phase before NextPhase triggered.
	TriggeredAt []time.Time
	PauseReason string
	// GatePaused: the pause is a gate's, so resuming waives the gate of
	// NextPhase.
	GatePaused bool
	// WaivedPhase is the phase whose gate an operator waived by resuming;
	// -1 for none.
	WaivedPhase int
	// Ended: end_timestamp passed; nothing more is released.
	Ended bool
	// WindowOpened is the window occurrence (MaintenanceWindow.Open)
	// whose opening has been handled: released devices were sent their
	// actions.
	WindowOpened int64
}

// PhasesTriggered is one boolean per phase: whether it triggered.
func (r *Rollout) PhasesTriggered() []bool {
	out := make([]bool, len(r.Schedule.Phases))
	for i := range out {
		out[i] = i < r.NextPhase
	}
	return out
}

// RolloutFacts is what a rollout's decision needs to know of its device
// actions, as the store reads them for the phase NextPhase.
type RolloutFacts struct {
	// Live counts the action's device actions that are not final.
	Live int
	// EarlierDevices counts the device actions of phases before
	// NextPhase, EarlierFinal those of them that are final; ReachedAt is
	// when the share an after_previous trigger waits for was reached: when
	// the last of the first FinalNeeded of them became final (zero while
	// fewer are, or when none is needed).
	EarlierDevices, EarlierFinal int
	ReachedAt                    time.Time
	// Finished and Failed count the device actions of phases before
	// NextPhase that are Completed or Failed, and Failed; EarlierLive
	// those that are not final.
	Finished, Failed, EarlierLive int
	// WatchedUntil is when the last device action of phases before
	// NextPhase that Completed has been watched for the gate's
	// watch_seconds: the latest completion plus watch_seconds.
	WatchedUntil time.Time
	// Alert is the first alert of a gate rule that opened on a device of
	// phases before NextPhase within watch_seconds after it Completed.
	Alert *GateAlert
}

// GateAlert is an alert that fails a gate.
type GateAlert struct {
	RuleName string
	DeviceID string
	After    time.Duration // from the device's completion to the alert's opening
}

// StepKind is what a rollout does next.
type StepKind int

// The steps of a rollout.
const (
	StepWait       StepKind = iota // nothing to do now
	StepTrigger                    // release phase Phase
	StepPause                      // a gate did not hold: pause with Reason
	StepEnd                        // end_timestamp passed: cancel what was never released
	StepComplete                   // every device action is final
	StepOpenWindow                 // the maintenance window opened: send what is released
)

// RolloutStep is a rollout's decision.
type RolloutStep struct {
	Kind   StepKind
	Phase  int
	Reason string
	// Window is the occurrence the step handles (StepOpenWindow), or the
	// one a trigger inside the window stands in (StepTrigger).
	Window int64
	// Until, for StepWait, is when the rollout may next have a step
	// without anyone acting on it; zero when it must be looked at again
	// soon (its devices are finishing).
	Until time.Time
}

// rolloutLook bounds the wait between two looks at a rollout that waits
// for a time: an operator on another replica may change it meanwhile.
const rolloutLook = time.Minute

// Next decides what the rollout does at now, knowing f. The store calls
// it in the transaction that applies the step, so the decision and its
// effect are one.
func (r *Rollout) Next(now time.Time, f RolloutFacts) RolloutStep {
	if r.Status.Done() {
		return RolloutStep{}
	}
	s := r.Schedule
	if !r.Ended && s.EndTimestamp != 0 && now.UnixMilli() >= s.EndTimestamp {
		return RolloutStep{Kind: StepEnd}
	}
	if r.Settling() && f.Live == 0 {
		return RolloutStep{Kind: StepComplete}
	}
	if r.releasing() && r.Due(now, f) {
		if step, ok := r.gate(now, f, false); ok {
			return step
		}
	}
	if step := r.window(now); step.Kind != StepWait {
		return step
	}
	return RolloutStep{Until: r.until(now, f)}
}

// Settling reports whether nothing more will be released, so the rollout
// completes once its device actions are all final.
func (r *Rollout) Settling() bool {
	return !r.Status.Done() && (r.Ended || r.NextPhase >= len(r.Schedule.Phases))
}

// releasing reports whether the rollout releases its next phase when due.
func (r *Rollout) releasing() bool {
	return !r.Status.Done() && r.Status != RolloutPaused && !r.Ended && r.NextPhase < len(r.Schedule.Phases)
}

// WaitsForPrevious reports whether the next phase's trigger waits for the
// earlier phases' devices.
func (r *Rollout) WaitsForPrevious() bool {
	return r.releasing() && r.NextPhase > 0 && r.Schedule.Phases[r.NextPhase].TriggerOn.Type == TriggerAfterPrevious
}

// PendingGate is the gate the next phase must pass, nil when it has none
// or an operator waived it.
func (r *Rollout) PendingGate() *Gate {
	if r.NextPhase >= len(r.Schedule.Phases) || r.WaivedPhase == r.NextPhase {
		return nil
	}
	return r.Schedule.Phases[r.NextPhase].Gate
}

// CompletionReason says why a rollout completed.
func (r *Rollout) CompletionReason() string {
	if r.Ended {
		return fmt.Sprintf("the schedule ended at %s: devices whose phase had not triggered were cancelled (status %s)",
			time.UnixMilli(r.Schedule.EndTimestamp).UTC().Format(time.RFC3339), StateScheduleEnded)
	}
	return fmt.Sprintf("all %d phases released and every device finished", len(r.Schedule.Phases))
}

// until is when a waiting rollout may next have a step by the clock.
func (r *Rollout) until(now time.Time, f RolloutFacts) time.Time {
	next := now.Add(rolloutLook)
	if r.Settling() || r.Schedule.MaintenanceWindow != nil {
		return time.Time{}
	}
	if end := r.Schedule.EndTimestamp; end != 0 && time.UnixMilli(end).Before(next) {
		next = time.UnixMilli(end)
	}
	if !r.releasing() {
		return next
	}
	t := r.Schedule.Phases[r.NextPhase].TriggerOn
	switch {
	case t.Type == TriggerTimestamp && time.UnixMilli(t.Timestamp).After(now):
		next = minTime(next, time.UnixMilli(t.Timestamp))
	case t.Type == TriggerAfterPrevious:
		at, ok := r.reached(f)
		if !ok {
			return time.Time{} // devices are finishing
		}
		next = minTime(next, at.Add(time.Duration(t.WaitSeconds)*time.Second))
	case r.PendingGate() != nil:
		return time.Time{} // devices are finishing, and alerts may open
	}
	return next
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// TriggerNow decides an operator's trigger_next_phase: the next phase
// triggers whatever its trigger says, if the rollout may release and the
// gate holds. An error is ECONFLICT, saying why not.
func (r *Rollout) TriggerNow(now time.Time, f RolloutFacts) (RolloutStep, error) {
	if err := r.State().Allows(OpTriggerNextPhase); err != nil {
		return RolloutStep{}, err
	}
	step, ok := r.gate(now, f, true)
	if !ok {
		p := r.Schedule.Phases[r.NextPhase]
		return RolloutStep{}, Errorf(ECONFLICT, "the gate of phase %d (%s) cannot judge yet: %s", r.NextPhase, p.Name, r.undecided(now, f))
	}
	return step, nil
}

// Due reports whether the next phase's trigger has come.
func (r *Rollout) Due(now time.Time, f RolloutFacts) bool {
	if r.NextPhase >= len(r.Schedule.Phases) {
		return false
	}
	k := r.NextPhase
	t := r.Schedule.Phases[k].TriggerOn
	switch t.Type {
	case TriggerNow:
		return true
	case TriggerTimestamp:
		return now.UnixMilli() >= t.Timestamp
	case TriggerAfterPrevious:
		at, ok := r.reached(f)
		return ok && !now.Before(at.Add(time.Duration(t.WaitSeconds)*time.Second))
	}
	return false // manual
}

// reached reports whether the share of the earlier phases' devices the
// next phase's after_previous trigger waits for is final, and since when:
// since the last of that share became final, and not before the previous
// phase triggered (a phase with no devices is final when it triggers).
func (r *Rollout) reached(f RolloutFacts) (time.Time, bool) {
	k := r.NextPhase
	if k == 0 || k > len(r.TriggeredAt) {
		return time.Time{}, false
	}
	need := FinalNeeded(r.Schedule.Phases[k].TriggerOn.Ratio(), f.EarlierDevices)
	if f.EarlierFinal < need {
		return time.Time{}, false
	}
	at := r.TriggeredAt[k-1]
	if need > 0 && f.ReachedAt.After(at) {
		at = f.ReachedAt
	}
	return at, true
}

// gate checks the next phase's gate. It returns the trigger when the gate
// holds (or was waived), the pause when it does not, and false while it
// cannot judge yet: too few devices finished, or completed devices still
// watched.
func (r *Rollout) gate(now time.Time, f RolloutFacts, manual bool) (RolloutStep, bool) {
	k := r.NextPhase
	trigger := RolloutStep{Kind: StepTrigger, Phase: k}
	if w := r.Schedule.MaintenanceWindow; w != nil {
		if open, occ := w.Open(now); open {
			trigger.Window = occ
		}
	}
	g := r.Schedule.Phases[k].Gate
	if g == nil || r.WaivedPhase == k {
		return trigger, true
	}
	prefix := r.phaseName(k) + " not released: "
	if g.MaxFailureRate != nil {
		if f.Finished < g.MinFinished {
			return RolloutStep{}, false
		}
		rate := float64(f.Failed) / float64(f.Finished)
		if rate > *g.MaxFailureRate {
			return RolloutStep{Kind: StepPause, Phase: k, Reason: prefix + fmt.Sprintf("%d of %d finished devices failed (%s > %s)",
				f.Failed, f.Finished, percent(rate), percent(*g.MaxFailureRate))}, true
		}
	}
	if len(g.AlertRules) > 0 {
		if a := f.Alert; a != nil {
			return RolloutStep{Kind: StepPause, Phase: k, Reason: prefix + fmt.Sprintf("alert '%s' opened on %s %s after its %s completed",
				a.RuleName, a.DeviceID, Span(a.After), r.noun())}, true
		}
		if f.EarlierLive > 0 || now.Before(f.WatchedUntil) {
			return RolloutStep{}, false
		}
	}
	return trigger, true
}

// undecided says why the gate cannot judge yet.
func (r *Rollout) undecided(now time.Time, f RolloutFacts) string {
	g := r.Schedule.Phases[r.NextPhase].Gate
	switch {
	case g.MaxFailureRate != nil && f.Finished < g.MinFinished:
		return fmt.Sprintf("%d of the %d finished devices it needs have finished", f.Finished, g.MinFinished)
	case f.EarlierLive > 0:
		return fmt.Sprintf("%d devices of earlier phases have not finished, and each is watched for alerts once it completed", f.EarlierLive)
	}
	return fmt.Sprintf("devices that completed are watched for alerts for %s more", Span(f.WatchedUntil.Sub(now)))
}

// phaseName names phase k as the pause and waiting reasons do.
func (r *Rollout) phaseName(k int) string {
	return fmt.Sprintf("phase %d (%s)", k, r.Schedule.Phases[k].Name)
}

// WaitingDevice is a device whose device action a rollout waits for.
type WaitingDevice struct {
	ID         string
	Status     ActionStatus
	LastSeenAt *time.Time
	// Online: connected now, as far as this replica can tell; nil when
	// it cannot tell.
	Online *bool
}

// RolloutWait is what a rollout that is neither paused nor done waits
// for, as the store reads it: the rollout, its decision's facts, and the
// devices not finished of those it waits on (of the phases before the next
// one, or of all once every phase triggered): the first few by id, and
// how many there are.
type RolloutWait struct {
	Rollout    *Rollout
	Facts      RolloutFacts
	Devices    []WaitingDevice
	Unfinished int
}

// WaitingShown is how many waiting devices a waiting reason names.
const WaitingShown = 5

// Reason says what the rollout waits for at now, "" when it waits for
// nothing (it is paused, done, or has a step to take).
func (w *RolloutWait) Reason(now time.Time) string {
	r, f := w.Rollout, w.Facts
	switch {
	case r.Status.Done() || r.Status == RolloutPaused:
		return ""
	case r.Settling() && w.Unfinished > 0:
		if r.Ended {
			return fmt.Sprintf("the schedule ended; waiting for %s released before it to finish: %s", howMany(w.Unfinished, "device"), w.devices())
		}
		return fmt.Sprintf("every phase triggered; waiting for %s to finish: %s", howMany(w.Unfinished, "device"), w.devices())
	case r.Settling():
		return ""
	}
	k := r.NextPhase
	name := r.phaseName(k)
	t := r.Schedule.Phases[k].TriggerOn
	switch t.Type {
	case TriggerManual:
		return name + " waits for an operator to trigger it"
	case TriggerTimestamp:
		if at := time.UnixMilli(t.Timestamp); now.Before(at) {
			return fmt.Sprintf("%s triggers at %s", name, at.UTC().Format(time.RFC3339))
		}
	case TriggerAfterPrevious:
		at, ok := r.reached(f)
		if !ok {
			need := FinalNeeded(t.Ratio(), f.EarlierDevices)
			share := ""
			if t.Ratio() < 1 {
				share = fmt.Sprintf(" (finished_ratio %g: %d of %d)", t.Ratio(), need, f.EarlierDevices)
			}
			return fmt.Sprintf("%s waits for %s of earlier phases to finish%s; not finished: %s",
				name, howMany(need-f.EarlierFinal, "more device"), share, w.devices())
		}
		if until := at.Add(time.Duration(t.WaitSeconds) * time.Second); now.Before(until) {
			return fmt.Sprintf("%s triggers at %s, %d seconds after the earlier phases' devices finished", name,
				until.UTC().Format(time.RFC3339), t.WaitSeconds)
		}
	}
	if r.PendingGate() == nil {
		return ""
	}
	if _, ok := r.gate(now, f, false); ok {
		return ""
	}
	reason := fmt.Sprintf("the gate of %s cannot judge yet: %s", name, r.undecided(now, f))
	if w.Unfinished > 0 {
		reason += "; not finished: " + w.devices()
	}
	return reason
}

// howMany says n things: "1 device", "3 devices".
func howMany(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}

// devices names the waiting devices: a few, then how many more.
func (w *RolloutWait) devices() string {
	parts := make([]string, 0, len(w.Devices)+1)
	for _, d := range w.Devices {
		var state []string
		state = append(state, string(d.Status))
		if d.Online != nil {
			state = append(state, map[bool]string{true: "online", false: "offline"}[*d.Online])
		}
		if d.Online == nil || !*d.Online {
			if d.LastSeenAt == nil {
				state = append(state, "never seen")
			} else {
				// A time, not an age: the reason changes only when the
				// wait does (watch prints each change).
				state = append(state, "last seen "+d.LastSeenAt.UTC().Format(time.RFC3339))
			}
		}
		parts = append(parts, fmt.Sprintf("%s (%s)", d.ID, strings.Join(state, ", ")))
	}
	out := strings.Join(parts, ", ")
	if more := w.Unfinished - len(w.Devices); more > 0 {
		out += fmt.Sprintf(" and %d more", more)
	}
	return out
}

// window decides the opening of the maintenance window: once per
// occurrence, released devices are sent what they wait for.
func (r *Rollout) window(now time.Time) RolloutStep {
	w := r.Schedule.MaintenanceWindow
	if w == nil || r.NextPhase == 0 {
		return RolloutStep{}
	}
	if open, occ := w.Open(now); open && occ > r.WindowOpened {
		return RolloutStep{Kind: StepOpenWindow, Window: occ}
	}
	return RolloutStep{}
}

// noun is what a device's action is called in a pause reason.
func (r *Rollout) noun() string {
	if r.Action == ActionUpdateFirmware {
		return "update"
	}
	return r.Action
}

// percent says a share as a percentage with at most one decimal: "30%",
// "33.3%".
func percent(x float64) string {
	return strings.TrimSuffix(strconv.FormatFloat(100*x, 'f', 1, 64), ".0") + "%"
}

// Span says a duration as a person would: "40 seconds", "12 minutes",
// "3 hours 5 minutes".
func Span(d time.Duration) string {
	plural := func(n int64, unit string) string {
		if n == 1 {
			return "1 " + unit
		}
		return fmt.Sprintf("%d %ss", n, unit)
	}
	switch {
	case d < time.Minute:
		return plural(int64(d/time.Second), "second")
	case d < time.Hour:
		return plural(int64(d/time.Minute), "minute")
	}
	h, m := int64(d/time.Hour), int64(d%time.Hour/time.Minute)
	if m == 0 {
		return plural(h, "hour")
	}
	return plural(h, "hour") + " " + plural(m, "minute")
}

// RolloutRef names a rollout.
type RolloutRef struct {
	Tenant   string
	ActionID int64
}

// RolloutChange is what a step or an operation did to a rollout: the
// event for the tenant's notifications (nil when there is none), and what
// the device channel must now send.
type RolloutChange struct {
	Step  RolloutStep
	Event *RolloutEvent
	// Deliver: released device actions may be sent now (a phase released
	// inside the maintenance window, or the window opened).
	Deliver bool
	// Targeted bounds the device actions Deliver may send.
	Targeted int
	// Action is the action, without its counts, when Deliver.
	Action *Action
	// Sent is the cancel_action an abort dispatched, to be sent.
	Sent *Action
	// Shadows are the shadows a desired rollout's release changed, by
	// device, whose devices are to be told (ActionDesired): those of its
	// first chunk of devices.
	Shadows map[string]*Shadow
	// MoreDesired: released devices of a desired rollout wait for their
	// change, to be released a chunk a transaction (ReleaseDesired).
	MoreDesired bool
}

// Cancellation is what cancelling an action did.
type Cancellation struct {
	// Sent is the cancel_action dispatched to the devices that had the
	// action in flight; nil when none had.
	Sent      *Action
	Cancelled int // device actions cancelled
	// Aborted is the event of the rollout the cancellation ended, if the
	// action had one not done.
	Aborted *RolloutEvent
}

// RolloutEvent is a change of a rollout's state, which the tenant's
// rollout notification rules are sent.
type RolloutEvent struct {
	Event     string    `json:"event"` // one of the RolloutEvent* kinds
	ActionID  int64     `json:"action_id"`
	Action    string    `json:"action"`
	Phase     *int      `json:"phase,omitempty"` // the phase triggered, or whose gate paused the rollout
	PhaseName string    `json:"phase_name,omitempty"`
	Status    string    `json:"status"` // the rollout's status after the change
	Reason    string    `json:"reason,omitempty"`
	Released  int       `json:"released,omitempty"` // device actions a trigger released
	At        time.Time `json:"at"`
}

// The kinds of rollout event.
const (
	RolloutEventTriggered = "phase_triggered"
	RolloutEventPaused    = "paused"
	RolloutEventResumed   = "resumed"
	RolloutEventCompleted = "completed"
	RolloutEventAborted   = "aborted"
)

// RolloutService runs the operations on a rollout (docs/actions.md). Each
// is ECONFLICT when the rollout's state forbids it, and ENOTFOUND for an
// unknown action; an action without a schedule is ECONFLICT.
type RolloutService interface {
	PauseRollout(ctx context.Context, tenant string, id int64) error
	ResumeRollout(ctx context.Context, tenant string, id int64) error
	AbortRollout(ctx context.Context, tenant string, id int64) error
	TriggerNextPhase(ctx context.Context, tenant string, id int64) error
	AppendPhase(ctx context.Context, tenant string, id int64, p Phase) error
}
