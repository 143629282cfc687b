package codec_test

import (
	"bytes"
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/codec"
	"github.com/google/uuid"
)

type inner struct {
	Z string `json:"z"`
}

type Embedded struct {
	E1 int `json:"e1"`
	E2 int
}

type plain struct {
	Embedded
	*inner
	Name string     `json:"name"`
	Role fleet.Role `json:"role"`
	Skip string     `json:"-"`
	//lint:ignore SA5008 encoding/json names this field "-"; the encoder must too
	Dash     string            `json:"-,"`
	Omit     string            `json:"omit,omitempty"`
	OmitPtr  *int              `json:"omit_ptr,omitempty"`
	Untagged float32           //
	Ints     []int64           `json:"ints"`
	NilSlice []string          `json:"nil_slice"`
	Bytes    []byte            `json:"bytes"`
	Map      map[string]int    `json:"map"`
	IntKeys  map[int]string    `json:"int_keys"`
	Any      any               `json:"any"`
	Arr      [2]bool           `json:"arr"`
	U8       uint8             `json:"u8"`
	U64      uint64            `json:"u64"`
	F64      float64           `json:"f64"`
	Strs     map[string]string `json:"strs,omitempty"`
	//lint:ignore U1000 an unexported field, which the encoder must skip
	private int
}

// TestEncodeJSONMatchesEncodingJSON checks byte compatibility with
// encoding/json (HTML escaping off) for values without times or integral
// floats (TestEncodeJSONFloats).
func TestEncodeJSONMatchesEncodingJSON(t *testing.T) {
	n := 7
	values := []any{
		nil, true, 0, -1, int64(math.MaxInt64), uint64(math.MaxUint64), 1.5, 1e21, 1e-7, 123456789.5, float32(0.1),
		"", "plain", "quote\" backslash\\ newline\n tab\t ctl\x01 del\x7f <html> & é 日本 \u2028\u2029 bad\xff",
		[]any{1, "a", nil}, map[string]any{"b": 1, "a": []any{}, "c": map[string]any{}},
		[]string(nil), map[string]int(nil), []byte("hello"), []int{},
		plain{Embedded: Embedded{E1: 1, E2: 2}, inner: &inner{Z: "z"}, Name: "n", Role: fleet.RoleAdmin, Skip: "s", Dash: "d",
			OmitPtr: &n, Untagged: 2.5, Ints: []int64{1, 2}, Bytes: []byte{0, 1, 2}, Map: map[string]int{"y": 1, "x": 2},
			IntKeys: map[int]string{10: "ten", 9: "nine"}, Any: map[string]any{"k": []any{true}}, U8: 8, U64: 64, F64: -0.5},
		&plain{Untagged: 0.5, F64: -1e-9},
		json.RawMessage(`{"raw" : [1, 2]}`),
	}
	for _, v := range values {
		var want bytes.Buffer
		je := json.NewEncoder(&want)
		je.SetEscapeHTML(false)
		if err := je.Encode(v); err != nil {
			t.Fatal(err)
		}
		got, err := codec.Marshal(codec.JSON, v)
		if err != nil {
			t.Errorf("Marshal(%#v): %v", v, err)
			continue
		}
		if w := strings.TrimSuffix(want.String(), "\n"); string(got) != w {
			t.Errorf("Marshal(%#v)\n got %s\nwant %s", v, got, w)
		}
	}
}

// TestEncodeJSONFloats: a float is written so that it reads back as a float,
// and the same one: with a decimal point or an exponent, unlike
// encoding/json, and with an exponent from 2^53 on
// (docs/encodings.md#responses).
func TestEncodeJSONFloats(t *testing.T) {
	for _, tt := range []struct {
		v    any
		want string
	}{
		{80.0, "80.0"},
		{0.0, "0.0"},
		{math.Copysign(0, -1), "-0.0"},
		{1e10, "10000000000.0"},
		{-2.5, "-2.5"},
		{float64(1 << 53), "9.007199254740992e+15"},
		{3.551759552515556e17, "3.551759552515556e+17"},
		{1e21, "1e+21"},
		{1e-7, "1e-7"},
		{float32(3), "3.0"},
		{float32(0.1), "0.1"},
		{int64(80), "80"},
	} {
		got, err := codec.Marshal(codec.JSON, tt.v)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != tt.want {
			t.Errorf("Marshal(JSON, %#v) = %s, want %s", tt.v, got, tt.want)
		}
		back, err := codec.Decode(codec.JSON, got)
		if err != nil {
			t.Fatal(err)
		}
		if _, f32 := tt.v.(float32); !f32 && back != tt.v {
			t.Errorf("%s decodes to %#v, want %#v", got, back, tt.v)
		}
	}
}

func TestEncodeJSONTimesAndUUIDs(t *testing.T) {
	type rec struct {
		ID        uuid.UUID       `json:"id"`
		CreatedAt time.Time       `json:"created_at"`
		SeenAt    *time.Time      `json:"seen_at"`
		Params    json.RawMessage `json:"params"`
	}
	at := time.Date(2026, 11, 21, 11, 0, 0, 123456789, time.FixedZone("CET", 3600))
	v := rec{
		ID:        uuid.MustParse("5A2CBEA3-E8C6-428B-B525-21239370DD55"),
		CreatedAt: at,
		Params:    json.RawMessage(`{"version": "2.3.0"}`),
	}
	got, err := codec.Marshal(codec.JSON, v)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id":"5a2cbea3-e8c6-428b-b525-21239370dd55","created_at":"2026-11-21T10:00:00.123Z","seen_at":null,"params":{"version":"2.3.0"}}`
	if string(got) != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

func TestEncodeJSONErrors(t *testing.T) {
	type cyclic struct {
		Next *cyclic `json:"next"`
	}
	c := &cyclic{}
	c.Next = c
	for _, v := range []any{math.NaN(), math.Inf(1), make(chan int), c, json.RawMessage(`{`), map[[2]int]int{{1, 2}: 3}} {
		var buf bytes.Buffer
		if err := codec.Encode(&buf, codec.JSON, v); err == nil {
			t.Errorf("Encode(%T) succeeded with %q, want an error", v, buf.String())
		} else if buf.Len() != 0 {
			t.Errorf("Encode(%T) failed but wrote %q", v, buf.String())
		}
	}
}

// TestEncodeJSONRoundTrip checks that what Encode writes, Decode reads back.
func TestEncodeJSONRoundTrip(t *testing.T) {
	b, err := codec.Marshal(codec.JSON, dispatchCanonical)
	if err != nil {
		t.Fatal(err)
	}
	got, err := codec.Decode(codec.JSON, b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, dispatchCanonical) {
		t.Errorf("round trip of %s gave %#v", b, got)
	}
	b2, _ := codec.Marshal(codec.JSON, got)
	if !bytes.Equal(b, b2) {
		t.Errorf("re-encoding changed the bytes:\n%s\n%s", b, b2)
	}
}
