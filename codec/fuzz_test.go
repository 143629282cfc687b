package codec_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/codec"
)

// seedExemplars adds the exemplar files with the extension ext, the small
// ones: a fuzzer mutates a short input faster.
func seedExemplars(f *testing.F, ext string, extra ...string) {
	files, _ := filepath.Glob(filepath.Join(exemplarDir, "*"+ext))
	for _, file := range files {
		if ext == ".json" && strings.HasSuffix(file, ".verbose.json") {
			continue
		}
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		if len(b) <= 4096 {
			f.Add(b)
		}
	}
	for _, s := range extra {
		f.Add([]byte(s))
	}
}

// checkDecode is the property every decoder keeps: no panic, only EINVALID
// errors, and on success only canonical values, which survive a round trip
// through JSON.
func checkDecode(t *testing.T, f codec.Format, b []byte) any {
	v, err := codec.Decode(f, b)
	checkBounded(t, f, b, v, err)
	if err != nil {
		if code := fleet.ErrorCode(err); code != fleet.EINVALID {
			t.Fatalf("Decode(%v, %q) error code %q: %v", f, b, code, err)
		}
		return nil
	}
	if !isCanonical(v, 0) {
		t.Fatalf("Decode(%v, %q) = %#v: not canonical", f, b, v)
	}
	jb, err := codec.Marshal(codec.JSON, v)
	if err != nil {
		t.Fatalf("Marshal(JSON, %#v): %v", v, err)
	}
	again, err := codec.Decode(codec.JSON, jb)
	if err != nil {
		t.Fatalf("Decode(JSON, %q) of re-encoded %#v: %v", jb, v, err)
	}
	if !sameCanonical(v, again) {
		t.Fatalf("round trip through JSON changed %#v into %#v", v, again)
	}
	return v
}

// fuzzLen is the Limits.Len the fuzz targets decode within too: small,
// so that the fuzzer reaches it often.
const fuzzLen = 3

// checkBounded is the property of the bounded decoders, given what
// decoding b without limits gave: within Limits they give the same value,
// or ETOOLARGE; never ETOOLARGE for a body whose collections all fit, and
// always a refusal for one whose canonical value has a longer collection.
func checkBounded(t *testing.T, f codec.Format, b []byte, v any, err error) {
	got, berr := codec.DecodeWithin(f, b, codec.Limits{Len: fuzzLen})
	switch {
	case berr != nil && fleet.ErrorCode(berr) == fleet.ETOOLARGE:
		if err == nil && longest(v) <= fuzzLen && !hasTransitComposite(b) {
			t.Fatalf("DecodeWithin(%v, %q, Len %d): %v, but its longest collection is %d", f, b, fuzzLen, berr, longest(v))
		}
	case berr != nil:
		if err == nil {
			t.Fatalf("DecodeWithin(%v, %q): %v, but Decode accepted it", f, b, berr)
		}
	case err != nil:
		t.Fatalf("DecodeWithin(%v, %q) = %#v, but Decode refused it: %v", f, b, got, err)
	case longest(v) > fuzzLen:
		t.Fatalf("DecodeWithin(%v, %q, Len %d) accepted a collection of %d", f, b, fuzzLen, longest(v))
	case !sameCanonical(got, v):
		t.Fatalf("DecodeWithin(%v, %q) = %#v, Decode %#v", f, b, got, v)
	}
}

// hasTransitComposite reports whether b may hold a Transit tagged
// composite such as ~#cmap, whose representation (an array of keys and
// values) is longer than the value it stands for.
func hasTransitComposite(b []byte) bool { return bytes.Contains(b, []byte("~#")) }

// longest returns the length of the longest array or map in a canonical
// value.
func longest(v any) int {
	n := 0
	switch v := v.(type) {
	case []any:
		n = len(v)
		for _, x := range v {
			n = max(n, longest(x))
		}
	case map[string]any:
		n = len(v)
		for _, x := range v {
			n = max(n, longest(x))
		}
	}
	return n
}

func isCanonical(v any, depth int) bool {
	if depth > codec.MaxDepth {
		return false
	}
	switch v := v.(type) {
	case nil, bool, int64, float64, string:
		return true
	case []any:
		for _, x := range v {
			if !isCanonical(x, depth+1) {
				return false
			}
		}
		return true
	case map[string]any:
		for _, x := range v {
			if !isCanonical(x, depth+1) {
				return false
			}
		}
		return true
	}
	return false
}

func FuzzDecodeJSON(f *testing.F) {
	seedExemplars(f, ".verbose.json", dispatchJSON, `{"a":"\ud83d\ude00","b":[1e400]}`, `[-0.0,1E+2,"\u0000"]`)
	f.Fuzz(func(t *testing.T, b []byte) {
		if v := checkDecode(t, codec.JSON, b); v != nil && !json.Valid(b) {
			t.Fatalf("Decode(JSON) accepted %q, which encoding/json calls invalid", b)
		}
	})
}

func FuzzDecodeTransitJSON(f *testing.F) {
	seedExemplars(f, ".json", dispatchTransit, `[["^ ","~:name",1],["^ ","^0",2]]`)
	f.Fuzz(func(t *testing.T, b []byte) {
		checkDecode(t, codec.TransitJSON, b)
		if _, err := codec.ReadTransitJSON(b); err == nil && !json.Valid(b) {
			t.Fatalf("ReadTransitJSON accepted %q, which is not JSON", b)
		}
	})
}

func FuzzDecodeTransitMsgpack(f *testing.F) {
	dispatch, err := codec.Marshal(codec.TransitMsgpack, dispatchCanonical)
	if err != nil {
		f.Fatal(err)
	}
	seedExemplars(f, ".mp", string(dispatch))
	f.Fuzz(func(t *testing.T, b []byte) {
		checkDecode(t, codec.TransitMsgpack, b)
	})
}

func FuzzDecodeEDN(f *testing.F) {
	seedExemplars(f, ".edn", dispatchEDN, `[\a \newline "\u00e9" #_ 1 #inst "2026-11-21T10:00:00Z" #uuid "5a2cbea3-e8c6-428b-b525-21239370dd55" 1N 1.5M (1) #{2}]`,
		`#:a{:b 1, :_/c 2, :d/e #:f{g 3}, "s" 4}`, `{:n 80, :d 80.0, :e 1.0E10, :big 3.5517595525155558E17}`)
	f.Fuzz(func(t *testing.T, b []byte) {
		checkDecode(t, codec.EDN, b)
	})
}

// FuzzReadWrite is the full-fidelity property: what a reader accepts, each
// of our writers writes so that its reader returns it unchanged.
func FuzzReadWrite(f *testing.F) {
	seedExemplars(f, ".edn", dispatchEDN)
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := codec.ReadEDN(b)
		if err != nil {
			return
		}
		for _, w := range writers {
			out, err := w.write(v)
			if err != nil {
				continue // e.g. a Tagged whose tag is no EDN symbol
			}
			got, err := w.read(out)
			if err != nil {
				t.Fatalf("%s: reading back %q (from %q): %v", w.name, out, b, err)
			}
			if !codec.Equal(got, v) {
				t.Fatalf("%s: %q read back as %#v, want %#v", w.name, out, got, v)
			}
		}
	})
}
