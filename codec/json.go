package codec

import (
	"fmt"
	"math"
	"math/big"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// jsonScanner reads the tokens of RFC 8259 JSON text. The strict decoder
// and the Transit JSON reader share it, so both reject the same malformed
// input with the same positions.
type jsonScanner struct {
	data    []byte
	pos     int
	depth   int
	what    string // "JSON" or "transit+json", for messages
	scratch []byte // unescaped string bytes
	stack   []any  // array elements being collected, reused across arrays
	counter
}

// errorf returns an EINVALID error located at byte offset off.
func (s *jsonScanner) errorf(off int, format string, args ...any) error {
	line, col := textPosition(s.data, off)
	return invalidf("invalid %s body at line %d, column %d: %s", s.what, line, col, fmt.Sprintf(format, args...))
}

func (s *jsonScanner) skipSpace() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// unexpected describes the byte at the current position for an error.
func (s *jsonScanner) unexpected(want string) error {
	if s.pos >= len(s.data) {
		return s.errorf(s.pos, "unexpected end of body, expected %s", want)
	}
	r, _ := utf8.DecodeRune(s.data[s.pos:])
	return s.errorf(s.pos, "unexpected %q, expected %s", r, want)
}

// count counts n more elements of the collection of kind that starts at
// off and now holds length (counter.count).
func (s *jsonScanner) count(off int, kind string, length, n int) error {
	return s.counter.count(s.what, kind, func() string {
		line, col := textPosition(s.data, off)
		return fmt.Sprintf("line %d, column %d", line, col)
	}, length, n)
}

// enter counts one level of nesting and refuses to go past MaxDepth.
func (s *jsonScanner) enter() error {
	s.depth++
	if s.depth > MaxDepth {
		return s.errorf(s.pos, "nesting deeper than %d levels", MaxDepth)
	}
	return nil
}

// literal consumes one of true, false and null.
func (s *jsonScanner) literal() (any, error) {
	for _, lit := range [...]struct {
		text string
		v    any
	}{{"true", true}, {"false", false}, {"null", nil}} {
		if len(s.data)-s.pos >= len(lit.text) && string(s.data[s.pos:s.pos+len(lit.text)]) == lit.text {
			s.pos += len(lit.text)
			return lit.v, nil
		}
	}
	return nil, s.unexpected("a value")
}

// jsonNumber is a number token: integral ones that fit int64 come as int,
// others as float or, when too large for int64, as their digits.
type jsonNumber struct {
	kind  byte // 'i' int64, 'f' float64, 'b' integer beyond int64
	i     int64
	f     float64
	start int
	end   int
}

// number consumes a number token, following RFC 8259's grammar exactly.
func (s *jsonScanner) number() (jsonNumber, error) {
	d := s.data
	start, i := s.pos, s.pos
	neg := false
	if i < len(d) && d[i] == '-' {
		neg = true
		i++
	}
	if i >= len(d) || d[i] < '0' || d[i] > '9' {
		s.pos = i
		return jsonNumber{}, s.unexpected("a digit")
	}
	// Accumulate as a negative number: its range includes math.MinInt64.
	var acc int64
	overflow := false
	if d[i] == '0' {
		i++
	} else {
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			digit := int64(d[i] - '0')
			if acc < (math.MinInt64+digit)/10 {
				overflow = true
			}
			acc = acc*10 - digit
			i++
		}
	}
	integral := true
	if i < len(d) && d[i] == '.' {
		integral = false
		i++
		if i >= len(d) || d[i] < '0' || d[i] > '9' {
			s.pos = i
			return jsonNumber{}, s.unexpected("a digit after the decimal point")
		}
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		integral = false
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if i >= len(d) || d[i] < '0' || d[i] > '9' {
			s.pos = i
			return jsonNumber{}, s.unexpected("a digit in the exponent")
		}
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
		}
	}
	s.pos = i
	n := jsonNumber{start: start, end: i}
	if integral {
		if !neg {
			if acc == math.MinInt64 {
				overflow = true
			}
			acc = -acc
		}
		if overflow {
			n.kind = 'b'
			return n, nil
		}
		n.kind, n.i = 'i', acc
		return n, nil
	}
	f, err := strconv.ParseFloat(string(d[start:i]), 64)
	if err != nil || math.IsInf(f, 0) {
		return n, s.errorf(start, "number %s is out of range", d[start:i])
	}
	n.kind, n.f = 'f', f
	return n, nil
}

