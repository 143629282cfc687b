package codec_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/fleetd/fleet/codec"
)

// independentDir holds encode.js and its pinned node packages, installed
// by `npm ci --prefix codec/testdata/independent` (.ci/run does it).
const independentDir = "testdata/independent"

// independentCase is a value in encode.js's schema and the JSON a client
// would send for the same body.
type independentCase struct {
	name string
	node any
	twin any
}

func kw(s string) any          { return map[string]any{"$kw": s} }
func sym(s string) any         { return map[string]any{"$sym": s} }
func bigint(s string) any      { return map[string]any{"$int": s} }
func inst(s string) any        { return map[string]any{"$inst": s} }
func uuidNode(s string) any    { return map[string]any{"$uuid": s} }
func setNode(v ...any) any     { return map[string]any{"$set": append([]any{}, v...)} }
func listNode(v ...any) any    { return map[string]any{"$list": append([]any{}, v...)} }
func mapNode(kv ...[2]any) any { return map[string]any{"$map": kv} }
func pair(k, v any) [2]any     { return [2]any{k, v} }
func num(s string) json.Number { return json.Number(s) }

func independentCases() []independentCase {
	manyKeys := map[string]any{}
	manyTwin := map[string]any{}
	for i := 0; i < 60; i++ {
		manyKeys[fmt.Sprintf("key%02d", i)] = i
		manyTwin[fmt.Sprintf("key%02d", i)] = i
	}
	var wrapNode, wrapTwin []any
	for round := 0; round < 2; round++ {
		for i := 0; i < 2000; i++ {
			wrapNode = append(wrapNode, kw(fmt.Sprintf("kw%04d", i)))
			wrapTwin = append(wrapTwin, fmt.Sprintf("kw%04d", i))
		}
	}
	var deepNode, deepTwin any = "bottom", "bottom"
	for i := 0; i < 30; i++ {
		deepNode = map[string]any{"next": deepNode}
		deepTwin = map[string]any{"next": deepTwin}
	}
	return []independentCase{
		{"dispatch", map[string]any{
			"action": "update_firmware", "params": map[string]any{"version": "2.3.0", "force": true},
			"search_type": "default", "device_ids": []any{"dev-1", "dev-2", "dev-3"}, "timeout": 3600,
		}, map[string]any{
			"action": "update_firmware", "params": map[string]any{"version": "2.3.0", "force": true},
			"search_type": "default", "device_ids": []any{"dev-1", "dev-2", "dev-3"}, "timeout": 3600,
		}},
		{"nested maps", map[string]any{"a": map[string]any{"b": map[string]any{"c": nil}}}, map[string]any{"a": map[string]any{"b": map[string]any{"c": nil}}}},
		{"keyword values", map[string]any{"search_type": kw("all"), "state": kw("fleet/active")}, map[string]any{"search_type": "all", "state": "fleet/active"}},
		{"namespaced keys", mapNode(pair(kw("fleet/id"), 1), pair(kw("-serial_metadata"), map[string]any{})), map[string]any{"fleet/id": 1, "-serial_metadata": map[string]any{}}},
		{"symbols", []any{sym("a"), sym("ns/b"), sym("+")}, []any{"a", "ns/b", "+"}},
		{"sets", map[string]any{"device_ids": setNode("dev-1", "dev-2")}, map[string]any{"device_ids": []any{"dev-1", "dev-2"}}},
		{"lists", listNode(1, listNode("x"), []any{}), []any{1, []any{"x"}, []any{}}},
		{"dates", []any{inst("2026-11-21T10:00:00.123Z"), inst("1776-07-04T12:00:00.000Z"), inst("1970-01-01T00:00:00.000Z")},
			[]any{"2026-11-21T10:00:00.123Z", "1776-07-04T12:00:00.000Z", "1970-01-01T00:00:00.000Z"}},
		{"uuids", map[string]any{"rule_id": uuidNode("5a2cbea3-e8c6-428b-b525-21239370dd55")}, map[string]any{"rule_id": "5a2cbea3-e8c6-428b-b525-21239370dd55"}},
		{"big integers", []any{bigint("9223372036854775807"), bigint("-9223372036854775808"), bigint("9007199254740993"), bigint("0")},
			[]any{num("9223372036854775807"), num("-9223372036854775808"), num("9007199254740993"), 0}},
		{"negative integers", []any{-1, -12345, -9007199254740991}, []any{-1, -12345, num("-9007199254740991")}},
		{"floats", []any{2.5, -0.125, 1e-7, 6.02e23}, []any{2.5, -0.125, 1e-7, 6.02e23}},
		{"unicode", map[string]any{"name": "日本語 😀 é"}, map[string]any{"name": "日本語 😀 é"}},
		{"escapes", []any{"quote \" backslash \\ newline \n tab \t ctl \x01", "~tilde", "^caret", "`tick", "#hash", "~#set", "^ "},
			[]any{"quote \" backslash \\ newline \n tab \t ctl \x01", "~tilde", "^caret", "`tick", "#hash", "~#set", "^ "}},
		{"string keys", mapNode(pair("with space", 1), pair("~x", 2), pair("^y", 3), pair("plain", 4)), map[string]any{"with space": 1, "~x": 2, "^y": 3, "plain": 4}},
		{"repeated keys", []any{
			map[string]any{"device_id": "a", "status": "ok"}, map[string]any{"device_id": "b", "status": "ok"},
			map[string]any{"device_id": "c", "status": kw("Failed")},
		}, []any{
			map[string]any{"device_id": "a", "status": "ok"}, map[string]any{"device_id": "b", "status": "ok"},
			map[string]any{"device_id": "c", "status": "Failed"},
		}},
		{"more than 44 repeated keys", []any{manyKeys, manyKeys, manyKeys}, []any{manyTwin, manyTwin, manyTwin}},
		{"cache wraps around", wrapNode, wrapTwin},
		{"empty collections", []any{[]any{}, map[string]any{}, setNode(), listNode()}, []any{[]any{}, map[string]any{}, []any{}, []any{}}},
		{"nulls and booleans", map[string]any{"a": nil, "b": true, "c": false}, map[string]any{"a": nil, "b": true, "c": false}},
		{"mixed vector", []any{1, "two", 3.5, nil, true, kw("six"), []any{7}}, []any{1, "two", 3.5, nil, true, "six", []any{7}}},
		{"deep nesting", deepNode, deepTwin},
		{"scalar", "just a string", "just a string"},
	}
}

