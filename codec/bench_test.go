package codec_test

import (
	"encoding/json"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/codec"
)

// BenchmarkDecode decodes a typical dispatch body in each encoding, beside
// encoding/json unmarshalling the same body into map[string]any.
func BenchmarkDecode(b *testing.B) {
	mpBody, err := codec.Marshal(codec.TransitMsgpack, dispatchCanonical)
	if err != nil {
		b.Fatal(err)
	}
	bodies := []struct {
		name string
		f    codec.Format
		body []byte
	}{
		{"json", codec.JSON, []byte(dispatchJSON)},
		{"transit-json", codec.TransitJSON, []byte(dispatchTransit)},
		{"transit-msgpack", codec.TransitMsgpack, mpBody},
		{"edn", codec.EDN, []byte(dispatchEDN)},
	}
	for _, c := range bodies {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := codec.Decode(c.f, c.body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("encoding-json", func(b *testing.B) {
		body := []byte(dispatchJSON)
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			var v map[string]any
			if err := json.Unmarshal(body, &v); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkEncode writes a page of 50 devices, as a list response does.
func BenchmarkEncode(b *testing.B) {
	now := time.Date(2026, 11, 21, 10, 0, 0, 123_000_000, time.UTC)
	devices := make([]*fleet.Device, 50)
	for i := range devices {
		devices[i] = &fleet.Device{
			ID:         fmt.Sprintf("dev-%d", i),
			Metadata:   map[string]string{"region": "eu-west", "model": "x2"},
			Components: map[string]string{"app": "2.3.0", "bootloader": "1.1.0"},
			CreatedAt:  now,
			LastSeenAt: &now,
		}
	}
	page := struct {
		Devices []*fleet.Device `json:"devices"`
		Count   int             `json:"count"`
	}{devices, 50}
	for _, f := range codec.Formats {
		b.Run(f.String(), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := codec.Encode(io.Discard, f, page); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	// Marshal is what the HTTP server uses: it needs the length first.
	b.Run("marshal-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := codec.Marshal(codec.JSON, page); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := json.NewEncoder(io.Discard).Encode(page); err != nil {
				b.Fatal(err)
			}
		}
	})
}
