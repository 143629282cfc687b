package server

import (
	"context"
	"io"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/cli"
)

// TestGCPercent checks which collector target fleetd serve sets: none of
// its own unless told, so that GOGC or Go's default stands; --gc-percent or
// FLEETD_GC_PERCENT over GOGC; and no collector without GOMEMLIMIT refused.
func TestGCPercent(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		want    int // the target afterwards; 50 is the test's own
		wantErr string
	}{
		{name: "untold", want: 50},
		{name: "GOGC stands", env: map[string]string{"GOGC": "50"}, want: 50},
		{name: "flag over GOGC", args: []string{"--gc-percent", "200"}, env: map[string]string{"GOGC": "50"}, want: 200},
		{name: "environment", env: map[string]string{"FLEETD_GC_PERCENT": "150"}, want: 150},
		{name: "off without a limit", args: []string{"--gc-percent", "-1"}, want: 50, wantErr: "GOMEMLIMIT"},
		{name: "off with a limit", args: []string{"--gc-percent", "-1"}, env: map[string]string{"GOMEMLIMIT": "1GiB"}, want: -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			debug.SetGCPercent(50)
			getenv := func(k string) string { return tc.env[k] }
			var c Config
			fs := cli.NewFlagSet("serve", "", "", cli.Env{Getenv: getenv, Stdout: io.Discard, Stderr: io.Discard})
			c.gcFlags(fs)
			if err := fs.Parse(tc.args, getenv); err != nil {
				t.Fatal(err)
			}
			err := c.applyGC(fs, getenv)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("error %v, want one naming %q", err, tc.wantErr)
			}
			if got := debug.SetGCPercent(100); got != tc.want {
				t.Errorf("GC percent %d, want %d", got, tc.want)
			}
		})
	}
}

// TestReleaseAfterBursts checks when fleetd gives a burst of connections'
// memory back: once 256 or more connected and none has for 5 s, not again
// within a minute, never for fewer.
func TestReleaseAfterBursts(t *testing.T) {
	steps := []struct{ s, n int }{ // at s seconds, n connections accepted so far
		{0, 0},
		{1, 300},   // a burst
		{3, 300},   // quiet 2 s: not over yet
		{6, 300},   // quiet 5 s: given back
		{7, 600},   // another burst
		{13, 600},  // over, but within a minute of the last
		{67, 600},  // given back
		{68, 700},  // 100 more
		{200, 700}, // too few to give back
	}
	// connects is read once a tick, on the watching goroutine: it moves
	// the script on, and release notes the second it ran at.
	i := -1
	connects := func() uint64 { i++; return uint64(steps[i].n) }
	var released []int
	tick := make(chan time.Time)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		releaseAfterBursts(ctx, connects, tick, func() { released = append(released, steps[i].s) })
	}()
	t0 := time.Now()
	for _, step := range steps {
		tick <- t0.Add(time.Duration(step.s) * time.Second)
	}
	cancel()
	<-done
	if want := []int{6, 67}; !slices.Equal(released, want) {
		t.Errorf("released at %v s, want %v", released, want)
	}
}
