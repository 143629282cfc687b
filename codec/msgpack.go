package codec

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/big"
	"unicode/utf8"
)

// ReadTransitMsgpack reads a transit+msgpack body in full fidelity. The
// MessagePack reader is ours because Transit needs map entries in stream
// order: a cache code may stand for a key defined earlier in the same map.
// Errors are EINVALID with the byte offset.
func ReadTransitMsgpack(b []byte) (any, error) {
	return readTransitMsgpack(b, Limits{})
}

func readTransitMsgpack(b []byte, l Limits) (any, error) {
	r := msgpackReader{data: b, counter: counter{limits: l}}
	v, err := r.value(false)
	if err != nil {
		return nil, err
	}
	if r.pos < len(b) {
		return nil, r.errorf(r.pos, "unexpected data after the value")
	}
	return v, nil
}

type msgpackReader struct {
	data  []byte
	pos   int
	depth int
	d     transitDecoder
	counter
}

func (r *msgpackReader) errorf(off int, format string, args ...any) error {
	return invalidf("invalid transit+msgpack body at byte offset %d: %s", off, fmt.Sprintf(format, args...))
}

// count counts the n elements of the collection of kind whose header is
// at off (counter.count): a MessagePack header says how many follow.
func (r *msgpackReader) count(off int, kind string, n int) error {
	return r.counter.count("transit+msgpack", kind, func() string { return fmt.Sprintf("byte offset %d", off) }, n, n)
}

func (r *msgpackReader) at(off int, err error) error {
	var te errTransit
	if errors.As(err, &te) {
		return r.errorf(off, "%s", string(te))
	}
	return err
}

// take returns the next n bytes.
func (r *msgpackReader) take(n int) ([]byte, error) {
	if n < 0 || len(r.data)-r.pos < n {
		return nil, r.errorf(len(r.data), "unexpected end of body")
	}
	b := r.data[r.pos : r.pos+n]
	r.pos += n
	return b, nil
}

// length reads a big-endian length of size bytes.
func (r *msgpackReader) length(size int) (int, error) {
	b, err := r.take(size)
	if err != nil {
		return 0, err
	}
	switch size {
	case 1:
		return int(b[0]), nil
	case 2:
		return int(binary.BigEndian.Uint16(b)), nil
	}
	return int(binary.BigEndian.Uint32(b)), nil
}

// header kinds that value and its callers dispatch on.
const (
	mpScalar = iota
	mpString
	mpArray
	mpMap
)

