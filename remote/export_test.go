package remote

import (
	"testing"
	"time"
)

// SetWriteTimeout shortens the time a write (and a spliced message's
// bytes) has, until t ends.
func SetWriteTimeout(t *testing.T, d time.Duration) {
	old := writeTimeoutNanos.Swap(int64(d))
	t.Cleanup(func() { writeTimeoutNanos.Store(old) })
}
