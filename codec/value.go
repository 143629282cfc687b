package codec

import (
	"bytes"
	"math"
	"math/big"
	"time"

	"github.com/google/uuid"
)

// The full-fidelity values that ReadTransitJSON, ReadTransitMsgpack and
// ReadEDN return, beside Go's own: nil, bool, int64, float64 (NaN and the
// infinities included), string, []any (a vector or array), []byte (Transit
// binary), *big.Int (an integer beyond int64, or written as one), time.Time
// (UTC) and uuid.UUID. Canonical narrows them to what validation takes.

// Keyword is a keyword without its colon: "name" or "ns/name".
type Keyword string

// Symbol is a symbol: "name" or "ns/name".
type Symbol string

// Char is a single character (EDN \c, Transit ~c).
type Char rune

// BigDecimal is an arbitrary-precision decimal (EDN 1.5M, Transit ~f) kept
// as its text without the M, so nothing is lost until Canonical.
type BigDecimal string

// URI is a Transit URI (~r). EDN has none; Clojure prints java.net.URI as
// #object[java.net.URI …], which ReadEDN accepts for it.
type URI string

// Set is a set in the order it was read.
type Set []any

// List is a list, which EDN and Transit tell apart from a vector ([]any).
type List []any

// Map is a map whose keys may be any value, in the order they were read.
type Map struct {
	Entries []KV
}

// KV is one entry of a Map.
type KV struct {
	Key, Value any
}

// Tagged is a value whose tag this package does not know: an EDN #tag, a
// Transit ~X scalar or ~#tag composite. It survives reading and writing but
// is never canonical.
type Tagged struct {
	Tag   string
	Value any
}

// Get returns the value of the first entry whose key equals k.
func (m *Map) Get(k any) (any, bool) {
	for _, e := range m.Entries {
		if Equal(e.Key, k) {
			return e.Value, true
		}
	}
	return nil, false
}

// Equal reports whether two full-fidelity values are the same value, as
// Clojure's = would say for data read from a body: maps and sets regardless
// of order, a List equal to a vector with the same elements, a *big.Int
// equal to the int64 of the same value. Unlike =, NaN equals NaN, so that
// every value read equals itself.
func Equal(a, b any) bool {
	switch a := a.(type) {
	case int64:
		switch b := b.(type) {
		case int64:
			return a == b
		case *big.Int:
			return b != nil && b.IsInt64() && b.Int64() == a
		}
		return false
	case *big.Int:
		switch b := b.(type) {
		case int64:
			return a != nil && a.IsInt64() && a.Int64() == b
		case *big.Int:
			return a != nil && b != nil && a.Cmp(b) == 0
		}
		return false
	case nil:
		return b == nil
	case float64:
		b, ok := b.(float64)
		return ok && (a == b || math.IsNaN(a) && math.IsNaN(b))
	case []byte:
		b, ok := b.([]byte)
		return ok && bytes.Equal(a, b)
	case time.Time:
		b, ok := b.(time.Time)
		return ok && a.Equal(b)
	case []any:
		return equalSeq(a, b)
	case List:
		return equalSeq(a, b)
	case Set:
		b, ok := b.(Set)
		return ok && len(a) == len(b) && containsAll(a, b) && containsAll(b, a)
	case *Map:
		b, ok := b.(*Map)
		if !ok || len(a.Entries) != len(b.Entries) {
			return false
		}
		for _, e := range a.Entries {
			v, ok := b.Get(e.Key)
			if !ok || !Equal(e.Value, v) {
				return false
			}
		}
		return true
	case Tagged:
		b, ok := b.(Tagged)
		return ok && a.Tag == b.Tag && Equal(a.Value, b.Value)
	case string, bool, Keyword, Symbol, Char, BigDecimal, URI, uuid.UUID:
		return a == b
	}
	return false
}

func equalSeq(a []any, b any) bool {
	var bs []any
	switch b := b.(type) {
	case []any:
		bs = b
	case List:
		bs = b
	default:
		return false
	}
	if len(a) != len(bs) {
		return false
	}
	for i := range a {
		if !Equal(a[i], bs[i]) {
			return false
		}
	}
	return true
}

func containsAll(a, b []any) bool {
	for _, x := range a {
		found := false
		for _, y := range b {
			if Equal(x, y) {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}
