package fleethttp

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

func TestRequestID(t *testing.T) {
	for _, n := range []uint64{0, 1, 0xf, 0xabcdef, math.MaxUint64, rand.Uint64(), rand.Uint64()} {
		if got, want := requestID(n), fmt.Sprintf("%016x", n); got != want {
			t.Errorf("requestID(%#x) = %q, want %q", n, got, want)
		}
	}
}
