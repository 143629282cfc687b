package codec

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
)

// ednEmitter writes EDN as Clojure's pr-str would: keyword keys where the
// name allows, #inst and #uuid, ", " between map entries.
type ednEmitter struct {
	buf    *bytes.Buffer
	err    error
	frames []ednFrame
}

type ednFrame struct {
	isMap bool
	n     int
}

func (e *ednEmitter) fail(err error) {
	if e.err == nil {
		e.err = err
	}
}

func (e *ednEmitter) finish() error { return e.err }

// next writes the separator before a value.
func (e *ednEmitter) next() {
	if len(e.frames) == 0 {
		return
	}
	f := &e.frames[len(e.frames)-1]
	switch {
	case f.n == 0:
	case f.isMap && f.n%2 == 0:
		e.buf.WriteString(", ")
	default:
		e.buf.WriteByte(' ')
	}
	f.n++
}

func (e *ednEmitter) open(s string, isMap bool) {
	e.next()
	e.buf.WriteString(s)
	e.frames = append(e.frames, ednFrame{isMap: isMap})
}

func (e *ednEmitter) close(s string) {
	e.buf.WriteString(s)
	e.frames = e.frames[:len(e.frames)-1]
}

func (e *ednEmitter) word(s string) {
	e.next()
	e.buf.WriteString(s)
}

func (e *ednEmitter) null() { e.word("nil") }

func (e *ednEmitter) boolean(b bool) {
	if b {
		e.word("true")
	} else {
		e.word("false")
	}
}

func (e *ednEmitter) integer(i int64) { e.word(strconv.FormatInt(i, 10)) }

// unsigned writes values beyond int64 with N, as Clojure prints a BigInt.
func (e *ednEmitter) unsigned(u uint64) {
	if u > math.MaxInt64 {
		e.word(strconv.FormatUint(u, 10) + "N")
		return
	}
	e.word(strconv.FormatUint(u, 10))
}

func (e *ednEmitter) float(f float64, bits int) {
	switch {
	case math.IsNaN(f):
		e.word("##NaN")
	case math.IsInf(f, 1):
		e.word("##Inf")
	case math.IsInf(f, -1):
		e.word("##-Inf")
	default:
		e.word(string(appendFloatText(nil, f, bits)))
	}
}

func (e *ednEmitter) str(s string) {
	e.next()
	e.buf.Write(appendEDNString(e.buf.AvailableBuffer(), s))
}

// appendEDNString quotes s with the escapes every EDN reader knows and
// \uXXXX for other control characters; invalid UTF-8 becomes U+FFFD.
func appendEDNString(b []byte, s string) []byte {
	b = append(b, '"')
	for _, r := range s {
		switch r {
		case '"', '\\':
			b = append(b, '\\', byte(r))
		case '\n':
			b = append(b, '\\', 'n')
		case '\t':
			b = append(b, '\\', 't')
		case '\r':
			b = append(b, '\\', 'r')
		default:
			if r < 0x20 || r == 0x7f {
				b = fmt.Appendf(b, `\u%04x`, r)
			} else {
				b = utf8.AppendRune(b, r)
			}
		}
	}
	return append(b, '"')
}

// binary writes base64 text: EDN has no bytes, and this is what the
// canonical value of Transit binary is.
func (e *ednEmitter) binary(p []byte) { e.str(base64.StdEncoding.EncodeToString(p)) }

func (e *ednEmitter) instant(t time.Time) {
	e.word(`#inst "` + string(AppendTime(nil, t)) + `"`)
}

func (e *ednEmitter) uuid(u uuid.UUID) { e.word(`#uuid "` + u.String() + `"`) }

func (e *ednEmitter) raw(enc *encoder, b []byte) {
	if len(b) == 0 {
		enc.any(nil)
		return
	}
	v, err := decodeJSON(b, Limits{})
	if err != nil {
		e.fail(err)
		return
	}
	enc.any(v)
}

func (e *ednEmitter) beginArray(int) { e.open("[", false) }
func (e *ednEmitter) endArray()      { e.close("]") }
func (e *ednEmitter) beginMap(int)   { e.open("{", true) }
func (e *ednEmitter) endMap()        { e.close("}") }

func (e *ednEmitter) key(k string) {
	if isKeywordName(k) {
		e.word(":" + k)
	} else {
		e.str(k)
	}
}

func (e *ednEmitter) rich(enc *encoder, v any) {
	switch v := v.(type) {
	case Keyword:
		if !validSymbol(string(v)) {
			e.fail(fmt.Errorf("codec: %q cannot be written as an EDN keyword", string(v)))
		}
		e.word(":" + string(v))
	case Symbol:
		if !validSymbol(string(v)) {
			e.fail(fmt.Errorf("codec: %q cannot be written as an EDN symbol", string(v)))
		}
		e.word(string(v))
	case Char:
		e.word(ednChar(rune(v)))
	case *big.Int:
		e.word(v.String() + "N")
	case BigDecimal:
		e.word(string(v) + "M")
	case URI:
		// As Clojure prints a java.net.URI; ReadEDN reads it back.
		e.word(`#object[java.net.URI 0x0 ` + string(appendEDNString(nil, string(v))) + `]`)
	case Set:
		e.seq("#{", "}", v, enc)
	case List:
		e.seq("(", ")", v, enc)
	case Tagged:
		if !validSymbol(v.Tag) || !unicode.IsLetter([]rune(v.Tag)[0]) {
			e.fail(fmt.Errorf("codec: %q cannot be written as an EDN tag", v.Tag))
			return
		}
		e.next()
		e.buf.WriteString("#" + v.Tag + " ")
		e.frames = append(e.frames, ednFrame{})
		enc.any(v.Value)
		e.frames = e.frames[:len(e.frames)-1]
	case *Map:
		e.open("{", true)
		for _, en := range v.Entries {
			enc.any(en.Key)
			enc.any(en.Value)
		}
		e.close("}")
	}
}

func (e *ednEmitter) seq(open, close string, a []any, enc *encoder) {
	e.open(open, false)
	for _, x := range a {
		enc.any(x)
	}
	e.close(close)
}

// ednChar writes a character literal, by name where it has one.
func ednChar(r rune) string {
	switch r {
	case '\n':
		return `\newline`
	case '\r':
		return `\return`
	case ' ':
		return `\space`
	case '\t':
		return `\tab`
	case '\f':
		return `\formfeed`
	case '\b':
		return `\backspace`
	}
	if r <= 0xffff && (r < 0x20 || r == 0x7f || !unicode.IsPrint(r)) {
		return fmt.Sprintf(`\u%04x`, r)
	}
	return `\` + string(r)
}
