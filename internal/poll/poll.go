// Package poll waits in tests for what a system under test does in the
// background, with a deadline that fails the test saying what it waited
// for, rather than hanging until go test's own timeout.
package poll

import (
	"testing"
	"time"
)

// Until calls cond until it holds, and fails the test if it has not held
// within d. what names the condition in the failure.
//
// It looks again after 5 ms, then twice as long each time up to 50 ms: a
// condition that soon holds is seen soon, and one that takes seconds is
// not asked for hundreds of times a second (conditions that ask fleetd's
// API would otherwise meet its rate limit of a key's requests).
func Until(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	wait := 5 * time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s", d, what)
		}
		time.Sleep(wait)
		wait = min(2*wait, 50*time.Millisecond)
	}
}
