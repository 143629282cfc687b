package codec

import (
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// Transit (cognitect/transit-format, README.md) is read in two layers: a
// syntax reader for JSON or MessagePack that meets strings, arrays and maps
// in stream order, and transitDecoder, which both share, for what those
// mean: the cache, the ~ escapes and tags, "^ " maps and tagged values.

// The read and write caches hold 44² entries, with codes of one or two
// digits from '0' (48) upwards after "^"; every implementation uses these,
// whatever the README's older 94-digit text says.
const (
	cacheDigits     = 44
	cacheBase       = 48
	cacheSize       = cacheDigits * cacheDigits
	minCacheableLen = 4
)

// cacheable reports whether a string is cached when read or written: map
// keys, keywords, symbols and tags longer than three characters.
func cacheable(s string, asKey bool) bool {
	return len(s) >= minCacheableLen && (asKey || s[0] == '~' && (s[1] == ':' || s[1] == '$' || s[1] == '#'))
}

// transitTag is a "~#tag" string: it means something only as the first of a
// two-element array or the only key of a map.
type transitTag string

// mapMarker is "^ ", which starts an array that is a map.
const mapMarker = "^ "

// transitDecoder holds the read cache of one body.
type transitDecoder struct {
	cache []any
}

// errTransit is a problem of meaning, which the syntax reader locates.
type errTransit string

func (e errTransit) Error() string { return string(e) }

func transitErrorf(format string, args ...any) error {
	return errTransit(fmt.Sprintf(format, args...))
}

// readString interprets a string met in the stream: a cache code, or a
// value that is remembered if cacheable.
func (d *transitDecoder) readString(s string, asKey bool) (any, error) {
	if len(s) > 0 && s[0] == '^' && s != mapMarker {
		i, ok := cacheIndex(s)
		if !ok {
			return nil, transitErrorf("%q is not a valid cache reference", s)
		}
		if i >= len(d.cache) {
			return nil, transitErrorf("cache reference %q was never defined", s)
		}
		return d.cache[i], nil
	}
	v, err := parseTransitString(s)
	if err != nil {
		return nil, err
	}
	if cacheable(s, asKey) {
		if len(d.cache) == cacheSize {
			d.cache = d.cache[:0]
		}
		d.cache = append(d.cache, v)
	}
	return v, nil
}

func cacheIndex(s string) (int, bool) {
	digit := func(c byte) (int, bool) {
		return int(c) - cacheBase, c >= cacheBase && c < cacheBase+cacheDigits
	}
	switch len(s) {
	case 2:
		return digit(s[1])
	case 3:
		hi, ok1 := digit(s[1])
		lo, ok2 := digit(s[2])
		return hi*cacheDigits + lo, ok1 && ok2
	}
	return 0, false
}

// parseTransitString decodes the ~ forms of a string. As in transit-java,
// a one-character string is itself, and "~" before an unknown letter makes
// a Tagged value for Canonical to refuse.
func parseTransitString(s string) (any, error) {
	if len(s) < 2 {
		if s == "^" {
			return nil, transitErrorf(`"^" is not a valid cache reference`)
		}
		return s, nil
	}
	switch s[0] {
	case '~':
		switch s[1] {
		case '~', '^', '`':
			return s[1:], nil
		case '#':
			return transitTag(s[2:]), nil
		}
		return decodeTransitScalar(s[1], s[2:])
	case '^':
		if s == mapMarker {
			return nil, transitErrorf(`"^ " may only start an array`)
		}
	}
	return s, nil
}

// decodeTransitScalar decodes the string form "~" + tag + rep.
func decodeTransitScalar(tag byte, rep string) (any, error) {
	switch tag {
	case '_':
		return nil, nil
	case 's':
		return rep, nil
	case '?':
		switch rep {
		case "t":
			return true, nil
		case "f":
			return false, nil
		}
		return nil, transitErrorf("boolean %q must be ~?t or ~?f", "~?"+rep)
	case 'i':
		if i, err := strconv.ParseInt(rep, 10, 64); err == nil {
			return i, nil
		}
		return parseBigInt(rep)
	case 'n':
		return parseBigInt(rep)
	case 'd':
		f, err := strconv.ParseFloat(rep, 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) || strings.ContainsAny(rep, "_xXpPnNiI") {
			return nil, transitErrorf("%q is not a decimal", rep)
		}
		return f, nil
	case 'f':
		if !isDecimal(rep) {
			return nil, transitErrorf("%q is not a big decimal", rep)
		}
		return BigDecimal(rep), nil
	case 'b':
		b, err := base64.StdEncoding.DecodeString(rep)
		if err != nil {
			if b, err = base64.RawStdEncoding.DecodeString(rep); err != nil {
				return nil, transitErrorf("binary value is not valid base64")
			}
		}
		return b, nil
	case ':':
		return Keyword(rep), nil
	case '$':
		return Symbol(rep), nil
	case 'm':
		ms, err := strconv.ParseInt(rep, 10, 64)
		if err != nil {
			return nil, transitErrorf("time %q must be milliseconds since 1970", rep)
		}
		return instant(time.UnixMilli(ms))
	case 't':
		return parseInstant(rep)
	case 'u':
		return parseUUID(rep)
	case 'r':
		return URI(rep), nil
	case 'c':
		r, size := utf8.DecodeRuneInString(rep)
		if size == 0 || size != len(rep) {
			return nil, transitErrorf("character %q must be one character", rep)
		}
		return Char(r), nil
	case 'z':
		switch rep {
		case "NaN":
			return math.NaN(), nil
		case "INF":
			return math.Inf(1), nil
		case "-INF":
			return math.Inf(-1), nil
		}
		return nil, transitErrorf("%q is not a special number (NaN, INF, -INF)", rep)
	}
	return Tagged{Tag: string(tag), Value: rep}, nil
}

func parseBigInt(s string) (any, error) {
	b, ok := new(big.Int).SetString(s, 10)
	if !ok {
		return nil, transitErrorf("%q is not an integer", s)
	}
	return b, nil
}

// isDecimal reports whether s is a plain decimal number, as a BigDecimal
// holds: digits, an optional fraction and exponent.
func isDecimal(s string) bool {
	s = strings.TrimPrefix(strings.TrimPrefix(s, "-"), "+")
	mant, exp, hasExp := strings.Cut(strings.ToLower(s), "e")
	whole, frac, _ := strings.Cut(mant, ".")
	digits := func(x string) bool { return strings.Trim(x, "0123456789") == "" }
	if whole+frac == "" || !digits(whole) || !digits(frac) {
		return false
	}
	if hasExp {
		exp = strings.TrimPrefix(strings.TrimPrefix(exp, "-"), "+")
		return exp != "" && len(exp) < 10 && digits(exp)
	}
	return true
}

// parseInstant reads an RFC 3339 time, as Transit's ~t and EDN's #inst
// carry it. "-00:00" (unknown offset, which Clojure prints) means UTC.
func parseInstant(s string) (any, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return nil, transitErrorf("time %q is not RFC 3339, such as 2026-11-21T10:00:00.000Z", s)
	}
	return instant(t)
}

