// Package gather batches the calls of concurrent callers, as the hot
// write paths do (status reports in package action, single shadow writes
// in sqlstore): a worker takes a call, gathers those already waiting,
// applies them together and, if that fails as a whole, each alone.
package gather

import (
	"context"
	"runtime"
)

// Waiting adds to first the calls already waiting on ch while their
// weight (weight of each; nil counts 1) is under limit. When none is
// waiting it yields once before it stops: callers that are a few
// instructions away from sending (requests being read while the last
// batch committed) get to join, and a batch's commit is shared by more.
// With nothing else to run, yielding returns at once.
func Waiting[T any](ch <-chan T, first T, limit int, weight func(T) int) []T {
	if weight == nil {
		weight = func(T) int { return 1 }
	}
	batch := []T{first}
	n := weight(first)
	for yielded := false; n < limit; {
		select {
		case c := <-ch:
			batch = append(batch, c)
			n += weight(c)
			yielded = false
		default:
			if yielded {
				return batch
			}
			runtime.Gosched()
			yielded = true
		}
	}
	return batch
}

// Apply applies a gathered batch: the calls whose callers went away
// (ctx of each) are answered with their context's error; the others are
// applied a group of one key at a time, in the order the keys first
// appear, each group's calls in theirs, and answered (answer with nil)
// once their group is. A group whose apply fails as a whole is applied
// again a call at a time, so that one bad call cannot fail the others.
func Apply[T any, K comparable](batch []T, ctx func(T) context.Context, key func(T) K, apply func(K, []T) error, answer func(T, error)) {
	groups := map[K][]T{}
	var keys []K
	for _, c := range batch {
		if err := ctx(c).Err(); err != nil {
			answer(c, err)
			continue
		}
		k := key(c)
		if groups[k] == nil {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], c)
	}
	for _, k := range keys {
		calls := groups[k]
		if err := apply(k, calls); err != nil && len(calls) > 1 {
			for _, c := range calls {
				apply(k, []T{c})
			}
		}
		for _, c := range calls {
			answer(c, nil)
		}
	}
}
