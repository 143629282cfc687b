package sqlstore

import (
	"encoding/json"
	"reflect"
	"testing"
)

// objectTexts are stored objects and texts that only resemble them: what
// SQLite's json_set and PostgreSQL's jsonb write, escapes, unicode, nulls,
// invalid UTF-8, duplicate keys and broken JSON.
var objectTexts = []string{
	`{}`, ` {} `, `{"site":"bench"}`, `{"site": "bench", "zone": "eu"}`, "{\n\t\"a\" : \"b\"\r\n}",
	`{"Failed":["checksum mismatch"]}`, `{"Failed": ["checksum mismatch", "retry limit"], "Installing": ["low battery"]}`,
	`{"Failed":[]}`, `{"Failed":null}`, `{"a":null}`, `null`, ``, `[]`, `"x"`, `{"a":1}`, `{"a":true}`, `{"a":{"b":"c"}}`,
	`{"héllo":"wörld ✓ 日本"}`, `{"emoji":"😀"}`, `{"e":"\u00e9"}`, `{"q":"a\"b"}`, `{"s":"a\\b"}`, `{"n":"line\nbreak"}`,
	`{"u":"\u2028\u2029"}`, `{"h":"\u003c&\u003e"}`, `{"sur":"\ud83d\ude00"}`, `{"lone":"\ud800"}`, "{\"bad\":\"\xff\xfe\"}",
	"{\"\xffkey\":\"v\"}", "{\"ctl\":\"a\x01b\"}", `{"a":"1","a":"2"}`, `{"F":["x"],"F":["y","z"]}`, `{"a":"b",}`, `{,"a":"b"}`,
	`{"a":"b"`, `{"a" "b"}`, `{"a":"b"} x`, `{"a":["x",]}`, `{"a":[,"x"]}`, `{"a":["x" "y"]}`, `{"a":"b"}{}`,
	`{"big":"12345678901234567890"}`, `{"k":""}`, `{"":""}`, `{"a":[""]}`,
}

// TestDecodeObject checks that decodeObject decodes what json.Unmarshal
// does, into both kinds of object, and fails where it fails.
func TestDecodeObject(t *testing.T) {
	for _, text := range objectTexts {
		t.Run(text, func(t *testing.T) { compareObject(t, text) })
	}
}

func FuzzDecodeObject(f *testing.F) {
	for _, text := range objectTexts {
		f.Add(text)
	}
	f.Fuzz(compareObject)
}

func compareObject(t *testing.T, text string) {
	var got, want map[string]string
	gotErr, wantErr := decodeObject(text, &got, (*objectLexer).str), unmarshal(text, &want)
	if (gotErr != nil) != (wantErr != nil) || !reflect.DeepEqual(got, want) {
		t.Errorf("metadata %q: got %#v, %v; json.Unmarshal %#v, %v", text, got, gotErr, want, wantErr)
	}
	var gotErrs, wantErrs map[string][]string
	gotErr, wantErr = decodeObject(text, &gotErrs, (*objectLexer).strs), unmarshal(text, &wantErrs)
	if (gotErr != nil) != (wantErr != nil) || !reflect.DeepEqual(gotErrs, wantErrs) {
		t.Errorf("errors %q: got %#v, %v; json.Unmarshal %#v, %v", text, gotErrs, gotErr, wantErrs, wantErr)
	}
}

// unmarshal is what the store did before decodeObject.
func unmarshal(text string, v any) error {
	if text == "{}" {
		return nil
	}
	return json.Unmarshal([]byte(text), v)
}

// BenchmarkDecodeObject decodes the stored objects S7 reads two of a row:
// a device's metadata and a device action's errors.
//
//	go test ./sqlstore -run '^$' -bench DecodeObject
func BenchmarkDecodeObject(b *testing.B) {
	b.Run("metadata", func(b *testing.B) {
		text := `{"site": "bench", "zone": "eu-west-1", "owner": "Zoë"}`
		b.ReportAllocs()
		for b.Loop() {
			var m map[string]string
			if err := decodeObject(text, &m, (*objectLexer).str); err != nil || len(m) != 3 {
				b.Fatal(m, err)
			}
		}
	})
	b.Run("errors", func(b *testing.B) {
		text := `{"Failed": ["checksum mismatch", "retry limit"], "Installing": ["low battery"]}`
		b.ReportAllocs()
		for b.Loop() {
			var m map[string][]string
			if err := decodeObject(text, &m, (*objectLexer).strs); err != nil || len(m) != 2 {
				b.Fatal(m, err)
			}
		}
	})
}
