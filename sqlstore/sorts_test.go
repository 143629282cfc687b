package sqlstore_test

import (
	"testing"

	"github.com/fleetd/fleet"
)

// TestFinalStatusesSortFirst guards migration 0009: its sort indexes hold
// the device actions whose action_status sorts before 'Initiated', which
// must be exactly the final ones.
func TestFinalStatusesSortFirst(t *testing.T) {
	for _, s := range fleet.ActionStatuses {
		if got, want := string(s) < "Initiated", s.Final(); got != want {
			t.Errorf("%s sorts before Initiated: %v, but Final() is %v", s, got, want)
		}
	}
}
