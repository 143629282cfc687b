package fleethttp

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/codec"
)

// TestPointPageJSON holds a page of points written by appendPointPageJSON
// byte for byte equal to the codec's JSON of the same page, for data of
// every canonical type as history keeps it.
func TestPointPageJSON(t *testing.T) {
	at := time.Date(2026, 11, 28, 23, 59, 59, 999_999_999, time.FixedZone("x", 3600))
	var pts []fleet.HistoryPoint
	for i, data := range []map[string]any{
		{"temp": 20.125},
		{"n": int64(-7), "big": 1e300, "tiny": 1e-9, "whole": 80.0},
		{"s": "ünïcødé \"quoted\" \\ <html> & \u2028 \x01", "ok": true, "no": false, "none": nil},
		{"nested": map[string]any{"a": []any{int64(1), "two", 3.5, nil, map[string]any{}}, "b": []any{}}},
		{},
	} {
		text, err := fleet.MarshalCanonical(data)
		if err != nil {
			t.Fatal(err)
		}
		pts = append(pts, fleet.HistoryPoint{Timestamp: at.Add(time.Duration(i) * time.Millisecond), Sequence: int64(i) - 2,
			Data: text, ReceivedAt: time.UnixMilli(int64(i) * 1e9)})
	}
	pts = append(pts, fleet.HistoryPoint{Timestamp: time.UnixMilli(0), Sequence: 1 << 62}) // no data: null
	for _, page := range []*fleet.PointPage{
		{Points: pts, Next: "MS5hLjE3NjQzNzQ0MDAwMDAuNS4tMTIzLjQ"},
		{Points: pts[:1]},
		{Points: []fleet.HistoryPoint{}},
	} {
		res := pointPage{Points: page.Points}
		if page.Next != "" {
			res.Next = &page.Next
		}
		want, err := codec.Marshal(codec.JSON, res)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendPointPageJSON(nil, page); !bytes.Equal(got, want) {
			t.Errorf("appendPointPageJSON:\n%s\nthe codec:\n%s", got, want)
		}
	}
}

// TestHourTimes holds hourTimes' text of times in and across hours equal
// to codec.AppendTime's.
func TestHourTimes(t *testing.T) {
	var h hourTimes
	at := time.Date(2026, 11, 28, 22, 59, 58, 0, time.UTC)
	for i := range 20_000 {
		var tm time.Time
		switch i % 4 {
		case 0, 1:
			at = at.Add(time.Duration(rand.IntN(2000)) * time.Millisecond)
			tm = at
		case 2:
			tm = time.UnixMilli(rand.Int64N(300_000_000_000_000) - 1000).In(time.FixedZone("x", 5400))
		default:
			tm = at.Add(time.Duration(rand.IntN(1e6))) // a fraction of a millisecond
		}
		got, want := h.append(nil, tm), codec.AppendTime(nil, tm)
		if !bytes.Equal(got, want) {
			t.Fatalf("%v: %s, want %s", tm, got, want)
		}
	}
}
