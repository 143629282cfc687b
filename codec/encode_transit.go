package codec

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// transitEmitter writes Transit in one of three syntaxes: JSON with the
// cache and "^ " maps, verbose JSON (objects, ~t times, no cache) or
// MessagePack. String keys of Go maps and structs become keywords when
// they are valid keyword names, so a Clojure client reads {:id 1}.
type transitEmitter struct {
	buf   *bytes.Buffer
	mode  byte // 'j' JSON, 'v' verbose JSON, 'm' MessagePack
	err   error
	depth int  // open arrays, maps and tagged values
	asKey bool // the next value is a map key
	cache map[string]string
	// keyword is the text of the last keyword key (key).
	keyword []byte
	// JSON separators: one frame per open array or object.
	frames []jsonFrame
}

type jsonFrame struct {
	object bool
	n      int
}

func newTransitJSONEmitter(buf *bytes.Buffer, verbose bool) emitter {
	if verbose {
		return &transitEmitter{buf: buf, mode: 'v'}
	}
	return &transitEmitter{buf: buf, mode: 'j'}
}

func newMsgpackEmitter(buf *bytes.Buffer) emitter {
	return &transitEmitter{buf: buf, mode: 'm'}
}

// MarshalTransitVerbose returns v as verbose transit+json: maps as JSON
// objects, times as ~t strings, no cache. It is for people reading the
// output; clients get the normal form from Encode.
func MarshalTransitVerbose(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := encoder{e: newTransitJSONEmitter(&buf, true)}
	enc.any(v)
	err := enc.e.finish()
	if enc.err != nil {
		err = enc.err
	}
	if err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func (e *transitEmitter) fail(err error) {
	if e.err == nil {
		e.err = err
	}
}

func (e *transitEmitter) finish() error { return e.err }

// sep writes what goes before a JSON value: ',' between array elements,
// ':' after an object key.
func (e *transitEmitter) sep() {
	if e.mode == 'm' || len(e.frames) == 0 {
		return
	}
	f := &e.frames[len(e.frames)-1]
	switch {
	case f.object && f.n%2 == 1:
		e.buf.WriteByte(':')
	case f.n > 0:
		e.buf.WriteByte(',')
	}
	f.n++
}

// The syntax layer: plain JSON or MessagePack tokens.

func (e *transitEmitter) putNull() {
	e.sep()
	if e.mode == 'm' {
		e.buf.WriteByte(0xc0)
	} else {
		e.buf.WriteString("null")
	}
}

func (e *transitEmitter) putBool(b bool) {
	e.sep()
	switch {
	case e.mode == 'm' && b:
		e.buf.WriteByte(0xc3)
	case e.mode == 'm':
		e.buf.WriteByte(0xc2)
	case b:
		e.buf.WriteString("true")
	default:
		e.buf.WriteString("false")
	}
}

func (e *transitEmitter) putInt(i int64) {
	e.sep()
	if e.mode != 'm' {
		e.buf.Write(strconv.AppendInt(e.buf.AvailableBuffer(), i, 10))
		return
	}
	// The smallest form, unsigned for positive values, as msgpack-java
	// (and so transit-java) writes them.
	b := e.buf.AvailableBuffer()
	switch {
	case i >= 0 && i <= 0x7f, i < 0 && i >= -32:
		b = append(b, byte(i))
	case i > 0 && i <= math.MaxUint8:
		b = append(b, 0xcc, byte(i))
	case i > 0 && i <= math.MaxUint16:
		b = binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(i))
	case i > 0 && i <= math.MaxUint32:
		b = binary.BigEndian.AppendUint32(append(b, 0xce), uint32(i))
	case i > 0:
		b = binary.BigEndian.AppendUint64(append(b, 0xcf), uint64(i))
	case i >= math.MinInt8:
		b = append(b, 0xd0, byte(i))
	case i >= math.MinInt16:
		b = binary.BigEndian.AppendUint16(append(b, 0xd1), uint16(i))
	case i >= math.MinInt32:
		b = binary.BigEndian.AppendUint32(append(b, 0xd2), uint32(i))
	default:
		b = binary.BigEndian.AppendUint64(append(b, 0xd3), uint64(i))
	}
	e.buf.Write(b)
}

// putFloat writes a finite float so that it reads back as a float: JSON
// gets a fraction or exponent even when the value is integral.
func (e *transitEmitter) putFloat(f float64, bits int) {
	e.sep()
	if e.mode == 'm' {
		b := binary.BigEndian.AppendUint64(append(e.buf.AvailableBuffer(), 0xcb), math.Float64bits(f))
		e.buf.Write(b)
		return
	}
	e.buf.Write(appendFloatText(e.buf.AvailableBuffer(), f, bits))
}

