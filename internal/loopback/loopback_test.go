package loopback_test

import (
	"fmt"
	"testing"

	"github.com/fleetd/fleet/internal/loopback"
)

// TestStartTriesOtherPorts: a start that finds its port taken is called
// again with other ports, and Start returns once one binds.
func TestStartTriesOtherPorts(t *testing.T) {
	var tried [][]int
	loopback.Start(t, 2, func(ports []int) error {
		tried = append(tried, ports)
		if len(tried) < 3 {
			return fmt.Errorf("server on %v: %w", ports, loopback.ErrPortTaken)
		}
		return nil
	})
	if len(tried) != 3 {
		t.Fatalf("start called %d times, want 3", len(tried))
	}
	for _, ports := range tried {
		if len(ports) != 2 || ports[0] == ports[1] {
			t.Fatalf("ports %v: want two distinct", ports)
		}
	}
	if fmt.Sprint(tried[0]) == fmt.Sprint(tried[1]) && fmt.Sprint(tried[1]) == fmt.Sprint(tried[2]) {
		t.Fatalf("tried %v each time after it was taken", tried[0])
	}
}
