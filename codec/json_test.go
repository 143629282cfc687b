package codec_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/codec"
)

func TestDecodeJSON(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want any
	}{
		{"null", `null`, nil},
		{"true", ` true `, true},
		{"false", "\n\tfalse\r\n", false},
		{"zero", `0`, int64(0)},
		{"negative", `-42`, int64(-42)},
		{"max int64", `9223372036854775807`, int64(9223372036854775807)},
		{"min int64", `-9223372036854775808`, int64(-9223372036854775808)},
		{"fraction is float", `30.0`, 30.0},
		{"exponent is float", `1e3`, 1000.0},
		{"negative exponent", `-2.5E-3`, -0.0025},
		{"tiny underflows to zero", `1e-400`, 0.0},
		{"string", `"hello"`, "hello"},
		{"escapes", `"a\"b\\c\/d\b\f\n\r\t"`, "a\"b\\c/d\b\f\n\r\t"},
		{"unicode escape", `"caf\u00e9"`, "café"},
		{"surrogate pair", `"\ud83d\ude00"`, "😀"},
		{"raw utf-8", `"日本"`, "日本"},
		{"empty array", `[]`, []any{}},
		{"empty object", `{}`, map[string]any{}},
		{"nested", `{"a":[1,{"b":null}],"c":{"d":"e"}}`, map[string]any{
			"a": []any{int64(1), map[string]any{"b": nil}},
			"c": map[string]any{"d": "e"},
		}},
		{"dispatch", dispatchJSON, dispatchCanonical},
		{"depth 64", strings.Repeat("[", 64) + strings.Repeat("]", 64), nest(64)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := codec.Decode(codec.JSON, []byte(tt.in))
			if err != nil {
				t.Fatalf("Decode(%q): %v", tt.in, err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Decode(%q) = %#v, want %#v", tt.in, got, tt.want)
			}
		})
	}
}

func TestDecodeJSONErrors(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		mention string // a name the message must carry, when there is one
	}{
		{"empty", ``, ""},
		{"only space", "  \n", ""},
		{"duplicate key", `{"a":1,"a":2}`, `"a"`},
		{"nested duplicate key", `{"x":{"timeout":1,"timeout":1}}`, `"timeout"`},
		{"integer beyond int64", `9223372036854775808`, ""},
		{"integer below int64", `-9223372036854775809`, ""},
		{"float overflow", `1e400`, ""},
		{"negative float overflow", `-1e400`, ""},
		{"trailing data", `{} {}`, ""},
		{"trailing garbage", `1x`, ""},
		{"leading zero", `01`, ""},
		{"plus sign", `+1`, ""},
		{"bare dot", `1.`, ""},
		{"dot first", `.5`, ""},
		{"exponent without digits", `1e`, ""},
		{"NaN", `NaN`, ""},
		{"Infinity", `Infinity`, ""},
		{"single quotes", `'a'`, ""},
		{"unterminated string", `"abc`, ""},
		{"control character", "\"a\x01b\"", ""},
		{"invalid escape", `"\x"`, ""},
		{"short unicode escape", `"\u12"`, ""},
		{"lone high surrogate", `"\ud83d"`, ""},
		{"lone low surrogate", `"\ude00"`, ""},
		{"high surrogate then letter", `"\ud83dx"`, ""},
		{"invalid utf-8", "\"\xff\"", ""},
		{"truncated utf-8", "\"\xe6\x97\"", ""},
		{"trailing comma in array", `[1,]`, ""},
		{"trailing comma in object", `{"a":1,}`, ""},
		{"missing colon", `{"a" 1}`, ""},
		{"unquoted key", `{a:1}`, ""},
		{"unclosed array", `[1,2`, ""},
		{"unclosed object", `{"a":1`, ""},
		{"comment", `{} // no`, ""},
		{"literal prefix", `tru`, ""},
		{"depth 65", strings.Repeat("[", 65) + strings.Repeat("]", 65), ""},
		{"very deep", strings.Repeat(`{"a":`, 100000), ""},
		{"BOM", "\ufeff{}", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := codec.Decode(codec.JSON, []byte(tt.in))
			if err == nil {
				t.Fatalf("Decode(%q) = %#v, want an error", tt.in, v)
			}
			if code := fleet.ErrorCode(err); code != fleet.EINVALID {
				t.Errorf("Decode(%q) error code = %q, want %q (%v)", tt.in, code, fleet.EINVALID, err)
			}
			if tt.mention != "" && !strings.Contains(fleet.ErrorMessage(err), tt.mention) {
				t.Errorf("Decode(%q) message %q does not name %s", tt.in, fleet.ErrorMessage(err), tt.mention)
			}
		})
	}
}

// TestDecodeJSONPosition checks that a person is told where the problem is.
func TestDecodeJSONPosition(t *testing.T) {
	_, err := codec.Decode(codec.JSON, []byte("{\n  \"a\": 1,\n  \"a\": 2\n}"))
	if msg := fleet.ErrorMessage(err); !strings.Contains(msg, "line 3, column 3") {
		t.Errorf("message %q does not give line 3, column 3", msg)
	}
}

// nest returns n empty arrays nested in each other.
func nest(n int) any {
	var v any = []any{}
	for i := 1; i < n; i++ {
		v = []any{v}
	}
	return v
}

const dispatchJSON = `{"action":"update_firmware","params":{"version":"2.3.0","force":true},"search_type":"default","device_ids":["dev-1","dev-2","dev-3"],"timeout":3600}`

var dispatchCanonical = map[string]any{
	"action":      "update_firmware",
	"params":      map[string]any{"version": "2.3.0", "force": true},
	"search_type": "default",
	"device_ids":  []any{"dev-1", "dev-2", "dev-3"},
	"timeout":     int64(3600),
}