// appendFloatText formats a finite float for Transit JSON and EDN, which
// both tell a float from an integer by its '.' or exponent.
func appendFloatText(b []byte, f float64, bits int) []byte {
	start := len(b)
	b = strconv.AppendFloat(b, f, 'g', -1, bits)
	if !bytes.ContainsAny(b[start:], ".e") {
		b = append(b, '.', '0')
	}
	return b
}

func (e *transitEmitter) putString(s string) {
	e.sep()
	if e.mode != 'm' {
		e.buf.Write(appendJSONString(e.buf.AvailableBuffer(), s))
		return
	}
	b := e.buf.AvailableBuffer()
	n := len(s)
	switch {
	case n < 32:
		b = append(b, 0xa0|byte(n))
	case n <= math.MaxUint8:
		b = append(b, 0xd9, byte(n))
	case n <= math.MaxUint16:
		b = binary.BigEndian.AppendUint16(append(b, 0xda), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xdb), uint32(n))
	}
	e.buf.Write(append(b, s...))
}

func (e *transitEmitter) putArrayHead(n int) { e.putHead(n, '[', false, 0x90, 0xdc, 0xdd) }
func (e *transitEmitter) putArrayEnd()       { e.putEnd(']') }

// putMapHead starts a MessagePack map or a verbose JSON object.
func (e *transitEmitter) putMapHead(n int) { e.putHead(n, '{', true, 0x80, 0xde, 0xdf) }
func (e *transitEmitter) putMapEnd()       { e.putEnd('}') }

// putHead starts a container of n entries: in JSON with open, in
// MessagePack with the head whose fix form is fix (up to 15 entries) and
// whose longer forms are c16 and c32.
func (e *transitEmitter) putHead(n int, open byte, object bool, fix, c16, c32 byte) {
	e.sep()
	if e.mode != 'm' {
		e.buf.WriteByte(open)
		e.frames = append(e.frames, jsonFrame{object: object})
		return
	}
	b := e.buf.AvailableBuffer()
	switch {
	case n < 16:
		b = append(b, fix|byte(n))
	case n <= math.MaxUint16:
		b = binary.BigEndian.AppendUint16(append(b, c16), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, c32), uint32(n))
	}
	e.buf.Write(b)
}

// putEnd ends a JSON container; MessagePack's need no end.
func (e *transitEmitter) putEnd(end byte) {
	if e.mode != 'm' {
		e.buf.WriteByte(end)
		e.frames = e.frames[:len(e.frames)-1]
	}
}

// The Transit layer.

// emitString writes a string that is already in its Transit form ("~:k",
// "~~escaped"), through the write cache when it is cacheable.
func (e *transitEmitter) emitString(s string, asKey bool) {
	if e.mode != 'v' && cacheable(s, asKey) {
		if code, ok := e.cache[s]; ok {
			e.putString(code)
			return
		}
		if e.cache == nil {
			e.cache = make(map[string]string)
		}
		if len(e.cache) == cacheSize {
			clear(e.cache)
		}
		e.cache[s] = cacheCode(len(e.cache))
	}
	e.putString(s)
}

func cacheCode(i int) string {
	if i < cacheDigits {
		return string([]byte{'^', byte(cacheBase + i)})
	}
	return string([]byte{'^', byte(cacheBase + i/cacheDigits), byte(cacheBase + i%cacheDigits)})
}

// escapeString escapes a string value that would otherwise read as a tag,
// a cache code or the reserved backquote.
func escapeString(s string) string {
	if len(s) > 0 && (s[0] == '~' || s[0] == '^' || s[0] == '`') {
		return "~" + s
	}
	return s
}

// scalar prepares for a scalar: it takes the key flag and, for a scalar
// alone at the top, opens the quote that JSON needs around it.
func (e *transitEmitter) scalar() (asKey, quoted bool) {
	asKey, e.asKey = e.asKey, false
	if e.depth == 0 && !asKey {
		e.openTagged("'", 2)
		return false, true
	}
	return asKey, false
}

func (e *transitEmitter) unquote(quoted bool) {
	if quoted {
		e.closeTagged()
	}
}

// openTagged starts ["~#tag", …] or, in verbose JSON, {"~#tag": …}.
func (e *transitEmitter) openTagged(tag string, n int) {
	e.depth++
	if e.mode == 'v' {
		e.putMapHead(1)
	} else {
		e.putArrayHead(n)
	}
	e.emitString("~#"+tag, false)
}

