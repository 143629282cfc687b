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
