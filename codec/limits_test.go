package codec_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/codec"
)

// TestDecodeWithinLen: every reader counts the elements of each
// collection as it reads them and refuses the first past Limits.Len, in
// each kind of collection its format has, at any depth.
func TestDecodeWithinLen(t *testing.T) {
	const n = 3
	cases := []struct {
		f        codec.Format
		name     string
		ok, long string // n elements, n+1
	}{
		{codec.JSON, "array", `[1,2,3]`, `[1,2,3,4]`},
		{codec.JSON, "object", `{"a":1,"b":2,"c":3}`, `{"a":1,"b":2,"c":3,"d":4}`},
		{codec.JSON, "nested", `{"a":[[1,2,3]]}`, `{"a":[[1,2,3,4]]}`},
		{codec.TransitJSON, "array", `[1,2,3]`, `[1,2,3,4]`},
		{codec.TransitJSON, "map", `["^ ","a",1,"b",2,"c",3]`, `["^ ","a",1,"b",2,"c",3,"d",4]`},
		{codec.TransitJSON, "verbose map", `{"a":1,"b":2,"c":3}`, `{"a":1,"b":2,"c":3,"d":4}`},
		{codec.TransitJSON, "set", `["~#set",[1,2,3]]`, `["~#set",[1,2,3,4]]`},
		{codec.TransitJSON, "nested", `["^ ","a",[[1,2,3]]]`, `["^ ","a",[[1,2,3,4]]]`},
		{codec.EDN, "vector", `[1 2 3]`, `[1 2 3 4]`},
		{codec.EDN, "list", `(1 2 3)`, `(1 2 3 4)`},
		{codec.EDN, "set", `#{1 2 3}`, `#{1 2 3 4}`},
		{codec.EDN, "map", `{:a 1 :b 2 :c 3}`, `{:a 1 :b 2 :c 3 :d 4}`},
		{codec.EDN, "nested", `{:a [[1 2 3]]}`, `{:a [[1 2 3 4]]}`},
	}
	for _, f := range []codec.Format{codec.TransitMsgpack} {
		for _, v := range []struct {
			name     string
			ok, long any
		}{
			{"array", []any{int64(1), int64(2), int64(3)}, []any{int64(1), int64(2), int64(3), int64(4)}},
			{"map", map[string]any{"a": int64(1), "b": int64(2), "c": int64(3)}, map[string]any{"a": int64(1), "b": int64(2), "c": int64(3), "d": int64(4)}},
			{"nested", map[string]any{"a": []any{[]any{"x", "y", "z"}}}, map[string]any{"a": []any{[]any{"x", "y", "z", "w"}}}},
		} {
			ok, err := codec.Marshal(f, v.ok)
			if err != nil {
				t.Fatal(err)
			}
			long, err := codec.Marshal(f, v.long)
			if err != nil {
				t.Fatal(err)
			}
			cases = append(cases, struct {
				f        codec.Format
				name     string
				ok, long string
			}{f, v.name, string(ok), string(long)})
		}
	}
	for _, tt := range cases {
		t.Run(tt.f.String()+"/"+tt.name, func(t *testing.T) {
			l := codec.Limits{Len: n}
			want, err := codec.Decode(tt.f, []byte(tt.ok))
			if err != nil {
				t.Fatal(err)
			}
			got, err := codec.DecodeWithin(tt.f, []byte(tt.ok), l)
			if err != nil {
				t.Fatalf("DecodeWithin(%q, Len %d): %v", tt.ok, n, err)
			}
			if !sameCanonical(got, want) {
				t.Errorf("DecodeWithin(%q) = %#v, want %#v", tt.ok, got, want)
			}
			if _, err := codec.Decode(tt.f, []byte(tt.long)); err != nil {
				t.Fatalf("Decode(%q) without limits: %v", tt.long, err)
			}
			_, err = codec.DecodeWithin(tt.f, []byte(tt.long), l)
			if code := fleet.ErrorCode(err); code != fleet.ETOOLARGE {
				t.Fatalf("DecodeWithin(%q, Len %d) error %v (code %q), want %q", tt.long, n, err, code, fleet.ETOOLARGE)
			}
			if msg := fleet.ErrorMessage(err); !strings.Contains(msg, "more than 3 elements") {
				t.Errorf("message %q does not say the limit", msg)
			}
		})
	}
}

// TestDecodeWithinStops: the reader stops at the first element past the
// limit. What follows it (here a megabyte of empty objects, then a syntax
// error) is never read, and what decoding allocated is proportional to
// the limit, not to the body.
func TestDecodeWithinStops(t *testing.T) {
	const limit = 1000
	for _, f := range codec.Formats {
		t.Run(f.String(), func(t *testing.T) {
			elems := make([]any, 1<<20/3)
			for i := range elems {
				elems[i] = map[string]any{}
			}
			body, err := codec.Marshal(f, elems)
			if err != nil {
				t.Fatal(err)
			}
			if f != codec.TransitMsgpack {
				// Broken at its end: only a reader that goes on finds it.
				body = append(bytes.TrimRight(body, "]"), '}')
			}
			var derr error
			allocs := testing.AllocsPerRun(3, func() {
				_, derr = codec.DecodeWithin(f, body, codec.Limits{Len: limit})
			})
			if code := fleet.ErrorCode(derr); code != fleet.ETOOLARGE {
				t.Fatalf("error %v (code %q), want %q", derr, code, fleet.ETOOLARGE)
			}
			// An empty map costs one or two allocations, its slot in the
			// array perhaps another; a megabyte of them, 350,000 maps.
			if allocs > 5*limit {
				t.Errorf("%d allocations to refuse %d elements, want at most %d", int(allocs), len(elems), 5*limit)
			}
		})
	}
}

// TestDecodeWithinTotal: Limits.Total bounds the elements of all the
// collections of a body together, each of them within Len.
func TestDecodeWithinTotal(t *testing.T) {
	v := []any{[]any{int64(1), int64(2)}, map[string]any{"a": int64(3), "b": int64(4)}, []any{int64(5)}}
	const total = 8 // 3 + 2 + 2 + 1
	for _, f := range codec.Formats {
		t.Run(f.String(), func(t *testing.T) {
			body, err := codec.Marshal(f, v)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := codec.DecodeWithin(f, body, codec.Limits{Len: 3, Total: total}); err != nil {
				t.Fatalf("DecodeWithin(%q, Total %d): %v", body, total, err)
			}
			_, err = codec.DecodeWithin(f, body, codec.Limits{Len: 3, Total: total - 1})
			if code := fleet.ErrorCode(err); code != fleet.ETOOLARGE {
				t.Fatalf("DecodeWithin(%q, Total %d) error %v (code %q), want %q", body, total-1, err, code, fleet.ETOOLARGE)
			}
			if msg := fleet.ErrorMessage(err); !strings.Contains(msg, "more than 7 elements in all") {
				t.Errorf("message %q does not say the limit", msg)
			}
		})
	}
}
