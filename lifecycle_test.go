package fleet_test

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/fleetd/fleet"
)

// lifecycleTable renders fleet.Lifecycle as docs/actions.md shows it.
func lifecycleTable() string {
	var b strings.Builder
	b.WriteString("| from | event | to | status word | deadline | device told |\n|---|---|---|---|---|---|\n")
	for _, t := range fleet.Lifecycle {
		word := t.Status
		if word == "" {
			word = "the reported state"
		}
		deadline := map[fleet.DeadlineChange]string{fleet.DeadlineKept: "kept", fleet.DeadlineStarted: "starts", fleet.DeadlineCleared: "none"}[t.Deadline]
		told := ""
		if t.TellDevice {
			told = "yes"
		}
		fmt.Fprintf(&b, "| %s | `%s` | %s | %s | %s | %s |\n", t.From, t.Event, t.To, word, deadline, told)
	}
	return b.String()
}

// TestLifecycleDocumented checks that docs/actions.md shows the transition
// table the code follows, row for row.
func TestLifecycleDocumented(t *testing.T) {
	doc, err := os.ReadFile("docs/actions.md")
	if err != nil {
		t.Fatal(err)
	}
	if want := lifecycleTable(); !strings.Contains(string(doc), want) {
		t.Fatalf("docs/actions.md does not show the lifecycle as the code has it; its table should read:\n%s", want)
	}
}

// TestLifecycle checks each transition against the rules the table must
// keep: nothing leaves a final status, the deadline exists exactly while
// the device has the action, the device is told of a cancellation exactly
// when it has the action, and each (status, event) pair has one row.
func TestLifecycle(t *testing.T) {
	seen := map[[2]string]bool{}
	for _, tr := range fleet.Lifecycle {
		t.Run(fmt.Sprintf("%s/%s", tr.From, tr.Event), func(t *testing.T) {
			key := [2]string{string(tr.From), string(tr.Event)}
			if seen[key] {
				t.Fatal("two transitions for one status and event")
			}
			seen[key] = true
			if !tr.From.Valid() || !tr.To.Valid() || !slices.Contains(fleet.Events, tr.Event) {
				t.Fatalf("unknown status or event in %+v", tr)
			}
			if tr.From.Final() {
				t.Fatalf("%s is final: nothing moves it", tr.From)
			}
			if got, ok := fleet.Next(tr.From, tr.Event); !ok || got != tr {
				t.Fatalf("Next = %+v, %v", got, ok)
			}
			wasRunning, runs := slices.Contains(fleet.InFlight, tr.From), slices.Contains(fleet.InFlight, tr.To)
			want := fleet.DeadlineCleared
			switch {
			case runs && wasRunning:
				want = fleet.DeadlineKept
			case runs:
				want = fleet.DeadlineStarted
			}
			if tr.Deadline != want {
				t.Errorf("deadline change %v, want %v: a deadline runs exactly while the device has the action", tr.Deadline, want)
			}
			if tr.TellDevice != (tr.Event == fleet.EventCancel && wasRunning) {
				t.Errorf("TellDevice %v: a device is told exactly when an operator ends an action it has", tr.TellDevice)
			}
			reported := tr.Event == fleet.EventProgress || tr.Event == fleet.EventCompleted || tr.Event == fleet.EventFailed
			if (tr.Status == "") != reported {
				t.Errorf("status word %q: the device's reports keep their own word, the server's events write theirs", tr.Status)
			}
		})
	}
	for _, s := range fleet.ActionStatuses {
		for _, e := range fleet.Events {
			if _, ok := fleet.Next(s, e); ok != seen[[2]string{string(s), string(e)}] {
				t.Errorf("Next(%s, %s) disagrees with the table", s, e)
			}
		}
	}
	if got := fmt.Sprint(fleet.InFlight); got != "[Initiated Progress]" {
		t.Errorf("InFlight = %s", got)
	}
	for state, want := range map[string]fleet.Event{"Completed": fleet.EventCompleted, "Failed": fleet.EventFailed, "Queued": fleet.EventProgress, "Downloading": fleet.EventProgress, "completed": fleet.EventProgress} {
		if got := fleet.ReportEvent(state); got != want {
			t.Errorf("ReportEvent(%q) = %s, want %s", state, got, want)
		}
	}
}

