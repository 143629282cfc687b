package codec

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// ReadEDN reads an EDN body (github.com/edn-format/edn) in full fidelity:
// lists, vectors, maps, sets, keywords, symbols, characters, integers with
// N, decimals with M, #inst, #uuid, ##NaN and the infinities, #_ discards,
// comments and commas. Other tags are returned as Tagged. As Clojure's
// reader does, it refuses duplicate map keys and set members. Errors are
// EINVALID with the line and column.
func ReadEDN(b []byte) (any, error) {
	return readEDN(b, Limits{})
}

func readEDN(b []byte, l Limits) (any, error) {
	r := ednReader{data: b, counter: counter{limits: l}}
	if err := r.skip(); err != nil {
		return nil, err
	}
	if r.pos >= len(b) {
		return nil, r.errorf(r.pos, "the body holds no value")
	}
	v, err := r.form()
	if err != nil {
		return nil, err
	}
	if err := r.skip(); err != nil {
		return nil, err
	}
	if r.pos < len(b) {
		return nil, r.errorf(r.pos, "unexpected data after the value")
	}
	return v, nil
}

type ednReader struct {
	data  []byte
	pos   int
	depth int
	counter
}

func (r *ednReader) errorf(off int, format string, args ...any) error {
	line, col := textPosition(r.data, off)
	return invalidf("invalid EDN body at line %d, column %d: %s", line, col, fmt.Sprintf(format, args...))
}

// count counts n more elements of the collection of kind that starts at
// off and now holds length (counter.count).
func (r *ednReader) count(off int, kind string, length, n int) error {
	return r.counter.count("EDN", kind, func() string {
		line, col := textPosition(r.data, off)
		return fmt.Sprintf("line %d, column %d", line, col)
	}, length, n)
}

func (r *ednReader) at(off int, err error) error {
	var te errTransit
	if errors.As(err, &te) {
		return r.errorf(off, "%s", string(te))
	}
	return err
}

func isEDNSpace(c byte) bool {
	return c == ' ' || c == ',' || c == '\n' || c == '\t' || c == '\r' || c == '\f'
}

// isDelimiter reports whether c ends a token: whitespace or a character
// that Clojure's reader treats as a terminating macro.
func isDelimiter(c byte) bool {
	return isEDNSpace(c) || strings.IndexByte("\";()[]{}\\@^`~", c) >= 0
}

// skip passes whitespace, commas, comments and #_ discarded forms.
func (r *ednReader) skip() error {
	for r.pos < len(r.data) {
		c := r.data[r.pos]
		switch {
		case isEDNSpace(c):
			r.pos++
		case c == ';':
			for r.pos < len(r.data) && r.data[r.pos] != '\n' {
				r.pos++
			}
		case c == '#' && r.pos+1 < len(r.data) && r.data[r.pos+1] == '_':
			off := r.pos
			r.pos += 2
			if err := r.skip(); err != nil {
				return err
			}
			if r.pos >= len(r.data) || strings.IndexByte(")]}", r.data[r.pos]) >= 0 {
				return r.errorf(off, "#_ must be followed by a value to discard")
			}
			if _, err := r.form(); err != nil {
				return err
			}
		default:
			return nil
		}
	}
	return nil
}

// token returns the run of characters up to the next delimiter.
func (r *ednReader) token() string {
	start := r.pos
	for r.pos < len(r.data) && !isDelimiter(r.data[r.pos]) {
		r.pos++
	}
	return string(r.data[start:r.pos])
}

