package relay

import (
	"testing"
	"time"
)

// SetEndPause makes each session's end wait d before it is recorded,
// until t ends: what a slow database would do, widened.
func SetEndPause(t *testing.T, d time.Duration) {
	old := endPause.Swap(int64(d))
	t.Cleanup(func() { endPause.Store(old) })
}
