package fleethttp_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	fleethttp "github.com/fleetd/fleet/http"
)

// lintDir holds the pinned OpenAPI linter (@redocly/cli) and its
// configuration, installed by `npm ci --prefix http/testdata/openapi-lint`
// (.ci/run does it).
const lintDir = "testdata/openapi-lint"

// TestOpenAPILint runs a standard OpenAPI linter, Redocly's, with its
// recommended rules on the document fleetd serves: what client generators
// and API portals read must be valid, not merely accepted by our own
// validator.
func TestOpenAPILint(t *testing.T) {
	redocly, err := filepath.Abs(filepath.Join(lintDir, "node_modules", ".bin", "redocly"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(redocly); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("the OpenAPI linter is missing: run npm ci --prefix http/%s (%v)", lintDir, err)
		}
		t.Skipf("the OpenAPI linter is not installed; run npm ci --prefix http/%s", lintDir)
	}
	if _, err := exec.LookPath("node"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("node is missing: %v", err)
		}
		t.Skipf("node is not installed: %v", err)
	}
	rec := httptest.NewRecorder()
	(&fleethttp.Server{}).Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/v1/openapi.json", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /api/v1/openapi.json: %d", rec.Code)
	}
	doc := filepath.Join(t.TempDir(), "openapi.json")
	if err := os.WriteFile(doc, rec.Body.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	lint := func(format string) ([]byte, error) {
		cmd := exec.Command(redocly, "lint", "--config", filepath.Join(lintDir, "redocly.yaml"), "--max-problems", "1000", "--format", format, doc)
		cmd.Stderr = nil // Node's deprecation banners
		return cmd.Output()
	}
	out, err := lint("json")
	var report struct {
		Totals struct{ Errors, Warnings int }
	}
	if jerr := json.Unmarshal(out, &report); jerr != nil {
		t.Fatalf("redocly lint: %v, %v\n%s", err, jerr, out)
	}
	// Warnings fail too: the recommended rules warn of what a reader of
	// the document would trip on.
	if report.Totals.Errors+report.Totals.Warnings > 0 {
		readable, _ := lint("stylish")
		t.Fatalf("redocly lint: %d errors, %d warnings:\n%s", report.Totals.Errors, report.Totals.Warnings, readable)
	}
}