// form reads one value; the caller has skipped what comes before it.
func (r *ednReader) form() (any, error) {
	off := r.pos
	if off >= len(r.data) {
		return nil, r.errorf(off, "unexpected end of body, expected a value")
	}
	c := r.data[off]
	switch c {
	case '(':
		a, err := r.seq(')')
		return List(a), err
	case '[':
		return r.seq(']')
	case '{':
		return r.mapForm()
	case ')', ']', '}':
		return nil, r.errorf(off, "unmatched %q", c)
	case '"':
		return r.str()
	case '\\':
		return r.char()
	case '#':
		return r.dispatch()
	case ':':
		r.pos++
		tok := r.token()
		if !validSymbol(tok) || strings.HasPrefix(tok, ":") {
			return nil, r.errorf(off, "%q is not a valid keyword", ":"+tok)
		}
		return Keyword(tok), nil
	}
	if c >= '0' && c <= '9' || (c == '+' || c == '-') && off+1 < len(r.data) && r.data[off+1] >= '0' && r.data[off+1] <= '9' {
		return r.number()
	}
	if c >= utf8.RuneSelf || !isDelimiter(c) {
		tok := r.token()
		switch tok {
		case "nil":
			return nil, nil
		case "true":
			return true, nil
		case "false":
			return false, nil
		}
		if !validSymbol(tok) {
			return nil, r.errorf(off, "%q is not a valid symbol", tok)
		}
		return Symbol(tok), nil
	}
	return nil, r.errorf(off, "unexpected %q", c)
}

// validSymbol applies EDN's rules to a symbol or a keyword without its
// colon: a name, or a namespace and a name around one "/", none starting
// with a digit (nor with +, - or . followed by one), and "/" alone.
func validSymbol(s string) bool {
	if s == "/" {
		return true
	}
	ns, name, qualified := strings.Cut(s, "/")
	if qualified {
		return validSymbolPart(ns) && validSymbolPart(name) && name != ""
	}
	return validSymbolPart(s)
}

func validSymbolPart(s string) bool {
	if s == "" || strings.ContainsRune(s, '/') {
		return false
	}
	for i, r := range s {
		switch {
		case unicode.IsLetter(r), strings.ContainsRune(".*+!-_?$%&=<>", r):
		case unicode.IsDigit(r), r == ':' || r == '#' || r == '\'':
			if i == 0 {
				return false
			}
		default:
			return false
		}
	}
	if c := s[0]; (c == '-' || c == '+' || c == '.') && len(s) > 1 && s[1] >= '0' && s[1] <= '9' {
		return false
	}
	return true
}

// enter counts one level of nesting and refuses to go past MaxDepth.
func (r *ednReader) enter() error {
	r.depth++
	if r.depth > MaxDepth {
		return r.errorf(r.pos, "nesting deeper than %d levels", MaxDepth)
	}
	return nil
}

// seq reads the forms of a list, vector or set up to end.
func (r *ednReader) seq(end byte) ([]any, error) {
	open := r.pos
	if err := r.enter(); err != nil {
		return nil, err
	}
	r.pos++
	if end == '}' {
		r.pos++ // "#{"
	}
	a := []any{}
	for {
		if err := r.skip(); err != nil {
			return nil, err
		}
		if r.pos >= len(r.data) {
			return nil, r.errorf(open, "%q is never closed", r.data[open])
		}
		if r.data[r.pos] == end {
			r.pos++
			r.depth--
			return a, nil
		}
		if err := r.count(open, map[byte]string{')': "list", ']': "vector", '}': "set"}[end], len(a)+1, 1); err != nil {
			return nil, err
		}
		v, err := r.form()
		if err != nil {
			return nil, err
		}
		a = append(a, v)
	}
}

func (r *ednReader) mapForm() (any, error) {
	open := r.pos
	if err := r.enter(); err != nil {
		return nil, err
	}
	r.pos++
	m := &Map{}
	var seen distinct
	for {
		if err := r.skip(); err != nil {
			return nil, err
		}
		if r.pos >= len(r.data) {
			return nil, r.errorf(open, "'{' is never closed")
		}
		if r.data[r.pos] == '}' {
			r.pos++
			r.depth--
			return m, nil
		}
		if err := r.count(open, "map", len(m.Entries)+1, 1); err != nil {
			return nil, err
		}
		off := r.pos
		k, err := r.form()
		if err != nil {
			return nil, err
		}
		if !seen.add(k) {
			return nil, r.errorf(off, "duplicate map key %s", describeValue(k))
		}
		if err := r.skip(); err != nil {
			return nil, err
		}
		if r.pos >= len(r.data) || r.data[r.pos] == '}' {
			return nil, r.errorf(off, "map key %s has no value", describeValue(k))
		}
		v, err := r.form()
		if err != nil {
			return nil, err
		}
		m.Entries = append(m.Entries, KV{k, v})
	}
}

