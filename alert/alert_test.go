package alert_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/notify"
	"github.com/fleetd/fleet/notify/notifytest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

func TestAlertRulesEndToEnd(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b, fleetdtest.AlertFlags...)
		admin := s.Admin()
		hot := map[string]any{"field": "temp", "operator": ">", "value": 80}

		t.Run("CreateQuietly", func(t *testing.T) {
			r := s.Do(t, admin, "POST", "/api/v1/alert-rules", map[string]any{"name": "quiet", "stream": "env", "condition": hot}).Want(t, 201)
			if len(r.Body) != 0 || !strings.Contains(r.Header.Get("Location"), "/api/v1/alert-rules/") {
				t.Fatalf("S2 answered %q with Location %q; want an empty body", r.Body, r.Header.Get("Location"))
			}
		})
		rule := s.MustAlertRule(t, admin, map[string]any{"name": "hot", "stream": "env", "group": "plant", "condition": hot,
			"metadata_filters": map[string]any{"site": []string{"berlin", "rome"}, "kind": "pump"}, "activation_threshold_seconds": 1.5})
		if rule.Group != "plant" || rule.ActivationThresholdSeconds != 1.5 || rule.DeactivationThresholdSeconds != 0 || rule.MetadataFilters["kind"] != "pump" {
			t.Fatalf("created %+v", rule)
		}
		t.Run("Read", func(t *testing.T) {
			var got fleetdtest.AlertRule
			s.Do(t, admin, "GET", "/api/v1/alert-rules/"+rule.ID, nil).Want(t, 200).Decode(t, &got)
			if got.Name != "hot" || got.Condition["operator"] != ">" {
				t.Fatalf("read %+v", got)
			}
			var list struct {
				AlertRules []fleetdtest.AlertRule `json:"alert_rules"`
				Count      int
			}
			s.Do(t, admin, "GET", "/api/v1/alert-rules?limit=1&page=2", nil).Want(t, 200).Decode(t, &list)
			if list.Count != 2 || len(list.AlertRules) != 1 || list.AlertRules[0].Name != "hot" {
				t.Fatalf("page 2 = %+v", list)
			}
		})
		t.Run("NameTaken", func(t *testing.T) {
			s.Do(t, admin, "POST", "/api/v1/alert-rules", map[string]any{"name": "hot", "stream": "x", "condition": hot}).Want(t, 409)
		})
		t.Run("Invalid", func(t *testing.T) {
			for _, tc := range []struct {
				body  map[string]any
				field string
			}{
				{map[string]any{"stream": "env", "condition": hot}, "name"},
				{map[string]any{"name": "x", "condition": hot}, "stream"},
				{map[string]any{"name": "x", "stream": "a/b", "condition": hot}, "stream"},
				{map[string]any{"name": "x", "stream": "env"}, "condition"},
				{map[string]any{"name": "x", "stream": "env", "condition": map[string]any{"all": []any{hot, map[string]any{"field": "t", "operator": "=~", "value": 1}}}}, "condition.all[1].operator"},
				{map[string]any{"name": "x", "stream": "env", "condition": hot, "activation_threshold_seconds": -1}, "activation_threshold_seconds"},
				{map[string]any{"name": "x", "stream": "env", "condition": hot, "deactivation_threshold_seconds": "5"}, "deactivation_threshold_seconds"},
				{map[string]any{"name": "x", "stream": "env", "condition": hot, "metadata_filters": map[string]any{"site": 3}}, "metadata_filters.site"},
				{map[string]any{"name": "x", "stream": "env", "condition": hot, "severity": "high"}, "severity"},
				{map[string]any{"name": "x", "stream": "env", "condition": map[string]any{"field": "t", "aggregate": "avg", "operator": ">", "value": 1}}, "condition.window_seconds"},
				{map[string]any{"name": "x", "stream": "env", "condition": map[string]any{"not": map[string]any{"field": "t", "aggregate": "p99", "window_seconds": 60, "operator": ">", "value": 1}}}, "condition.not.aggregate"},
				{map[string]any{"name": "x", "stream": "env", "condition": map[string]any{"field": "t", "aggregate": "max", "window_seconds": 90000, "operator": ">", "value": 1}}, "condition.window_seconds"},
			} {
				var e struct {
					Error  string
					Fields map[string]string
				}
				s.Do(t, admin, "POST", "/api/v1/alert-rules", tc.body).Want(t, 400).Decode(t, &e)
				if _, ok := e.Fields[tc.field]; !ok || e.Error != "invalid" {
					t.Errorf("body %v: fields %v, want a problem with %s", tc.body, e.Fields, tc.field)
				}
			}
		})
		t.Run("BadAndUnknownIDs", func(t *testing.T) {
			s.Do(t, admin, "GET", "/api/v1/alert-rules/not-a-uuid", nil).Want(t, 400)
			s.Do(t, admin, "GET", "/api/v1/alert-rules/00000000-0000-0000-0000-000000000001", nil).Want(t, 404)
			s.Do(t, admin, "DELETE", "/api/v1/alert-rules/00000000-0000-0000-0000-000000000001", nil).Want(t, 404)
			s.Do(t, admin, "GET", "/api/v1/alerts/nope", nil).Want(t, 400)
			s.Do(t, admin, "GET", "/api/v1/alerts?state=open", nil).Want(t, 400)
			s.Do(t, admin, "GET", "/api/v1/alerts?rule_id=x", nil).Want(t, 400)
			s.Do(t, admin, "GET", "/api/v1/alerts?colour=red", nil).Want(t, 400)
		})
		t.Run("Edit", func(t *testing.T) {
			gw := s.NewKey(t, admin, "edit-gateway", "device")
			viewer := s.NewKey(t, admin, "edit-viewer", "viewer")
			s.MustDevice(t, admin, "edit-dev", nil)
			r := s.MustAlertRule(t, admin, map[string]any{"name": "edit-me", "stream": "edits", "condition": hot})
			path := "/api/v1/alert-rules/" + r.ID
			start := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
			s.Do(t, gw, "POST", "/api/v1/devices/edit-dev/streams/edits", fleetdtest.Points(start, 90)).Want(t, 200)
			if a := s.Alerts(t, admin, "?rule_id="+r.ID+"&state=active"); len(a) != 1 {
				t.Fatalf("active alerts %+v, want one", a)
			}
			hotter := map[string]any{"field": "temp", "operator": ">", "value": 95}
			var got fleetdtest.AlertRule
			s.Send(t, fleetdtest.Req{Method: "PUT", Path: path, Creds: admin, Body: map[string]any{"name": "edited", "stream": "edits", "group": "g", "condition": hotter},
				Header: http.Header{"Prefer": {"return=representation"}}}).Want(t, 200).Decode(t, &got)
			if got.ID != r.ID || got.Name != "edited" || got.Group != "g" || got.Condition["value"] != 95.0 {
				t.Fatalf("edited %+v", got)
			}
			s.Do(t, admin, "GET", path, nil).Want(t, 200).Decode(t, &got)
			if got.Name != "edited" || got.Condition["value"] != 95.0 {
				t.Fatalf("read after the edit %+v", got)
			}
			// Hot by the old condition, not by the new: the open alert ends.
			s.Do(t, gw, "POST", "/api/v1/devices/edit-dev/streams/edits", fleetdtest.Points(start.Add(time.Minute), 92)).Want(t, 200)
			if a := s.Alerts(t, admin, "?rule_id="+r.ID); len(a) != 1 || a[0].State != "ended" {
				t.Fatalf("alerts after the edit %+v, want the one ended", a)
			}
			for _, tc := range []struct {
				body   map[string]any
				status int
				field  string
			}{
				{map[string]any{"name": "edited", "stream": "other", "condition": hotter}, 400, "stream"},
				{map[string]any{"name": "edited", "stream": "edits", "condition": map[string]any{"field": "t", "operator": "=~", "value": 1}}, 400, "condition.operator"},
				{map[string]any{"name": "hot", "stream": "edits", "condition": hotter}, 409, ""},
			} {
				var e struct{ Fields map[string]string }
				s.Do(t, admin, "PUT", path, tc.body).Want(t, tc.status).Decode(t, &e)
				if _, ok := e.Fields[tc.field]; tc.field != "" && !ok {
					t.Errorf("body %v: fields %v, want a problem with %s", tc.body, e.Fields, tc.field)
				}
			}
			s.Do(t, viewer, "PUT", path, map[string]any{"name": "x", "stream": "edits", "condition": hotter}).Want(t, 403)
			s.Do(t, admin, "PUT", "/api/v1/alert-rules/00000000-0000-0000-0000-000000000001", map[string]any{"name": "x", "stream": "edits", "condition": hotter}).Want(t, 404)
			if s.Do(t, admin, "GET", path, nil).Want(t, 200).Decode(t, &got); got.Name != "edited" {
				t.Errorf("a refused edit changed the rule: %+v", got)
			}
		})
		t.Run("NotificationRules", func(t *testing.T) {
			base := "/api/v1/alert-rules/" + rule.ID + "/alert-notification-rules"
			var n struct {
				ID                string
				AlertRuleID       string         `json:"alert_rule_id"`
				ChannelParameters map[string]any `json:"channel_parameters"`
				IntervalSeconds   int64          `json:"interval_seconds"`
				Timezone          string
			}
			s.Send(t, fleetdtest.Req{Method: "POST", Path: base, Creds: admin, Header: http.Header{"Prefer": {"return=representation"}}, Body: map[string]any{
				"channel_parameters": map[string]any{"type": "webhook", "url": "https://hooks.example.com/x?token=abc", "secret": "s3cret",
					"headers": map[string]string{"Authorization": "Bearer tok", "X-Team": "ops"}},
				"timezone": "Europe/Berlin", "notification_template": map[string]any{"subject": "{{.Rule.Name}}", "body": "{{.Alert.DeviceID}}"},
			}}).Want(t, 201).Decode(t, &n)
			ch := n.ChannelParameters
			if n.AlertRuleID != rule.ID || n.Timezone != "Europe/Berlin" || ch["has_secret"] != true || ch["secret"] != nil ||
				ch["headers"].(map[string]any)["Authorization"] != "***" || ch["headers"].(map[string]any)["X-Team"] != "ops" || strings.Contains(ch["url"].(string), "abc") {
				t.Fatalf("created %+v", n)
			}
			for _, tc := range []struct {
				body  map[string]any
				field string
			}{
				{map[string]any{"channel_parameters": map[string]any{"type": "fax"}}, "channel_parameters.type"},
				{map[string]any{"channel_parameters": map[string]any{"type": "webhook", "url": "ftp://x"}}, "channel_parameters.url"},
				{map[string]any{"channel_parameters": map[string]any{"type": "slack", "url": "/relative"}}, "channel_parameters.url"},
				{map[string]any{"channel_parameters": map[string]any{"type": "email", "to": []string{"not an address"}}}, "channel_parameters.to[0]"},
				{map[string]any{"channel_parameters": map[string]any{"type": "email", "to": []string{"ops@example.com"}}}, "channel_parameters.type"}, // no SMTP configured
				{map[string]any{"channel_parameters": map[string]any{"type": "slack", "url": "https://x.example.com", "secret": "s"}}, "channel_parameters.secret"},
				{map[string]any{"channel_parameters": map[string]any{"type": "slack", "url": "https://x.example.com"}, "timezone": "Mars/Olympus"}, "timezone"},
				{map[string]any{"channel_parameters": map[string]any{"type": "slack", "url": "https://x.example.com"}, "interval_seconds": -1}, "interval_seconds"},
				{map[string]any{"channel_parameters": map[string]any{"type": "slack", "url": "https://x.example.com"}, "notification_template": map[string]any{"body": "{{.Nope}}"}}, "notification_template.body"},
				{map[string]any{"channel_parameters": map[string]any{"type": "slack", "url": "https://x.example.com"}, "notification_template": map[string]any{"subject": "{{"}}, "notification_template.subject"},
				{map[string]any{"channel_parameters": map[string]any{"type": "webhook", "url": "https://x.example.com", "headers": map[string]string{"X-Fleet-Signature": "x"}}}, "channel_parameters.headers.X-Fleet-Signature"},
			} {
				var e struct{ Fields map[string]string }
				s.Do(t, admin, "POST", base, tc.body).Want(t, 400).Decode(t, &e)
				if _, ok := e.Fields[tc.field]; !ok {
					t.Errorf("body %v: fields %v, want a problem with %s", tc.body, e.Fields, tc.field)
				}
			}
			// S4: a partial update keeps the secret and masked headers.
			s.Do(t, admin, "PUT", base+"/"+n.ID, map[string]any{"interval_seconds": 60}).Want(t, 204)
			var updated map[string]any
			s.Send(t, fleetdtest.Req{Method: "PUT", Path: base + "/" + n.ID, Creds: admin, Header: http.Header{"Prefer": {"return=representation"}}, Body: map[string]any{
				"channel_parameters": map[string]any{"type": "webhook", "url": "https://hooks.example.com/y", "headers": map[string]string{"Authorization": "***"}},
			}}).Want(t, 200).Decode(t, &updated)
			if updated["interval_seconds"] != 60.0 || updated["channel_parameters"].(map[string]any)["has_secret"] != true {
				t.Fatalf("updated %v", updated)
			}
			s.Do(t, admin, "PUT", base+"/"+n.ID, map[string]any{"timezone": "Nowhere/Land"}).Want(t, 400)
			other := s.MustAlertRule(t, admin, map[string]any{"name": "other", "stream": "env", "condition": hot})
			s.Do(t, admin, "PUT", "/api/v1/alert-rules/"+other.ID+"/alert-notification-rules/"+n.ID, map[string]any{"interval_seconds": 5}).Want(t, 404)
			s.Do(t, admin, "POST", "/api/v1/alert-rules/00000000-0000-0000-0000-000000000001/alert-notification-rules",
				map[string]any{"channel_parameters": map[string]any{"type": "slack", "url": "https://x.example.com"}}).Want(t, 404)
			var list struct {
				Rules []map[string]any `json:"alert_notification_rules"`
				Count int
			}
			r := s.Do(t, admin, "GET", base, nil).Want(t, 200).Decode(t, &list)
			if list.Count != 1 || strings.Contains(string(r.Body), "s3cret") || strings.Contains(string(r.Body), "Bearer tok") {
				t.Fatalf("list %s", r.Body)
			}
			var logs struct {
				AuditLogs []map[string]any `json:"audit_logs"`
			}
			lr := s.Do(t, admin, "GET", "/api/v1/audit-logs?limit=1000", nil).Want(t, 200).Decode(t, &logs)
			if strings.Contains(string(lr.Body), "s3cret") || strings.Contains(string(lr.Body), "Bearer tok") || !strings.Contains(string(lr.Body), "notification_rule.update") {
				t.Fatalf("audit logs show a secret or miss the update: %s", lr.Body)
			}
			s.Do(t, admin, "DELETE", "/api/v1/alert-rules/"+other.ID, nil).Want(t, 204)
			s.Do(t, admin, "DELETE", "/api/v1/alert-rules/"+other.ID, nil).Want(t, 404)
		})
	})
}

