package ctl_test

import (
	"testing"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestFleetctlShadowRollout: `fleetctl shadow set --group` with phases
// rolls the change out as a desired_state action: the first phase's
// device is changed, the manual phase's is not until it triggers; misused
// flags are usage errors.
func TestFleetctlShadowRollout(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b, "--rollout-interval", "50ms")
		admin := s.Admin()
		s.MustDevice(t, admin, "cr-1", map[string]string{"site": "berlin"})
		s.MustDevice(t, admin, "cr-2", map[string]string{"site": "berlin"})
		f := s.NewFleetctl(t, admin)
		f.OK(t, "groups", "create", "berlin", "site=berlin")

		var fd fleet.FleetDesired
		f.JSON(t, &fd, "shadow", "set", "--group", "berlin", "interval=30", "--phase", "canary cr-1", "--phase", "rest 100% trigger=manual", "--timeout", "10m")
		if fd.ActionID == 0 || fd.Matched != 2 {
			t.Fatalf("answered %+v", fd)
		}
		if a := s.Action(t, admin, fd.ActionID); a.Action != fleet.ActionDesired || a.Timeout != 600 {
			t.Fatalf("the rollout's action is %+v", a)
		}
		s.AwaitActionStatus(t, admin, "cr-1", fd.ActionID, "Initiated")
		var sh fleetdtest.Shadow
		f.JSON(t, &sh, "shadow", "get", "cr-1")
		if sh.Desired["interval"] != float64(30) {
			t.Fatalf("cr-1, released, has desired %v", sh.Desired)
		}
		var sh2 fleetdtest.Shadow
		f.JSON(t, &sh2, "shadow", "get", "cr-2")
		if len(sh2.Desired) != 0 {
			t.Fatalf("cr-2, not released, has desired %v", sh2.Desired)
		}
		fleetdtest.WantContains(t, "the table", f.OK(t, "shadow", "set", "--group", "berlin", "mode=eco", "--phase", "all 100%"), "MATCHED", "ACTION")
		f.Fails(t, 2, "shadow", "set", "cr-1", "interval=31", "--phase", "all 100%")
		f.Fails(t, 2, "shadow", "set", "--group", "berlin", "interval=31", "--timeout", "10m")
	})
}
