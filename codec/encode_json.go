package codec

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/fleetd/fleet"
)

// jsonEmitter writes JSON as encoding/json does (without HTML escaping),
// except for times, which are RFC 3339 UTC with milliseconds as
// docs/api.md#responses says, floats, which always show that they are
// (fleet.AppendFloat), and full-fidelity values, which are written as their
// canonical form.
type jsonEmitter struct {
	buf       *bytes.Buffer
	needComma bool
	err       error
}

func (e *jsonEmitter) fail(err error) {
	if e.err == nil {
		e.err = err
	}
}

func (e *jsonEmitter) finish() error { return e.err }

// sep writes the comma that goes before every value but the first of an
// array or object.
func (e *jsonEmitter) sep() {
	if e.needComma {
		e.buf.WriteByte(',')
	}
	e.needComma = true
}

func (e *jsonEmitter) null() {
	e.sep()
	e.buf.WriteString("null")
}

func (e *jsonEmitter) boolean(b bool) {
	e.sep()
	if b {
		e.buf.WriteString("true")
	} else {
		e.buf.WriteString("false")
	}
}

func (e *jsonEmitter) integer(i int64) {
	e.sep()
	e.buf.Write(strconv.AppendInt(e.buf.AvailableBuffer(), i, 10))
}

func (e *jsonEmitter) unsigned(u uint64) {
	e.sep()
	e.buf.Write(strconv.AppendUint(e.buf.AvailableBuffer(), u, 10))
}

func (e *jsonEmitter) float(f float64, bits int) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		e.fail(fmt.Errorf("codec: JSON cannot represent %v", f))
		return
	}
	e.sep()
	e.buf.Write(fleet.AppendFloat(e.buf.AvailableBuffer(), f, bits))
}

func (e *jsonEmitter) str(s string) {
	e.sep()
	e.buf.Write(appendJSONString(e.buf.AvailableBuffer(), s))
}

const hexDigits = "0123456789abcdef"

// appendJSONString quotes s as encoding/json does with HTML escaping off:
// invalid UTF-8 becomes U+FFFD and U+2028, U+2029 are escaped for
// JavaScript's sake.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

func (e *jsonEmitter) binary(p []byte) {
	e.sep()
	b := append(e.buf.AvailableBuffer(), '"')
	b = base64.StdEncoding.AppendEncode(b, p)
	e.buf.Write(append(b, '"'))
}

// TimeLayout is how every format writes a time as text: RFC 3339 in UTC
// with exactly three fractional digits (docs/api.md#responses).
const TimeLayout = "2006-01-02T15:04:05.000Z07:00"

// AppendTime appends t as TimeLayout writes it, in UTC, without reading
// the layout each time: a page of 1000 stream points holds 2000 times,
// and formatting them through the layout took a sixth of its CPU.
func AppendTime(b []byte, t time.Time) []byte {
	t = t.UTC()
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		return t.AppendFormat(b, TimeLayout)
	}
	hour, minute, sec := t.Clock()
	b = appendDigits(b, year, 4)
	b = appendDigits(append(b, '-'), int(month), 2)
	b = appendDigits(append(b, '-'), day, 2)
	b = appendDigits(append(b, 'T'), hour, 2)
	b = appendDigits(append(b, ':'), minute, 2)
	b = appendDigits(append(b, ':'), sec, 2)
	b = appendDigits(append(b, '.'), t.Nanosecond()/int(time.Millisecond), 3)
	return append(b, 'Z')
}

// appendDigits appends n, at least 0, as width digits with leading zeros.
func appendDigits(b []byte, n, width int) []byte {
	for i := width - 1; i >= 0; i-- {
		b = append(b, 0)
	}
	for i := len(b) - 1; i >= len(b)-width; i-- {
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return b
}

func (e *jsonEmitter) instant(t time.Time) {
	e.sep()
	b := append(e.buf.AvailableBuffer(), '"')
	b = AppendTime(b, t)
	e.buf.Write(append(b, '"'))
}

func (e *jsonEmitter) uuid(u uuid.UUID) {
	e.sep()
	b := append(e.buf.AvailableBuffer(), '"')
	b = append(b, u.String()...)
	e.buf.Write(append(b, '"'))
}

func (e *jsonEmitter) raw(enc *encoder, b []byte) {
	e.sep()
	if len(b) == 0 {
		e.buf.WriteString("null")
		return
	}
	if err := json.Compact(e.buf, b); err != nil {
		e.fail(fmt.Errorf("codec: invalid raw JSON: %w", err))
	}
}

func (e *jsonEmitter) beginArray(int) {
	e.sep()
	e.buf.WriteByte('[')
	e.needComma = false
}

func (e *jsonEmitter) endArray() {
	e.buf.WriteByte(']')
	e.needComma = true
}

func (e *jsonEmitter) beginMap(int) {
	e.sep()
	e.buf.WriteByte('{')
	e.needComma = false
}

func (e *jsonEmitter) key(k string) {
	e.sep()
	b := appendJSONString(e.buf.AvailableBuffer(), k)
	e.buf.Write(append(b, ':'))
	e.needComma = false
}

func (e *jsonEmitter) endMap() {
	e.buf.WriteByte('}')
	e.needComma = true
}

// rich writes a full-fidelity value as its canonical form: JSON has no
// keywords, sets or tags.
func (e *jsonEmitter) rich(enc *encoder, v any) {
	c, err := Canonical(v)
	if err != nil {
		e.fail(err)
		return
	}
	enc.any(c)
}
