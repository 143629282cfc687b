package agent_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/fleetd/fleet/internal/fleetdtest"
)

// TestAgentUpdateConfig changes devices' desired state with the tenant's
// update_config setting on, so that each change reaches a real
// fleetd-agent as an update_config action: one writes the whole desired
// state to its file and runs its hook on it, and the action completes;
// one configured for neither fails it saying so.
func TestAgentUpdateConfig(t *testing.T) {
	t.Parallel()
	withFleetd(t, nil, func(t *testing.T, s *agents) {
		admin := s.Admin()
		s.Do(t, admin, "PUT", "/api/v1/tenants/default/shadow-settings", map[string]any{"update_config": true}).Want(t, 204)
		dir := t.TempDir()
		file, copied := filepath.Join(dir, "desired.json"), filepath.Join(dir, "applied.json")
		hook := filepath.Join(dir, "apply")
		writeScript(t, hook, `cat "$1" > `+copied+`; read -r stdin; [ "$stdin" = "$(cat "$1")" ] || { echo "stdin differs" >&2; exit 1; }`)
		s.StartDevice(t, "cfg-1", "--update-config-file", file, "--update-config-hook", hook+" {file}")
		s.StartDevice(t, "cfg-bare")

		s.Do(t, admin, "PATCH", "/api/v1/devices/cfg-1/shadow", map[string]any{"desired": map[string]any{"interval": 30}}).Want(t, 200)
		s.Do(t, admin, "PATCH", "/api/v1/devices/cfg-1/shadow", map[string]any{"desired": map[string]any{"log": map[string]any{"level": "debug"}}}).Want(t, 200)
		const want = `{"interval":30,"log":{"level":"debug"}}`
		fleetdtest.Eventually(t, "the hook to have applied the whole desired state", func() bool {
			b, _ := os.ReadFile(copied)
			return string(b) == want
		})
		if b, _ := os.ReadFile(file); string(b) != want {
			t.Fatalf("the file holds %q", b)
		}
		if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("the file: %v, %v", fi, err)
		}
		var list struct {
			DeviceActions []fleetdtest.DeviceActionBody `json:"device_actions"`
		}
		fleetdtest.Eventually(t, "both update_config actions to complete", func() bool {
			s.Do(t, admin, "GET", "/api/v1/devices/cfg-1/actions", nil).Want(t, 200).Decode(t, &list)
			n := 0
			for _, da := range list.DeviceActions {
				if da.ActionStatus == "Completed" {
					n++
				}
			}
			return n == 2
		})

		s.Do(t, admin, "PATCH", "/api/v1/devices/cfg-bare/shadow", map[string]any{"desired": map[string]any{"interval": 5}}).Want(t, 200)
		fleetdtest.Eventually(t, "the unconfigured device to fail update_config", func() bool {
			s.Do(t, admin, "GET", "/api/v1/devices/cfg-bare/actions", nil).Want(t, 200).Decode(t, &list)
			return len(list.DeviceActions) == 1 && hasError(list.DeviceActions[0], "Failed", "update_config is not configured on this device")
		})
	})
}