// TestRolloutOperations checks every row of fleet.RolloutOperations in
// every rollout status, and the conditions beyond the status: what is
// allowed is what docs/actions.md says, and each refusal is a 409 that
// names the state and what to do instead.
func TestRolloutOperations(t *testing.T) {
	running := fleet.RolloutState{Status: fleet.RolloutRunning, NextPhase: 1, Phases: 3}
	with := func(f func(*fleet.RolloutState)) fleet.RolloutState { s := running; f(&s); return s }
	allStatuses := func(op fleet.RolloutOp) map[fleet.RolloutStatus]bool {
		return map[fleet.RolloutStatus]bool{
			fleet.RolloutScheduled: op != fleet.OpResume,
			fleet.RolloutRunning:   op != fleet.OpResume,
			fleet.RolloutPaused:    op == fleet.OpResume || op == fleet.OpAppendPhase || op == fleet.OpAbort || op == fleet.OpCancel,
			fleet.RolloutCompleted: op == fleet.OpCancel,
			fleet.RolloutAborted:   op == fleet.OpCancel,
		}
	}
	if len(fleet.RolloutOperations) != 6 {
		t.Fatalf("%d operations; this test knows 6", len(fleet.RolloutOperations))
	}
	for _, row := range fleet.RolloutOperations {
		for status, want := range allStatuses(row.Op) {
			t.Run(fmt.Sprintf("%s/%s", row.Op, status), func(t *testing.T) {
				err := with(func(s *fleet.RolloutState) { s.Status, s.PauseReason = status, "paused by ann" }).Allows(row.Op)
				if want != (err == nil) {
					t.Fatalf("allowed %v, want %v (%v)", err == nil, want, err)
				}
				if err == nil {
					return
				}
				msg := err.Error()
				if fleet.ErrorCode(err) != fleet.ECONFLICT || !strings.Contains(msg, "the rollout is "+string(status)) ||
					strings.HasSuffix(msg, "; ") {
					t.Fatalf("refusal %q (%s): it must be a conflict naming the status and what to do", msg, fleet.ErrorCode(err))
				}
				if status == fleet.RolloutPaused && !strings.Contains(msg, "paused by ann") {
					t.Fatalf("refusal %q does not say why the rollout is paused", msg)
				}
			})
		}
	}
	for _, c := range []struct {
		name  string
		state fleet.RolloutState
		op    fleet.RolloutOp
		want  string // "" when allowed
	}{
		{"trigger when ended", with(func(s *fleet.RolloutState) { s.Ended = true }), fleet.OpTriggerNextPhase, "the schedule ended"},
		{"append when ended", with(func(s *fleet.RolloutState) { s.Ended = true }), fleet.OpAppendPhase, "the schedule ended"},
		{"pause when ended", with(func(s *fleet.RolloutState) { s.Ended = true }), fleet.OpPause, ""},
		{"abort when ended", with(func(s *fleet.RolloutState) { s.Ended = true }), fleet.OpAbort, ""},
		{"trigger with no phase left", with(func(s *fleet.RolloutState) { s.NextPhase = 3 }), fleet.OpTriggerNextPhase, "append a phase"},
		{"append with no phase left", with(func(s *fleet.RolloutState) { s.NextPhase = 3 }), fleet.OpAppendPhase, ""},
		{"append to the most phases", with(func(s *fleet.RolloutState) { s.Phases = fleet.MaxPhases }), fleet.OpAppendPhase, "the most it may have"},
		{"append to one less", with(func(s *fleet.RolloutState) { s.Phases = fleet.MaxPhases - 1 }), fleet.OpAppendPhase, ""},
		{"trigger the first phase", with(func(s *fleet.RolloutState) { s.Status, s.NextPhase = fleet.RolloutScheduled, 0 }), fleet.OpTriggerNextPhase, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.state.Allows(c.op)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.want != "" && (fleet.ErrorCode(err) != fleet.ECONFLICT || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("got %v, want a conflict saying %q", err, c.want)
			}
		})
	}
	if err := running.Allows("reboot"); fleet.ErrorCode(err) != fleet.EINVALID {
		t.Fatalf("an unknown operation: %v", err)
	}
	if got := running.Allowed(); !slices.Equal(got, []fleet.RolloutOp{fleet.OpPause, fleet.OpTriggerNextPhase, fleet.OpAppendPhase, fleet.OpAbort, fleet.OpCancel}) {
		t.Fatalf("a running rollout allows %v", got)
	}
	var none fleet.Action
	if err := none.RolloutAllows(fleet.OpPause); fleet.ErrorCode(err) != fleet.ECONFLICT || none.RolloutOps() != nil {
		t.Fatalf("an action without a schedule: %v, %v", err, none.RolloutOps())
	}
}

// rolloutOperationsTable renders fleet.RolloutOperations as
// docs/actions.md shows it.
func rolloutOperationsTable() string {
	var b strings.Builder
	b.WriteString("| operation | allowed when the rollout is | and |\n|---|---|---|\n")
	for _, o := range fleet.RolloutOperations {
		var from []string
		for _, s := range o.From {
			from = append(from, "`"+string(s)+"`")
		}
		var more []string
		if o.Releases {
			more = append(more, "the schedule has not ended")
		}
		switch o.Op {
		case fleet.OpTriggerNextPhase:
			more = append(more, "a phase is left")
		case fleet.OpAppendPhase:
			more = append(more, fmt.Sprintf("it has fewer than %d phases", fleet.MaxPhases))
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", o.Op, strings.Join(from, ", "), strings.Join(more, ", "))
	}
	return b.String()
}

// TestRolloutOperationsDocumented checks that docs/actions.md shows the
// operations' table the code follows.
func TestRolloutOperationsDocumented(t *testing.T) {
	doc, err := os.ReadFile("docs/actions.md")
	if err != nil {
		t.Fatal(err)
	}
	if want := rolloutOperationsTable(); !strings.Contains(string(doc), want) {
		t.Fatalf("docs/actions.md does not show the rollout operations as the code has them; its table should read:\n%s", want)
	}
}