// bigInt returns the value of a 'b' number.
func (s *jsonScanner) bigInt(n jsonNumber) *big.Int {
	b, _ := new(big.Int).SetString(string(s.data[n.start:n.end]), 10)
	return b
}

// str consumes a string token. Invalid UTF-8, control characters and
// escapes of lone surrogates are errors: what arrives is what is stored.
func (s *jsonScanner) str() (string, error) {
	d := s.data
	start := s.pos + 1
	for i := start; i < len(d); {
		c := d[i]
		switch {
		case c == '"':
			s.pos = i + 1
			return string(d[start:i]), nil
		case c == '\\':
			return s.escapedStr(start, i)
		case c < 0x20:
			return "", s.errorf(i, "control character %U in a string must be escaped", c)
		case c < utf8.RuneSelf:
			i++
		default:
			r, size := utf8.DecodeRune(d[i:])
			if r == utf8.RuneError && size == 1 {
				return "", s.errorf(i, "invalid UTF-8 in a string")
			}
			i += size
		}
	}
	return "", s.errorf(s.pos, "string is not terminated")
}

// escapedStr is the slow path of str from the first backslash at i.
func (s *jsonScanner) escapedStr(start, i int) (string, error) {
	d := s.data
	buf := append(s.scratch[:0], d[start:i]...)
	defer func() { s.scratch = buf[:0] }()
	for i < len(d) {
		c := d[i]
		switch {
		case c == '"':
			s.pos = i + 1
			return string(buf), nil
		case c == '\\':
			if i+1 >= len(d) {
				return "", s.errorf(i, "string is not terminated")
			}
			esc := d[i+1]
			i += 2
			switch esc {
			case '"', '\\', '/':
				buf = append(buf, esc)
			case 'b':
				buf = append(buf, '\b')
			case 'f':
				buf = append(buf, '\f')
			case 'n':
				buf = append(buf, '\n')
			case 'r':
				buf = append(buf, '\r')
			case 't':
				buf = append(buf, '\t')
			case 'u':
				r, ok := hex4(d, i)
				if !ok {
					return "", s.errorf(i-2, `\u must be followed by four hex digits`)
				}
				i += 4
				if utf16.IsSurrogate(r) {
					r2, ok := rune(0), false
					if r < 0xdc00 && i+6 <= len(d) && d[i] == '\\' && d[i+1] == 'u' {
						r2, ok = hex4(d, i+2)
					}
					r = utf16.DecodeRune(r, r2)
					if !ok || r == utf8.RuneError {
						return "", s.errorf(i-6, "lone UTF-16 surrogate escape")
					}
					i += 6
				}
				buf = utf8.AppendRune(buf, r)
			default:
				return "", s.errorf(i-2, "invalid escape \\%c", esc)
			}
		case c < 0x20:
			return "", s.errorf(i, "control character %U in a string must be escaped", c)
		case c < utf8.RuneSelf:
			buf = append(buf, c)
			i++
		default:
			r, size := utf8.DecodeRune(d[i:])
			if r == utf8.RuneError && size == 1 {
				return "", s.errorf(i, "invalid UTF-8 in a string")
			}
			buf = append(buf, d[i:i+size]...)
			i += size
		}
	}
	return "", s.errorf(s.pos, "string is not terminated")
}

