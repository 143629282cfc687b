package egress_test

import (
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestOutboundAllow: without --outbound-allow naming it, fleetd sends no
// notification to an internal address, and what a viewer reads of the
// attempt is fleetd's own sentence (docs/reliability.md#outbound-requests).
// The other tests allow 127.0.0.0/8 for their receivers; this one takes that
// back.
func TestOutboundAllow(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b, append(fleetdtest.AlertFlags, "--outbound-allow", "", "--notify-max-attempts", "1")...)
		admin := s.Admin()
		viewer := s.NewKey(t, admin, "watcher", "viewer")
		hook := fleetdtest.NewReceiver(t, 0)
		s.MustDevice(t, admin, "pump-1", nil)
		rule := s.MustAlertRule(t, admin, map[string]any{"name": "hot", "stream": "env",
			"condition": map[string]any{"field": "temp", "operator": ">", "value": 80}})
		s.Do(t, admin, "POST", "/api/v1/alert-rules/"+rule.ID+"/alert-notification-rules",
			map[string]any{"channel_parameters": map[string]any{"type": "webhook", "url": hook.URL + "/alerts"}}).Want(t, 201)
		s.Do(t, admin, "POST", "/api/v1/devices/pump-1/streams/env", fleetdtest.Points(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC), 90)).Want(t, 200)
		alerts := s.Alerts(t, admin, "?state=active")
		if len(alerts) != 1 {
			t.Fatalf("alerts %+v", alerts)
		}
		var ds struct {
			Notifications []struct {
				Status   string
				Attempts []struct{ Error string }
			}
		}
		fleetdtest.Eventually(t, "the notification to die", func() bool {
			s.Do(t, viewer, "GET", "/api/v1/alerts/"+alerts[0].ID+"/notifications", nil).Want(t, 200).Decode(t, &ds)
			return len(ds.Notifications) == 1 && ds.Notifications[0].Status == "dead"
		})
		if a := ds.Notifications[0].Attempts; len(a) != 1 || !strings.Contains(a[0].Error, "loopback address") || !strings.Contains(a[0].Error, "--outbound-allow") {
			t.Fatalf("attempts %+v", a)
		}
		if n := len(hook.Got()); n != 0 {
			t.Fatalf("the receiver on 127.0.0.1 got %d requests", n)
		}
	})
}
