package alert_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/alert"
	"github.com/fleetd/fleet/internal/testclock"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestWindowedRules runs windowed conditions on both databases: an
// average and a minimum over the last seconds of a device's points open
// and close their alerts at the moments the windows' arithmetic says. The
// engine that opened them is then replaced by another (a restart), whose
// windows start from the stream's history, and the points go through it
// and a third engine in turn (two replicas): each time an engine's window
// has missed points it warms again, so the alerts close when a single
// engine's would.
func TestWindowedRules(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		ctx := context.Background()
		clk := testclock.New(t0)
		db := storeWithDevice(t, b, clk)
		avg := &fleet.AlertRule{Name: "warm on average", Stream: "env",
			Condition: canon(t, `{"field": "temp", "aggregate": "avg", "window_seconds": 60, "operator": ">", "value": 80}`)}
		low := &fleet.AlertRule{Name: "never below 90", Stream: "env",
			Condition: canon(t, `{"all": [{"field": "status", "operator": "==", "value": "ok"},
				{"field": "temp", "aggregate": "min", "window_seconds": 30, "operator": ">", "value": 90}]}`)}
		for _, r := range []*fleet.AlertRule{avg, low} {
			if errs := alert.CompileRule(r); errs != nil {
				t.Fatal(errs)
			}
			if err := db.CreateAlertRule(ctx, "acme", r); err != nil {
				t.Fatal(err)
			}
		}
		ingest := func(e *alert.Engine, sec int, temp float64) {
			t.Helper()
			clk.Set(t0.Add(time.Duration(sec) * time.Second))
			p := fleet.DataPoint{DeviceID: "d1", Stream: "env", Timestamp: clk.Now(), ReceivedAt: clk.Now(),
				Data: map[string]any{"temp": temp, "status": "ok"}}
			if err := e.IngestPoints(ctx, "acme", "d1", "env", []fleet.DataPoint{p}); err != nil {
				t.Fatal(err)
			}
		}
		alerts := func(r *fleet.AlertRule) string {
			t.Helper()
			as, _, err := db.FindAlerts(ctx, "acme", fleet.AlertFilter{RuleID: r.ID, Page: fleet.Page{Page: 1, Limit: 100}})
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, a := range as {
				s := fmt.Sprintf("%v", a.StartedAt.Sub(t0))
				if a.EndedAt != nil {
					s += "-" + a.EndedAt.Sub(t0).String()
				}
				out = append(out, s)
			}
			return strings.Join(out, " ")
		}

		// 70 for a minute, then 100: the minute's average passes 80 with
		// the 21st point of 100 (at 80s), the last 30 s are all above 90
		// from 89s. A text value is not counted.
		a := loadedEngine(t, db, clk)
		for sec := 0; sec < 60; sec++ {
			ingest(a, sec, 70)
		}
		for sec := 60; sec <= 95; sec++ {
			ingest(a, sec, 100)
		}
		if got := alerts(avg) + " | " + alerts(low); got != "1m20s | 1m29s" {
			t.Fatalf("alerts while 100 arrives: %s, want 1m20s | 1m29s", got)
		}

		// A restart, then two replicas in turn: 40 from 96s. The minimum
		// falls at once; the average by half a degree a point, to 80 at
		// 111s, which a window without the history before 96s would have
		// reached at 96s.
		b1, b2 := loadedEngine(t, db, clk), loadedEngine(t, db, clk)
		for sec := 96; sec <= 115; sec++ {
			ingest([]*alert.Engine{b1, b2}[sec%2], sec, 40)
		}
		if got := alerts(avg) + " | " + alerts(low); got != "1m20s-1m51s | 1m29s-1m36s" {
			t.Fatalf("alerts after the restart: %s, want 1m20s-1m51s | 1m29s-1m36s", got)
		}
	})
}

