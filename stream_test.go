package fleet_test

import (
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet"
)

func TestReadDataPoints(t *testing.T) {
	now := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	ms := now.UnixMilli()
	tests := []struct {
		name     string
		body     any
		good     int
		problems []string
	}{
		{"Batch", []any{map[string]any{"timestamp": ms, "sequence": int64(1), "t": 1.5}, map[string]any{"timestamp": float64(ms + 1)}}, 2, nil},
		{"SingleObject", map[string]any{"timestamp": ms, "t": "x"}, 1, nil},
		{"Empty", []any{}, 0, nil},
		{"NotArray", "points", 0, []string{"body"}},
		{"NotObject", []any{int64(3)}, 0, []string{"[0]"}},
		{"NoTimestamp", []any{map[string]any{"t": 1}}, 0, []string{"[0].timestamp"}},
		{"StringTimestamp", []any{map[string]any{"timestamp": "2026-11-21T10:00:00Z"}}, 0, []string{"[0].timestamp"}},
		{"FractionalTimestamp", []any{map[string]any{"timestamp": 1.5e12 + 0.5}}, 0, []string{"[0].timestamp"}},
		{"Epoch1970", []any{map[string]any{"timestamp": int64(0)}}, 0, []string{"[0].timestamp"}},
		{"NegativeSequence", []any{map[string]any{"timestamp": ms, "sequence": int64(-1)}}, 0, []string{"[0].sequence"}},
		{"Oversized", []any{map[string]any{"timestamp": ms, "blob": strings.Repeat("x", fleet.MaxPointBytes)}}, 0, []string{"[0]"}},
		{"MixedKeepsGood", []any{map[string]any{"timestamp": ms}, nil, map[string]any{"timestamp": ms, "sequence": "1"}, map[string]any{"timestamp": ms + 5}}, 2, []string{"[1]", "[2].sequence"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pts, problems := fleet.ReadDataPoints(tt.body, "d1", "env", now)
			if len(pts) != tt.good || len(problems) != len(tt.problems) {
				t.Fatalf("got %d points and problems %v, want %d points and problems at %v", len(pts), problems, tt.good, tt.problems)
			}
			for _, k := range tt.problems {
				if problems[k] == "" {
					t.Fatalf("problems %v lack %s", problems, k)
				}
			}
			for _, p := range pts {
				if p.DeviceID != "d1" || p.Stream != "env" || !p.ReceivedAt.Equal(now) || p.Data == nil {
					t.Fatalf("point %+v", p)
				}
				if _, ok := p.Data["timestamp"]; ok {
					t.Fatal("timestamp is kept among the data fields")
				}
			}
		})
	}
	t.Run("TooMany", func(t *testing.T) {
		items := make([]any, fleet.MaxPointsPerBatch+1)
		if _, problems := fleet.ReadDataPoints(items, "d1", "env", now); problems["body"] == "" {
			t.Fatalf("problems %v, want body", problems)
		}
	})
	t.Run("Sort", func(t *testing.T) {
		pts := []fleet.DataPoint{{Timestamp: now.Add(time.Second)}, {Timestamp: now, Sequence: 2}, {Timestamp: now, Sequence: 1}}
		fleet.SortDataPoints(pts)
		if pts[0].Sequence != 1 || pts[1].Sequence != 2 || !pts[2].Timestamp.After(now) {
			t.Fatalf("sorted %+v", pts)
		}
	})
}