// instant is t as every reader returns it. Instants are of the millisecond,
// as in Transit's ~m, in Clojure's java.util.Date and everywhere in fleetd:
// finer digits are dropped. And they are in the years 0000 to 9999 in UTC,
// which RFC 3339 can write: so every format writes back what was read.
func instant(t time.Time) (any, error) {
	t = t.UTC()
	if y := t.Year(); y < 0 || y > 9999 {
		return nil, transitErrorf("time %s is outside the years 0000 to 9999 (UTC)", t.Format(time.RFC3339))
	}
	return t.Truncate(time.Millisecond), nil
}

// parseUUID accepts only the canonical 8-4-4-4-12 form.
func parseUUID(s string) (any, error) {
	u, err := uuid.Parse(s)
	if err != nil || len(s) != 36 {
		return nil, transitErrorf("%q is not a UUID", s)
	}
	return u, nil
}

// decodeTagged gives a tagged value its meaning; tags this package does
// not know stay Tagged, so that Canonical can name them.
func decodeTagged(tag string, rep any) (any, error) {
	switch tag {
	case "'":
		return rep, nil
	case "set", "list", "cmap", "ints", "longs", "floats", "doubles", "bools", "shorts", "chars":
		a, ok := rep.([]any)
		if !ok {
			return nil, transitErrorf("~#%s must be followed by an array", tag)
		}
		switch tag {
		case "set":
			var seen distinct
			for _, x := range a {
				if !seen.add(x) {
					return nil, transitErrorf("duplicate set member %s", describeValue(x))
				}
			}
			return Set(a), nil
		case "list":
			return List(a), nil
		case "cmap":
			if len(a)%2 != 0 {
				return nil, transitErrorf("~#cmap must have an even number of elements")
			}
			m := &Map{Entries: make([]KV, 0, len(a)/2)}
			var seen distinct
			for i := 0; i < len(a); i += 2 {
				if !seen.add(a[i]) {
					return nil, transitErrorf("duplicate map key %s", describeValue(a[i]))
				}
				m.Entries = append(m.Entries, KV{a[i], a[i+1]})
			}
			return m, nil
		}
		return a, nil // typed arrays are arrays
	case "m":
		switch r := rep.(type) {
		case int64:
			return instant(time.UnixMilli(r))
		case string:
			return decodeTransitScalar('m', r)
		}
		return nil, transitErrorf("~#m must be followed by milliseconds")
	case "u":
		switch r := rep.(type) {
		case string:
			return parseUUID(r)
		case []any:
			if len(r) == 2 {
				hi, ok1 := uint64Of(r[0])
				lo, ok2 := uint64Of(r[1])
				if ok1 && ok2 {
					var u uuid.UUID
					for i := 0; i < 8; i++ {
						u[i] = byte(hi >> (56 - 8*i))
						u[8+i] = byte(lo >> (56 - 8*i))
					}
					return u, nil
				}
			}
		}
		return nil, transitErrorf("~#u must be followed by a UUID string or two 64-bit integers")
	}
	if len(tag) == 1 {
		if s, ok := rep.(string); ok {
			return decodeTransitScalar(tag[0], s)
		}
	}
	if tag == "" {
		return nil, transitErrorf("empty tag \"~#\"")
	}
	return Tagged{Tag: tag, Value: rep}, nil
}

