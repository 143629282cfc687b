package fleet

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

// TestValidName holds validName to the regular expressions of the rules
// it replaced, over names made to sit on their edges: every byte value,
// the empty name and names one byte too long.
func TestValidName(t *testing.T) {
	for _, rule := range []struct {
		max   int
		extra string
		re    *regexp.Regexp
	}{
		{128, "._:-", regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)}, // device ids
		{128, "._-", regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)},   // streams, components
		{64, "._-", regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)},     // API keys, groups
	} {
		check := func(s string) {
			if got, want := validName(s, rule.max, rule.extra), rule.re.MatchString(s); got != want {
				t.Fatalf("validName(%q, %d, %q) = %v, the rule says %v", s, rule.max, rule.extra, got, want)
			}
		}
		check("")
		for c := 0; c < 256; c++ {
			check(string(rune(c)))
			check("a" + string([]byte{byte(c)}) + "Z")
		}
		check(strings.Repeat("a", rule.max))
		check(strings.Repeat("a", rule.max+1))
		r := rand.New(rand.NewPCG(1, 2))
		alphabet := "aZ09._:-/ \x00\xff"
		for range 10_000 {
			b := make([]byte, r.IntN(rule.max+3))
			for i := range b {
				b[i] = alphabet[r.IntN(len(alphabet))]
			}
			check(string(b))
		}
	}
}

func BenchmarkValidDeviceID(b *testing.B) {
	for range b.N {
		ValidDeviceID("sensor-0042.site:berlin")
	}
}