func TestStreamIngestEndToEnd(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b, fleetdtest.AlertFlags...)
		admin := s.Admin()
		gw := s.NewKey(t, admin, "gateway", "device")
		s.MustDevice(t, admin, "pump-1", nil)
		start := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
		path := "/api/v1/devices/pump-1/streams/env"

		t.Run("Batch", func(t *testing.T) {
			var res struct{ Accepted, Rejected int }
			s.Do(t, gw, "POST", path, fleetdtest.Points(start, 20, 21, 22)).Want(t, 200).Decode(t, &res)
			if res.Accepted != 3 || res.Rejected != 0 {
				t.Fatalf("result %+v", res)
			}
			var p struct {
				DeviceID  string `json:"device_id"`
				Timestamp string
				Sequence  int
				Data      map[string]any
			}
			s.Do(t, admin, "GET", path+"/latest", nil).Want(t, 200).Decode(t, &p)
			if p.Data["temp"] != 22.0 || p.Sequence != 2 || p.Timestamp != "2026-11-21T10:00:02.000Z" || p.DeviceID != "pump-1" {
				t.Fatalf("latest %+v", p)
			}
		})
		t.Run("PartlyBadKeepsTheGood", func(t *testing.T) {
			body := []any{
				map[string]any{"timestamp": start.Add(time.Minute).UnixMilli(), "temp": 30},
				"not an object",
				map[string]any{"temp": 31},
				map[string]any{"timestamp": "yesterday", "temp": 32},
				map[string]any{"timestamp": start.Add(2 * time.Minute).UnixMilli(), "sequence": -1},
			}
			var res struct {
				Accepted, Rejected int
				Errors             map[string]string
			}
			s.Do(t, gw, "POST", path, body).Want(t, 200).Decode(t, &res)
			if res.Accepted != 1 || res.Rejected != 4 {
				t.Fatalf("result %+v", res)
			}
			for _, k := range []string{"[1]", "[2].timestamp", "[3].timestamp", "[4].sequence"} {
				if res.Errors[k] == "" {
					t.Errorf("errors %v lack %s", res.Errors, k)
				}
			}
		})
		t.Run("AllBadIsRefused", func(t *testing.T) {
			var e struct {
				Error  string
				Fields map[string]string
			}
			s.Do(t, gw, "POST", path, []any{1, map[string]any{"t": 1}}).Want(t, 400).Decode(t, &e)
			if e.Fields["[0]"] == "" || e.Fields["[1].timestamp"] == "" {
				t.Fatalf("fields %v", e.Fields)
			}
			s.Do(t, gw, "POST", path, "just a string").Want(t, 400)
			big := strings.Repeat("x", 70<<10)
			s.Do(t, gw, "POST", path, []any{map[string]any{"timestamp": start.UnixMilli(), "blob": big}}).Want(t, 400)
		})
		t.Run("UnknownDeviceAndBadNames", func(t *testing.T) {
			s.Do(t, gw, "POST", "/api/v1/devices/ghost/streams/env", fleetdtest.Points(start, 1)).Want(t, 404)
			s.Do(t, gw, "POST", "/api/v1/devices/pump-1/streams/a%20b", fleetdtest.Points(start, 1)).Want(t, 400)
			s.Do(t, admin, "GET", "/api/v1/devices/pump-1/streams/nothing/latest", nil).Want(t, 404)
		})
		t.Run("MetadataFilterSeesPatch", func(t *testing.T) {
			r := s.MustAlertRule(t, admin, map[string]any{"name": "berlin-hot", "stream": "env",
				"condition": map[string]any{"field": "temp", "operator": ">", "value": 80}, "metadata_filters": map[string]any{"site": "berlin"}})
			s.Do(t, gw, "POST", path, fleetdtest.Points(start.Add(10*time.Minute), 95)).Want(t, 200)
			if n := len(s.Alerts(t, admin, "?rule_id="+r.ID)); n != 0 {
				t.Fatalf("%d alerts for a device outside the filter", n)
			}
			s.Do(t, admin, "PATCH", "/api/v1/devices/pump-1", map[string]any{"metadata": map[string]any{"site": "berlin"}}).Want(t, 204)
			s.Do(t, gw, "POST", path, fleetdtest.Points(start.Add(11*time.Minute), 96)).Want(t, 200)
			if n := len(s.Alerts(t, admin, "?state=active&rule_id="+r.ID)); n != 1 {
				t.Fatalf("%d alerts once the device moved to berlin, want 1", n)
			}
			s.Do(t, admin, "DELETE", "/api/v1/alert-rules/"+r.ID, nil).Want(t, 204)
		})
		t.Run("DeviceGroupFollowsReportedState", func(t *testing.T) {
			hot := map[string]any{"field": "temp", "operator": ">", "value": 80}
			r := s.Do(t, admin, "POST", "/api/v1/alert-rules", map[string]any{"name": "test-hot", "stream": "env", "condition": hot, "device_group": "testing"})
			fleetdtest.WantCode(t, r, 400, "invalid")
			if !strings.Contains(string(r.Body), `"device_group":"no group is named \"testing\""`) {
				t.Fatalf("the refusal does not name the field: %s", r.Body)
			}
			s.Do(t, admin, "POST", "/api/v1/groups", map[string]any{"name": "testing", "selector": "reported.mode=test"}).Want(t, 201)
			rule := s.MustAlertRule(t, admin, map[string]any{"name": "test-hot", "stream": "env", "condition": hot, "device_group": "testing"})
			s.Do(t, gw, "POST", path, fleetdtest.Points(start.Add(20*time.Minute), 95)).Want(t, 200)
			if n := len(s.Alerts(t, admin, "?rule_id="+rule.ID)); n != 0 {
				t.Fatalf("%d alerts for a device outside the group", n)
			}
			// uplink's device_shadow stream fills the reported state,
			// which puts the device in the group.
			s.Do(t, gw, "POST", "/api/v1/devices/pump-1/streams/device_shadow",
				[]any{map[string]any{"timestamp": start.Add(21 * time.Minute).UnixMilli(), "mode": "test"}}).Want(t, 200)
			s.Do(t, gw, "POST", path, fleetdtest.Points(start.Add(22*time.Minute), 96)).Want(t, 200)
			if n := len(s.Alerts(t, admin, "?state=active&rule_id="+rule.ID)); n != 1 {
				t.Fatalf("%d alerts once the device is in the group, want 1", n)
			}
			var got fleetdtest.AlertRule
			s.Do(t, admin, "GET", "/api/v1/alert-rules/"+rule.ID, nil).Want(t, 200).Decode(t, &got)
			if got.DeviceGroup != "testing" {
				t.Fatalf("read %+v", got)
			}
			s.Do(t, admin, "DELETE", "/api/v1/alert-rules/"+rule.ID, nil).Want(t, 204)
		})
		t.Run("Roles", func(t *testing.T) {
			viewer := s.NewKey(t, admin, "viewer", "viewer")
			operator := s.NewKey(t, admin, "operator", "operator")
			s.Do(t, viewer, "POST", path, fleetdtest.Points(start, 1)).Want(t, 403)
			s.Do(t, gw, "GET", path+"/latest", nil).Want(t, 403)
			s.Do(t, gw, "GET", "/api/v1/alerts", nil).Want(t, 403)
			s.Do(t, gw, "POST", "/api/v1/alert-rules", map[string]any{"name": "x", "stream": "env", "condition": map[string]any{"no_data_seconds": 5}}).Want(t, 403)
			s.Do(t, viewer, "POST", "/api/v1/alert-rules", map[string]any{"name": "x", "stream": "env", "condition": map[string]any{"no_data_seconds": 5}}).Want(t, 403)
			s.Do(t, viewer, "GET", path+"/latest", nil).Want(t, 200)
			s.Do(t, viewer, "GET", "/api/v1/alert-rules", nil).Want(t, 200)
			s.Do(t, viewer, "GET", "/api/v1/alerts", nil).Want(t, 200)
			s.Do(t, operator, "POST", path, fleetdtest.Points(start.Add(time.Hour), 1)).Want(t, 200)
			r := s.MustAlertRule(t, operator, map[string]any{"name": "by-operator", "stream": "env", "condition": map[string]any{"no_data_seconds": 3600}})
			s.Do(t, viewer, "DELETE", "/api/v1/alert-rules/"+r.ID, nil).Want(t, 403)
			s.Do(t, viewer, "POST", "/api/v1/alert-rules/"+r.ID+"/alert-notification-rules", map[string]any{"channel_parameters": map[string]any{"type": "slack", "url": "https://x.example.com"}}).Want(t, 403)
			s.Do(t, viewer, "GET", "/api/v1/alert-rules/"+r.ID+"/alert-notification-rules", nil).Want(t, 200)
			s.Do(t, operator, "DELETE", "/api/v1/alert-rules/"+r.ID, nil).Want(t, 204)
			s.Do(t, fleetdtest.Creds{Tenant: "default", Key: "fk_wrong"}, "GET", "/api/v1/alerts", nil).Want(t, 401)
		})
	})
}

