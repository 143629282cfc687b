// Package ratelimit is token buckets: one per connection (Bucket) or one
// per key in a map that forgets idle keys (Limiter). fleetd uses them to
// keep one API key, end user, device or source address from taking what
// belongs to the others.
package ratelimit

import (
	"math"
	"sync"
	"time"
)

// Bucket holds up to burst tokens and gains rate tokens per second. The
// zero value is full at its first use. It is not safe for concurrent use.
type Bucket struct {
	tokens float64
	last   time.Time
}

// Take spends one token if there is one. Otherwise it reports how long
// until there will be.
func (b *Bucket) Take(now time.Time, rate float64, burst int) (ok bool, wait time.Duration) {
	if b.last.IsZero() {
		b.tokens, b.last = float64(burst), now
	}
	if d := now.Sub(b.last); d > 0 {
		b.tokens = math.Min(float64(burst), b.tokens+d.Seconds()*rate)
		b.last = now
	}
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	return false, time.Duration((1 - b.tokens) / rate * float64(time.Second))
}

// full reports whether the bucket has refilled by now, so forgetting it
// changes nothing.
func (b *Bucket) full(now time.Time, rate float64, burst int) bool {
	return b.tokens+now.Sub(b.last).Seconds()*rate >= float64(burst)
}

// Limiter is a bucket per key. Rate ≤ 0 lets everything through.
type Limiter struct {
	Rate  float64 // tokens per second
	Burst int     // at least 1
	Now   func() time.Time

	mu      sync.Mutex
	buckets map[string]*Bucket
	swept   time.Time
}

// sweepEvery is how often idle buckets are forgotten, so that the map
// holds only keys seen lately.
const sweepEvery = time.Minute

// Allow spends one of key's tokens, or says how long until it may retry.
func (l *Limiter) Allow(key string) (ok bool, retryAfter time.Duration) {
	if l.Rate <= 0 {
		return true, 0
	}
	now := time.Now()
	if l.Now != nil {
		now = l.Now()
	}
	burst := max(l.Burst, 1)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.buckets == nil {
		l.buckets = map[string]*Bucket{}
		l.swept = now
	}
	if now.Sub(l.swept) >= sweepEvery {
		for k, b := range l.buckets {
			if b.full(now, l.Rate, burst) {
				delete(l.buckets, k)
			}
		}
		l.swept = now
	}
	b := l.buckets[key]
	if b == nil {
		b = &Bucket{}
		l.buckets[key] = b
	}
	return b.Take(now, l.Rate, burst)
}

// Available reports whether key has a token now, without spending it.
func (l *Limiter) Available(key string) bool {
	if l.Rate <= 0 {
		return true
	}
	now := time.Now()
	if l.Now != nil {
		now = l.Now()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buckets[key]
	return b == nil || b.tokens+now.Sub(b.last).Seconds()*l.Rate >= 1
}

// Len is the number of keys remembered, for tests and metrics.
func (l *Limiter) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.buckets)
}
