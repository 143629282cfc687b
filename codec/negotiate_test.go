package codec_test

import (
	"testing"

	"github.com/fleetd/fleet/codec"
)

func TestFormatOf(t *testing.T) {
	tests := []struct {
		in   string
		want codec.Format
		ok   bool
	}{
		{"application/json", codec.JSON, true},
		{"application/json; charset=utf-8", codec.JSON, true},
		{"Application/JSON", codec.JSON, true},
		{"application/transit+json", codec.TransitJSON, true},
		{" application/transit+json ;charset=UTF-8", codec.TransitJSON, true},
		{"application/transit+msgpack", codec.TransitMsgpack, true},
		{"application/edn", codec.EDN, true},
		{"APPLICATION/EDN;charset=utf-8", codec.EDN, true},
		{"", codec.JSON, false},
		{"text/plain", codec.JSON, false},
		{"application/json-patch+json", codec.JSON, false},
		{"application/*", codec.JSON, false},
		{"*/*", codec.JSON, false},
		{"multipart/form-data; boundary=x", codec.JSON, false},
		{"application/jsonx", codec.JSON, false},
	}
	for _, tt := range tests {
		f, ok := codec.FormatOf(tt.in)
		if ok != tt.ok || ok && f != tt.want {
			t.Errorf("FormatOf(%q) = %v, %v; want %v, %v", tt.in, f, ok, tt.want, tt.ok)
		}
	}
}

func TestNegotiate(t *testing.T) {
	tests := []struct {
		accept string
		want   codec.Format
	}{
		{"", codec.JSON},
		{"*/*", codec.JSON},
		{"application/*", codec.JSON},
		{"application/json", codec.JSON},
		{"application/edn", codec.EDN},
		{"application/transit+json", codec.TransitJSON},
		{"application/transit+msgpack", codec.TransitMsgpack},
		{"APPLICATION/EDN", codec.EDN},
		{"text/html", codec.JSON},
		{"text/html, application/edn;q=0.1", codec.EDN},
		{"application/edn, application/json", codec.EDN},
		{"application/json, application/edn", codec.JSON},
		{"application/json;q=0.5, application/transit+json", codec.TransitJSON},
		{"application/transit+json;q=0.9, application/transit+msgpack;q=0.95", codec.TransitMsgpack},
		{"application/edn;q=0, */*", codec.JSON},
		{"application/json;q=0, application/edn;q=0.2", codec.EDN},
		{"*/*;q=0.1, application/edn", codec.EDN},
		{"application/*;q=0.2, application/transit+json;q=0.1", codec.JSON},
		{"application/edn;q=1.0", codec.EDN},
		{"application/edn;q=0.001, text/plain", codec.EDN},
		{"application/edn; charset=utf-8; q=0.5", codec.EDN},
		{"application/edn;q=2", codec.JSON},
		{"application/edn;q=abc", codec.JSON},
		{"garbage", codec.JSON},
		{";;;", codec.JSON},
		{"application/edn;q=0", codec.JSON},
		{"application/edn, ,", codec.EDN},
	}
	for _, tt := range tests {
		if got := codec.Negotiate(tt.accept); got != tt.want {
			t.Errorf("Negotiate(%q) = %v, want %v", tt.accept, got, tt.want)
		}
	}
}

func TestFormatNames(t *testing.T) {
	for _, f := range codec.Formats {
		got, ok := codec.FormatOf(f.ContentType())
		if !ok || got != f {
			t.Errorf("FormatOf(%q) = %v, %v; want %v", f.ContentType(), got, ok, f)
		}
		if f.String() == "" {
			t.Errorf("Format(%d).String() is empty", f)
		}
	}
}