// TestAlertNotificationsEndToEnd publishes data over HTTP and receives the
// notifications: a webhook that fails twice first, Slack and email, for the
// opening and the closing of an alert.
func TestAlertNotificationsEndToEnd(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		smtpd := notifytest.NewSMTPServer(t)
		s := fleetdtest.Start(t, b, append(fleetdtest.AlertFlags, "--smtp-addr", smtpd.Addr, "--smtp-from", "fleetd@example.com", "--smtp-tls", "none")...)
		admin := s.Admin()
		s.MustDevice(t, admin, "pump-1", map[string]string{"site": "berlin"})
		s.MustDevice(t, admin, "pump-2", map[string]string{"site": "paris"})
		rule := s.MustAlertRule(t, admin, map[string]any{"name": "hot", "stream": "env",
			"condition":        map[string]any{"field": "temp", "operator": ">", "value": 80},
			"metadata_filters": map[string]any{"site": "berlin"}})
		hook := fleetdtest.NewReceiver(t, 2)
		slack := fleetdtest.NewReceiver(t, 0)
		base := "/api/v1/alert-rules/" + rule.ID + "/alert-notification-rules"
		var webhookRule struct{ ID string }
		s.Send(t, fleetdtest.Req{Method: "POST", Path: base, Creds: admin, Header: http.Header{"Prefer": {"return=representation"}}, Body: map[string]any{
			"channel_parameters":    map[string]any{"type": "webhook", "url": hook.URL + "/alerts", "secret": "s3cret", "headers": map[string]string{"X-Team": "ops"}},
			"notification_template": map[string]any{"subject": "{{.Rule.Name}} {{.Event}}", "body": "{{.Alert.DeviceID}} at {{.Alert.StartedAt.Format \"15:04:05 MST\"}} temp={{.Value.temp}}"},
			"timezone":              "Asia/Tokyo",
		}}).Want(t, 201).Decode(t, &webhookRule)
		s.Do(t, admin, "POST", base, map[string]any{"channel_parameters": map[string]any{"type": "slack", "url": slack.URL}}).Want(t, 201)
		s.Do(t, admin, "POST", base, map[string]any{"channel_parameters": map[string]any{"type": "email", "to": []string{"ops@example.com"}},
			"notification_template": map[string]any{"subject": "[{{.Event}}] {{.Rule.Name}} on {{.Alert.DeviceID}}"}}).Want(t, 201)

		start := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
		s.Do(t, admin, "POST", "/api/v1/devices/pump-2/streams/env", fleetdtest.Points(start, 99)).Want(t, 200) // paris: filtered out
		s.Do(t, admin, "POST", "/api/v1/devices/pump-1/streams/env", fleetdtest.Points(start, 70, 85, 90)).Want(t, 200)

		active := s.Alerts(t, admin, "?state=active")
		if len(active) != 1 || active[0].DeviceID != "pump-1" || active[0].RuleID != rule.ID || active[0].StartedAt != "2026-11-21T10:00:01.000Z" ||
			active[0].Value == nil || active[0].Value.Data["temp"] != 85.0 {
			t.Fatalf("active alerts %+v", active)
		}
		alertID := active[0].ID

		fleetdtest.Eventually(t, "the webhook, after two 503s", func() bool { return len(hook.Got()) >= 3 })
		fleetdtest.Eventually(t, "slack", func() bool { return len(slack.Got()) >= 1 })
		var mail notifytest.Mail
		select {
		case mail = <-smtpd.Mail:
		case <-time.After(15 * time.Second):
			t.Fatal("no email")
		}
		if mail.To[0] != "ops@example.com" || !strings.Contains(mail.Data, "Subject: [opened] hot on pump-1") {
			t.Fatalf("mail %+v", mail)
		}
		got := hook.Got()[2]
		if sig := got.Header.Get("X-Fleet-Signature"); sig != notify.Sign("s3cret", got.Body) {
			t.Fatalf("signature %q does not verify", sig)
		}
		var payload struct {
			Event        string
			Alert        fleetdtest.AlertSession
			Rule         struct{ ID, Name string }
			Notification struct{ Subject, Body string }
		}
		if err := json.Unmarshal(got.Body, &payload); err != nil {
			t.Fatal(err)
		}
		if payload.Event != "opened" || payload.Alert.ID != alertID || payload.Rule.Name != "hot" || payload.Notification.Subject != "hot opened" ||
			payload.Notification.Body != "pump-1 at 19:00:01 JST temp=85" || got.Header.Get("X-Team") != "ops" {
			t.Fatalf("webhook %s %v", got.Body, got.Header)
		}
		if !strings.Contains(string(slack.Got()[0].Body), "hot opened on pump-1") {
			t.Fatalf("slack %s", slack.Got()[0].Body)
		}

		type delivery struct {
			Event, Status      string
			NotificationRuleID string `json:"notification_rule_id"`
			Attempts           []struct {
				StatusCode int `json:"status_code"`
				Error      string
			}
		}
		var ds struct {
			Notifications []delivery
			Count         int
		}
		fleetdtest.Eventually(t, "three delivered notifications", func() bool {
			s.Do(t, admin, "GET", "/api/v1/alerts/"+alertID+"/notifications", nil).Want(t, 200).Decode(t, &ds)
			n := 0
			for _, d := range ds.Notifications {
				if d.Status == "delivered" {
					n++
				}
			}
			return n == 3
		})
		for _, d := range ds.Notifications {
			if d.NotificationRuleID != webhookRule.ID {
				continue
			}
			if a := d.Attempts; len(a) != 3 || a[0].StatusCode != 503 || a[1].StatusCode != 503 || a[2].StatusCode != 200 || a[0].Error == "" {
				t.Fatalf("webhook attempts %+v", a)
			}
		}

		// Cooling down closes the alert, and that is notified too.
		s.Do(t, admin, "POST", "/api/v1/devices/pump-1/streams/env", fleetdtest.Points(start.Add(time.Minute), 60)).Want(t, 200)
		ended := s.Alerts(t, admin, "?state=ended&device_id=pump-1&rule_id="+rule.ID)
		if len(ended) != 1 || ended[0].EndedAt == nil || *ended[0].EndedAt != "2026-11-21T10:01:00.000Z" {
			t.Fatalf("ended alerts %+v", ended)
		}
		fleetdtest.Eventually(t, "the closing webhook", func() bool {
			for _, r := range hook.Got() {
				if r.Header.Get("X-Fleet-Event") == "closed" {
					return true
				}
			}
			return false
		})
		select {
		case mail = <-smtpd.Mail:
			if !strings.Contains(mail.Data, "Subject: [closed] hot on pump-1") {
				t.Fatalf("closing mail %s", mail.Data)
			}
		case <-time.After(15 * time.Second):
			t.Fatal("no closing email")
		}
		if n := len(s.Alerts(t, admin, "")); n != 1 {
			t.Fatalf("%d alerts, want 1", n)
		}
	})
}

