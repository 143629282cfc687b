package fleet

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
)

// The canonical values of docs/encodings.md#requests-one-canonical-value
// (nil, bool, int64, float64, string, []any, map[string]any) are kept as
// JSON text wherever they are stored: action params and metadata, alert
// conditions and metadata filters, data points. MarshalCanonical and
// ParseCanonical are the one path there and back, and AppendFloat the one
// way a double is written as JSON (package codec's JSON responses use it
// too), so that a number keeps its type and its value: an integer stays an
// integer, a double a double, exactly.

// MarshalCanonical returns the JSON text of a canonical value: map keys
// sorted, strings without HTML escapes, doubles as AppendFloat writes
// them. Other values are written by encoding/json. NaN and the infinities
// are errors.
func MarshalCanonical(v any) ([]byte, error) {
	return appendCanonical(nil, v)
}

// AppendCanonical appends the JSON text of a canonical value to b, as
// MarshalCanonical writes it.
func AppendCanonical(b []byte, v any) ([]byte, error) {
	return appendCanonical(b, v)
}

func appendCanonical(b []byte, v any) ([]byte, error) {
	var err error
	switch v := v.(type) {
	case nil:
		return append(b, "null"...), nil
	case bool:
		return strconv.AppendBool(b, v), nil
	case int64:
		return strconv.AppendInt(b, v, 10), nil
	case int:
		return strconv.AppendInt(b, int64(v), 10), nil
	case float64:
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, fmt.Errorf("fleet: JSON cannot hold %v", v)
		}
		return AppendFloat(b, v, 64), nil
	case string:
		return appendString(b, v), nil
	case []any:
		b = append(b, '[')
		for i, x := range v {
			if i > 0 {
				b = append(b, ',')
			}
			if b, err = appendCanonical(b, x); err != nil {
				return nil, err
			}
		}
		return append(b, ']'), nil
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		b = append(b, '{')
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(appendString(b, k), ':')
			if b, err = appendCanonical(b, v[k]); err != nil {
				return nil, err
			}
		}
		return append(b, '}'), nil
	}
	j, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return append(b, j...), nil
}

// appendString writes s as a JSON string as encoding/json does, but
// without escaping <, > and &: the params a device receives are the text
// the operator sent.
func appendString(b []byte, s string) []byte {
	if plainASCII(s) {
		// What the encoder writes for it, without the encoder's cost
		// (a third of the CPU of ingest with stream history).
		b = append(b, '"')
		b = append(b, s...)
		return append(b, '"')
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.Encode(s) // a string always encodes
	return append(b, bytes.TrimSuffix(buf.Bytes(), []byte("\n"))...)
}

// plainASCII reports whether s is printable ASCII without a quote or a
// backslash, which a JSON string holds as it is.
func plainASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// AppendFloat appends f, a float of bits 32 or 64, as JSON number text
// that every reader that tells integers from floats (fleetd's own,
// Clojure's, Jackson, Python's) reads back as the same float: always with
// a decimal point or an exponent (80.0, not 80; 10000000000.0, not
// 10000000000), in encoding/json's notation otherwise, and with an
// exponent from 2^53 on, where writing all the digits would name another
// integer (3.551759552515556e+17, not 355175955251555600). f must be
// finite.
func AppendFloat(b []byte, f float64, bits int) []byte {
	start := len(b)
	abs := math.Abs(f)
	format := byte('f')
	if abs != 0 {
		if bits == 64 && (abs < 1e-6 || abs >= 1<<53) ||
			bits == 32 && (float32(abs) < 1e-6 || abs >= 1<<53) {
			format = 'e'
		}
	}
	b = strconv.AppendFloat(b, f, format, -1, bits)
	if format == 'e' {
		// Turn e-09 into e-9, as encoding/json does.
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
		return b
	}
	if bytes.IndexByte(b[start:], '.') < 0 {
		b = append(b, '.', '0')
	}
	return b
}

// ParseCanonical reads JSON text into canonical values: a number without
// a fraction or exponent is an int64, any other a float64. It reads what
// MarshalCanonical wrote, and what encoding/json wrote before it.
func ParseCanonical(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	return numbers(v), nil
}

func numbers(v any) any {
	switch v := v.(type) {
	case json.Number:
		if n, err := v.Int64(); err == nil {
			return n
		}
		f, err := v.Float64()
		if err != nil || math.IsInf(f, 0) {
			return v.String()
		}
		return f
	case []any:
		for i, e := range v {
			v[i] = numbers(e)
		}
	case map[string]any:
		for k, e := range v {
			v[k] = numbers(e)
		}
	}
	return v
}
