package console

import (
	"testing"

	"github.com/fleetd/fleet"
)

// TestConfirmOpCounts: what abort and cancel ask names each count with
// its noun in the singular for one and the plural for any other count.
func TestConfirmOpCounts(t *testing.T) {
	for _, c := range []struct {
		statuses map[string]int
		want     string
	}{
		{map[string]int{"Queued": 1}, "Cancel action #7 (reboot)? This cancels the 1 device action not finished: 1 not yet on its device is cancelled at once, and the 0 devices that have it (mid-download, for an update) are sent a cancel_action and asked to stop. It cannot be undone."},
		{map[string]int{"Queued": 2, "Progress": 1, "Completed": 4}, "Cancel action #7 (reboot)? This cancels the 3 device actions not finished: 2 not yet on their device are cancelled at once, and the 1 device that has it (mid-download, for an update) is sent a cancel_action and asked to stop. It cannot be undone."},
	} {
		if got := confirmOp(&fleet.Action{ID: 7, Action: "reboot", Statuses: c.statuses}, "cancel"); got != c.want {
			t.Errorf("%v:\n got %s\nwant %s", c.statuses, got, c.want)
		}
	}
}
