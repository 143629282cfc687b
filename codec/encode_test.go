package codec_test

import (
	"encoding/json"
	"math/big"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/codec"
	"github.com/google/uuid"
)

type deviceAction struct {
	ActionID   int64               `json:"action_id"`
	DeviceID   string              `json:"device_id"`
	Status     string              `json:"status"`
	Progress   int                 `json:"progress"`
	Params     json.RawMessage     `json:"params"`
	Errors     map[string][]string `json:"errors"`
	Serial     map[string]string   `json:"-serial_metadata"`
	CreatedAt  time.Time           `json:"created_at"`
	UpdatedAt  *time.Time          `json:"updated_at"`
	FirmwareID uuid.UUID           `json:"firmware_id"`
	Role       fleet.Role          `json:"role,omitempty"`
	Note       string              `json:"note,omitempty"`
	Weight     float64             `json:"weight"`
}

var (
	testTime = time.Date(2026, 11, 21, 10, 0, 0, 123_000_000, time.UTC)
	testUUID = uuid.MustParse("5a2cbea3-e8c6-428b-b525-21239370dd55")
)

func sampleResponse() any {
	return map[string]any{
		"device_actions": []deviceAction{{
			ActionID: 7, DeviceID: "dev-1", Status: "Queued", Progress: 0,
			Params:     json.RawMessage(`{"version":"2.3.0","content-length":1024}`),
			Errors:     map[string][]string{"Failed": {"disk full"}},
			Serial:     map[string]string{"region": "eu", "with space": "x", "1st": "y"},
			CreatedAt:  testTime,
			UpdatedAt:  &testTime,
			FirmwareID: testUUID,
			Role:       fleet.RoleOperator,
			Weight:     2,
		}},
		"count":  int64(1),
		"counts": map[string]int{"Queued": 3, "Completed": 7},
		"blob":   []byte("hi"),
		"big":    int64(1) << 60,
	}
}

// TestEncodeEveryFormatDecodes checks that a response written in any
// format decodes to what its JSON twin decodes to.
func TestEncodeEveryFormatDecodes(t *testing.T) {
	v := sampleResponse()
	jb, err := codec.Marshal(codec.JSON, v)
	if err != nil {
		t.Fatal(err)
	}
	want, err := codec.Decode(codec.JSON, jb)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range codec.Formats {
		t.Run(f.String(), func(t *testing.T) {
			b, err := codec.Marshal(f, v)
			if err != nil {
				t.Fatal(err)
			}
			got, err := codec.Decode(f, b)
			if err != nil {
				t.Fatalf("Decode(%q): %v", b, err)
			}
			if !sameCanonical(got, want) {
				t.Errorf("Decode(%v) of %q\n got %#v\nwant %#v", f, b, got, want)
			}
		})
	}
}

// TestEncodeRichTypes checks what a Clojure client reads: keyword keys
// where the name allows, instants and UUIDs.
func TestEncodeRichTypes(t *testing.T) {
	v := struct {
		ID        uuid.UUID         `json:"id"`
		CreatedAt time.Time         `json:"created_at"`
		Meta      map[string]string `json:"metadata"`
	}{testUUID, testTime, map[string]string{"a b": "1", "ns/k": "2"}}
	want := &codec.Map{Entries: []codec.KV{
		{codec.Keyword("id"), testUUID},
		{codec.Keyword("created_at"), testTime},
		{codec.Keyword("metadata"), &codec.Map{Entries: []codec.KV{{"a b", "1"}, {codec.Keyword("ns/k"), "2"}}}},
	}}
	for _, w := range writers {
		t.Run(w.name, func(t *testing.T) {
			b, err := w.write(v)
			if err != nil {
				t.Fatal(err)
			}
			got, err := w.read(b)
			if err != nil {
				t.Fatalf("read %q: %v", b, err)
			}
			if !codec.Equal(got, want) {
				t.Errorf("read %q\n got %#v\nwant %#v", b, got, want)
			}
		})
	}
}

func TestEncodeText(t *testing.T) {
	v := struct {
		ID        uuid.UUID `json:"id"`
		CreatedAt time.Time `json:"created_at"`
		Tags      []string  `json:"tags"`
		Ratio     float64   `json:"ratio"`
	}{testUUID, testTime, []string{"~x", "y"}, 2}
	tests := []struct {
		f    codec.Format
		v    any
		want string
	}{
		{codec.EDN, v, `{:id #uuid "5a2cbea3-e8c6-428b-b525-21239370dd55", :created_at #inst "2026-11-21T10:00:00.123Z", :tags ["~x" "y"], :ratio 2.0}`},
		{codec.TransitJSON, v, `["^ ","~:id","~u5a2cbea3-e8c6-428b-b525-21239370dd55","~:created_at","~m1795255200123","~:tags",["~~x","y"],"~:ratio",2.0]`},
		{codec.TransitJSON, "plain", `["~#'","plain"]`},
		{codec.TransitJSON, []map[string]int{{"name": 1}, {"name": 2}}, `[["^ ","~:name",1],["^ ","^0",2]]`},
		{codec.TransitJSON, int64(1) << 60, `["~#'","~i1152921504606846976"]`},
		{codec.EDN, map[string]any{"n": nil, "set": codec.Set{codec.Keyword("a")}, "big": big.NewInt(5)}, `{:big 5N, :n nil, :set #{:a}}`},
		{codec.EDN, "line\nbreak \"q\"", `"line\nbreak \"q\""`},
	}
	for _, tt := range tests {
		got, err := codec.Marshal(tt.f, tt.v)
		if err != nil {
			t.Errorf("Marshal(%v, %#v): %v", tt.f, tt.v, err)
			continue
		}
		if string(got) != tt.want {
			t.Errorf("Marshal(%v, %#v)\n got %s\nwant %s", tt.f, tt.v, got, tt.want)
		}
	}
	if tm, _ := codec.MarshalTransitVerbose(testTime); string(tm) != `{"~#'":"~t2026-11-21T10:00:00.123Z"}` {
		t.Errorf("verbose time = %s", tm)
	}
}

