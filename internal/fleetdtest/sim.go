package fleetdtest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/cli"
	"github.com/fleetd/fleet/internal/sim"
)

// SimRun is `fleetd sim` running in the background.
type SimRun struct {
	cancel context.CancelFunc
	done   chan error
	Out    *LockedBuffer
}

// StartSim runs `fleetd sim` against s with args added; it stops when
// the test ends.
func (s *Server) StartSim(t *testing.T, args ...string) *SimRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &SimRun{cancel: cancel, done: make(chan error, 1), Out: &LockedBuffer{}}
	args = append([]string{"--mqtt-addr", s.MQTTAddr, "--report-interval", "20ms", "--step", "5ms"}, args...)
	env := cli.Env{Getenv: NoEnv, Stdin: strings.NewReader(""), Stdout: r.Out, Stderr: r.Out}
	go func() { r.done <- sim.Run(ctx, args, env) }()
	t.Cleanup(func() { r.Stop(t) })
	return r
}

// Stop interrupts the simulator, which must end cleanly.
func (r *SimRun) Stop(t *testing.T) {
	t.Helper()
	if r.cancel == nil {
		return
	}
	r.cancel()
	r.cancel = nil
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("fleetd sim: %v\n%s", err, r.Out)
		}
	case <-time.After(Bound):
		t.Errorf("fleetd sim did not stop; output:\n%s", r.Out)
	}
}

// Connected waits for the progress line that says all n are connected:
// for up to four times the usual bound, since the simulator provisions and
// connects its devices in another process's worth of goroutines, which a
// loaded machine runs last (15 s was seen to fall short at load 25).
func (r *SimRun) Connected(t *testing.T, n int) {
	t.Helper()
	EventuallyWithin(t, 4*Bound, fmt.Sprintf("%d simulated devices to connect; output:\n%s", n, r.Out), func() bool {
		return strings.Contains(r.Out.String(), fmt.Sprintf("connected=%d/%d", n, n))
	})
}
