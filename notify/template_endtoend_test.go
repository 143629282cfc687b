package notify_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestNotificationTemplateBudget: a template that would render without
// end is refused when saved (400, not a dead fleetd), and one that loops
// over a value of the data fails its notification once, for good, while
// another tenant's notifications go out; fleetd then stops when told to
// (docs/reliability.md#notification-templates).
func TestNotificationTemplateBudget(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b, fleetdtest.AlertFlags...)
		acme, beta := s.NewTenant(t, "acme"), s.NewTenant(t, "beta")
		hook := fleetdtest.NewReceiver(t, 0)
		ruleOf := func(c fleetdtest.Creds) string {
			s.MustDevice(t, c, "pump-1", nil)
			return s.MustAlertRule(t, c, map[string]any{"name": "hot", "stream": "env",
				"condition": map[string]any{"field": "temp", "operator": ">", "value": 80}}).ID
		}
		acmeRule, betaRule := ruleOf(acme), ruleOf(beta)
		acmeBase := "/api/v1/alert-rules/" + acmeRule + "/alert-notification-rules"
		channel := map[string]any{"type": "webhook", "url": hook.URL + "/alerts"}

		for _, body := range []string{`{{range 100000000000000}}AAAA{{end}}`, `{{range 100000000000000}}{{end}}`} {
			r := s.Do(t, acme, "POST", acmeBase, map[string]any{"channel_parameters": channel,
				"notification_template": map[string]any{"body": body}}).Want(t, 400)
			var e struct{ Fields map[string]string }
			r.Decode(t, &e)
			if !strings.Contains(e.Fields["notification_template.body"], "must render within 50ms and 65536 bytes") {
				t.Fatalf("%s: fields %v", body, e.Fields)
			}
		}

		var rule struct{ ID string }
		s.Send(t, fleetdtest.Req{Method: "POST", Path: acmeBase, Creds: acme, Header: http.Header{"Prefer": {"return=representation"}}, Body: map[string]any{
			"channel_parameters": channel, "notification_template": map[string]any{"body": `{{range .Value.n}}{{end}}`}}}).Want(t, 201).Decode(t, &rule)
		s.Do(t, acme, "PUT", acmeBase+"/"+rule.ID, map[string]any{"notification_template": map[string]any{"subject": `{{range 100000000000000}}{{end}}`}}).Want(t, 400)
		s.Do(t, beta, "POST", "/api/v1/alert-rules/"+betaRule+"/alert-notification-rules", map[string]any{"channel_parameters": channel}).Want(t, 201)

		at := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC).UnixMilli()
		s.Do(t, acme, "POST", "/api/v1/devices/pump-1/streams/env", []map[string]any{{"timestamp": at, "temp": 90, "n": int64(1e14)}}).Want(t, 200)
		s.Do(t, beta, "POST", "/api/v1/devices/pump-1/streams/env", []map[string]any{{"timestamp": at, "temp": 90}}).Want(t, 200)
		fleetdtest.Eventually(t, "beta's notification", func() bool { return len(hook.Got()) == 1 })

		alerts := s.Alerts(t, acme, "?state=active")
		if len(alerts) != 1 {
			t.Fatalf("acme alerts %+v", alerts)
		}
		var ds struct {
			Notifications []struct {
				Status   string
				Attempts []struct{ Error string }
			}
		}
		fleetdtest.Eventually(t, "acme's notification to die", func() bool {
			s.Do(t, acme, "GET", "/api/v1/alerts/"+alerts[0].ID+"/notifications", nil).Want(t, 200).Decode(t, &ds)
			return len(ds.Notifications) == 1 && ds.Notifications[0].Status == "dead"
		})
		if a := ds.Notifications[0].Attempts; len(a) != 1 || !strings.Contains(a[0].Error, "took longer than 50ms") {
			t.Fatalf("attempts %+v, want one over the budget", a)
		}
		s.Stop(t) // fails unless fleetd stops
		if n := len(hook.Got()); n != 1 {
			t.Fatalf("%d webhook requests, want beta's only", n)
		}
	})
}
