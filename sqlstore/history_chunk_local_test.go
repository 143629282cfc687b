package sqlstore

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/fleetd/fleet"
)

// TestChunkPoints reads chunks of awkward data back point by point:
// strings holding brackets, commas, quotes and escapes, nested objects and
// arrays, every kind of value.
func TestChunkPoints(t *testing.T) {
	for _, data := range []string{
		`{}`,
		`{"temp":21.5}`,
		`{"a":"]","b":"[","c":",","d":"}{"}`,
		`{"q":"say \"hi\"","bs":"\\","tail":"\\\\"}`,
		`{"nested":{"x":[1,[2,{"y":"]]"}],3.5],"e":{}},"arr":[]}`,
		`{"n":null,"t":true,"f":false,"i":-9007199254740993,"big":1.5e+300,"u":"\u2028 é 😀"}`,
	} {
		checkChunk(t, data)
	}
}

// FuzzChunkPoints holds chunkPoints to what ParseCanonical reads of the same
// chunk, for any data a point may carry.
func FuzzChunkPoints(f *testing.F) {
	f.Add(`{"temp":21.5,"s":"]\"\\"}`)
	f.Add(`{"a":[{"b":"}"}],"c":null}`)
	f.Fuzz(func(t *testing.T, data string) {
		var v map[string]any
		if json.Unmarshal([]byte(data), &v) != nil || v == nil {
			return
		}
		checkChunk(t, data)
	})
}

// chunkTimes are the timestamps of checkChunk's points: negative, zero,
// the largest, the smallest.
var chunkTimes = []int64{-1000, 0, math.MaxInt64, math.MinInt64}

// checkChunk keeps data as points of a chunk, as ingest writes them,
// and reads them back.
func checkChunk(t *testing.T, data string) {
	t.Helper()
	parsed, err := fleet.ParseCanonical([]byte(data))
	if err != nil {
		t.Fatalf("%s: %v", data, err)
	}
	want := parsed.(map[string]any)
	b := []byte{'['}
	for i := range chunkTimes {
		if i > 0 {
			b = append(b, ',')
		}
		if b, err = appendPoint(b, chunkTimes[i], int64(i), want); err != nil {
			t.Skipf("%s cannot be kept: %v", data, err)
		}
	}
	b = append(b, ']')
	n := 0
	err = chunkPoints(b, func(i int, ts, seq int64, text []byte) bool {
		got, err := fleet.ParseCanonical(text)
		if err != nil || i != n || ts != chunkTimes[i] || seq != int64(i) || !reflect.DeepEqual(got, want) {
			t.Fatalf("point %d of %s: %d %d %s (%v)", i, b, ts, seq, text, err)
		}
		// The text is a slice of the chunk, which FindPoints keeps for the
		// next page and hands to other reads: appending to it must not
		// write into the chunk.
		if cap(text) != len(text) {
			t.Fatalf("point %d of %s: its data %s has room for %d more bytes of the chunk", i, b, text, cap(text)-len(text))
		}
		n++
		return true
	})
	if err != nil || n != len(chunkTimes) {
		t.Fatalf("%s: %d points, %v", b, n, err)
	}
	for _, cut := range []int{1, len(b) / 2, len(b) - 1} {
		if err := chunkPoints(b[:cut], func(int, int64, int64, []byte) bool { return true }); err == nil {
			t.Fatalf("%s cut at %d: no error", b, cut)
		}
	}
	if err := chunkPoints([]byte("[]"), func(int, int64, int64, []byte) bool { t.Fatal("a point of []"); return false }); err != nil {
		t.Fatal(err)
	}
}

// TestBestPoints keeps the first n of points offered in order, in reverse,
// in order but for a few, and shuffled, in both orders of a read.
func TestBestPoints(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, desc := range []bool{false, true} {
		for _, shape := range []string{"sorted", "reversed", "nearly", "shuffled"} {
			for _, n := range []int{1, 2, 7, 100} {
				keys := make([]pointKey, 300)
				for i := range keys {
					keys[i] = pointKey{ts: int64(i / 3), seq: int64(i % 3), chunk: 1, idx: i}
				}
				want := slices.Clone(keys)
				if desc {
					slices.Reverse(want)
				}
				offered := slices.Clone(want)
				switch shape {
				case "reversed":
					slices.Reverse(offered)
				case "nearly":
					for range 5 {
						i, j := r.IntN(len(offered)), r.IntN(len(offered))
						offered[i], offered[j] = offered[j], offered[i]
					}
				case "shuffled":
					r.Shuffle(len(offered), func(i, j int) { offered[i], offered[j] = offered[j], offered[i] })
				}
				best := &bestPoints{n: n, desc: desc}
				for _, k := range offered {
					best.offer(pagePoint{key: k})
				}
				var got []pointKey
				for _, p := range best.sorted() {
					got = append(got, p.key)
				}
				if !slices.Equal(got, want[:n]) {
					t.Fatalf("desc %v, %s, n %d: %v, want %v", desc, shape, n, got, want[:n])
				}
			}
		}
	}
}