// header reads the head of the next object. For strings, arrays and maps
// it returns their length; scalars are returned whole.
func (r *msgpackReader) header() (kind int, n int, v any, err error) {
	off := r.pos
	if r.pos >= len(r.data) {
		return 0, 0, nil, r.errorf(r.pos, "unexpected end of body")
	}
	c := r.data[r.pos]
	r.pos++
	switch {
	case c <= 0x7f:
		return mpScalar, 0, int64(c), nil
	case c >= 0xe0:
		return mpScalar, 0, int64(int8(c)), nil
	case c&0xf0 == 0x80:
		return mpMap, int(c & 0x0f), nil, nil
	case c&0xf0 == 0x90:
		return mpArray, int(c & 0x0f), nil, nil
	case c&0xe0 == 0xa0:
		return mpString, int(c & 0x1f), nil, nil
	}
	var b []byte
	switch c {
	case 0xc0:
		return mpScalar, 0, nil, nil
	case 0xc2:
		return mpScalar, 0, false, nil
	case 0xc3:
		return mpScalar, 0, true, nil
	case 0xc4, 0xc5, 0xc6:
		n, err := r.length(1 << (c - 0xc4))
		if err != nil {
			return 0, 0, nil, err
		}
		if b, err = r.take(n); err != nil {
			return 0, 0, nil, err
		}
		return mpScalar, 0, append([]byte(nil), b...), nil
	case 0xca:
		if b, err = r.take(4); err != nil {
			return 0, 0, nil, err
		}
		return mpScalar, 0, float64(math.Float32frombits(binary.BigEndian.Uint32(b))), nil
	case 0xcb:
		if b, err = r.take(8); err != nil {
			return 0, 0, nil, err
		}
		return mpScalar, 0, math.Float64frombits(binary.BigEndian.Uint64(b)), nil
	case 0xcc, 0xcd, 0xce, 0xcf:
		if b, err = r.take(1 << (c - 0xcc)); err != nil {
			return 0, 0, nil, err
		}
		var u uint64
		for _, x := range b {
			u = u<<8 | uint64(x)
		}
		if u > math.MaxInt64 {
			return mpScalar, 0, new(big.Int).SetUint64(u), nil
		}
		return mpScalar, 0, int64(u), nil
	case 0xd0, 0xd1, 0xd2, 0xd3:
		size := 1 << (c - 0xd0)
		if b, err = r.take(size); err != nil {
			return 0, 0, nil, err
		}
		var u uint64
		for _, x := range b {
			u = u<<8 | uint64(x)
		}
		shift := 64 - 8*size // sign-extend
		return mpScalar, 0, int64(u<<shift) >> shift, nil
	case 0xd9, 0xda, 0xdb:
		n, err := r.length(1 << (c - 0xd9))
		return mpString, n, nil, err
	case 0xdc, 0xdd:
		n, err := r.length(2 << (c - 0xdc))
		return mpArray, n, nil, err
	case 0xde, 0xdf:
		n, err := r.length(2 << (c - 0xde))
		return mpMap, n, nil, err
	case 0xc7, 0xc8, 0xc9, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8:
		return 0, 0, nil, r.errorf(off, "MessagePack extension types are not part of Transit")
	}
	return 0, 0, nil, r.errorf(off, "0x%02x is not a MessagePack type", c)
}

// str reads the n bytes of a string, which must be UTF-8.
func (r *msgpackReader) str(n int) (string, error) {
	off := r.pos
	b, err := r.take(n)
	if err != nil {
		return "", err
	}
	if !utf8.Valid(b) {
		return "", r.errorf(off, "invalid UTF-8 in a string")
	}
	return string(b), nil
}

func (r *msgpackReader) value(asKey bool) (any, error) {
	off := r.pos
	kind, n, v, err := r.header()
	if err != nil {
		return nil, err
	}
	switch kind {
	case mpString:
		s, err := r.str(n)
		if err != nil {
			return nil, err
		}
		v, err := r.d.readString(s, asKey)
		if err != nil {
			return nil, r.at(off, err)
		}
		if t, ok := v.(transitTag); ok {
			return nil, r.errorf(off, "tag \"~#%s\" must start a two-element array or be the only key of a map", string(t))
		}
		return v, nil
	}
	return r.container(off, kind, n, v)
}

// container reads the elements of the array or map whose header, of kind
// and n elements, was read at off; any other value is v, whole already.
func (r *msgpackReader) container(off, kind, n int, v any) (any, error) {
	switch kind {
	case mpArray:
		return r.array(off, n)
	case mpMap:
		return r.mapEntries(off, n)
	}
	return v, nil
}

// enter counts a level of nesting and checks that n elements, each at
// least a byte, can fit in what is left.
func (r *msgpackReader) enter(off, n int) error {
	r.depth++
	if r.depth > MaxDepth {
		return r.errorf(off, "nesting deeper than %d levels", MaxDepth)
	}
	if n > len(r.data)-r.pos {
		return r.errorf(off, "%d elements cannot fit in the rest of the body", n)
	}
	return nil
}