// TestIndependentEncoders decodes bodies written by transit-js and
// edn-data and requires what their JSON twins decode to.
func TestIndependentEncoders(t *testing.T) {
	if _, err := os.Stat(filepath.Join(independentDir, "node_modules")); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("node packages are missing: run npm ci --prefix codec/testdata/independent (%v)", err)
		}
		t.Skip("node packages not installed; run npm ci --prefix codec/testdata/independent")
	}
	cases := independentCases()
	nodes := make([]any, len(cases))
	for i, c := range cases {
		nodes[i] = c.node
	}
	in, err := json.Marshal(nodes)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("node", "encode.js")
	cmd.Dir = independentDir
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node encode.js: %v\n%s", err, stderr.Bytes())
	}
	var encoded []struct {
		Transit string `json:"transit"`
		EDN     string `json:"edn"`
	}
	if err := json.Unmarshal(out, &encoded); err != nil || len(encoded) != len(cases) {
		t.Fatalf("encode.js gave %d results for %d cases: %v", len(encoded), len(cases), err)
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			twin, err := json.Marshal(c.twin)
			if err != nil {
				t.Fatal(err)
			}
			want, err := codec.Decode(codec.JSON, twin)
			if err != nil {
				t.Fatalf("Decode(JSON, %.200s): %v", twin, err)
			}
			for _, body := range []struct {
				f    codec.Format
				text string
			}{{codec.TransitJSON, encoded[i].Transit}, {codec.EDN, encoded[i].EDN}} {
				got, err := codec.Decode(body.f, []byte(body.text))
				if err != nil {
					t.Errorf("Decode(%v, %.300s): %v", body.f, body.text, err)
					continue
				}
				if !sameCanonical(got, want) {
					t.Errorf("Decode(%v, %.300s)\n got %.300v\nwant %.300v", body.f, body.text, got, want)
				}
			}
		})
	}
}