// dispatch reads what starts with '#': a set, a tagged value or a
// symbolic value (##NaN). #_ has been handled by skip.
func (r *ednReader) dispatch() (any, error) {
	off := r.pos
	if off+1 >= len(r.data) {
		return nil, r.errorf(off, "'#' must be followed by a tag, '{' or '#'")
	}
	switch c := r.data[off+1]; {
	case c == '{':
		a, err := r.seq('}')
		if err != nil {
			return nil, err
		}
		var seen distinct
		for _, x := range a {
			if !seen.add(x) {
				return nil, r.errorf(off, "duplicate set member %s", describeValue(x))
			}
		}
		return Set(a), nil
	case c == '#':
		r.pos += 2
		switch tok := r.token(); tok {
		case "NaN":
			return math.NaN(), nil
		case "Inf":
			return math.Inf(1), nil
		case "-Inf":
			return math.Inf(-1), nil
		default:
			return nil, r.errorf(off, "##%s is not a symbolic value (##NaN, ##Inf, ##-Inf)", tok)
		}
	case c == ':':
		return r.namespacedMap()
	case c < utf8.RuneSelf && !unicode.IsLetter(rune(c)):
		return nil, r.errorf(off, "#%c is Clojure syntax, not EDN", c)
	}
	r.pos++
	tag := r.token()
	if !validSymbol(tag) {
		return nil, r.errorf(off, "%q is not a valid tag", "#"+tag)
	}
	if err := r.skip(); err != nil {
		return nil, err
	}
	if r.pos >= len(r.data) || strings.IndexByte(")]}", r.data[r.pos]) >= 0 {
		return nil, r.errorf(off, "tag #%s must be followed by a value", tag)
	}
	valOff := r.pos
	v, err := r.form()
	if err != nil {
		return nil, err
	}
	switch tag {
	case "inst", "uuid":
		s, ok := v.(string)
		if !ok {
			return nil, r.errorf(valOff, "#%s must be followed by a string", tag)
		}
		if tag == "inst" {
			v, err = parseInstant(s)
		} else {
			v, err = parseUUID(s)
		}
		return v, r.at(valOff, err)
	case "object":
		// How Clojure prints a java.net.URI: #object[java.net.URI 0x… "…"].
		if a, ok := v.([]any); ok && len(a) == 3 && a[0] == Symbol("java.net.URI") {
			if s, ok := a[2].(string); ok {
				return URI(s), nil
			}
		}
	}
	return Tagged{Tag: tag, Value: v}, nil
}