// TestWindowedRuleSilence: a window moves with the points, not the clock:
// a maximum stays while no point arrives, and falls with the first point
// after the window; the edge moves by a slice (a 60th of the window).
func TestWindowedRuleSilence(t *testing.T) {
	ctx := context.Background()
	clk := testclock.New(t0)
	st := newMemStore()
	r := &fleet.AlertRule{Tenant: "acme", ID: "r1", Name: "spike", Stream: "env",
		Condition: canon(t, `{"field": "v", "aggregate": "max", "window_seconds": 60, "operator": ">=", "value": 100}`)}
	st.rules = append(st.rules, r)
	e := &alert.Engine{Store: st, Now: clk.Now}
	if err := e.Load(ctx); err != nil {
		t.Fatal(err)
	}
	ingest := func(ms int, v any) {
		t.Helper()
		at := t0.Add(time.Duration(ms) * time.Millisecond)
		clk.Set(at)
		p := fleet.DataPoint{DeviceID: "d1", Stream: "env", Timestamp: at, ReceivedAt: at, Data: map[string]any{"v": v}}
		if err := e.IngestPoints(ctx, "acme", "d1", "env", []fleet.DataPoint{p}); err != nil {
			t.Fatal(err)
		}
	}
	open := func() bool {
		for _, a := range st.alerts {
			if a.EndedAt == nil {
				return true
			}
		}
		return false
	}
	ingest(0, int64(120))
	clk.Set(t0.Add(10 * time.Minute))
	if err := e.CheckTimers(ctx); err != nil || !open() {
		t.Fatalf("the spike's alert closed by the clock alone (%v)", err)
	}
	ingest(59_000, "n/a") // not a number: not counted, the window holds the spike
	if !open() {
		t.Fatal("a text value closed the alert")
	}
	ingest(59_999, int64(1))
	if !open() {
		t.Fatal("closed within the window")
	}
	ingest(60_000, int64(1)) // the spike's slice leaves the window
	if open() {
		t.Fatal("the spike is a minute old and the alert is open")
	}
}

func TestCompileWindowErrors(t *testing.T) {
	tests := []struct {
		name, cond, path, says string
	}{
		{"AggregateAlone", `{"field": "t", "aggregate": "avg", "operator": ">", "value": 1}`, "condition.window_seconds", "is required with aggregate"},
		{"WindowAlone", `{"field": "t", "window_seconds": 60, "operator": ">", "value": 1}`, "condition.aggregate", "is required with window_seconds"},
		{"UnknownAggregate", `{"field": "t", "aggregate": "median", "window_seconds": 60, "operator": ">", "value": 1}`, "condition.aggregate", `must be one of avg, min, max, not "median"`},
		{"AggregateNotString", `{"field": "t", "aggregate": 1, "window_seconds": 60, "operator": ">", "value": 1}`, "condition.aggregate", "not 1"},
		{"WindowZero", `{"field": "t", "aggregate": "min", "window_seconds": 0, "operator": ">", "value": 1}`, "condition.window_seconds", "from 1 to 86400, not 0"},
		{"WindowFraction", `{"field": "t", "aggregate": "min", "window_seconds": 1.5, "operator": ">", "value": 1}`, "condition.window_seconds", "whole number"},
		{"WindowTooLong", `{"field": "t", "aggregate": "max", "window_seconds": 86401, "operator": ">", "value": 1}`, "condition.window_seconds", "86400"},
		{"WindowString", `{"field": "t", "aggregate": "max", "window_seconds": "60", "operator": ">", "value": 1}`, "condition.window_seconds", `not "60"`},
		{"TextValue", `{"field": "t", "aggregate": "max", "window_seconds": 60, "operator": "==", "value": "hot"}`, "condition.value", "must be a number"},
		{"Nested", `{"any": [{"field": "t", "operator": ">", "value": 1}, {"field": "t", "aggregate": "avg", "window_seconds": -5, "operator": ">", "value": 1}]}`, "condition.any[1].window_seconds", "whole number"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, errs := alert.CompileCondition("condition", canon(t, tt.cond))
			if c != nil || !strings.Contains(errs[tt.path], tt.says) {
				t.Fatalf("CompileCondition(%s) = %v, want %q at %s", tt.cond, errs, tt.says, tt.path)
			}
		})
	}
	t.Run("TooMany", func(t *testing.T) {
		var list []any
		for range alert.MaxWindows + 1 {
			list = append(list, canon(t, `{"field": "t", "aggregate": "avg", "window_seconds": 60, "operator": ">", "value": 1}`))
		}
		_, errs := alert.CompileCondition("condition", map[string]any{"any": list})
		if !strings.Contains(errs[fmt.Sprintf("condition.any[%d]", alert.MaxWindows)], "windowed comparisons") {
			t.Fatalf("errors %v", errs)
		}
	})
	t.Run("Compiles", func(t *testing.T) {
		c, errs := alert.CompileCondition("condition", canon(t, `{"all": [{"field": "a", "aggregate": "avg", "window_seconds": 30.0, "operator": "<", "value": 1},
			{"not": {"field": "b.c", "aggregate": "max", "window_seconds": 86400, "operator": "!=", "value": 2.5}}]}`))
		if errs != nil {
			t.Fatal(errs)
		}
		ws := c.Windows()
		if len(ws) != 2 || ws[0].Aggregate != "avg" || ws[0].Window != 30*time.Second || ws[0].WindowIndex != 0 ||
			ws[1].Aggregate != "max" || ws[1].Window != 24*time.Hour || ws[1].WindowIndex != 1 {
			t.Fatalf("windows %+v %+v", ws[0], ws[1])
		}
	})
}