// uint64Of reads one half of a UUID: a signed 64-bit integer, or an
// unsigned one that MessagePack wrote as such.
func uint64Of(v any) (uint64, bool) {
	switch v := v.(type) {
	case int64:
		return uint64(v), true
	case *big.Int:
		if v.Sign() >= 0 && v.BitLen() <= 64 {
			return v.Uint64(), true
		}
	}
	return 0, false
}

// ReadTransitJSON reads a transit+json body, normal or verbose, in full
// fidelity. Errors are EINVALID with the line and column.
func ReadTransitJSON(b []byte) (any, error) {
	return readTransitJSON(b, Limits{})
}

func readTransitJSON(b []byte, l Limits) (any, error) {
	r := transitJSONReader{s: jsonScanner{data: b, what: "transit+json", counter: counter{limits: l}}}
	r.s.skipSpace()
	v, err := r.value(false)
	if err != nil {
		return nil, err
	}
	r.s.skipSpace()
	if r.s.pos < len(b) {
		return nil, r.s.errorf(r.s.pos, "unexpected data after the value")
	}
	return v, nil
}

type transitJSONReader struct {
	s jsonScanner
	d transitDecoder
}

// at turns a meaning error into one located at off.
func (r *transitJSONReader) at(off int, err error) error {
	var te errTransit
	if errors.As(err, &te) {
		return r.s.errorf(off, "%s", string(te))
	}
	return err
}

func (r *transitJSONReader) value(asKey bool) (any, error) {
	s := &r.s
	if s.pos >= len(s.data) {
		return nil, s.unexpected("a value")
	}
	switch c := s.data[s.pos]; {
	case c == '[':
		return r.array()
	case c == '{':
		return r.object()
	case c == '"':
		off := s.pos
		str, err := s.str()
		if err != nil {
			return nil, err
		}
		v, err := r.d.readString(str, asKey)
		if err != nil {
			return nil, r.at(off, err)
		}
		if t, ok := v.(transitTag); ok {
			return nil, s.errorf(off, "tag \"~#%s\" must start a two-element array or be the only key of a map", string(t))
		}
		return v, nil
	case c == '-' || c >= '0' && c <= '9':
		n, err := s.number()
		switch {
		case err != nil:
			return nil, err
		case n.kind == 'i':
			return n.i, nil
		case n.kind == 'f':
			return n.f, nil
		}
		return s.bigInt(n), nil
	}
	return s.literal()
}