// namespacedMap reads #:ns{…} as Clojure's readers do (clojure.edn and
// clojure.core alike; Clojure's printer writes it for any map whose keys
// share a namespace): a keyword or symbol key without a namespace takes
// ns, one in the namespace _ loses it, any other key stays as it is; keys
// equal once qualified are duplicates. #::{…} and #::alias{…} take their
// namespace from the reader's current one, which a body does not have;
// clojure.edn refuses them too.
func (r *ednReader) namespacedMap() (any, error) {
	off := r.pos
	r.pos += 2
	if r.pos < len(r.data) && r.data[r.pos] == ':' {
		return nil, r.errorf(off, "#::{…} takes the namespace of the code that reads it, which a request body has none of: name it, as in #:firmware{:version \"2.3.0\"}")
	}
	if err := r.skip(); err != nil {
		return nil, err
	}
	ns := r.token()
	if !validSymbolPart(ns) || ns == "nil" || ns == "true" || ns == "false" {
		return nil, r.errorf(off, "a namespaced map must name a namespace without a slash, as in #:firmware{:version \"2.3.0\"}, not %q", ns)
	}
	for r.pos < len(r.data) && isEDNSpace(r.data[r.pos]) {
		r.pos++
	}
	if r.pos >= len(r.data) || r.data[r.pos] != '{' {
		return nil, r.errorf(off, "#:%s must be followed by a map", ns)
	}
	v, err := r.mapForm()
	if err != nil {
		return nil, err
	}
	m := v.(*Map)
	var seen distinct
	for i, e := range m.Entries {
		var name string
		switch k := e.Key.(type) {
		case Keyword:
			name = string(k)
		case Symbol:
			name = string(k)
		}
		if name == "/" {
			return nil, r.errorf(off, "the symbol / cannot be a key of namespaced map #:%s", ns)
		}
		if name != "" {
			keyNS, local, qualified := strings.Cut(name, "/")
			switch {
			case !qualified:
				name = ns + "/" + name
			case keyNS == "_":
				name = local
			}
			if _, ok := e.Key.(Keyword); ok {
				m.Entries[i].Key = Keyword(name)
			} else {
				m.Entries[i].Key = Symbol(name)
			}
		}
		if !seen.add(m.Entries[i].Key) {
			return nil, r.errorf(off, "duplicate map key %s in #:%s{…}", describeValue(m.Entries[i].Key), ns)
		}
	}
	return m, nil
}

// number reads an integer (with N for a big one) or a decimal (with M for
// a BigDecimal), as the EDN spec writes them.
func (r *ednReader) number() (any, error) {
	off := r.pos
	tok := r.token()
	bad := func() (any, error) {
		if strings.ContainsRune(tok, '/') {
			return nil, r.errorf(off, "ratio %s is not EDN", tok)
		}
		return nil, r.errorf(off, "%q is not a valid number", tok)
	}
	s := tok
	sign := ""
	if s[0] == '+' || s[0] == '-' {
		sign, s = s[:1], s[1:]
	}
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	if i == 0 || s[0] == '0' && i > 1 {
		return bad()
	}
	digits, rest := s[:i], s[i:]
	if sign == "+" {
		sign = ""
	}
	if digits == "0" && len(rest) > 1 && (rest[0] == 'x' || rest[0] == 'X') {
		// Not EDN but Clojure, which prints object identities in hex:
		// #object[java.net.URI 0x15e0fe05 "…"].
		b, ok := new(big.Int).SetString(sign+strings.TrimSuffix(rest[1:], "N"), 16)
		if !ok || strings.ContainsAny(rest[1:], "+-_") {
			return bad()
		}
		if b.IsInt64() && !strings.HasSuffix(rest, "N") {
			return b.Int64(), nil
		}
		return b, nil
	}
	switch rest {
	case "":
		if n, err := strconv.ParseInt(sign+digits, 10, 64); err == nil {
			return n, nil
		}
		b, _ := new(big.Int).SetString(sign+digits, 10)
		return b, nil
	case "N":
		b, _ := new(big.Int).SetString(sign+digits, 10)
		return b, nil
	}
	dec := strings.TrimSuffix(rest, "M")
	isBig := len(dec) < len(rest)
	frac, exp := dec, ""
	if e := strings.IndexAny(dec, "eE"); e >= 0 {
		frac, exp = dec[:e], dec[e+1:]
		exp = strings.TrimPrefix(strings.TrimPrefix(exp, "+"), "-")
		if exp == "" || strings.Trim(exp, "0123456789") != "" {
			return bad()
		}
	}
	if frac != "" && (frac[0] != '.' || strings.Trim(frac[1:], "0123456789") != "") {
		return bad()
	}
	text := sign + digits + dec
	if isBig {
		return BigDecimal(text), nil
	}
	f, err := strconv.ParseFloat(text, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return bad()
	}
	return f, nil
}