// TestAlertTenantIsolation proves that another tenant sees none of these
// endpoints' resources and that ingest into one tenant never evaluates
// another's rules.
func TestAlertTenantIsolation(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b, fleetdtest.AlertFlags...)
		a := s.Admin()
		other := s.NewTenant(t, "beta")
		hot := map[string]any{"field": "temp", "operator": ">", "value": 80}
		ra := s.MustAlertRule(t, a, map[string]any{"name": "hot", "stream": "env", "condition": hot})
		rb := s.MustAlertRule(t, other, map[string]any{"name": "hot", "stream": "env", "condition": hot})
		s.MustDevice(t, a, "pump-1", nil)
		s.MustDevice(t, other, "pump-1", nil)
		na := struct{ ID string }{}
		s.Send(t, fleetdtest.Req{Method: "POST", Path: "/api/v1/alert-rules/" + ra.ID + "/alert-notification-rules", Creds: a, Header: http.Header{"Prefer": {"return=representation"}},
			Body: map[string]any{"channel_parameters": map[string]any{"type": "slack", "url": "https://x.example.com"}}}).Want(t, 201).Decode(t, &na)

		s.Do(t, a, "POST", "/api/v1/devices/pump-1/streams/env", fleetdtest.Points(time.Now(), 90)).Want(t, 200)
		if n := len(s.Alerts(t, a, "")); n != 1 {
			t.Fatalf("tenant default has %d alerts, want 1", n)
		}
		if n := len(s.Alerts(t, other, "")); n != 0 {
			t.Fatalf("beta has %d alerts after default's ingest, want 0", n)
		}
		alertID := s.Alerts(t, a, "")[0].ID
		for _, r := range []struct{ method, path string }{
			{"GET", "/api/v1/alert-rules/" + ra.ID},
			{"DELETE", "/api/v1/alert-rules/" + ra.ID},
			{"GET", "/api/v1/alert-rules/" + ra.ID + "/alert-notification-rules"},
			{"GET", "/api/v1/alerts/" + alertID},
			{"GET", "/api/v1/alerts/" + alertID + "/notifications"},
			{"DELETE", "/api/v1/alert-rules/" + ra.ID + "/alert-notification-rules/" + na.ID},
			{"GET", "/api/v1/devices/pump-2/streams/env/latest"},
		} {
			s.Do(t, other, r.method, r.path, nil).Want(t, 404)
		}
		s.Do(t, other, "POST", "/api/v1/alert-rules/"+ra.ID+"/alert-notification-rules",
			map[string]any{"channel_parameters": map[string]any{"type": "slack", "url": "https://x.example.com"}}).Want(t, 404)
		s.Do(t, other, "PUT", "/api/v1/alert-rules/"+ra.ID+"/alert-notification-rules/"+na.ID, map[string]any{"interval_seconds": 5}).Want(t, 404)
		s.Do(t, other, "PUT", "/api/v1/alert-rules/"+rb.ID+"/alert-notification-rules/"+na.ID, map[string]any{"interval_seconds": 5}).Want(t, 404)
		var list struct{ Count int }
		s.Do(t, other, "GET", "/api/v1/alert-rules", nil).Want(t, 200).Decode(t, &list)
		if list.Count != 1 {
			t.Fatalf("beta lists %d rules, want its own 1", list.Count)
		}
		if n := len(s.Alerts(t, other, "?rule_id="+ra.ID)); n != 0 {
			t.Fatalf("beta sees %d alerts of default's rule", n)
		}
		s.Do(t, other, "GET", "/api/v1/devices/pump-1/streams/env/latest", nil).Want(t, 404)
		s.MustDevice(t, a, "solo", nil)
		s.Do(t, other, "POST", "/api/v1/devices/solo/streams/env", fleetdtest.Points(time.Now(), 90)).Want(t, 404)
		s.Do(t, other, "GET", "/api/v1/devices/solo/streams/env/latest", nil).Want(t, 404)
	})
}

