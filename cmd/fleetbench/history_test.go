package main

import (
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"time"

	segjson "github.com/segmentio/encoding/json"
)

// testdata/points-page.json is a page of GET …/points as fleetd wrote it:
// the first 1000 points of a day kept as the history scenario keeps them
// (sequence k at the day's k-th second, {"temp": 20 + k%1000/8}), in two
// ingest calls.
func readPointPage(tb testing.TB) []byte {
	b, err := os.ReadFile("testdata/points-page.json")
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// TestPointPageDecoders checks that the decoder the day's read uses
// decodes a page to the values encoding/json does, and that these are the
// values the SQL read's row k holds (pointReadTime): the k-th second of
// the day, sequence k, the data's JSON text.
func TestPointPageDecoders(t *testing.T) {
	b := readPointPage(t)
	var fast, std pointPage
	if err := decodePointPage(b, &fast); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &std); err != nil {
		t.Fatal(err)
	}
	if !samePointPage(fast, std) {
		t.Fatal("decodePointPage and encoding/json decode the page to different values")
	}
	if len(fast.Points) != 1000 || fast.Next == nil || *fast.Next == "" {
		t.Fatalf("%d points, next %v; want 1000 and a cursor", len(fast.Points), fast.Next)
	}
	day := time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC)
	for k, p := range fast.Points {
		data := fmt.Sprintf(`{"temp":%g}`, 20+float64(k%1000)/8)
		if !p.Timestamp.Equal(day.Add(time.Duration(k)*time.Second)) || p.Timestamp.Location() != time.UTC ||
			p.Sequence != int64(k) || string(p.Data) != data || p.ReceivedAt.IsZero() {
			t.Fatalf("point %d: %v %d %s %v; want %v %d %s", k, p.Timestamp, p.Sequence, p.Data, p.ReceivedAt, day.Add(time.Duration(k)*time.Second), k, data)
		}
	}
	// The data is a copy, not the body's bytes: a client may reuse the
	// body's buffer.
	for i := range b {
		b[i] = ' '
	}
	if string(fast.Points[0].Data) != `{"temp":20}` {
		t.Fatalf("the data shares the body's bytes: %q", fast.Points[0].Data)
	}
	// A page that is not a page is an error, as with encoding/json.
	for _, bad := range []string{`{"points":[{"timestamp":"yesterday"}]}`, `{"points":[{"sequence":"1"}]}`, `{"points":[`} {
		var p pointPage
		if err := decodePointPage([]byte(bad), &p); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

// BenchmarkPointPage weighs JSON decoders on a recorded page of 1000
// points decoded to pointPage's values: ns/op is a page's time, cpu-µs/op
// its CPU (the garbage collector's included, on whatever thread it ran).
// encoding/json and segmentio/encoding (decodePointPage's); built with
// GOEXPERIMENT=jsonv2, encoding/json/v2 too (history_jsonv2_test.go).
// Others were weighed once (docs/benchmarks-notebook.md, "A day's read:
// the client's decoder").
func BenchmarkPointPage(b *testing.B) {
	for _, d := range append([]pointDecoder{
		{"encoding-json", json.Unmarshal},
		{"segmentio", segjson.Unmarshal},
	}, moreDecoders...) {
		b.Run(d.name, func(b *testing.B) {
			page := readPointPage(b)
			b.SetBytes(int64(len(page)))
			b.ReportAllocs()
			c0 := selfCPU()
			for b.Loop() {
				var p pointPage
				if err := d.decode(page, &p); err != nil || len(p.Points) != 1000 {
					b.Fatal(len(p.Points), err)
				}
			}
			b.ReportMetric((selfCPU()-c0)/float64(b.N)*1e6, "cpu-µs/op")
		})
	}
}

// pointDecoder is a JSON decoder BenchmarkPointPage weighs.
type pointDecoder struct {
	name   string
	decode func([]byte, any) error
}
