package fleet_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocsSayWhatTheyCite: the documentation is read without DESIGN.md,
// which is not in the repository, so it cites none of its sections; and a
// page that names the ten original endpoints by number (S1 to S10) links
// docs/api.md, which says what they are.
func TestDocsSayWhatTheyCite(t *testing.T) {
	pages, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, "README.md", "BENCHMARKS.md")
	endpoint := regexp.MustCompile(`\bS([1-9]|10)\b`)
	const definition = "api.md#the-ten-original-endpoints-s1s10"
	for _, p := range pages {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		if strings.Contains(text, "DESIGN") {
			t.Errorf("%s cites DESIGN, which its readers do not have: say what it says", p)
		}
		// api.md defines them; README's one "S9" is in its layout, which
		// sends the reader to docs/api.md.
		if p == "docs/api.md" || p == "README.md" {
			continue
		}
		if loc := endpoint.FindStringIndex(text); loc != nil && !strings.Contains(text, definition) {
			t.Errorf("%s names %s without a link to %s", p, text[loc[0]:loc[1]], definition)
		}
	}
}
