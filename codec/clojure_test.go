package codec_test

import (
	"testing"

	"github.com/fleetd/fleet/codec"
)

// The bodies below are byte for byte what Clojure 1.11's printer wrote
// (pr-str, with *print-namespace-maps* bound as clojure.main binds it for
// scripts and -m; clj-http's :content-type :edn prints the same), and the
// refusals are those of clojure.edn/read-string for the same text. A JVM is
// not needed to run them: docs/encodings.md quotes the forms.

// TestDecodeEDNNamespacedMaps: #:ns{…} reads as Clojure's readers read it
// (docs/encodings.md#what-a-clojure-client-should-expect): a key without a
// namespace takes ns, :_/k loses it, a key with another namespace keeps it,
// keys that are not keywords or symbols stay as they are; then keys become
// strings as usual.
func TestDecodeEDNNamespacedMaps(t *testing.T) {
	testDecode(t, codec.EDN, []decodeCase{
		{"printed", `#:firmware{:version "2.3.0", :file "a.bin"}`,
			map[string]any{"firmware/version": "2.3.0", "firmware/file": "a.bin"}},
		{"nested", `#:a{:x 1, :y #:c{:z 1}}`,
			map[string]any{"a/x": int64(1), "a/y": map[string]any{"c/z": int64(1)}}},
		{"symbol key", `#:a{:x 1, y 2}`, map[string]any{"a/x": int64(1), "a/y": int64(2)}},
		{"every kind of key", `#:a{:b 1 :_/c 2 :d/e 3 f 4 "s" 5}`,
			map[string]any{"a/b": int64(1), "c": int64(2), "d/e": int64(3), "a/f": int64(4), "s": int64(5)}},
		{"space before the map", `#:a {:b 1}`, map[string]any{"a/b": int64(1)}},
		{"comma before the map", `#:a,{:b 1}`, map[string]any{"a/b": int64(1)}},
		{"space before the namespace", `#: a{:b 1}`, map[string]any{"a/b": int64(1)}},
		{"empty", `#:a{}`, map[string]any{}},
		{"in a dispatch", `{:action "reboot", :params #:reboot{:delay 5}, :search_type :all}`,
			map[string]any{"action": "reboot", "params": map[string]any{"reboot/delay": int64(5)}, "search_type": "all"}},
	})
	testDecodeErrors(t, codec.EDN, []errorCase{
		{"auto-resolved", `#::{:b 1}`, "#::"},
		{"auto-resolved alias", `#::fw{:b 1}`, "#::"},
		{"qualified namespace", `#:a/b{:b 1}`, "namespace"},
		{"numeric namespace", `#:1{:b 1}`, "namespace"},
		{"nil namespace", `#:nil{:b 1}`, "namespace"},
		{"no map", `#:a [1]`, "map"},
		{"comment before the map", "#:a;x\n{:b 1}", "map"},
		{"discard before the map", `#:a #_x {:b 1}`, "map"},
		{"odd forms", `#:a{:b}`, ":b"},
		{"duplicate once qualified", `#:a{:b 1 :a/b 2}`, ":a/b"},
		{"duplicate", `#:a{:b 1 :b 2}`, ":b"},
	})
}

// TestDecodeClojureNumbers: what Clojure prints for numbers. A double is
// a float64 and an integer an int64, whatever their size; ratios and
// integers beyond 64 bits are refused (no field could take them exactly).
func TestDecodeClojureNumbers(t *testing.T) {
	testDecode(t, codec.EDN, []decodeCase{
		{"doubles and a long", `{:params {:ratio 80.0, :big 3.5517595525155558E17, :e 1.0E10, :small 1.0E-5, :n 80}}`,
			map[string]any{"params": map[string]any{"ratio": 80.0, "big": 3.551759552515556e17, "e": 1e10, "small": 1e-5, "n": int64(80)}}},
		{"shortest double (Java 19+)", `3.551759552515556E17`, 3.551759552515556e17},
		{"big decimal", `1.5M`, 1.5},
		{"big integer within 64 bits", `80N`, int64(80)},
	})
	testDecodeErrors(t, codec.EDN, []errorCase{
		{"ratio", `{:r 1/3}`, "1/3"},
		{"big integer", `12345678901234567890N`, "12345678901234567890"},
		{"metadata", `^{:m true} {:a 1}`, ""},
	})
}
