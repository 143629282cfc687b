package codec

import (
	"strconv"
	"strings"
)

// Negotiate picks the response format for an Accept header (RFC 9110
// §12.5.1). Each format takes the q-value of the most specific media range
// that matches it; the highest q wins, then the more specific range, then
// the one listed first, then JSON. q=0 excludes a format. An empty or
// malformed header, or one that accepts none of the four, gives JSON.
func Negotiate(accept string) Format {
	if strings.TrimSpace(accept) == "" {
		return JSON
	}
	type match struct {
		q     int // thousandths, so that comparisons are exact
		spec  int // 0 for */*, 1 for type/*, 2 for type/subtype
		index int
		ok    bool
	}
	var best [4]match
	for index, r := range strings.Split(accept, ",") {
		if strings.TrimSpace(r) == "" {
			continue // RFC 9110 allows empty list elements
		}
		typ, sub, q, ok := parseMediaRange(r)
		if !ok {
			return JSON
		}
		spec := 2
		switch {
		case typ == "*" && sub == "*":
			spec = 0
		case sub == "*":
			spec = 1
		case typ == "*":
			return JSON // "*/json" is not a media range
		}
		for _, f := range Formats {
			ft, fs, _ := strings.Cut(f.ContentType(), "/")
			if spec >= 1 && typ != ft || spec == 2 && sub != fs {
				continue
			}
			if m := &best[f]; !m.ok || spec > m.spec {
				*m = match{q: q, spec: spec, index: index, ok: true}
			}
		}
	}
	chosen, found := JSON, false
	for _, f := range Formats {
		m := best[f]
		if !m.ok || m.q == 0 {
			continue
		}
		c := best[chosen]
		if !found || m.q > c.q || m.q == c.q && (m.spec > c.spec || m.spec == c.spec && m.index < c.index) {
			chosen, found = f, true
		}
	}
	return chosen
}

// parseMediaRange splits one element of an Accept header into its
// lower-cased type and subtype and its weight in thousandths.
func parseMediaRange(r string) (typ, sub string, q int, ok bool) {
	params := strings.Split(r, ";")
	typ, sub, ok = strings.Cut(strings.ToLower(strings.TrimSpace(params[0])), "/")
	if !ok || !isToken(typ) || !isToken(sub) {
		return "", "", 0, false
	}
	q = 1000
	for _, p := range params[1:] {
		name, value, ok := strings.Cut(strings.TrimSpace(p), "=")
		if !ok {
			return "", "", 0, false
		}
		if !strings.EqualFold(strings.TrimSpace(name), "q") {
			continue
		}
		q, ok = parseQValue(strings.TrimSpace(value))
		if !ok {
			return "", "", 0, false
		}
	}
	return typ, sub, q, true
}

// parseQValue parses RFC 9110's qvalue: 0 to 1 with at most three decimals.
func parseQValue(s string) (int, bool) {
	whole, frac, _ := strings.Cut(s, ".")
	if (whole != "0" && whole != "1") || len(frac) > 3 {
		return 0, false
	}
	q := 0
	if frac != "" {
		n, err := strconv.Atoi(frac)
		if err != nil || frac[0] == '+' || frac[0] == '-' {
			return 0, false
		}
		for i := len(frac); i < 3; i++ {
			n *= 10
		}
		q = n
	}
	if whole == "1" {
		if q != 0 {
			return 0, false
		}
		q = 1000
	}
	return q, true
}

func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`()<>@,;:\"/[]?={}`, c) >= 0 {
			return false
		}
	}
	return true
}