func TestEncodeRawMessageInEveryFormat(t *testing.T) {
	v := map[string]any{"params": json.RawMessage(`{"force": true, "list": [1, 2.5, "x"]}`)}
	want := obj("params", obj("force", true, "list", arr(int64(1), 2.5, "x")))
	for _, f := range codec.Formats {
		b, err := codec.Marshal(f, v)
		if err != nil {
			t.Fatalf("%v: %v", f, err)
		}
		got, err := codec.Decode(f, b)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%v: Decode(%q) = %#v, %v; want %#v", f, b, got, err, want)
		}
	}
	for _, f := range []codec.Format{codec.TransitJSON, codec.TransitMsgpack, codec.EDN} {
		if _, err := codec.Marshal(f, json.RawMessage(`{"a":1,"a":2}`)); err == nil {
			t.Errorf("%v accepted raw JSON with a duplicate key", f)
		}
	}
}

// sameCanonical compares canonical values, taking an integral float and
// the integer of the same value as equal: JSON writes 2.0 as 2.
func sameCanonical(a, b any) bool {
	switch a := a.(type) {
	case float64:
		if bi, ok := b.(int64); ok {
			return a == float64(bi) && int64(a) == bi
		}
	case int64:
		if bf, ok := b.(float64); ok {
			return bf == float64(a) && int64(bf) == a
		}
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range a {
			if !sameCanonical(a[i], b[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for k, x := range a {
			y, ok := b[k]
			if !ok || !sameCanonical(x, y) {
				return false
			}
		}
		return true
	}
	return reflect.DeepEqual(a, b)
}

// metadata and reportErrors are the domain's maps under other names, which
// the reflective map encoder takes: what it writes is what stringMap must.
type (
	metadata     map[string]string
	reportErrors map[string][]string
)

// TestEncodeStringMapsAsReflection checks that metadata and error maps,
// encoded without reflection, are byte for byte what the reflective
// encoder writes, in every format, for awkward keys and values.
func TestEncodeStringMapsAsReflection(t *testing.T) {
	many := map[string]string{}
	for i := range 40 { // past the keys kept on the stack
		many[string(rune('a'+i%26))+strings.Repeat("z", i)] = strings.Repeat("é", i)
	}
	metas := map[string]map[string]string{
		"nil": nil, "empty": {}, "one": {"site": "bench"}, "many": many,
		"unicode":    {"héllo": "wörld ✓ 日本", "😀": "\u2028\u2029", "": ""},
		"escapes":    {`q"uote`: `back\slash`, "ctl\x01": "line\nbreak", "html": "<&>"},
		"invalid":    {"bad\xff": "\xfe\xff"},
		"transit":    {"~tilde": "~t2024", "^caret": "^ ", "`tick": "`x", "kw-like": "kw-like", "a/b": "1"},
		"big ints":   {"n": "12345678901234567890", "-9223372036854775808": "9223372036854775807"},
		"sort order": {"b": "2", "B": "1", "a": "0", "ä": "3", "aa": "4"},
	}
	errs := map[string]map[string][]string{
		"nil": nil, "empty": {}, "nil list": {"Failed": nil}, "empty list": {"Failed": {}},
		"lists":   {"Failed": {"checksum mismatch", "retry limit"}, "Installing": {"low battery"}},
		"unicode": {"Échec": {"", "日本", "\u2028", "bad\xff"}, "~x": {"~y", "^z"}},
	}
	type record struct {
		ID     int64               `json:"id"`
		Errors map[string][]string `json:"errors"`
		Serial map[string]string   `json:"-serial_metadata"`
	}
	type reflected struct {
		ID     int64        `json:"id"`
		Errors reportErrors `json:"errors"`
		Serial metadata     `json:"-serial_metadata"`
	}
	formats := []codec.Format{codec.JSON, codec.TransitJSON, codec.TransitMsgpack, codec.EDN}
	compare := func(t *testing.T, got, want any) {
		t.Helper()
		for _, f := range formats {
			g, gerr := codec.Marshal(f, got)
			w, werr := codec.Marshal(f, want)
			if string(g) != string(w) || (gerr == nil) != (werr == nil) {
				t.Errorf("%v: got %q, %v; reflection %q, %v", f, g, gerr, w, werr)
			}
		}
	}
	t.Run("canonical nil map", func(t *testing.T) {
		if b, err := codec.Marshal(codec.JSON, map[string]any(nil)); string(b) != "{}" || err != nil {
			t.Errorf("got %q, %v; want {}", b, err)
		}
	})
	for name, m := range metas {
		t.Run("metadata/"+name, func(t *testing.T) {
			compare(t, m, metadata(m))
			compare(t, []any{m, map[string]any{"m": 1}}, []any{metadata(m), map[string]any{"m": 1}})
			compare(t, record{Serial: m}, reflected{Serial: metadata(m)})
		})
	}
	for name, m := range errs {
		t.Run("errors/"+name, func(t *testing.T) {
			compare(t, m, reportErrors(m))
			compare(t, record{Errors: m, Serial: map[string]string{"site": "x"}}, reflected{Errors: reportErrors(m), Serial: metadata{"site": "x"}})
		})
	}
}
