package fleet_test

import (
	"encoding/json"
	"testing"

	"github.com/fleetd/fleet"
)

// TestPointPageRelease: a released page's points hold no data (the pool
// keeps no point's text alive), and a nil page releases as a no-op.
func TestPointPageRelease(t *testing.T) {
	p := fleet.NewPointPage(2)
	if len(p.Points) != 0 || cap(p.Points) < 2 {
		t.Fatalf("a new page has %d points, room for %d; want 0, at least 2", len(p.Points), cap(p.Points))
	}
	p.Points = append(p.Points, fleet.HistoryPoint{Sequence: 1, Data: json.RawMessage(`{"a":1}`)}, fleet.HistoryPoint{Sequence: 2, Data: json.RawMessage(`{"a":2}`)})
	kept := p.Points
	p.Release()
	if p.Points != nil {
		t.Errorf("a released page still has its points")
	}
	for i, pt := range kept {
		if pt.Data != nil || pt.Sequence != 0 {
			t.Errorf("point %d still holds %+v after the release", i, pt)
		}
	}
	(*fleet.PointPage)(nil).Release()
	(&fleet.PointPage{}).Release()
}
