//go:build goexperiment.jsonv2

package main

import (
	jsonv2 "encoding/json/v2"
	"testing"
)

// moreDecoders are the decoders BenchmarkPointPage weighs beyond its own:
// the standard library's encoding/json/v2, built with GOEXPERIMENT=jsonv2.
var moreDecoders = []pointDecoder{{"encoding-json-v2", func(b []byte, v any) error { return jsonv2.Unmarshal(b, v) }}}

// TestPointPageJSONv2 checks that encoding/json/v2 decodes the page to the
// values encoding/json does.
func TestPointPageJSONv2(t *testing.T) {
	b := readPointPage(t)
	var v2, std pointPage
	if err := jsonv2.Unmarshal(b, &v2); err != nil {
		t.Fatal(err)
	}
	if err := decodePointPage(b, &std); err != nil {
		t.Fatal(err)
	}
	if !samePointPage(v2, std) {
		t.Fatal("encoding/json/v2 decodes the page to other values")
	}
}
