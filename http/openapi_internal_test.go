package fleethttp

import "testing"

// TestErrorCodesDescription pins the description the status table makes:
// the same words as when it was written by hand.
func TestErrorCodesDescription(t *testing.T) {
	want := "An error: invalid (400), unauthenticated (401), forbidden (403), not_found (404), method_not_allowed (405), conflict (409), gone (410, DDI feedback on a finished action), too_large (413), unsupported_media_type (415), range_not_satisfiable (416, artifact downloads), rate_limited (429), internal (500), unavailable (503)."
	if got := errorCodesDescription(); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}
