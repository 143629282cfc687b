package alert

import (
	"context"
	"math"
	"time"

	"github.com/fleetd/fleet"
)

// Windowed comparisons (docs/alerts.md#windows) aggregate a field over the
// last window_seconds of a device's points. Each keeps, per device and
// rule, a window of at most WindowSlices slices, each the count, sum,
// minimum and maximum of the values whose timestamps fall in it: a point
// adds to its slice, and slices that fall out of the window are dropped,
// so evaluation never reads history again and a window's memory is bound
// by WindowSlices whatever the device sends. A window starts from the
// stream's history once (warm) when the engine first evaluates the rule
// for the device: after a restart, after the rule is made or edited, after
// another replica moved the stream on, or after a commit failed.

// WindowSlices is how many slices a window is cut into: its edge moves by
// a slice, 1/WindowSlices of the window, at a time.
const WindowSlices = 60

// window is one windowed comparison's window for one device.
type window struct {
	width  int64   // of a slice, ms
	n      int64   // slices in the window
	slices []slice // by idx, ascending; at most n
}

// slice aggregates the values of [idx*width, (idx+1)*width).
type slice struct {
	idx           int64
	count         int64
	sum, min, max float64
}

func newWindow(d time.Duration) *window {
	ms := d.Milliseconds()
	width := (ms + WindowSlices - 1) / WindowSlices
	return &window{width: width, n: (ms + width - 1) / width}
}

// add counts v at data time ts (ms). Slices the window at ts no longer
// covers are dropped; a value older than the window is not counted.
func (w *window) add(ts int64, v float64) {
	i := ts / w.width
	w.advance(i)
	if len(w.slices) > 0 && i <= w.slices[len(w.slices)-1].idx-w.n {
		return
	}
	k := len(w.slices)
	for k > 0 && w.slices[k-1].idx > i {
		k--
	}
	if k > 0 && w.slices[k-1].idx == i {
		s := &w.slices[k-1]
		s.count++
		s.sum += v
		s.min, s.max = math.Min(s.min, v), math.Max(s.max, v)
		return
	}
	w.slices = append(w.slices, slice{})
	copy(w.slices[k+1:], w.slices[k:])
	w.slices[k] = slice{idx: i, count: 1, sum: v, min: v, max: v}
}

// advance drops the slices older than the window that ends in slice i.
func (w *window) advance(i int64) {
	drop := 0
	for drop < len(w.slices) && w.slices[drop].idx <= i-w.n {
		drop++
	}
	if drop > 0 {
		w.slices = append(w.slices[:0], w.slices[drop:]...)
	}
}

// value is the window's aggregate, false when it holds no value.
func (w *window) value(agg string) (float64, bool) {
	if len(w.slices) == 0 {
		return 0, false
	}
	var count int64
	var sum float64
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range w.slices {
		count += s.count
		sum += s.sum
		lo, hi = math.Min(lo, s.min), math.Max(hi, s.max)
	}
	switch agg {
	case fleet.AggMin:
		return lo, true
	case fleet.AggMax:
		return hi, true
	}
	return sum / float64(count), true
}

// numeric is a field's value as a number a window counts: integers and
// doubles; anything else, or a missing field, is not counted.
func numeric(data map[string]any, c *fleet.Condition) (float64, bool) {
	v, ok := lookup(data, c)
	if !ok {
		return 0, false
	}
	switch n := v.(type) {
	case int64:
		return float64(n), true
	case float64:
		return n, true
	}
	return 0, false
}

// addPoint counts a point in each of the state's windows.
func (st *ruleState) addPoint(ts int64, data map[string]any) {
	for i, c := range st.rule.windows {
		if v, ok := numeric(data, c); ok {
			st.wins[i].add(ts, v)
		}
	}
}

// HistoryReader is a Store that keeps stream history (*sqlstore.DB is
// one): windows start from it. Without it a window starts empty.
type HistoryReader interface {
	FindPoints(ctx context.Context, tenant, device, stream string, q fleet.PointQuery) (*fleet.PointPage, error)
}

// warm gives a state of a windowed rule its windows, from the stream's
// points the engine evaluated so far (up to ss's last point) within the
// longest window. ss.mu is held.
func (e *Engine) warm(ctx context.Context, ss *streamState, st *ruleState) error {
	wins := make([]*window, len(st.rule.windows))
	for i, c := range st.rule.windows {
		wins[i] = newWindow(c.Window)
	}
	h, ok := e.Store.(HistoryReader)
	if ok && ss.hasLast {
		// A slice more than the window: the first slice the window covers
		// starts before the window's nominal start.
		q := fleet.PointQuery{From: time.UnixMilli(ss.lastTS - st.rule.span - st.rule.span/WindowSlices - 1),
			To: time.UnixMilli(ss.lastTS + 1), Limit: fleet.MaxLimit}
		tmp := &ruleState{rule: st.rule, wins: wins}
		for {
			page, err := h.FindPoints(ctx, ss.key.tenant, ss.key.device, ss.key.stream, q)
			if err != nil {
				return err
			}
			for _, p := range page.Points {
				ts := p.Timestamp.UnixMilli()
				if ts < ss.lastTS || ts == ss.lastTS && p.Sequence <= ss.lastSeq {
					data, err := p.Values()
					if err != nil {
						return err
					}
					tmp.addPoint(ts, data)
				}
			}
			if page.Next == "" {
				break
			}
			q.Cursor = page.Next
		}
	}
	st.wins = wins
	return nil
}
