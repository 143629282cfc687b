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

// TestNextLinkDeclared: the cursor-paged reads declare their Link header
// in the document, and only they.
func TestNextLinkDeclared(t *testing.T) {
	paged := map[string]bool{"/api/v1/devices/{id}/streams/{stream}/points": true, "/api/v1/devices/{id}/logs": true}
	for path, ops := range (&Server{}).openAPI()["paths"].(map[string]any) {
		for method, o := range ops.(map[string]any) {
			ok, _ := o.(map[string]any)["responses"].(map[string]any)["200"].(map[string]any)
			headers, _ := ok["headers"].(map[string]any)
			if _, has := headers["Link"]; has != (paged[path] && method == "get") {
				t.Errorf("%s %s: the 200 declares Link: %v", method, path, has)
			}
		}
	}
}
