package twin_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestShadowUpdateConfig: with the tenant's update_config setting on, a
// desired change reaches a device that takes only actions (as uplink's
// does) as an update_config action carrying the whole desired state;
// with it off, or when the change leaves the device in sync, no action is
// sent. Only an admin changes the setting, which is audited with the
// previous value, and one tenant's setting is not another's.
func TestShadowUpdateConfig(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		admin := s.Admin()
		operator := s.NewKey(t, admin, "op", "operator")
		viewer := s.NewKey(t, admin, "view", "viewer")
		other := s.NewTenant(t, "other")
		const path = "/api/v1/tenants/default/shadow-settings"
		setting := func(c fleetdtest.Creds, tenant string) bool {
			t.Helper()
			var got fleet.ShadowSettings
			s.Do(t, c, "GET", "/api/v1/tenants/"+tenant+"/shadow-settings", nil).Want(t, 200).Decode(t, &got)
			return got.UpdateConfig
		}
		if setting(viewer, "default") {
			t.Fatal("update_config is on before anyone set it")
		}
		s.Do(t, operator, "PUT", path, map[string]any{"update_config": true}).Want(t, 403)
		fleetdtest.WantCode(t, s.Do(t, admin, "PUT", path, map[string]any{"update_config": "yes"}), 400, "invalid")
		fleetdtest.WantCode(t, s.Do(t, admin, "PUT", path, map[string]any{}), 400, "invalid")
		s.Do(t, other, "PUT", path, map[string]any{"update_config": true}).Want(t, 404)
		s.Do(t, admin, "PUT", path, map[string]any{"update_config": true}).Want(t, 204)
		if !setting(viewer, "default") || setting(other, "other") {
			t.Fatal("the setting is not the tenant's own")
		}
		var logs struct {
			AuditLogs []struct {
				Action  string         `json:"action"`
				Details map[string]any `json:"details"`
			} `json:"audit_logs"`
		}
		s.Do(t, admin, "GET", "/api/v1/audit-logs?action=tenant.shadow_settings", nil).Want(t, 200).Decode(t, &logs)
		if len(logs.AuditLogs) != 1 || !strings.Contains(mustJSON(t, logs.AuditLogs[0].Details), `"previous":{"update_config":false}`) {
			t.Fatalf("audit: %+v", logs)
		}

		tok := s.MustDevice(t, admin, "up-1", nil).Token
		d := s.ConnectDevice(t, "default", "up-1", tok)
		s.Do(t, operator, "PATCH", "/api/v1/devices/up-1/shadow", map[string]any{"desired": map[string]any{"interval": 30, "log": map[string]any{"level": "debug"}}}).Want(t, 200)
		m := d.Next(t)
		if m.Name != fleet.ActionUpdateConfig || m.Payload != `{"interval":30,"log":{"level":"debug"}}` {
			t.Fatalf("the device received %+v", m)
		}
		// An ordinary action's timeout, a day: with none (0), the sweeper
		// timed the device out as soon as it had received the action.
		var a fleetdtest.ActionBody
		s.Do(t, operator, "GET", "/api/v1/actions/"+m.ID, nil).Want(t, 200).Decode(t, &a)
		if a.Timeout != fleet.DefaultActionTimeout {
			t.Fatalf("update_config's timeout is %d s, want %d", a.Timeout, fleet.DefaultActionTimeout)
		}
		s.Do(t, operator, "PATCH", "/api/v1/devices/up-1/shadow", map[string]any{"desired": map[string]any{"log": nil}}).Want(t, 200)
		if m := d.Next(t); m.Name != fleet.ActionUpdateConfig || m.Payload != `{"interval":30}` {
			t.Fatalf("after the second change the device received %+v", m)
		}
		// The device took it: its state as reported matches, so a change
		// to what it has already leaves it in sync and sends nothing.
		d.Report(t, map[string]any{"action_id": m.ID, "state": "Completed", "progress": 100})
		s.Do(t, admin, "POST", "/api/v1/devices/up-1/streams/device_shadow",
			[]any{map[string]any{"timestamp": 1_700_000_000_000, "interval": 30, "mode": "eco"}}).Want(t, 200)
		s.Do(t, operator, "PATCH", "/api/v1/devices/up-1/shadow", map[string]any{"desired": map[string]any{"mode": "eco"}}).Want(t, 200)
		d.Nothing(t)

		s.Do(t, admin, "PUT", path, map[string]any{"update_config": false}).Want(t, 204)
		s.Do(t, operator, "PATCH", "/api/v1/devices/up-1/shadow", map[string]any{"desired": map[string]any{"interval": 60}}).Want(t, 200)
		d.Nothing(t)
	})
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
