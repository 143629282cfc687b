package main

import (
	"path/filepath"
	"testing"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestSimulatorTakesDesiredState: a simulated device reports the desired
// state it is sent, so its shadow comes in sync.
func TestSimulatorTakesDesiredState(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := startServer(t, b)
		admin := s.Admin()
		sim := s.StartSim(t, "--devices", "2", "--provision", "--url", s.URL, "--api-key", admin.Key,
			"--tokens", filepath.Join(t.TempDir(), "tokens.csv"), "--prefix", "tw-", "--telemetry-interval", "0")
		sim.Connected(t, 2)
		s.Do(t, admin, "PATCH", "/api/v1/devices/tw-00001/shadow", map[string]any{"desired": map[string]any{"interval": 30, "log": map[string]any{"level": "debug"}}}).Want(t, 200)
		fleetdtest.Eventually(t, "tw-00001 in sync with its desired state", func() bool {
			var sh fleetdtest.Shadow
			s.Do(t, admin, "GET", "/api/v1/devices/tw-00001/shadow", nil).Want(t, 200).Decode(t, &sh)
			return sh.InSync && sh.Reported["interval"] == float64(30)
		})
	})
}
