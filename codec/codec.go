// Package codec reads and writes fleetd's four body encodings: JSON, Transit
// (JSON and MessagePack) and EDN (docs/encodings.md).
//
// Every request body becomes one canonical value (nil, bool, int64, float64,
// string, []any, map[string]any) so that validation has one path whatever
// the client spoke. Transit and EDN are first read in full fidelity
// (ReadTransitJSON, ReadTransitMsgpack, ReadEDN return keywords, sets,
// instants and so on) and then narrowed by Canonical. Responses go the other
// way: Encode writes handler values in any of the four, with keyword keys,
// instants and UUIDs where the format has them.
package codec

import (
	"bytes"
	"fmt"
	"io"
	"strings"

	"github.com/fleetd/fleet"
)

// Format is one of the four body encodings.
type Format int

// The four encodings, JSON first: it is the default everywhere.
const (
	JSON Format = iota
	TransitJSON
	TransitMsgpack
	EDN
)

// Formats lists every format in order of preference, for error messages
// and tests that cover them all.
var Formats = []Format{JSON, TransitJSON, TransitMsgpack, EDN}

// ContentType returns the media type of f.
func (f Format) ContentType() string {
	switch f {
	case TransitJSON:
		return "application/transit+json"
	case TransitMsgpack:
		return "application/transit+msgpack"
	case EDN:
		return "application/edn"
	}
	return "application/json"
}

// String returns a short name of f, such as "transit+json".
func (f Format) String() string {
	switch f {
	case JSON:
		return "json"
	case TransitJSON:
		return "transit+json"
	case TransitMsgpack:
		return "transit+msgpack"
	case EDN:
		return "edn"
	}
	return fmt.Sprintf("Format(%d)", int(f))
}

// FormatOf maps a Content-Type header value to a format. Parameters
// (charset=…) are ignored and matching is case-insensitive; ok is false for
// anything else, including an empty value.
func FormatOf(contentType string) (f Format, ok bool) {
	mt, _, _ := strings.Cut(contentType, ";")
	mt = strings.TrimSpace(mt)
	for _, f := range Formats {
		if strings.EqualFold(mt, f.ContentType()) {
			return f, true
		}
	}
	return JSON, false
}

// MaxDepth is the deepest nesting of arrays and maps a body may have.
const MaxDepth = 64

// Limits bound what decoding one body may build, beside MaxDepth. The
// zero value bounds nothing more.
type Limits struct {
	// Len is the most elements one array, list, set or map may hold (a
	// map's entries count once each); 0 is no bound. Readers count as they
	// go and stop at the first element past it, so a body of a million
	// empty objects costs what Len of them cost, not 35 times its size.
	Len int
	// Total is the most elements all of them may hold together; 0 is no
	// bound. It bounds a large body (a bulk one) that nests many
	// collections each within Len.
	Total int
}

// Decode reads exactly one value from a whole request body in format f and
// returns its canonical form: nil, bool, int64, float64, string, []any or
// map[string]any, nested. Any problem is an EINVALID *fleet.Error whose
// message says what is wrong and where.
func Decode(f Format, body []byte) (any, error) {
	return DecodeWithin(f, body, Limits{})
}

// DecodeWithin is Decode within l: a collection longer than l.Len is an
// ETOOLARGE *fleet.Error that says where it is, found before more of it
// was built.
func DecodeWithin(f Format, body []byte, l Limits) (any, error) {
	var v any
	var err error
	switch f {
	case JSON:
		return decodeJSON(body, l)
	case TransitJSON:
		v, err = readTransitJSON(body, l)
	case TransitMsgpack:
		v, err = readTransitMsgpack(body, l)
	case EDN:
		v, err = readEDN(body, l)
	default:
		return nil, fleet.Errorf(fleet.EUNSUPPORTED, "unsupported body format %v", f)
	}
	if err != nil {
		return nil, err
	}
	return Canonical(v)
}

// counter counts the elements a reader reads against its Limits.
type counter struct {
	limits Limits
	total  int
}

// count counts n more elements of a collection of kind, which now holds
// length, in a body of format what; where says, when asked, where the
// collection starts. Past a limit it is an ETOOLARGE error.
func (c *counter) count(what, kind string, where func() string, length, n int) error {
	c.total += n
	switch l := c.limits; {
	case l.Len > 0 && length > l.Len:
		return fleet.Errorf(fleet.ETOOLARGE, "%s body too large: the %s at %s holds more than %d elements, the most one may hold here", what, kind, where(), l.Len)
	case l.Total > 0 && c.total > l.Total:
		return fleet.Errorf(fleet.ETOOLARGE, "%s body too large: with the %s at %s it holds more than %d elements in all, the most one body may hold here; send it in parts", what, kind, where(), l.Total)
	}
	return nil
}

// Marshal returns v encoded in format f; see Encode. It returns an exact
// copy of the encoding: a buffer grown from empty for each response (a
// page of 50 device actions is some 30 KB) left twice the response in
// garbage.
func Marshal(f Format, v any) ([]byte, error) {
	var out []byte
	err := Encoded(f, v, func(b []byte) error {
		out = bytes.Clone(b)
		return nil
	})
	return out, err
}

// Encode writes v in format f. v is what a handler builds: structs (with
// their json tags), maps with string keys, slices, scalars, time.Time,
// uuid.UUID, json.RawMessage, canonical values and the full-fidelity types
// of this package. Nothing is written when v cannot be encoded.
func Encode(w io.Writer, f Format, v any) error {
	return Encoded(f, v, func(b []byte) error {
		_, err := w.Write(b)
		return err
	})
}

// maxPooledBuffer bounds the buffers kept for reuse: one large answer
// must not stay pinned in the pool.
const maxPooledBuffer = 1 << 20

// Encoded encodes v in format f (see Encode) into a pooled buffer and
// hands the bytes to use, which must not keep them; it returns the error
// of either. An HTTP response written from them leaves no copy behind:
// Marshal's was an eighth of an S7 page's garbage.
func Encoded(f Format, v any, use func([]byte) error) error {
	buf := bufferPool.Get().(*bytes.Buffer)
	defer func() {
		if buf.Cap() <= maxPooledBuffer {
			buf.Reset()
			bufferPool.Put(buf)
		}
	}()
	if err := encodeTo(buf, f, v); err != nil {
		return err
	}
	return use(buf.Bytes())
}

// maxMessage bounds an error message: it may quote a key, a number or a
// token from the body, and a body may hold a megabyte of one.
const maxMessage = 300

// invalidf returns the EINVALID error of a malformed body.
func invalidf(format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if r := []rune(msg); len(r) > maxMessage {
		msg = string(r[:maxMessage]) + "…"
	}
	return &fleet.Error{Code: fleet.EINVALID, Message: msg}
}

// textPosition turns a byte offset into the 1-based line and column (in
// characters) that a person sees in an editor.
func textPosition(b []byte, off int) (line, col int) {
	if off > len(b) {
		off = len(b)
	}
	line = 1 + bytes.Count(b[:off], []byte{'\n'})
	start := bytes.LastIndexByte(b[:off], '\n') + 1
	col = 1 + len([]rune(string(b[start:off])))
	return line, col
}