func hex4(d []byte, i int) (rune, bool) {
	if i+4 > len(d) {
		return 0, false
	}
	var r rune
	for _, c := range d[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// decodeJSON is Decode for strict JSON: RFC 8259 and nothing more, with
// duplicate keys and integers beyond int64 rejected rather than guessed at.
func decodeJSON(b []byte, l Limits) (any, error) {
	s := jsonScanner{data: b, what: "JSON", counter: counter{limits: l}}
	s.skipSpace()
	v, err := s.value()
	if err != nil {
		return nil, err
	}
	s.skipSpace()
	if s.pos < len(s.data) {
		return nil, s.errorf(s.pos, "unexpected data after the value")
	}
	return v, nil
}

func (s *jsonScanner) value() (any, error) {
	if s.pos >= len(s.data) {
		return nil, s.unexpected("a value")
	}
	switch c := s.data[s.pos]; {
	case c == '{':
		return s.object()
	case c == '[':
		return s.array()
	case c == '"':
		return s.str()
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
		return nil, s.errorf(n.start, "integer %s out of range (the limits are ±9223372036854775807)", s.data[n.start:n.end])
	}
	return s.literal()
}

func (s *jsonScanner) object() (any, error) {
	open := s.pos
	m := make(map[string]any)
	if empty, err := s.open('}'); err != nil {
		return nil, err
	} else if empty {
		return m, nil
	}
	for {
		k, keyPos, err := s.key()
		if err != nil {
			return nil, err
		}
		if _, dup := m[k]; dup {
			return nil, s.errorf(keyPos, "duplicate key %q", k)
		}
		if err := s.count(open, "object", len(m)+1, 1); err != nil {
			return nil, err
		}
		v, err := s.value()
		if err != nil {
			return nil, err
		}
		m[k] = v
		if more, err := s.next('}'); err != nil {
			return nil, err
		} else if !more {
			return m, nil
		}
	}
}

func (s *jsonScanner) array() (any, error) {
	open := s.pos
	if empty, err := s.open(']'); err != nil {
		return nil, err
	} else if empty {
		return []any{}, nil
	}
	mark := len(s.stack)
	for {
		if err := s.count(open, "array", len(s.stack)-mark+1, 1); err != nil {
			return nil, err
		}
		v, err := s.value()
		if err != nil {
			return nil, err
		}
		s.stack = append(s.stack, v)
		more, err := s.next(']')
		if err != nil {
			return nil, err
		}
		if !more {
			a := make([]any, len(s.stack)-mark)
			copy(a, s.stack[mark:])
			clear(s.stack[mark:])
			s.stack = s.stack[:mark]
			return a, nil
		}
	}
}

// open consumes the '{' or '[' at pos, and its end when that follows at
// once: empty says so.
func (s *jsonScanner) open(end byte) (empty bool, err error) {
	if err := s.enter(); err != nil {
		return false, err
	}
	s.pos++
	s.skipSpace()
	if s.pos < len(s.data) && s.data[s.pos] == end {
		s.pos++
		s.depth--
		return true, nil
	}
	return false, nil
}

// key reads an object's key and the ':' after it; off is where the key
// began.
func (s *jsonScanner) key() (k string, off int, err error) {
	if s.pos >= len(s.data) || s.data[s.pos] != '"' {
		return "", 0, s.unexpected("a string as object key")
	}
	off = s.pos
	if k, err = s.str(); err != nil {
		return "", 0, err
	}
	s.skipSpace()
	if s.pos >= len(s.data) || s.data[s.pos] != ':' {
		return "", 0, s.unexpected("':' after an object key")
	}
	s.pos++
	s.skipSpace()
	return k, off, nil
}

// next consumes what follows a member of an object or array: ',' when
// more follow, or end.
func (s *jsonScanner) next(end byte) (more bool, err error) {
	s.skipSpace()
	if s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ',':
			s.pos++
			s.skipSpace()
			return true, nil
		case end:
			s.pos++
			s.depth--
			return false, nil
		}
	}
	return false, s.unexpected("',' or '" + string(end) + "'")
}
