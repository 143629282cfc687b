package ctl_test

import (
	"testing"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestFleetctlTwin: fleetctl shadow and groups against a real server.
func TestFleetctlTwin(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		s.MustDevice(t, s.Admin(), "ct-1", map[string]string{"site": "berlin"})
		s.MustDevice(t, s.Admin(), "ct-2", map[string]string{"site": "paris"})
		f := s.NewFleetctl(t, s.Admin())

		var sh fleetdtest.Shadow
		f.JSON(t, &sh, "shadow", "set", "ct-1", "interval=10", "log.level=debug", "name=pump one", "on=true")
		if sh.Version != 1 || sh.Desired["interval"] != float64(10) || sh.Desired["name"] != "pump one" || sh.Desired["on"] != true ||
			sh.Desired["log"].(map[string]any)["level"] != "debug" {
			t.Fatalf("after set: %+v", sh)
		}
		f.Fails(t, 1, "shadow", "set", "ct-1", "interval=11", "--version", "0")
		f.OK(t, "shadow", "set", "ct-1", "log=null", "--version", "1")
		var delta map[string]any
		f.JSON(t, &delta, "shadow", "diff", "ct-1")
		if len(delta) != 3 || delta["interval"] != float64(10) {
			t.Fatalf("diff = %v", delta)
		}
		fleetdtest.WantContains(t, "shadow get", f.OK(t, "shadow", "get", "ct-1"), "VERSION", "IN SYNC", "false")
		f.OK(t, "groups", "create", "everyone", "site")
		fleetdtest.WantContains(t, "shadow set --group", f.OK(t, "shadow", "set", "--group", "everyone", "mode=eco"), "MATCHED", "CHANGED", "2")
		var sh2 fleetdtest.Shadow
		f.JSON(t, &sh2, "shadow", "get", "ct-2")
		if sh2.Desired["mode"] != "eco" {
			t.Fatalf("ct-2 after set --group: %+v", sh2)
		}
		f.Fails(t, 2, "shadow", "set", "--group", "everyone", "mode=eco", "--version", "1")
		f.OK(t, "groups", "delete", "everyone")

		fleetdtest.WantContains(t, "groups create", f.OK(t, "groups", "create", "berlin", "site=berlin", "--description", "the Berlin site"), "berlin", "site=berlin", "1")
		f.OK(t, "groups", "update", "berlin", "site in (berlin,paris)")
		fleetdtest.WantContains(t, "groups list", f.OK(t, "groups", "list"), "NAME", "berlin", "site in (berlin,paris)", "2")
		fleetdtest.WantContains(t, "groups devices", f.OK(t, "groups", "devices", "berlin"), "ct-1", "ct-2")
		f.Fails(t, 1, "groups", "create", "bad", "site in (")
		// A dispatch to a group, and a rollout whose first phase is one.
		fleetdtest.WantContains(t, "dispatch --group", f.OK(t, "actions", "dispatch", "reboot", "--group", "berlin"), "2")
		f.OK(t, "groups", "create", "paris", "site=paris")
		var d struct {
			ID int64 `json:"id"`
		}
		f.JSON(t, &d, "actions", "dispatch", "reboot", "--all", "--phase", "paris @paris", "--phase", "rest 100% trigger=manual")
		if da := s.DeviceAction(t, s.Admin(), "ct-2", d.ID); da.Phase != 0 || da.Status != "Queued" {
			t.Fatalf("ct-2 after the @paris phase: %+v", da)
		}
		if da := s.DeviceAction(t, s.Admin(), "ct-1", d.ID); da.Phase != 1 || da.Status != "Scheduled" {
			t.Fatalf("ct-1 after the @paris phase: %+v", da)
		}
		f.OK(t, "groups", "delete", "berlin")
		f.Fails(t, 1, "groups", "get", "berlin")
	})
}
