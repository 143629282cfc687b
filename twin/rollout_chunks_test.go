package twin_test

import (
	"fmt"
	"testing"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestDesiredRolloutChunks: a desired rollout's phase of more devices than
// one transaction of its release changes (500) is released in full, a
// chunk at a time: every device action is Initiated, each device's change
// is made and audited once, and connected devices are sent their delta.
func TestDesiredRolloutChunks(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b, "--rollout-interval", "50ms")
		admin := s.Admin()
		const n = 1201 // chunks of 500, 500 and 201
		tokens := s.ProvisionDevices(t, admin, "big-", n, nil)
		var devs []*twinDevice
		for _, id := range []string{"big-00000", "big-00499", "big-00500", "big-01200"} {
			devs = append(devs, dialTwinDevice(t, s.MQTTAddr, "default", id, tokens[id]))
		}
		var fd fleet.FleetDesired
		s.Do(t, admin, "PATCH", "/api/v1/shadows", map[string]any{"search_type": "search", "search_query": "big-", "desired": map[string]any{"interval": 30},
			"schedule": map[string]any{"phases": []any{
				map[string]any{"name": "all", "trigger_on": map[string]any{"type": "now"}, "info": map[string]any{"type": "percentage", "percentage": 100}},
			}}}).Want(t, 200).Decode(t, &fd)
		if fd.Matched != n || fd.ActionID == 0 {
			t.Fatalf("answered %+v", fd)
		}
		for _, d := range devs {
			if got := d.nextDelta(t); got != `{"interval":30}` {
				t.Fatalf("%s's delta is %s", d.id, got)
			}
		}
		fleetdtest.Eventually(t, "every device action Initiated", func() bool {
			var a struct {
				Statuses map[string]int `json:"statuses"`
			}
			s.Do(t, admin, "GET", fmt.Sprintf("/api/v1/actions/%d", fd.ActionID), nil).Want(t, 200).Decode(t, &a)
			return a.Statuses["Initiated"] == n
		})
		var logs struct {
			Count int `json:"count"`
		}
		s.Do(t, admin, "GET", "/api/v1/audit-logs?action=device.shadow.update&limit=1", nil).Want(t, 200).Decode(t, &logs)
		if logs.Count != n {
			t.Fatalf("%d desired changes audited for %d devices", logs.Count, n)
		}
		for _, d := range devs {
			var sh fleet.Shadow
			s.Do(t, admin, "GET", "/api/v1/devices/"+d.id+"/shadow", nil).Want(t, 200).Decode(t, &sh)
			if sh.Version != 1 || sh.Desired["interval"] != 30.0 {
				t.Fatalf("%s's shadow: %+v", d.id, sh)
			}
		}
	})
}