func (e *transitEmitter) closeTagged() {
	e.depth--
	if e.mode == 'v' {
		e.putMapEnd()
	} else {
		e.putArrayEnd()
	}
}

func (e *transitEmitter) null() {
	asKey, q := e.scalar()
	if asKey && e.mode != 'm' {
		e.emitString("~_", true)
	} else {
		e.putNull()
	}
	e.unquote(q)
}

func (e *transitEmitter) boolean(b bool) {
	asKey, q := e.scalar()
	switch {
	case asKey && e.mode != 'm' && b:
		e.emitString("~?t", true)
	case asKey && e.mode != 'm':
		e.emitString("~?f", true)
	default:
		e.putBool(b)
	}
	e.unquote(q)
}

// integer writes JSON numbers only up to 2^53, which JavaScript readers
// hold exactly; larger ones, and keys, go as ~i strings.
func (e *transitEmitter) integer(i int64) {
	asKey, q := e.scalar()
	if e.mode != 'm' && (asKey || i >= 1<<53 || i <= -(1<<53)) {
		e.emitString("~i"+strconv.FormatInt(i, 10), asKey)
	} else {
		e.putInt(i)
	}
	e.unquote(q)
}

func (e *transitEmitter) unsigned(u uint64) {
	if u <= math.MaxInt64 {
		e.integer(int64(u))
		return
	}
	asKey, q := e.scalar()
	e.emitString("~n"+strconv.FormatUint(u, 10), asKey)
	e.unquote(q)
}

func (e *transitEmitter) float(f float64, bits int) {
	asKey, q := e.scalar()
	switch {
	case math.IsNaN(f):
		e.emitString("~zNaN", asKey)
	case math.IsInf(f, 1):
		e.emitString("~zINF", asKey)
	case math.IsInf(f, -1):
		e.emitString("~z-INF", asKey)
	case asKey && e.mode != 'm':
		e.emitString("~d"+string(appendFloatText(nil, f, bits)), true)
	default:
		e.putFloat(f, bits)
	}
	e.unquote(q)
}

func (e *transitEmitter) str(s string) {
	asKey, q := e.scalar()
	e.emitString(escapeString(s), asKey)
	e.unquote(q)
}

func (e *transitEmitter) binary(p []byte) {
	asKey, q := e.scalar()
	e.emitString("~b"+base64.StdEncoding.EncodeToString(p), asKey)
	e.unquote(q)
}

// instant writes ~m milliseconds in JSON, ~t text in verbose JSON and
// ["~#m", ms] in MessagePack, as transit-java does.
func (e *transitEmitter) instant(t time.Time) {
	asKey, q := e.scalar()
	switch {
	case e.mode == 'v':
		e.emitString("~t"+string(AppendTime(nil, t)), asKey)
	case e.mode == 'j' || asKey:
		e.emitString("~m"+strconv.FormatInt(t.UnixMilli(), 10), asKey)
	default:
		e.openTagged("m", 2)
		e.putInt(t.UnixMilli())
		e.closeTagged()
	}
	e.unquote(q)
}

// uuid writes ~u text, or in MessagePack ["~#u", [hi, lo]] as
// transit-java does.
func (e *transitEmitter) uuid(u uuid.UUID) {
	asKey, q := e.scalar()
	if e.mode != 'm' || asKey {
		e.emitString("~u"+u.String(), asKey)
	} else {
		e.openTagged("u", 2)
		e.putArrayHead(2)
		e.putInt(int64(binary.BigEndian.Uint64(u[:8])))
		e.putInt(int64(binary.BigEndian.Uint64(u[8:])))
		e.putArrayEnd()
		e.closeTagged()
	}
	e.unquote(q)
}

