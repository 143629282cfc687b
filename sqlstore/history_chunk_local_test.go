package sqlstore

import (
	"encoding/json"
	"math"
	"reflect"
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
