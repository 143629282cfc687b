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

// TestShares: a client holding its whole share waits for more (here past
// its wait), while another client takes its own at once; once released,
// the share is the first client's again.
func TestShares(t *testing.T) {
	ctx := context.Background()
	s := codec.NewShares(100)
	a, err := s.Acquire(ctx, "a", 1000, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, "a", 1, time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a's second body while a holds its share: %v, want a deadline exceeded", err)
	}
	b, err := s.Acquire(ctx, "b", 100, time.Millisecond)
	if err != nil {
		t.Fatalf("b while a holds its share: %v", err)
	}
	b.Release()
	a.Release()
	a, err = s.Acquire(ctx, "a", 100, time.Millisecond)
	if err != nil {
		t.Fatalf("a after its release: %v", err)
	}
	a.Release()
}
