package codec_test

import (
	"encoding/hex"
	"reflect"
	"strings"
	"testing"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/codec"
)

// decodeCase is one body and the canonical value it must decode to.
type decodeCase struct {
	name string
	in   string
	want any
}

// errorCase is one body that must be refused as invalid; mention, when
// set, is a tag or key name the message must carry.
type errorCase struct {
	name    string
	in      string
	mention string
}

func testDecode(t *testing.T, f codec.Format, cases []decodeCase) {
	t.Helper()
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			got, err := codec.Decode(f, []byte(tt.in))
			if err != nil {
				t.Fatalf("Decode(%v, %q): %v", f, tt.in, err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Decode(%v, %q) = %#v, want %#v", f, tt.in, got, tt.want)
			}
		})
	}
}

func testDecodeErrors(t *testing.T, f codec.Format, cases []errorCase) {
	t.Helper()
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			v, err := codec.Decode(f, []byte(tt.in))
			if err == nil {
				t.Fatalf("Decode(%v, %q) = %#v, want an error", f, tt.in, v)
			}
			if code := fleet.ErrorCode(err); code != fleet.EINVALID {
				t.Errorf("Decode(%v, %q) error code = %q, want %q (%v)", f, tt.in, code, fleet.EINVALID, err)
			}
			if tt.mention != "" && !strings.Contains(fleet.ErrorMessage(err), tt.mention) {
				t.Errorf("Decode(%v, %q) message %q does not name %q", f, tt.in, fleet.ErrorMessage(err), tt.mention)
			}
		})
	}
}

func obj(kv ...any) map[string]any {
	m := map[string]any{}
	for i := 0; i < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	return m
}

func arr(v ...any) []any { return append([]any{}, v...) }

const dispatchTransit = `["^ ","~:action","update_firmware","~:params",["^ ","~:version","2.3.0","~:force",true],"~:search_type","default","~:device_ids",["dev-1","dev-2","dev-3"],"~:timeout",3600]`

const dispatchEDN = `{:action "update_firmware", :params {:version "2.3.0", :force true}, :search_type "default", :device_ids ["dev-1" "dev-2" "dev-3"], :timeout 3600}`

func TestDecodeTransitJSON(t *testing.T) {
	testDecode(t, codec.TransitJSON, []decodeCase{
		{"dispatch", dispatchTransit, dispatchCanonical},
		{"verbose dispatch", `{"~:action":"update_firmware","~:params":{"~:version":"2.3.0","~:force":true},"~:search_type":"default","~:device_ids":["dev-1","dev-2","dev-3"],"~:timeout":3600}`, dispatchCanonical},
		{"string keys", `["^ ","a",1,"b",null]`, obj("a", int64(1), "b", nil)},
		{"namespaced keyword", `["^ ","~:fleet/id",1]`, obj("fleet/id", int64(1))},
		{"symbol key and value", `["^ ","~$sym","~$ns/val"]`, obj("sym", "ns/val")},
		{"keyword value", `["~:queued"]`, arr("queued")},
		{"quoted scalar", `["~#'",42]`, int64(42)},
		{"quoted scalar verbose", `{"~#'":"hi"}`, "hi"},
		{"set", `["~#set",[1,2]]`, arr(int64(1), int64(2))},
		{"list", `{"~#list":["a"]}`, arr("a")},
		{"typed array", `["~#ints",[1,2]]`, arr(int64(1), int64(2))},
		{"cmap of string keys", `["~#cmap",["a",1,"~:b",2]]`, obj("a", int64(1), "b", int64(2))},
		{"time in ms", `["~m946728000000"]`, arr("2000-01-01T12:00:00.000Z")},
		{"time as text", `["~t2000-01-01T13:00:00.5+01:00"]`, arr("2000-01-01T12:00:00.500Z")},
		{"time tagged", `[["~#m",0]]`, arr(arr("1970-01-01T00:00:00.000Z")[0])},
		{"uuid lowercased", `["~u5A2CBEA3-E8C6-428B-B525-21239370DD55"]`, arr("5a2cbea3-e8c6-428b-b525-21239370dd55")},
		{"uuid as hi lo", `[["~#u",[6497777973583037067,-5393868542025081515]]]`, arr("5a2cbea3-e8c6-428b-b525-21239370dd55")},
		{"big integer in range", `["~n123","~i-9223372036854775808"]`, arr(int64(123), int64(-9223372036854775808))},
		{"large integer as ~i", `["~i9007199254740993"]`, arr(int64(9007199254740993))},
		{"big decimal", `["~f1.5","~d2.25"]`, arr(1.5, 2.25)},
		{"char", `["~cé"]`, arr("é")},
		{"uri", `["~rhttp://example.com/a"]`, arr("http://example.com/a")},
		{"binary", `["~baGVsbG8="]`, arr("aGVsbG8=")},
		{"escapes", `["~~a","~^b","~` + "`" + `c","~"]`, arr("~a", "^b", "`c", "~")},
		{"null string", `["~_","~?t","~?f"]`, arr(nil, true, false)},
		{"cache of keys", `[["^ ","~:name",1],["^ ","^0",2]]`, arr(obj("name", int64(1)), obj("name", int64(2)))},
		{"cache of string keys", `[["^ ","aaaa",1],["^ ","^0",2]]`, arr(obj("aaaa", int64(1)), obj("aaaa", int64(2)))},
		{"cache of tags", `[["~#set",[1]],["^0",[2]]]`, arr(arr(int64(1)), arr(int64(2)))},
		{"short keys not cached", `[["^ ","~:a",1,"~:ab",2],["^ ","^0",3]]`, arr(obj("a", int64(1), "ab", int64(2)), obj("ab", int64(3)))},
		{"float", `[1.5,-0.0,1e3]`, arr(1.5, 0.0, 1000.0)},
		{"unicode", `["日本\u00e9"]`, arr("日本é")},
		{"empty", `[]`, arr()},
		{"empty map", `["^ "]`, obj()},
		{"empty verbose map", `{}`, obj()},
	})
}

