package sqlstore

import (
	"testing"
	"time"
)

// TestRetryPause: however many tries the retry budget allows (a quick
// error, such as a serialization failure, may be tried hundreds of times
// in writeRetryFor), each pause is drawn below 100 ms; the bound's
// doubling must not overflow into a negative one, which rand.N refuses
// with a panic.
func TestRetryPause(t *testing.T) {
	for n := 1; n <= 1000; n++ {
		for range 20 {
			if d := retryPause(n); d < 0 || d >= 100*time.Millisecond {
				t.Fatalf("pause after try %d: %s, want in [0, 100ms)", n, d)
			}
		}
	}
}
