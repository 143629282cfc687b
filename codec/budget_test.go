package codec_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fleetd/fleet/codec"
)

// TestBudget: a body larger than the budget takes all of it (it is decoded
// alone); the next waits, at most its wait, and gets its share once the
// first is released; Transit and EDN weigh double.
func TestBudget(t *testing.T) {
	ctx := context.Background()
	b := codec.NewBudget(100)
	held, err := b.Acquire(ctx, 1000, 0)
	if err != nil || held != 100 {
		t.Fatalf("Acquire(1000) = %d, %v; want the whole budget, 100", held, err)
	}
	if _, err := b.Acquire(ctx, 1, time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire while the budget is taken: %v, want a deadline exceeded", err)
	}
	done := make(chan int64)
	go func() {
		n, err := b.Acquire(ctx, 60, 0)
		if err != nil {
			t.Error(err)
		}
		done <- n
	}()
	b.Release(held)
	if n := <-done; n != 60 {
		t.Fatalf("Acquire(60) after the release = %d", n)
	}
	for f, want := range map[codec.Format]int64{codec.JSON: 10, codec.TransitJSON: 20, codec.TransitMsgpack: 20, codec.EDN: 20} {
		if got := codec.DecodingWeight(f, 10); got != want {
			t.Errorf("DecodingWeight(%v, 10) = %d, want %d", f, got, want)
		}
	}
}