func TestDecodeTransitJSONErrors(t *testing.T) {
	testDecodeErrors(t, codec.TransitJSON, []errorCase{
		{"empty", ``, ""},
		{"not json", `[1,]`, ""},
		{"big integer", `["~n9223372036854775808"]`, ""},
		{"big JSON integer", `[9223372036854775808]`, ""},
		{"big integer with two signs", `["~n-+5"]`, "not an integer"},
		{"instant before the year 0000", `["~m-62167219200001"]`, "0000 to 9999"},
		{"instant after the year 9999", `["~#m",253402300800000]`, "0000 to 9999"},
		{"big integer key with two signs", `["^ ","~n-+5",1,"~n+-5",2]`, "not an integer"},
		{"duplicate key", `["^ ","a",1,"a",2]`, `"a"`},
		{"duplicate keyword key", `["^ ","~:timeout",1,"~:timeout",2]`, "timeout"},
		{"duplicate verbose key", `{"a":1,"a":2}`, `"a"`},
		{"keyword and string collide", `["^ ","~:a",1,"a",2]`, `"a"`},
		{"unknown tag", `["~#point",[1,2]]`, "point"},
		{"unknown verbose tag", `{"~#point":[1,2]}`, "point"},
		{"unknown scalar tag", `["~Qfoo"]`, `"Q"`},
		{"link", `["~#link",["^ ","href","~rhttp://x"]]`, "link"},
		{"undefined cache code", `["^0"]`, ""},
		{"undefined cache code as key", `["^ ","^5",1]`, ""},
		{"invalid cache code", `["^~"]`, ""},
		{"caret alone", `["^"]`, ""},
		{"map marker inside", `[1,"^ "]`, ""},
		{"composite key", `["~#cmap",[[1],2]]`, ""},
		{"null key", `["^ ","~_",1]`, ""},
		{"integer key", `["^ ","~i1",1]`, ""},
		{"NaN", `["~zNaN"]`, ""},
		{"infinity", `["~zINF"]`, ""},
		{"bad special number", `["~zfoo"]`, ""},
		{"tag with three elements", `["~#set",[1],2]`, ""},
		{"tag alone", `["~#set"]`, ""},
		{"tag as value", `[1,"~#set"]`, ""},
		{"tag in a map with more keys", `{"a":1,"~#set":[1]}`, ""},
		{"odd map", `["^ ","a"]`, ""},
		{"odd cmap", `["~#cmap",[1]]`, ""},
		{"set of a scalar", `["~#set",1]`, ""},
		{"duplicate set member", `["~#set",[1,1]]`, ""},
		{"bad boolean", `["~?x"]`, ""},
		{"bad uuid", `["~unot-a-uuid"]`, ""},
		{"bad time", `["~mabc"]`, ""},
		{"bad rfc 3339", `["~t2000-13-01"]`, ""},
		{"bad integer", `["~iabc"]`, ""},
		{"bad big decimal", `["~f1.2.3"]`, ""},
		{"big decimal overflow", `["~f1e999"]`, ""},
		{"bad base64", `["~b!!"]`, ""},
		{"bad char", `["~cab"]`, ""},
		{"bad uuid pair", `[["~#u",[1]]]`, ""},
		{"empty tag", `["~#",1]`, ""},
		{"trailing data", `[] []`, ""},
		{"depth 65", strings.Repeat("[", 65) + strings.Repeat("]", 65), ""},
		{"depth 65 in maps", strings.Repeat(`["^ ","a",`, 65) + "1" + strings.Repeat("]", 65), ""},
		{"invalid utf-8", "[\"\xff\"]", ""},
	})
}