// array reads a vector, a "^ " map or a tagged value of n elements.
func (r *msgpackReader) array(off, n int) (any, error) {
	if err := r.enter(off, n); err != nil {
		return nil, err
	}
	defer func() { r.depth-- }()
	if n == 0 {
		return []any{}, nil
	}
	// A "^ " map of Len entries has 2×Len+1 elements; which this array
	// is, its first element says.
	if l := r.limits.Len; l > 0 && (n-1)/2 > l {
		return nil, r.count(off, "array", n)
	}
	a := make([]any, 0, n)
	firstOff := r.pos
	kind, sn, v, err := r.header()
	if err != nil {
		return nil, err
	}
	switch kind {
	case mpString:
		s, err := r.str(sn)
		if err != nil {
			return nil, err
		}
		if s == mapMarker {
			if err := r.count(off, "map", n/2); err != nil {
				return nil, err
			}
			return r.mapArray(firstOff, n-1)
		}
		first, err := r.d.readString(s, false)
		if err != nil {
			return nil, r.at(firstOff, err)
		}
		if tag, ok := first.(transitTag); ok {
			if n != 2 {
				return nil, r.errorf(firstOff, "a tagged value has exactly two elements, not %d", n)
			}
			repOff := r.pos
			rep, err := r.value(false)
			if err != nil {
				return nil, err
			}
			v, err := decodeTagged(string(tag), rep)
			return v, r.at(repOff, err)
		}
		if err := r.count(off, "array", n); err != nil {
			return nil, err
		}
		a = append(a, first)
	default:
		if err := r.count(off, "array", n); err != nil {
			return nil, err
		}
		first, err := r.container(firstOff, kind, sn, v)
		if err != nil {
			return nil, err
		}
		a = append(a, first)
	}
	for i := 1; i < n; i++ {
		v, err := r.value(false)
		if err != nil {
			return nil, err
		}
		a = append(a, v)
	}
	return a, nil
}

// mapArray reads the n elements after "^ ": keys and values in turn.
func (r *msgpackReader) mapArray(off, n int) (any, error) {
	if n%2 != 0 {
		return nil, r.errorf(off, "a \"^ \" map must have an even number of elements after the marker")
	}
	return r.entries(n / 2)
}

// mapEntries reads a MessagePack map of n entries: a Transit map, or a
// tagged value when its only key is a tag.
func (r *msgpackReader) mapEntries(off, n int) (any, error) {
	if err := r.enter(off, 2*n); err != nil {
		return nil, err
	}
	defer func() { r.depth-- }()
	if err := r.count(off, "map", n); err != nil {
		return nil, err
	}
	if n == 1 {
		keyOff := r.pos
		kind, sn, v, err := r.header()
		if err != nil {
			return nil, err
		}
		var k any
		switch kind {
		case mpString:
			s, err := r.str(sn)
			if err != nil {
				return nil, err
			}
			if k, err = r.d.readString(s, true); err != nil {
				return nil, r.at(keyOff, err)
			}
			if tag, ok := k.(transitTag); ok {
				repOff := r.pos
				rep, err := r.value(false)
				if err != nil {
					return nil, err
				}
				v, err := decodeTagged(string(tag), rep)
				return v, r.at(repOff, err)
			}
		case mpArray:
			k, err = r.array(keyOff, sn)
		case mpMap:
			k, err = r.mapEntries(keyOff, sn)
		default:
			k = v
		}
		if err != nil {
			return nil, err
		}
		val, err := r.value(false)
		if err != nil {
			return nil, err
		}
		return &Map{Entries: []KV{{k, val}}}, nil
	}
	return r.entries(n)
}

// entries reads n key-value pairs into a Map.
func (r *msgpackReader) entries(n int) (any, error) {
	m := &Map{Entries: make([]KV, 0, n)}
	var seen distinct
	for i := 0; i < n; i++ {
		off := r.pos
		k, err := r.value(true)
		if err != nil {
			return nil, err
		}
		if !seen.add(k) {
			return nil, r.errorf(off, "duplicate map key %s", describeValue(k))
		}
		v, err := r.value(false)
		if err != nil {
			return nil, err
		}
		m.Entries = append(m.Entries, KV{k, v})
	}
	return m, nil
}
