package codec

import (
	"encoding/base64"
	"math"
	"math/big"
	"strconv"
	"time"

	"github.com/google/uuid"
)

// Canonical narrows a full-fidelity value to the canonical values Decode
// returns (docs/encodings.md#requests-one-canonical-value): keywords and
// symbols become strings ("ns/name"), vectors, lists and sets arrays,
// instants RFC 3339 strings in UTC with milliseconds, UUIDs and URIs
// strings, characters one-character strings, binary base64 strings, big
// integers int64 (an error beyond it), big decimals float64. Map keys must
// be strings, keywords or symbols and stay distinct once they are strings.
// NaN, the infinities and unknown tags are errors: no request field could
// take them.
func Canonical(v any) (any, error) {
	switch v := v.(type) {
	case nil, bool, string, int64:
		return v, nil
	case float64:
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, invalidf("invalid body: %v is not a number a request may carry", v)
		}
		return v, nil
	case *big.Int:
		if v == nil || !v.IsInt64() {
			return nil, invalidf("invalid body: integer %v out of range (the limits are ±9223372036854775807)", v)
		}
		return v.Int64(), nil
	case BigDecimal:
		f, err := strconv.ParseFloat(string(v), 64)
		if err != nil || math.IsInf(f, 0) {
			return nil, invalidf("invalid body: decimal %sM is out of range", string(v))
		}
		return f, nil
	case Keyword:
		return string(v), nil
	case Symbol:
		return string(v), nil
	case Char:
		return string(rune(v)), nil
	case URI:
		return string(v), nil
	case time.Time:
		return string(AppendTime(nil, v)), nil
	case uuid.UUID:
		return v.String(), nil
	case []byte:
		return base64.StdEncoding.EncodeToString(v), nil
	case []any:
		return canonicalSeq(v)
	case List:
		return canonicalSeq(v)
	case Set:
		return canonicalSeq(v)
	case map[string]any:
		m := make(map[string]any, len(v))
		for k, x := range v {
			c, err := Canonical(x)
			if err != nil {
				return nil, err
			}
			m[k] = c
		}
		return m, nil
	case *Map:
		m := make(map[string]any, len(v.Entries))
		for _, e := range v.Entries {
			var k string
			switch key := e.Key.(type) {
			case string:
				k = key
			case Keyword:
				k = string(key)
			case Symbol:
				k = string(key)
			default:
				return nil, invalidf("invalid body: map key %s is not a string or keyword", describeValue(e.Key))
			}
			if _, dup := m[k]; dup {
				return nil, invalidf("invalid body: duplicate map key %q", k)
			}
			c, err := Canonical(e.Value)
			if err != nil {
				return nil, err
			}
			m[k] = c
		}
		return m, nil
	case Tagged:
		return nil, invalidf("invalid body: unsupported tag %q", v.Tag)
	}
	return nil, invalidf("invalid body: unsupported value of type %T", v)
}

func canonicalSeq(a []any) (any, error) {
	out := make([]any, len(a))
	for i, x := range a {
		c, err := Canonical(x)
		if err != nil {
			return nil, err
		}
		out[i] = c
	}
	return out, nil
}

// describeValue shows a value in EDN, shortened, for an error message.
func describeValue(v any) string {
	b, err := Marshal(EDN, v)
	if err != nil {
		return "of an unsupported kind"
	}
	const max = 60
	if r := []rune(string(b)); len(r) > max {
		return string(r[:max]) + "…"
	}
	return string(b)
}