// mp decodes hex, ignoring spaces, into a MessagePack body.
func mp(s string) string {
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		panic(err)
	}
	return string(b)
}

func TestDecodeTransitMsgpack(t *testing.T) {
	dispatch, err := codec.Marshal(codec.TransitMsgpack, dispatchCanonical)
	if err != nil {
		t.Fatal(err)
	}
	testDecode(t, codec.TransitMsgpack, []decodeCase{
		{"dispatch", string(dispatch), dispatchCanonical},
		{"fixint", mp("92 a3 7e 23 27 05"), int64(5)},
		{"negative fixint", mp("91 ff"), arr(int64(-1))},
		{"int8 to int64", mp("94 d0 80 d1 80 00 d2 80 00 00 00 d3 80 00 00 00 00 00 00 00"), arr(int64(-128), int64(-32768), int64(-2147483648), int64(-9223372036854775808))},
		{"uint8 to uint64", mp("94 cc ff cd ff ff ce ff ff ff ff cf 7f ff ff ff ff ff ff ff"), arr(int64(255), int64(65535), int64(4294967295), int64(9223372036854775807))},
		{"floats", mp("92 ca 3f c0 00 00 cb 3f f8 00 00 00 00 00 00"), arr(1.5, 1.5)},
		{"nil and bools", mp("93 c0 c2 c3"), arr(nil, false, true)},
		{"str8 str16 str32", mp("93 d9 01 61 da 00 01 62 db 00 00 00 01 63"), arr("a", "b", "c")},
		{"bin is binary", mp("91 c4 02 68 69"), arr("aGk=")},
		{"array16 and map16", mp("92 dc 00 01 01 de 00 01 a1 61 02"), arr(arr(int64(1)), obj("a", int64(2)))},
		{"array32 and map32", mp("92 dd 00 00 00 01 01 df 00 00 00 01 a1 61 02"), arr(arr(int64(1)), obj("a", int64(2)))},
		{"keyword keys", mp("81 a3 7e 3a 61 01"), obj("a", int64(1))},
		{"cache code as key", mp("92 81 a6 7e 3a 6e 61 6d 65 01 81 a2 5e 30 02"), arr(obj("name", int64(1)), obj("name", int64(2)))},
		{"map as array", mp("93 a2 5e 20 a1 61 01"), obj("a", int64(1))},
		{"tagged map form", mp("81 a5 7e 23 73 65 74 91 01"), arr(int64(1))},
		{"time", mp("92 a3 7e 23 27 92 a3 7e 23 6d 00"), "1970-01-01T00:00:00.000Z"},
		{"uuid", mp("91 92 a3 7e 23 75 92 cf 5a 2c be a3 e8 c6 42 8b d3 b5 25 21 23 93 70 dd 55"), arr("5a2cbea3-e8c6-428b-b525-21239370dd55")},
	})
}

func TestDecodeTransitMsgpackErrors(t *testing.T) {
	testDecodeErrors(t, codec.TransitMsgpack, []errorCase{
		{"empty", "", ""},
		{"never used", mp("c1"), ""},
		{"fixext", mp("91 d4 01 00"), ""},
		{"ext8", mp("91 c7 01 01 00"), ""},
		{"truncated int", mp("91 cd 01"), ""},
		{"truncated string", mp("91 a5 61"), ""},
		{"truncated array", mp("93 01 02"), ""},
		{"huge array count", mp("dd ff ff ff ff 01"), ""},
		{"huge map count", mp("df ff ff ff ff 01"), ""},
		{"huge string length", mp("91 db ff ff ff ff"), ""},
		{"invalid utf-8", mp("91 a1 ff"), ""},
		{"uint64 beyond int64", mp("91 cf 80 00 00 00 00 00 00 00"), ""},
		{"trailing byte", mp("90 00"), ""},
		{"duplicate key", mp("82 a1 61 01 a1 61 02"), `"a"`},
		{"keyword and string collide", mp("82 a3 7e 3a 61 01 a1 61 02"), `"a"`},
		{"undefined cache code", mp("91 a2 5e 30"), ""},
		{"unknown tag", mp("92 a7 7e 23 70 6f 69 6e 74 92 01 02"), "point"},
		{"tag with three elements", mp("93 a5 7e 23 73 65 74 90 01"), ""},
		{"integer key", mp("81 01 02"), ""},
		{"odd map as array", mp("92 a2 5e 20 a1 61"), ""},
		{"NaN", mp("91 a5 7e 7a 4e 61 4e"), ""},
		{"float NaN", mp("91 cb 7f f8 00 00 00 00 00 01"), ""},
		{"depth 65", strings.Repeat("\x91", 64) + "\x90", ""},
	})
}

