package codec

import (
	"hash/maphash"
	"math"
	"math/big"
	"time"

	"github.com/google/uuid"
)

// distinct finds a repeated map key or set member as entries are read: by
// scanning while there are few, by hash once there are many, so that a
// large body cannot make the check quadratic.
type distinct struct {
	n      int
	small  [8]any
	byHash map[uint64][]any
}

// add records v and reports whether it was new.
func (d *distinct) add(v any) bool {
	if d.byHash == nil {
		for _, s := range d.small[:d.n] {
			if Equal(s, v) {
				return false
			}
		}
		if d.n < len(d.small) {
			d.small[d.n] = v
			d.n++
			return true
		}
		d.byHash = make(map[uint64][]any)
		for _, s := range d.small {
			h := hashValue(s)
			d.byHash[h] = append(d.byHash[h], s)
		}
	}
	h := hashValue(v)
	for _, s := range d.byHash[h] {
		if Equal(s, v) {
			return false
		}
	}
	d.byHash[h] = append(d.byHash[h], v)
	return true
}

var hashSeed = maphash.MakeSeed()

// hashValue is a hash consistent with Equal: equal values hash alike.
func hashValue(v any) uint64 {
	const prime = 1099511628211
	str := func(salt uint64, s string) uint64 { return maphash.String(hashSeed, s) ^ salt }
	switch v := v.(type) {
	case nil:
		return 1
	case bool:
		if v {
			return 2
		}
		return 3
	case int64:
		return uint64(v)*prime ^ 4
	case *big.Int:
		if v.IsInt64() {
			return uint64(v.Int64())*prime ^ 4
		}
		return str(5, v.String())
	case float64:
		if math.IsNaN(v) {
			return 6
		}
		if v == 0 {
			v = 0 // -0 equals 0
		}
		return math.Float64bits(v)*prime ^ 7
	case string:
		return str(8, v)
	case Keyword:
		return str(9, string(v))
	case Symbol:
		return str(10, string(v))
	case Char:
		return uint64(v)*prime ^ 11
	case BigDecimal:
		return str(12, string(v))
	case URI:
		return str(13, string(v))
	case []byte:
		return maphash.Bytes(hashSeed, v) ^ 14
	case time.Time:
		return (uint64(v.Unix())*1_000_000_007+uint64(v.Nanosecond()))*prime ^ 15
	case uuid.UUID:
		return maphash.Bytes(hashSeed, v[:]) ^ 16
	case []any:
		return hashSeq(v)
	case List:
		return hashSeq(v)
	case Set:
		var h uint64 = 17
		for _, x := range v {
			h += hashValue(x) // order does not matter in a set
		}
		return h
	case *Map:
		var h uint64 = 18
		for _, e := range v.Entries {
			h += hashValue(e.Key)*prime ^ hashValue(e.Value)
		}
		return h
	case Tagged:
		return str(19, v.Tag) ^ hashValue(v.Value)*prime
	}
	return 0
}

func hashSeq(a []any) uint64 {
	var h uint64 = 20
	for _, x := range a {
		h = h*1099511628211 ^ hashValue(x)
	}
	return h
}