// raw converts embedded JSON through the strict decoder: Transit has no
// way to embed it verbatim.
func (e *transitEmitter) raw(enc *encoder, b []byte) {
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

func (e *transitEmitter) beginArray(n int) {
	e.asKey = false
	e.depth++
	e.putArrayHead(n)
}

func (e *transitEmitter) endArray() {
	e.depth--
	e.putArrayEnd()
}

// beginMap starts a map whose keys arrive through key or, from rich, as
// values with asKey set.
func (e *transitEmitter) beginMap(n int) {
	e.asKey = false
	e.depth++
	if e.mode == 'j' {
		e.putArrayHead(2*n + 1)
		e.putString(mapMarker)
	} else {
		e.putMapHead(n)
	}
}

func (e *transitEmitter) key(k string) {
	if !isKeywordName(k) {
		e.emitString(escapeString(k), true)
		return
	}
	// The keyword's text is made only when the cache lacks it: the keys
	// of a list are the same few over and over, and making each was a
	// third of the allocations of an S7 page in Transit.
	e.keyword = append(append(e.keyword[:0], "~:"...), k...)
	if code, ok := e.cache[string(e.keyword)]; ok {
		e.putString(code)
		return
	}
	e.emitString(string(e.keyword), true)
}

func (e *transitEmitter) endMap() {
	e.depth--
	if e.mode == 'j' {
		e.putArrayEnd()
	} else {
		e.putMapEnd()
	}
}

func (e *transitEmitter) rich(enc *encoder, v any) {
	switch v := v.(type) {
	case Keyword:
		asKey, q := e.scalar()
		e.emitString("~:"+string(v), asKey)
		e.unquote(q)
	case Symbol:
		asKey, q := e.scalar()
		e.emitString("~$"+string(v), asKey)
		e.unquote(q)
	case Char:
		asKey, q := e.scalar()
		e.emitString("~c"+string(rune(v)), asKey)
		e.unquote(q)
	case *big.Int:
		asKey, q := e.scalar()
		e.emitString("~n"+v.String(), asKey)
		e.unquote(q)
	case BigDecimal:
		asKey, q := e.scalar()
		e.emitString("~f"+string(v), asKey)
		e.unquote(q)
	case URI:
		asKey, q := e.scalar()
		e.emitString("~r"+string(v), asKey)
		e.unquote(q)
	case Set:
		e.taggedSeq("set", v, enc)
	case List:
		e.taggedSeq("list", v, enc)
	case Tagged:
		if transitTags[v.Tag] || v.Tag == "" {
			// Only EDN makes these (#b "…"); in Transit the tag would
			// change the value's meaning.
			e.fail(fmt.Errorf("codec: tag %q has a meaning of its own in Transit", v.Tag))
			return
		}
		if s, ok := v.Value.(string); ok && len(v.Tag) == 1 && !strings.Contains("~^`#", v.Tag) {
			asKey, q := e.scalar()
			e.emitString("~"+v.Tag+s, asKey)
			e.unquote(q)
			return
		}
		e.asKey = false
		e.openTagged(v.Tag, 2)
		enc.any(v.Value)
		e.closeTagged()
	case *Map:
		e.asKey = false
		if !stringableKeys(v) {
			e.openTagged("cmap", 2)
			e.beginArray(2 * len(v.Entries))
			for _, en := range v.Entries {
				enc.any(en.Key)
				enc.any(en.Value)
			}
			e.endArray()
			e.closeTagged()
			return
		}
		e.beginMap(len(v.Entries))
		for _, en := range v.Entries {
			e.asKey = true
			enc.any(en.Key)
			enc.any(en.Value)
		}
		e.endMap()
	}
}

// transitTags are the tags a Transit reader decodes rather than keeps.
var transitTags = map[string]bool{
	"_": true, "s": true, "?": true, "i": true, "d": true, "b": true, ":": true, "$": true,
	"f": true, "n": true, "m": true, "t": true, "u": true, "r": true, "c": true, "z": true,
	"'": true, "set": true, "list": true, "cmap": true, "ints": true, "longs": true,
	"floats": true, "doubles": true, "bools": true, "shorts": true, "chars": true,
}

func (e *transitEmitter) taggedSeq(tag string, a []any, enc *encoder) {
	e.asKey = false
	e.openTagged(tag, 2)
	e.beginArray(len(a))
	for _, x := range a {
		enc.any(x)
	}
	e.endArray()
	e.closeTagged()
}

// stringableKeys reports whether every key of m has a string form, so that
// m is a map rather than a cmap.
func stringableKeys(m *Map) bool {
	for _, en := range m.Entries {
		switch k := en.Key.(type) {
		case []any, List, Set, *Map:
			return false
		case Tagged:
			if _, ok := k.Value.(string); !ok || len(k.Tag) != 1 {
				return false
			}
		}
	}
	return true
}

// isKeywordName reports whether a string key can be written as a keyword
// that every EDN and Transit reader takes back: ASCII letters, digits and
// *+!-_?<>=. , not starting with a digit, with at most one '/' inside.
func isKeywordName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c == '*', c == '+', c == '!', c == '-', c == '_',
			c == '?', c == '<', c == '>', c == '=', c == '.', c == '/':
		case c >= '0' && c <= '9':
		default:
			return false
		}
	}
	return validSymbol(s) && s != "/"
}
