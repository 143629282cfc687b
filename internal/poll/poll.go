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
func Until(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