func TestDecodeMsgpackPosition(t *testing.T) {
	_, err := codec.Decode(codec.TransitMsgpack, []byte(mp("92 01 c1")))
	if msg := fleet.ErrorMessage(err); !strings.Contains(msg, "byte offset 2") {
		t.Errorf("message %q does not give byte offset 2", msg)
	}
}

func TestDecodeEDN(t *testing.T) {
	testDecode(t, codec.EDN, []decodeCase{
		{"dispatch", dispatchEDN, dispatchCanonical},
		{"comments commas and discards", "; a comment\n{:a 1,,, #_ :ignored :b #_#_ 1 2 [2 #_ 3]} ; end", obj("a", int64(1), "b", arr(int64(2)))},
		{"discard before value", "#_ {:x 1} 7", int64(7)},
		{"namespaced keyword", `{:fleet/id 1}`, obj("fleet/id", int64(1))},
		{"symbol and string keys", `{sym 1 "str" 2}`, obj("sym", int64(1), "str", int64(2))},
		{"symbols", `[foo ns/bar / + - ... a.b *x* <=> a:b a#]`, arr("foo", "ns/bar", "/", "+", "-", "...", "a.b", "*x*", "<=>", "a:b", "a#")},
		{"literals", `[nil true false]`, arr(nil, true, false)},
		{"integers", `[0 -0 +5 -12 9223372036854775807 -9223372036854775808 1N -7N]`, arr(int64(0), int64(0), int64(5), int64(-12), int64(9223372036854775807), int64(-9223372036854775808), int64(1), int64(-7))},
		{"floats", `[1.5 -2.5e3 1E-2 2. 1.5M 3M 0.0]`, arr(1.5, -2500.0, 0.01, 2.0, 1.5, 3.0, 0.0)},
		{"strings", `["a\tb\nc\rd\\e\"f" "\u00e9\b\f" "multi
line" "\101"]`, arr("a\tb\nc\rd\\e\"f", "é\b\f", "multi\nline", "A")},
		{"surrogate pair escape", `"\ud83d\ude00"`, "😀"},
		{"chars", `[\a \newline \space \tab \return \formfeed \backspace \u0041 \o101 \é \( \\]`, arr("a", "\n", " ", "\t", "\r", "\f", "\b", "A", "A", "é", "(", `\`)},
		{"list and set", `[(1 2) #{3}]`, arr(arr(int64(1), int64(2)), arr(int64(3)))},
		{"inst", `#inst "2026-11-21T11:00:00.123+01:00"`, "2026-11-21T10:00:00.123Z"},
		{"inst with unknown offset", `#inst "2000-01-01T12:00:00.000-00:00"`, "2000-01-01T12:00:00.000Z"},
		{"inst finer than the millisecond", `#inst "0000-01-01T00:00:00,0009999+00:00"`, "0000-01-01T00:00:00.000Z"},
		{"uuid", `#uuid "5A2CBEA3-E8C6-428B-B525-21239370DD55"`, "5a2cbea3-e8c6-428b-b525-21239370dd55"},
		{"tag with space and discard", `#inst #_ 1 "1970-01-01T00:00:00Z"`, "1970-01-01T00:00:00.000Z"},
		{"empty collections", `[[] () #{} {}]`, arr(arr(), arr(), arr(), obj())},
		{"whitespace everywhere", " \t\n\r\f, 1 ,\n", int64(1)},
		{"unicode symbol", `[café]`, arr("café")},
	})
}

func TestDecodeEDNErrors(t *testing.T) {
	testDecodeErrors(t, codec.EDN, []errorCase{
		{"empty", ``, ""},
		{"only a comment", `; nothing`, ""},
		{"only a discard", `#_ 1`, ""},
		{"duplicate key", `{:a 1 :a 2}`, ":a"},
		{"duplicate string key", `{"device_ids" 1 "device_ids" 2}`, "device_ids"},
		{"keyword and string collide", `{:a 1 "a" 2}`, `"a"`},
		{"keyword and symbol collide", `{:a 1 a 2}`, `"a"`},
		{"duplicate integer keys across N", `{1 :a 1N :b}`, ""},
		{"duplicate set member", `#{1 1}`, ""},
		{"duplicate nested set member", `#{[1 2] [1 2]}`, ""},
		{"unknown tag", `#myapp/point [1 2]`, "myapp/point"},
		{"unknown tag in a map", `{:at #date "2026"}`, "date"},
		{"odd map", `{:a}`, ""},
		{"unclosed vector", `[1 2`, ""},
		{"unclosed string", `"abc`, ""},
		{"unmatched", `)`, ""},
		{"mismatched", `[1 2)`, ""},
		{"ratio", `1/2`, ""},
		{"big integer", `9223372036854775808`, ""},
		{"big integer N", `-9223372036854775809N`, ""},
		{"float overflow", `1e999`, ""},
		{"big decimal overflow", `1e999M`, ""},
		{"leading zero", `01`, ""},
		{"bad number", `1.5.5`, ""},
		{"bad exponent", `1e`, ""},
		{"NaN", `##NaN`, ""},
		{"infinity", `##Inf`, ""},
		{"bad symbolic value", `##Foo`, ""},
		{"bad inst", `#inst "yesterday"`, ""},
		{"inst of a number", `#inst 1`, ""},
		{"inst before the year 0000 in UTC", `#inst "0000-01-01T00:00:00+00:01"`, "0000 to 9999"},
		{"bad uuid", `#uuid "1234"`, ""},
		{"bad escape", `"\q"`, ""},
		{"lone surrogate", `"\ud800"`, ""},
		{"bad char", `\bogus`, ""},
		{"char surrogate", `\ud800`, ""},
		{"double colon keyword", `::a`, ""},
		{"bare colon", `:`, ""},
		{"keyword starting with digit", `:1a`, ""},
		{"symbol with two slashes", `a/b/c`, ""},
		{"symbol ending in slash", `a/`, ""},
		{"discard at end of vector", `[1 #_]`, ""},
		{"vector key", `{[1] 2}`, ""},
		{"integer key", `{1 2}`, ""},
		{"nil key", `{nil 2}`, ""},
		{"trailing value", `1 2`, ""},
		{"regex", `#"re"`, ""},
		{"auto-resolved namespaced map", `#::{:a 1}`, "#::"},
		{"anonymous fn", `#(inc %)`, ""},
		{"tag without value", `[#foo]`, ""},
		{"hash alone", `#`, ""},
		{"deref", `@a`, ""},
		{"invalid utf-8", "\"\xff\"", ""},
		{"invalid utf-8 symbol", "a\xff", ""},
		{"depth 65", strings.Repeat("[", 65) + strings.Repeat("]", 65), ""},
		{"depth 65 in discard", "#_" + strings.Repeat("[", 65) + strings.Repeat("]", 65) + " 1", ""},
	})
}

func TestDecodeEDNPosition(t *testing.T) {
	_, err := codec.Decode(codec.EDN, []byte("{:a 1\n :b 2\n :a 3}"))
	if msg := fleet.ErrorMessage(err); !strings.Contains(msg, "line 3, column 2") {
		t.Errorf("message %q does not give line 3, column 2", msg)
	}
}

// TestDecodeErrorMessagesAreShort checks that a huge token in a body does
// not make a huge message.
func TestDecodeErrorMessagesAreShort(t *testing.T) {
	long := strings.Repeat("9", 100000)
	for _, c := range []struct {
		f    codec.Format
		body string
	}{
		{codec.JSON, long},
		{codec.JSON, `{"` + long + `":1,"` + long + `":2}`},
		{codec.TransitJSON, `["~u` + long + `"]`},
		{codec.EDN, `#inst "` + long + `"`},
		{codec.EDN, `{:` + long + ` 1 :` + long + ` 2}`},
	} {
		_, err := codec.Decode(c.f, []byte(c.body))
		if n := len(fleet.ErrorMessage(err)); err == nil || n > 1000 {
			t.Errorf("Decode(%v, %.20q…): message of %d bytes (%v)", c.f, c.body, n, err == nil)
		}
	}
}