// TestWindowedRuleSilentAfterRestart: "hot, then silent" with the heat a
// window's maximum. The engine restarts between the hot point and the
// silence; the timer that finds the silence warms the window from the
// stream's history, so the alert opens on both databases.
func TestWindowedRuleSilentAfterRestart(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		ctx := context.Background()
		clk := testclock.New(t0)
		db := storeWithDevice(t, b, clk)
		r := &fleet.AlertRule{Name: "hot then silent", Stream: "env",
			Condition: canon(t, `{"all": [{"no_data_seconds": 60}, {"field": "temp", "aggregate": "max", "window_seconds": 300, "operator": ">=", "value": 100}]}`)}
		if errs := alert.CompileRule(r); errs != nil {
			t.Fatal(errs)
		}
		if err := db.CreateAlertRule(ctx, "acme", r); err != nil {
			t.Fatal(err)
		}
		before := loadedEngine(t, db, clk)
		for i, temp := range []float64{120, 50} { // the window's maximum stays 120
			at := t0.Add(time.Duration(i) * time.Second)
			clk.Set(at)
			p := fleet.DataPoint{DeviceID: "d1", Stream: "env", Timestamp: at, ReceivedAt: at, Data: map[string]any{"temp": temp}}
			if err := before.IngestPoints(ctx, "acme", "d1", "env", []fleet.DataPoint{p}); err != nil {
				t.Fatal(err)
			}
		}
		after := loadedEngine(t, db, clk) // the restart
		clk.Set(t0.Add(2 * time.Minute))
		// The restarted engine learns the stream's version at its first
		// commit, which finds it stale and schedules the timer again: the
		// second check opens the alert.
		for range 2 {
			if err := after.CheckTimers(ctx); err != nil {
				t.Fatal(err)
			}
		}
		as, _, err := db.FindAlerts(ctx, "acme", fleet.AlertFilter{RuleID: r.ID, Page: fleet.Page{Page: 1, Limit: 10}})
		if err != nil || len(as) != 1 || as[0].State != fleet.AlertActive || !as[0].StartedAt.Equal(t0.Add(61*time.Second)) {
			t.Fatalf("after a minute's silence: %+v %v, want one active alert from 1m1s", as, err)
		}
	})
}