// array reads a vector, a "^ " map or a tagged value, which the first
// element tells apart.
func (r *transitJSONReader) array() (any, error) {
	s := &r.s
	open := s.pos
	if empty, err := s.open(']'); err != nil {
		return nil, err
	} else if empty {
		return []any{}, nil
	}
	var first any
	if s.pos < len(s.data) && s.data[s.pos] == '"' {
		off := s.pos
		str, err := s.str()
		if err != nil {
			return nil, err
		}
		if str == mapMarker {
			return r.mapArray(open)
		}
		first, err = r.d.readString(str, false)
		if err != nil {
			return nil, r.at(off, err)
		}
		if tag, ok := first.(transitTag); ok {
			if err := r.comma(']'); err != nil {
				return nil, err
			}
			repOff := s.pos
			rep, err := r.value(false)
			if err != nil {
				return nil, err
			}
			if err := r.close(']', "a tagged value has exactly two elements"); err != nil {
				return nil, err
			}
			v, err := decodeTagged(string(tag), rep)
			return v, r.at(repOff, err)
		}
	} else {
		var err error
		if first, err = r.value(false); err != nil {
			return nil, err
		}
	}
	a := []any{first}
	if err := s.count(open, "array", 1, 1); err != nil {
		return nil, err
	}
	for {
		if more, err := s.next(']'); err != nil {
			return nil, err
		} else if !more {
			return a, nil
		}
		if err := s.count(open, "array", len(a)+1, 1); err != nil {
			return nil, err
		}
		v, err := r.value(false)
		if err != nil {
			return nil, err
		}
		a = append(a, v)
	}
}

// comma consumes the ',' between elements.
func (r *transitJSONReader) comma(end byte) error {
	s := &r.s
	s.skipSpace()
	if s.pos < len(s.data) && s.data[s.pos] == ',' {
		s.pos++
		s.skipSpace()
		return nil
	}
	return s.unexpected("',' or '" + string(end) + "'")
}

// close consumes the end of an array or object that must end here.
func (r *transitJSONReader) close(end byte, why string) error {
	s := &r.s
	s.skipSpace()
	if s.pos < len(s.data) && s.data[s.pos] == end {
		s.pos++
		s.depth--
		return nil
	}
	if s.pos >= len(s.data) {
		return s.unexpected("'" + string(end) + "'")
	}
	return s.errorf(s.pos, "expected '%c': %s", end, why)
}

// mapArray reads the rest of ["^ ", k, v, …].
func (r *transitJSONReader) mapArray(open int) (any, error) {
	s := &r.s
	m := &Map{}
	var seen distinct
	for {
		if more, err := s.next(']'); err != nil {
			return nil, err
		} else if !more {
			return m, nil
		}
		if err := s.count(open, "map", len(m.Entries)+1, 1); err != nil {
			return nil, err
		}
		off := s.pos
		k, err := r.value(true)
		if err != nil {
			return nil, err
		}
		if !seen.add(k) {
			return nil, s.errorf(off, "duplicate map key %s", describeValue(k))
		}
		if err := r.comma(']'); err != nil {
			return nil, err
		}
		v, err := r.value(false)
		if err != nil {
			return nil, err
		}
		m.Entries = append(m.Entries, KV{k, v})
	}
}

// object reads a JSON object: a verbose map, or {"~#tag": rep}.
func (r *transitJSONReader) object() (any, error) {
	s := &r.s
	open := s.pos
	m := &Map{}
	var seen distinct
	if empty, err := s.open('}'); err != nil {
		return nil, err
	} else if empty {
		return m, nil
	}
	for {
		str, off, err := s.key()
		if err != nil {
			return nil, err
		}
		k, err := r.d.readString(str, true)
		if err != nil {
			return nil, r.at(off, err)
		}
		if tag, ok := k.(transitTag); ok {
			if len(m.Entries) > 0 {
				return nil, s.errorf(off, "tag \"~#%s\" must be the only key of its map", string(tag))
			}
			repOff := s.pos
			rep, err := r.value(false)
			if err != nil {
				return nil, err
			}
			if err := r.close('}', "a tagged value has exactly one key"); err != nil {
				return nil, err
			}
			v, err := decodeTagged(string(tag), rep)
			return v, r.at(repOff, err)
		}
		if !seen.add(k) {
			return nil, s.errorf(off, "duplicate map key %s", describeValue(k))
		}
		if err := s.count(open, "map", len(m.Entries)+1, 1); err != nil {
			return nil, err
		}
		v, err := r.value(false)
		if err != nil {
			return nil, err
		}
		m.Entries = append(m.Entries, KV{k, v})
		if more, err := s.next('}'); err != nil {
			return nil, err
		} else if !more {
			return m, nil
		}
	}
}
