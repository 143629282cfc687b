package ratelimit_test

import (
	"testing"
	"time"

	"github.com/fleetd/fleet/ratelimit"
)

func TestBucket(t *testing.T) {
	now := time.Unix(1000, 0)
	var b ratelimit.Bucket
	for i := range 3 {
		if ok, _ := b.Take(now, 2, 3); !ok {
			t.Fatalf("take %d of a full bucket of 3 refused", i)
		}
	}
	ok, wait := b.Take(now, 2, 3)
	if ok || wait != 500*time.Millisecond {
		t.Fatalf("empty bucket: got %v, %v; want refused, 500ms", ok, wait)
	}
	if ok, _ := b.Take(now.Add(500*time.Millisecond), 2, 3); !ok {
		t.Fatal("a token refilled after 500ms at 2/s was refused")
	}
	// Never more than the burst, however long it rested.
	now = now.Add(time.Hour)
	n := 0
	for {
		if ok, _ := b.Take(now, 2, 3); !ok {
			break
		}
		n++
	}
	if n != 3 {
		t.Fatalf("after an hour's rest %d tokens, want the burst 3", n)
	}
}

func TestLimiter(t *testing.T) {
	now := time.Unix(1000, 0)
	l := &ratelimit.Limiter{Rate: 1, Burst: 2, Now: func() time.Time { return now }}
	for _, key := range []string{"a", "a"} {
		if ok, _ := l.Allow(key); !ok {
			t.Fatalf("%s refused within its burst", key)
		}
	}
	if ok, retry := l.Allow("a"); ok || retry != time.Second {
		t.Fatalf("a beyond its burst: %v, %v; want refused, 1s", ok, retry)
	}
	if ok, _ := l.Allow("b"); !ok {
		t.Fatal("b refused: keys must not share a bucket")
	}
	// Idle keys are forgotten once they would be full again.
	now = now.Add(2 * time.Minute)
	l.Allow("c")
	if n := l.Len(); n != 1 {
		t.Fatalf("%d keys remembered after the sweep, want 1 (c)", n)
	}
	if ok, _ := (&ratelimit.Limiter{}).Allow("x"); !ok {
		t.Fatal("a limiter without a rate refused")
	}
}
