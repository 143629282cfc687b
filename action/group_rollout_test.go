package action_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestRolloutGroupPhase dispatches a rollout whose canary is a group,
// triggered by hand after a device joined it: the phase takes the group's
// devices as they are when it triggers. A group phase naming a group the
// tenant does not have is 400 naming the field, and nothing is dispatched.
func TestRolloutGroupPhase(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		admin := s.Admin()
		for _, d := range []string{"g1", "g2", "g3", "g4"} {
			ring := "main"
			if d == "g2" {
				ring = "lab"
			}
			s.MustDevice(t, admin, d, map[string]string{"ring": ring})
		}
		s.Do(t, admin, "POST", "/api/v1/groups", map[string]any{"name": "lab", "selector": "ring=lab"}).Want(t, 201)
		canary := map[string]any{"type": "group", "group": "lab"}
		id := s.Dispatch(t, admin, map[string]any{"action": "reboot", "params": map[string]any{}, "search_type": "all",
			"schedule": map[string]any{"phases": []any{fleetdtest.Phase("lab", fleetdtest.TriggerManual, canary), fleetdtest.Phase("rest", fleetdtest.TriggerManual, fleetdtest.Percent(100))}}})
		s.Do(t, admin, "PATCH", "/api/v1/devices/g4", map[string]any{"metadata": map[string]any{"ring": "lab"}}).Want(t, 204)
		s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/trigger_next_phase", id), nil).Want(t, 204)
		if a := s.Rollout(t, admin, id); fmt.Sprint(a.StatusesPhased) != "map[0:map[Queued:2] 1:map[Scheduled:2]]" {
			t.Fatalf("after the lab phase: %+v", a)
		}
		for d, want := range map[string]int{"g1": 1, "g2": 0, "g3": 1, "g4": 0} {
			if da := s.DeviceAction(t, admin, d, id); da.Phase != want {
				t.Fatalf("%s in phase %d, want %d", d, da.Phase, want)
			}
		}
		r := s.Do(t, admin, "GET", fmt.Sprintf("/api/v1/actions/%d", id), nil).Want(t, 200)
		if !strings.Contains(string(r.Body), `"info":{"type":"group","group":"lab"}`) {
			t.Fatalf("the action does not show its group phase: %s", r.Body)
		}
		before := s.Do(t, admin, "GET", "/api/v1/actions", nil).Want(t, 200)
		r = s.Do(t, admin, "POST", "/api/v1/actions", map[string]any{"action": "reboot", "params": map[string]any{}, "search_type": "all",
			"schedule": map[string]any{"phases": []any{fleetdtest.Phase("lab", fleetdtest.TriggerNow, map[string]any{"type": "group", "group": "nowhere"}), fleetdtest.Phase("rest", fleetdtest.TriggerAfter, fleetdtest.Percent(100))}}})
		fleetdtest.WantCode(t, r, 400, "invalid")
		if !strings.Contains(string(r.Body), `"schedule.phases[0].info.group":"no group is named \"nowhere\""`) {
			t.Fatalf("the refusal does not name the field: %s", r.Body)
		}
		if after := s.Do(t, admin, "GET", "/api/v1/actions", nil).Want(t, 200); string(after.Body) != string(before.Body) {
			t.Fatalf("a refused dispatch changed the actions:\n%s\n%s", before.Body, after.Body)
		}
	})
}