// str reads a string with EDN's escapes and Clojure's \b, \f, \uXXXX and
// octal ones.
func (r *ednReader) str() (any, error) {
	open := r.pos
	r.pos++
	var b strings.Builder
	start := r.pos
	for r.pos < len(r.data) {
		c := r.data[r.pos]
		switch {
		case c == '"':
			b.Write(r.data[start:r.pos])
			r.pos++
			return b.String(), nil
		case c == '\\':
			b.Write(r.data[start:r.pos])
			if err := r.escape(&b); err != nil {
				return nil, err
			}
			start = r.pos
		case c < utf8.RuneSelf:
			r.pos++
		default:
			rn, size := utf8.DecodeRune(r.data[r.pos:])
			if rn == utf8.RuneError && size == 1 {
				return nil, r.errorf(r.pos, "invalid UTF-8 in a string")
			}
			r.pos += size
		}
	}
	return nil, r.errorf(open, "string is not terminated")
}

func (r *ednReader) escape(b *strings.Builder) error {
	off := r.pos
	if r.pos+1 >= len(r.data) {
		return r.errorf(off, "string is not terminated")
	}
	c := r.data[r.pos+1]
	r.pos += 2
	switch c {
	case 't':
		b.WriteByte('\t')
	case 'r':
		b.WriteByte('\r')
	case 'n':
		b.WriteByte('\n')
	case '\\', '"':
		b.WriteByte(c)
	case 'b':
		b.WriteByte('\b')
	case 'f':
		b.WriteByte('\f')
	case 'u':
		rn, ok := hex4(r.data, r.pos)
		if !ok {
			return r.errorf(off, `\u must be followed by four hex digits`)
		}
		r.pos += 4
		if utf16.IsSurrogate(rn) {
			lo, ok := rune(0), false
			if rn < 0xdc00 && r.pos+6 <= len(r.data) && r.data[r.pos] == '\\' && r.data[r.pos+1] == 'u' {
				lo, ok = hex4(r.data, r.pos+2)
			}
			rn = utf16.DecodeRune(rn, lo)
			if !ok || rn == utf8.RuneError {
				return r.errorf(off, "lone UTF-16 surrogate escape")
			}
			r.pos += 6
		}
		b.WriteRune(rn)
	default:
		if c >= '0' && c <= '7' {
			n, i := 0, r.pos-1
			for ; i < len(r.data) && i < r.pos+2 && r.data[i] >= '0' && r.data[i] <= '7'; i++ {
				n = n*8 + int(r.data[i]-'0')
			}
			if n > 0377 {
				return r.errorf(off, "octal escape must be at most \\377")
			}
			r.pos = i
			b.WriteRune(rune(n))
			return nil
		}
		return r.errorf(off, "invalid escape \\%c in a string", c)
	}
	return nil
}

// char reads a character literal: \c, \newline, \uXXXX and the like.
func (r *ednReader) char() (any, error) {
	off := r.pos
	r.pos++
	if r.pos >= len(r.data) {
		return nil, r.errorf(off, "'\\' must be followed by a character")
	}
	first, size := utf8.DecodeRune(r.data[r.pos:])
	if first == utf8.RuneError && size == 1 {
		return nil, r.errorf(r.pos, "invalid UTF-8 in a character")
	}
	r.pos += size
	tok := string(r.data[off+1:r.pos]) + r.token()
	if utf8.RuneCountInString(tok) == 1 {
		return Char(first), nil
	}
	switch tok {
	case "newline":
		return Char('\n'), nil
	case "return":
		return Char('\r'), nil
	case "space":
		return Char(' '), nil
	case "tab":
		return Char('\t'), nil
	case "formfeed":
		return Char('\f'), nil
	case "backspace":
		return Char('\b'), nil
	}
	if len(tok) == 5 && tok[0] == 'u' {
		if rn, ok := hex4([]byte(tok), 1); ok && !utf16.IsSurrogate(rn) {
			return Char(rn), nil
		}
	}
	if len(tok) >= 2 && len(tok) <= 4 && tok[0] == 'o' {
		if n, err := strconv.ParseUint(tok[1:], 8, 16); err == nil && n <= 0377 {
			return Char(rune(n)), nil
		}
	}
	return nil, r.errorf(off, "%q is not a valid character", "\\"+tok)
}