// TestAlertsSurviveRestart restarts the server with an alert open and one
// pending: the open one is neither opened again nor forgotten, and the
// pending one opens when its threshold elapses by the clock.
func TestAlertsSurviveRestart(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b, fleetdtest.AlertFlags...)
		admin := s.Admin()
		s.MustDevice(t, admin, "pump-1", nil)
		s.MustDevice(t, admin, "pump-2", nil)
		hot := map[string]any{"field": "temp", "operator": ">", "value": 80}
		s.MustAlertRule(t, admin, map[string]any{"name": "hot", "stream": "env", "condition": hot})
		slow := s.MustAlertRule(t, admin, map[string]any{"name": "slow", "stream": "slow", "condition": hot, "activation_threshold_seconds": 0.5})
		start := time.Now().UTC()
		s.Do(t, admin, "POST", "/api/v1/devices/pump-1/streams/env", fleetdtest.Points(start, 90)).Want(t, 200)
		s.Do(t, admin, "POST", "/api/v1/devices/pump-2/streams/slow", fleetdtest.Points(start, 90)).Want(t, 200)
		if n := len(s.Alerts(t, admin, "")); n != 1 {
			t.Fatalf("%d alerts before the restart, want 1", n)
		}

		s.Restart(t, fleetdtest.AlertFlags...)
		// The same point again, as a device whose acknowledgement was lost
		// would send it, and another hot one: still one alert.
		s.Do(t, admin, "POST", "/api/v1/devices/pump-1/streams/env", fleetdtest.Points(start, 90, 95)).Want(t, 200)
		if active := s.Alerts(t, admin, "?state=active&device_id=pump-1"); len(active) != 1 {
			t.Fatalf("%d active alerts of pump-1 after the restart, want 1", len(active))
		}
		fleetdtest.Eventually(t, "the pending alert to open by the clock after the restart", func() bool {
			return len(s.Alerts(t, admin, "?state=active&rule_id="+slow.ID)) == 1
		})
		s.Do(t, admin, "POST", "/api/v1/devices/pump-1/streams/env", fleetdtest.Points(start.Add(time.Minute), 20)).Want(t, 200)
		all := s.Alerts(t, admin, "?device_id=pump-1")
		if len(all) != 1 || all[0].State != "ended" {
			t.Fatalf("pump-1 alerts after cooling %+v, want the one from before the restart, ended", all)
		}
	})
}

