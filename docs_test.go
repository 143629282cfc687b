package fleet_test

import (
	"io/fs"
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
		if strings.Contains(text, sharedDir) {
			t.Errorf("%s cites %s, which is not in the repository: say what it says", p, sharedDir)
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

// Written so that this file does not match them itself.
const (
	designSection = "DESIGN" + " §"
	sharedDir     = ".." + "/shared"
)

// issueNumber finds a citation of an issue by its number (the word issue, a
// space and digits), which readers of the repository cannot look up either.
var issueNumber = regexp.MustCompile(`(?i)\bissues? #?[0-9]+`)

// TestCodeSaysWhatItCites holds the Go files to the same rule as the docs:
// their comments and help texts are read without DESIGN.md, the issues or
// the files beside the repository, so they cite none of them.
func TestCodeSaysWhatItCites(t *testing.T) {
	const advice = "link the page and section of docs/*.md, README.md or BENCHMARKS.md that says it " +
		"(for example docs/api.md#errors), or say the rule in the comment itself; if no page says it, add it to the right one"
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch {
			case d.Name() == "testdata", d.Name() == "node_modules", strings.HasPrefix(d.Name(), ".") && p != ".",
				p == filepath.Join("console", "static", "xterm"):
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(b), "\n") {
			for _, cited := range []string{designSection, sharedDir} {
				if strings.Contains(line, cited) {
					t.Errorf("%s:%d cites %q, which its readers do not have: %s", p, i+1, cited, advice)
				}
			}
			if m := issueNumber.FindString(line); m != "" {
				t.Errorf("%s:%d cites %q, which its readers cannot look up: %s", p, i+1, m, advice)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
