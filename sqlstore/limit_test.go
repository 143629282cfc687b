package sqlstore

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestLimitSteps checks pageLimit's and batchLimit's steps: at or above
// (below) n, few for every page size a client may ask, and the usual sizes
// exact.
func TestLimitSteps(t *testing.T) {
	pages, batches := map[int]bool{}, map[int]bool{}
	for n := 1; n <= 1000; n++ {
		p, b := pageLimit(n), batchLimit(n)
		if p < n || p > 5*n/2 {
			t.Errorf("pageLimit(%d) = %d", n, p)
		}
		if b > n || b < (2*n+4)/5 {
			t.Errorf("batchLimit(%d) = %d", n, b)
		}
		pages[p], batches[b] = true, true
	}
	if len(pages) > 10 || len(batches) > 10 {
		t.Errorf("pages of 1 to 1000 take %d LIMITs, batches %d; want at most 10", len(pages), len(batches))
	}
	for _, n := range []int{1, 10, 20, 50, 100, 1000} {
		if pageLimit(n) != n || batchLimit(n) != n {
			t.Errorf("a page of %d is read with LIMIT %d, a batch with %d", n, pageLimit(n), batchLimit(n))
		}
	}
	for _, n := range []int{0, -1, -1000} {
		if pageLimit(n) != 0 || batchLimit(n) != 0 || limitClause(n) != " LIMIT 0" {
			t.Errorf("%d: pageLimit %d, batchLimit %d, %q", n, pageLimit(n), batchLimit(n), limitClause(n))
		}
	}
	if got := limitClause(4000); got != " LIMIT 4000" {
		t.Errorf("limitClause(4000) = %q", got)
	}
}

// TestLimitsAreInText reads sqlstore's statements and fails on a LIMIT
// that is a parameter, or that is not a number written in the literal or
// by limitClause (from an int): SQLite re-prepares a statement whose LIMIT
// is bound at every run (limitClause).
func TestLimitsAreInText(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	// In upper case, as every statement here writes it: not a word of a
	// message.
	limit := regexp.MustCompile(`\bLIMIT\b`)
	literal := regexp.MustCompile(`^LIMIT\s+[0-9]+\b`)
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil {
				t.Fatalf("%s: %v", fset.Position(lit.Pos()), err)
			}
			for _, at := range limit.FindAllStringIndex(s, -1) {
				checked++
				if literal.MatchString(s[at[0]:]) {
					continue
				}
				if name == "limit.go" && s == " LIMIT " {
					continue // limitClause's own
				}
				t.Errorf("%s: a LIMIT not written by limitClause: %q", fset.Position(lit.Pos()), s[at[0]:min(len(s), at[0]+30)])
			}
			return true
		})
	}
	if checked < 5 {
		t.Fatalf("only %d LIMITs found in sqlstore's statements: the test does not see them", checked)
	}
}