// TestAlertReminders: a notification rule with interval_seconds reminds
// while the alert is open.
func TestAlertReminders(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b, fleetdtest.AlertFlags...)
		admin := s.Admin()
		s.MustDevice(t, admin, "pump-1", nil)
		rule := s.MustAlertRule(t, admin, map[string]any{"name": "hot", "stream": "env", "condition": map[string]any{"field": "temp", "operator": ">", "value": 80}})
		hook := fleetdtest.NewReceiver(t, 0)
		s.Do(t, admin, "POST", "/api/v1/alert-rules/"+rule.ID+"/alert-notification-rules", map[string]any{
			"channel_parameters": map[string]any{"type": "webhook", "url": hook.URL}, "interval_seconds": 1,
			"notification_template": map[string]any{"subject": "{{.Event}}"}}).Want(t, 201)
		s.Do(t, admin, "POST", "/api/v1/devices/pump-1/streams/env", fleetdtest.Points(time.Now(), 90)).Want(t, 200)
		events := func() []string {
			var ev []string
			for _, r := range hook.Got() {
				ev = append(ev, r.Header.Get("X-Fleet-Event"))
			}
			return ev
		}
		fleetdtest.Eventually(t, "a reminder", func() bool {
			ev := events()
			return len(ev) >= 2 && ev[0] == "opened" && ev[len(ev)-1] == "repeat"
		})
	})
}
