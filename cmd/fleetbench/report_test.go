package main

import (
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	var l latencies
	for i := 1; i <= 100; i++ {
		l = append(l, time.Duration(i)*time.Millisecond)
	}
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{
		{50, 50 * time.Millisecond},
		{99, 99 * time.Millisecond},
		{100, 100 * time.Millisecond},
		{0.1, 1 * time.Millisecond},
	} {
		if got := l.percentile(tc.p); got != tc.want {
			t.Errorf("p%v = %v, want %v", tc.p, got, tc.want)
		}
	}
	if got := (latencies{}).percentile(99); got != 0 {
		t.Errorf("p99 of nothing = %v, want 0", got)
	}
}

func TestThousands(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 999: "999", 1000: "1,000", 31245.6: "31,246", 1000000: "1,000,000", -1234: "-1,234"} {
		if got := thousands(v); got != want {
			t.Errorf("thousands(%v) = %q, want %q", v, got, want)
		}
	}
}

func TestMet(t *testing.T) {
	var r report
	fast := r.add(&figure{Value: 0.8, Unit: seconds, Goal: 1})
	slow := r.add(&figure{Value: 12, Unit: seconds, Goal: 10})
	many := r.add(&figure{Value: 31000, Unit: perSecond, Goal: 30000, AtLeast: true})
	info := r.add(&figure{Value: 5, Unit: millis})
	if fast.met() != "met" || slow.met() != "NOT MET" || many.met() != "met" || info.met() != "" {
		t.Errorf("met: %q %q %q %q", fast.met(), slow.met(), many.met(), info.met())
	}
	if got := many.target(); got != "≥ 30,000/s" {
		t.Errorf("target %q", got)
	}
}
