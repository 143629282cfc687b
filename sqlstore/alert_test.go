package sqlstore_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
	"github.com/google/uuid"
)

func mustAlertRule(t *testing.T, db *sqlstore.DB, tenant, name string) *fleet.AlertRule {
	t.Helper()
	r := &fleet.AlertRule{Name: name, Stream: "env", Group: "g",
		Condition:                  map[string]any{"field": "temp", "operator": ">", "value": int64(80)},
		MetadataFilters:            map[string]any{"site": []any{"a", "b"}},
		ActivationThresholdSeconds: 1.5}
	if err := db.CreateAlertRule(context.Background(), tenant, r); err != nil {
		t.Fatalf("CreateAlertRule: %v", err)
	}
	return r
}

func mustAlertDevices(t testing.TB, db *sqlstore.DB, tenant string, ids ...string) {
	t.Helper()
	var devs []fleet.NewDevice
	for _, id := range ids {
		devs = append(devs, fleet.NewDevice{ID: id})
	}
	if _, err := db.CreateDevices(context.Background(), tenant, devs); err != nil {
		t.Fatal(err)
	}
}

func TestAlertRulesStore(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, clk := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustTenant(t, db, "beta")
		r := mustAlertRule(t, db, "acme", "hot")
		clk.Add(time.Second)
		mustAlertRule(t, db, "acme", "cold")
		if _, err := uuid.Parse(r.ID); err != nil || r.CreatedAt.IsZero() {
			t.Fatalf("created rule %+v", r)
		}
		t.Run("NameTaken", func(t *testing.T) {
			wantCode(t, db.CreateAlertRule(ctx, "acme", &fleet.AlertRule{Name: "hot", Stream: "x", Condition: map[string]any{}}), fleet.ECONFLICT)
			mustAlertRule(t, db, "beta", "hot") // another tenant may
		})
		t.Run("ReadBack", func(t *testing.T) {
			got, err := db.FindAlertRule(ctx, "acme", r.ID)
			if err != nil {
				t.Fatal(err)
			}
			b1, _ := json.Marshal(got)
			b2, _ := json.Marshal(r)
			if string(b1) != string(b2) {
				t.Fatalf("read %s, want %s", b1, b2)
			}
			if got.Condition.(map[string]any)["value"] != int64(80) {
				t.Fatalf("condition value %T, want int64", got.Condition.(map[string]any)["value"])
			}
		})
		t.Run("OtherTenant", func(t *testing.T) {
			_, err := db.FindAlertRule(ctx, "beta", r.ID)
			wantCode(t, err, fleet.ENOTFOUND)
			wantCode(t, db.DeleteAlertRule(ctx, "beta", r.ID), fleet.ENOTFOUND)
		})
		t.Run("Paging", func(t *testing.T) {
			rules, n, err := db.FindAlertRules(ctx, "acme", fleet.Page{Page: 2, Limit: 1})
			if err != nil || n != 2 || len(rules) != 1 || rules[0].Name != "cold" {
				t.Fatalf("page 2: %v %d %v", rules, n, err)
			}
			all, err := db.FindAllAlertRules(ctx)
			if err != nil || len(all) != 3 {
				t.Fatalf("all rules: %d %v", len(all), err)
			}
		})
		t.Run("Delete", func(t *testing.T) {
			wantCode(t, db.DeleteAlertRule(ctx, "acme", r.ID), "")
			_, err := db.FindAlertRule(ctx, "acme", r.ID)
			wantCode(t, err, fleet.ENOTFOUND)
		})
	})
}

// TestAlertRuleDeviceGroup: a rule keeps its device group, which must be
// one of the tenant's; InGroup, what the engine asks of each device, is
// the group's membership now, by metadata and reported state.
func TestAlertRuleDeviceGroup(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, _ := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustTenant(t, db, "beta")
		mustAlertDevices(t, db, "acme", "d1", "d2")
		mustAlertDevices(t, db, "beta", "d1")
		if _, err := db.CreateGroup(ctx, "beta", &fleet.Group{Name: "lab", Selector: "!site"}); err != nil {
			t.Fatal(err)
		}
		r := &fleet.AlertRule{Name: "hot", Stream: "env", DeviceGroup: "lab", Condition: map[string]any{"field": "temp", "operator": ">", "value": int64(80)}}
		err := db.CreateAlertRule(ctx, "acme", r) // beta's group is not acme's
		if fleet.ErrorCode(err) != fleet.EINVALID || !strings.Contains(err.Error(), `device_group: no group is named "lab"`) {
			t.Fatalf("a rule of an unknown group: %v", err)
		}
		if _, err := db.CreateGroup(ctx, "acme", &fleet.Group{Name: "lab", Selector: "reported.fw=2"}); err != nil {
			t.Fatal(err)
		}
		if err := db.CreateAlertRule(ctx, "acme", r); err != nil {
			t.Fatal(err)
		}
		if got, err := db.FindAlertRule(ctx, "acme", r.ID); err != nil || got.DeviceGroup != "lab" {
			t.Fatalf("read back %+v, %v", got, err)
		}
		r.DeviceGroup = "nowhere"
		if err := db.UpdateAlertRule(ctx, "acme", r.ID, r); fleet.ErrorCode(err) != fleet.EINVALID {
			t.Fatalf("an update to an unknown group: %v", err)
		}
		in := func(tenant, group, device string, want bool) {
			t.Helper()
			if got, err := db.InGroup(ctx, tenant, group, device); err != nil || got != want {
				t.Fatalf("InGroup(%s, %s, %s) = %v, %v; want %v", tenant, group, device, got, err, want)
			}
		}
		in("acme", "lab", "d1", false)
		if _, err := db.UpdateReported(ctx, "acme", "d1", map[string]any{"fw": 2}); err != nil {
			t.Fatal(err)
		}
		in("acme", "lab", "d1", true)
		in("acme", "lab", "d2", false)
		in("beta", "lab", "d1", true) // beta's own group: !site
		in("acme", "nowhere", "d1", false)
	})
}

func TestCommitStream(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, clk := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustAlertDevices(t, db, "acme", "d1", "d2")
		r := mustAlertRule(t, db, "acme", "hot")
		n := &fleet.NotificationRule{AlertRuleID: r.ID, Timezone: "UTC",
			ChannelParameters: fleet.ChannelParameters{Type: "webhook", URL: "http://127.0.0.1:1/x", Secret: "s3cret"}}
		if err := db.CreateNotificationRule(ctx, "acme", n); err != nil {
			t.Fatal(err)
		}
		notification := n
		point := func(sec int, temp int64) *fleet.DataPoint {
			return &fleet.DataPoint{DeviceID: "d1", Stream: "env", Timestamp: clk.Now().Add(time.Duration(sec) * time.Second).Truncate(time.Millisecond),
				Sequence: 1, Data: map[string]any{"temp": temp, "nested": map[string]any{"x": 1.5}}, ReceivedAt: clk.Now().Truncate(time.Millisecond)}
		}

		t.Run("LatestKeepsTheNewest", func(t *testing.T) {
			if err := db.CommitStream(ctx, "acme", "d1", "env", []fleet.DataPoint{*point(10, 1)}, nil); err != nil {
				t.Fatal(err)
			}
			if err := db.CommitStream(ctx, "acme", "d1", "env", []fleet.DataPoint{*point(5, 2)}, nil); err != nil {
				t.Fatal(err)
			}
			got, err := db.FindLatestPoint(ctx, "acme", "d1", "env")
			if err != nil {
				t.Fatal(err)
			}
			if got.Data["temp"] != int64(1) || got.Data["nested"].(map[string]any)["x"] != 1.5 || !got.Timestamp.Equal(point(10, 1).Timestamp) {
				t.Fatalf("latest = %+v", got)
			}
			_, err = db.FindLatestPoint(ctx, "acme", "d2", "env")
			wantCode(t, err, fleet.ENOTFOUND)
			_, err = db.FindLatestPoint(ctx, "beta", "d1", "env")
			wantCode(t, err, fleet.ENOTFOUND)
			pts, err := db.FindLatestPoints(ctx, "acme", "env")
			if err != nil || len(pts) != 1 {
				t.Fatalf("latest points: %v %v", pts, err)
			}
		})
		t.Run("DeviceStreams", func(t *testing.T) {
			p := point(1, 3)
			p.Stream = "battery"
			if err := db.CommitStream(ctx, "acme", "d1", "battery", []fleet.DataPoint{*p}, nil); err != nil {
				t.Fatal(err)
			}
			pts, n, err := db.FindDeviceStreams(ctx, "acme", "d1", fleet.Page{Page: 1, Limit: 1})
			if err != nil || n != 2 || len(pts) != 1 || pts[0].Stream != "battery" || pts[0].Data["temp"] != int64(3) {
				t.Fatalf("first page of d1's streams: %+v, %d, %v; want battery of 2", pts, n, err)
			}
			pts, _, err = db.FindDeviceStreams(ctx, "acme", "d1", fleet.Page{Page: 2, Limit: 1})
			if err != nil || len(pts) != 1 || pts[0].Stream != "env" {
				t.Fatalf("second page of d1's streams: %+v, %v; want env", pts, err)
			}
			if pts, n, err := db.FindDeviceStreams(ctx, "beta", "d1", fleet.Page{Page: 1, Limit: 10}); err != nil || n != 0 || len(pts) != 0 {
				t.Fatalf("another tenant's d1: %+v, %d, %v; want none", pts, n, err)
			}
		})
		t.Run("UnknownDevice", func(t *testing.T) {
			wantCode(t, db.CommitStream(ctx, "acme", "ghost", "env", []fleet.DataPoint{*point(1, 1)}, nil), fleet.ENOTFOUND)
		})

		var alertID string
		t.Run("OpenWritesAlertStateAndOutbox", func(t *testing.T) {
			alertID = uuid.NewString()
			ch := &fleet.AlertChange{Stream: "env",
				State: fleet.AlertState{Tenant: "acme", RuleID: r.ID, DeviceID: "d1", Phase: fleet.PhaseActive, SinceClock: clk.Now(), AlertID: alertID},
				Open:  &fleet.Alert{ID: alertID, RuleID: r.ID, DeviceID: "d1", StartedAt: clk.Now(), Value: point(20, 99)}}
			if err := db.CommitStream(ctx, "acme", "d1", "env", []fleet.DataPoint{*point(20, 99)}, []*fleet.AlertChange{ch}); err != nil {
				t.Fatal(err)
			}
			a, err := db.FindAlert(ctx, "acme", alertID)
			if err != nil {
				t.Fatal(err)
			}
			if a.State != fleet.AlertActive || a.RuleName != "hot" || a.Value == nil || a.Value.Data["temp"] != int64(99) {
				t.Fatalf("alert = %+v", a)
			}
			states, err := db.FindAlertStates(ctx)
			if err != nil || len(states) != 1 || states[0].AlertID != alertID || !states[0].SinceData.IsZero() {
				t.Fatalf("states = %+v, %v", states, err)
			}
			ds, n, err := db.FindDeliveries(ctx, "acme", fleet.DeliveryFilter{AlertID: alertID, Page: fleet.Page{Page: 1, Limit: 50}})
			if err != nil || n != 1 || ds[0].Event != fleet.EventOpened || ds[0].Status != fleet.DeliveryPending {
				t.Fatalf("deliveries = %+v, %d, %v", ds, n, err)
			}
		})
		t.Run("SecondOpenIsAdopted", func(t *testing.T) {
			other := uuid.NewString()
			ch := &fleet.AlertChange{Stream: "env",
				State: fleet.AlertState{Tenant: "acme", RuleID: r.ID, DeviceID: "d1", Phase: fleet.PhaseActive, SinceClock: clk.Now(), AlertID: other},
				Open:  &fleet.Alert{ID: other, RuleID: r.ID, DeviceID: "d1", StartedAt: clk.Now()}}
			if err := db.CommitStream(ctx, "acme", "d1", "env", nil, []*fleet.AlertChange{ch}); err != nil {
				t.Fatal(err)
			}
			if ch.Open.ID != alertID || ch.State.AlertID != alertID {
				t.Fatalf("adopted %s, want %s", ch.Open.ID, alertID)
			}
			_, n, _ := db.FindAlerts(ctx, "acme", fleet.AlertFilter{Page: fleet.Page{Page: 1, Limit: 50}})
			if n != 1 {
				t.Fatalf("%d alerts, want 1", n)
			}
		})
		t.Run("Close", func(t *testing.T) {
			clk.Add(time.Minute)
			ch := &fleet.AlertChange{Stream: "env",
				State: fleet.AlertState{Tenant: "acme", RuleID: r.ID, DeviceID: "d1", Phase: fleet.PhaseNormal},
				Close: &fleet.AlertClose{ID: alertID, EndedAt: clk.Now().Add(-time.Hour)}} // before it started: clamped
			if err := db.CommitStream(ctx, "acme", "d1", "env", nil, []*fleet.AlertChange{ch}); err != nil {
				t.Fatal(err)
			}
			a, _ := db.FindAlert(ctx, "acme", alertID)
			if a.State != fleet.AlertEnded || a.EndedAt == nil || a.EndedAt.Before(a.StartedAt) {
				t.Fatalf("closed alert = %+v", a)
			}
			states, _ := db.FindAlertStates(ctx)
			if len(states) != 0 {
				t.Fatalf("states after close = %+v", states)
			}
			ended, n, _ := db.FindAlerts(ctx, "acme", fleet.AlertFilter{State: fleet.AlertEnded, RuleID: r.ID, DeviceID: "d1", Page: fleet.Page{Page: 1, Limit: 50}})
			if n != 1 || ended[0].ID != alertID {
				t.Fatalf("ended alerts = %d", n)
			}
			_, n, _ = db.FindAlerts(ctx, "acme", fleet.AlertFilter{State: fleet.AlertActive, Page: fleet.Page{Page: 1, Limit: 50}})
			if n != 0 {
				t.Fatalf("%d active alerts, want 0", n)
			}
			_, n, _ = db.FindAlerts(ctx, "beta", fleet.AlertFilter{Page: fleet.Page{Page: 1, Limit: 50}})
			if n != 0 {
				t.Fatalf("beta sees %d alerts", n)
			}
			_, _, err := db.FindDeliveries(ctx, "beta", fleet.DeliveryFilter{AlertID: alertID, Page: fleet.Page{Page: 1, Limit: 50}})
			wantCode(t, err, fleet.ENOTFOUND)
			// A notification rule's deliveries: newest first, a page at a
			// time, only in its tenant and under its alert rule.
			byRule := fleet.DeliveryFilter{AlertRuleID: r.ID, NotificationRuleID: notification.ID, Page: fleet.Page{Page: 1, Limit: 1}}
			ds, count, err := db.FindDeliveries(ctx, "acme", byRule)
			if err != nil || count != 2 || len(ds) != 1 || ds[0].Event != fleet.EventClosed || ds[0].AlertID != alertID {
				t.Fatalf("the notification rule's first page = %+v, %d, %v", ds, count, err)
			}
			byRule.Page.Page = 2
			if ds, _, _ := db.FindDeliveries(ctx, "acme", byRule); len(ds) != 1 || ds[0].Event != fleet.EventOpened {
				t.Fatalf("the notification rule's second page = %+v", ds)
			}
			_, _, err = db.FindDeliveries(ctx, "beta", byRule)
			wantCode(t, err, fleet.ENOTFOUND)
			byRule.AlertRuleID = uuid.NewString()
			_, _, err = db.FindDeliveries(ctx, "acme", byRule)
			wantCode(t, err, fleet.ENOTFOUND)
		})
		t.Run("DeletedRuleChangesIgnored", func(t *testing.T) {
			r2 := mustAlertRule(t, db, "acme", "gone")
			wantCode(t, db.DeleteAlertRule(ctx, "acme", r2.ID), "")
			id := uuid.NewString()
			ch := &fleet.AlertChange{Stream: "env",
				State: fleet.AlertState{Tenant: "acme", RuleID: r2.ID, DeviceID: "d1", Phase: fleet.PhaseActive, SinceClock: clk.Now(), AlertID: id},
				Open:  &fleet.Alert{ID: id, RuleID: r2.ID, DeviceID: "d1", StartedAt: clk.Now()}}
			if err := db.CommitStream(ctx, "acme", "d1", "env", []fleet.DataPoint{*point(30, 1)}, []*fleet.AlertChange{ch}); err != nil {
				t.Fatal(err)
			}
		})
	})
}

func TestOutbox(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, clk := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustAlertDevices(t, db, "acme", "d1")
		r := mustAlertRule(t, db, "acme", "hot")
		hook := &fleet.NotificationRule{AlertRuleID: r.ID, Timezone: "UTC", IntervalSeconds: 60,
			ChannelParameters: fleet.ChannelParameters{Type: "webhook", URL: "http://127.0.0.1:1/x", Secret: "s3cret", Headers: map[string]string{"Authorization": "Bearer x", "X-Env": "prod"}}}
		if err := db.CreateNotificationRule(ctx, "acme", hook); err != nil {
			t.Fatal(err)
		}
		alertID := uuid.NewString()
		open := &fleet.AlertChange{Stream: "env",
			State: fleet.AlertState{Tenant: "acme", RuleID: r.ID, DeviceID: "d1", Phase: fleet.PhaseActive, SinceClock: clk.Now(), AlertID: alertID},
			Open:  &fleet.Alert{ID: alertID, RuleID: r.ID, DeviceID: "d1", StartedAt: clk.Now()}}
		if err := db.CommitStream(ctx, "acme", "d1", "env", nil, []*fleet.AlertChange{open}); err != nil {
			t.Fatal(err)
		}

		ds, err := db.ClaimDeliveries(ctx, "w1", time.Minute, 10)
		if err != nil || len(ds) != 1 {
			t.Fatalf("claim: %d, %v; want the opened notification", len(ds), err)
		}
		d := ds[0]
		if d.Event != fleet.EventOpened || d.Alert.ID != alertID || d.Rule.Name != "hot" || d.Notification.ChannelParameters.Secret != "s3cret" {
			t.Fatalf("claimed %+v", d)
		}
		t.Run("LeaseHeld", func(t *testing.T) {
			ds, err := db.ClaimDeliveries(ctx, "w2", time.Minute, 10)
			if err != nil || len(ds) != 0 {
				t.Fatalf("second claim: %d, %v", len(ds), err)
			}
			// A due notification that cannot be claimed is not due now, or
			// an idle replica spins on it, claiming nothing: next is the
			// reminder, a minute on.
			due, ok, err := db.NextDeliveryDue(ctx)
			if want := clk.Now().Add(time.Minute).Truncate(time.Millisecond); err != nil || !ok || !due.Equal(want) {
				t.Fatalf("next due %v %v %v while leased; want %v, the reminder", due, ok, err, want)
			}
		})
		t.Run("RetryLater", func(t *testing.T) {
			at := fleet.DeliveryAttempt{At: clk.Now(), StatusCode: 503, Error: "503 Service Unavailable", DurationMS: 3}
			if err := db.CompleteDelivery(ctx, d.ID, "w1", at, fleet.DeliveryPending, clk.Now().Add(10*time.Second)); err != nil {
				t.Fatal(err)
			}
			if ds, _ := db.ClaimDeliveries(ctx, "w2", time.Minute, 10); len(ds) != 0 {
				t.Fatal("claimed before its backoff ended")
			}
			due, ok, err := db.NextDeliveryDue(ctx)
			if err != nil || !ok || !due.Equal(clk.Now().Add(10*time.Second).Truncate(time.Millisecond)) {
				t.Fatalf("next due %v %v %v", due, ok, err)
			}
		})
		t.Run("LeaseExpiresToAnotherWorker", func(t *testing.T) {
			clk.Add(10 * time.Second)
			ds, _ := db.ClaimDeliveries(ctx, "w2", time.Minute, 10)
			if len(ds) != 1 || ds[0].AttemptCount != 1 {
				t.Fatalf("claimed %d after backoff", len(ds))
			}
			clk.Add(2 * time.Minute) // w2 died
			ds, _ = db.ClaimDeliveries(ctx, "w3", time.Minute, 10)
			// The opened notification again, and the first reminder (due a
			// minute after the opening).
			if len(ds) != 2 || ds[0].ID != d.ID || ds[1].Event != fleet.EventRepeat {
				t.Fatalf("claimed %d after the lease ran out", len(ds))
			}
			// w2 comes back late: its attempt is recorded, its verdict not.
			late := fleet.DeliveryAttempt{At: clk.Now(), Error: "timeout"}
			if err := db.CompleteDelivery(ctx, d.ID, "w2", late, fleet.DeliveryDead, clk.Now()); err != nil {
				t.Fatal(err)
			}
			ok := fleet.DeliveryAttempt{At: clk.Now(), StatusCode: 200, DurationMS: 1}
			if err := db.CompleteDelivery(ctx, d.ID, "w3", ok, fleet.DeliveryDelivered, clk.Now()); err != nil {
				t.Fatal(err)
			}
			ds, _, _ = db.FindDeliveries(ctx, "acme", fleet.DeliveryFilter{AlertID: alertID, Page: fleet.Page{Page: 1, Limit: 50}})
			var opened *fleet.Delivery
			for _, x := range ds {
				if x.Event == fleet.EventOpened {
					opened = x
				}
			}
			if opened.Status != fleet.DeliveryDelivered || len(opened.Attempts) != 3 || opened.Attempts[0].StatusCode != 503 || opened.DeliveredAt == nil {
				t.Fatalf("opened delivery = %+v", opened)
			}
		})
		t.Run("RemindersRepeatUntilClose", func(t *testing.T) {
			// Claiming the first reminder scheduled the next.
			all, n, _ := db.FindDeliveries(ctx, "acme", fleet.DeliveryFilter{AlertID: alertID, Page: fleet.Page{Page: 1, Limit: 50}})
			if n != 3 || all[2].Event != fleet.EventRepeat || all[2].Status != fleet.DeliveryPending {
				t.Fatalf("after the reminder: %d deliveries, want the next reminder scheduled", n)
			}
			cl := &fleet.AlertChange{Stream: "env", State: fleet.AlertState{Tenant: "acme", RuleID: r.ID, DeviceID: "d1"},
				Close: &fleet.AlertClose{ID: alertID, EndedAt: clk.Now()}}
			if err := db.CommitStream(ctx, "acme", "d1", "env", nil, []*fleet.AlertChange{cl}); err != nil {
				t.Fatal(err)
			}
			all, _, _ = db.FindDeliveries(ctx, "acme", fleet.DeliveryFilter{AlertID: alertID, Page: fleet.Page{Page: 1, Limit: 50}})
			if all[2].Status != fleet.DeliveryCancelled || all[3].Event != fleet.EventClosed {
				t.Fatalf("after close: %s %s", all[2].Status, all[3].Event)
			}
		})
		t.Run("UpdateKeepsSecretAndMaskedHeaders", func(t *testing.T) {
			interval := int64(0)
			n, err := db.UpdateNotificationRule(ctx, "acme", r.ID, hook.ID, fleet.NotificationRuleUpdate{
				ChannelParameters: &fleet.ChannelParameters{Type: "webhook", URL: "https://example.com/new", Headers: map[string]string{"Authorization": fleet.Masked}},
				IntervalSeconds:   &interval,
			})
			if err != nil {
				t.Fatal(err)
			}
			if n.ChannelParameters.Secret != "s3cret" || n.ChannelParameters.Headers["Authorization"] != "Bearer x" || n.IntervalSeconds != 0 {
				t.Fatalf("updated = %+v", n.ChannelParameters)
			}
			_, err = db.UpdateNotificationRule(ctx, "acme", uuid.NewString(), hook.ID, fleet.NotificationRuleUpdate{IntervalSeconds: &interval})
			wantCode(t, err, fleet.ENOTFOUND)
			_, err = db.UpdateNotificationRule(ctx, "beta", r.ID, hook.ID, fleet.NotificationRuleUpdate{IntervalSeconds: &interval})
			wantCode(t, err, fleet.ENOTFOUND)
		})
		t.Run("AuditHoldsNoSecret", func(t *testing.T) {
			logs, _, err := db.FindAuditLogs(ctx, "acme", fleet.AuditFilter{Page: fleet.Page{Page: 1, Limit: 100}})
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range logs {
				b, _ := json.Marshal(l)
				if strings.Contains(string(b), "s3cret") || strings.Contains(string(b), "Bearer x") {
					t.Fatalf("audit log %s shows a secret: %s", l.Action, b)
				}
			}
		})
		t.Run("NotificationRuleOfUnknownRule", func(t *testing.T) {
			err := db.CreateNotificationRule(ctx, "acme", &fleet.NotificationRule{AlertRuleID: uuid.NewString(), Timezone: "UTC",
				ChannelParameters: fleet.ChannelParameters{Type: "slack", URL: "https://hooks.example.com/x"}})
			wantCode(t, err, fleet.ENOTFOUND)
			_, _, err = db.FindNotificationRules(ctx, "beta", r.ID, fleet.Page{Page: 1, Limit: 50})
			wantCode(t, err, fleet.ENOTFOUND)
		})
		t.Run("DeleteRuleTakesEverything", func(t *testing.T) {
			wantCode(t, db.DeleteAlertRule(ctx, "acme", r.ID), "")
			if _, ok, _ := db.NextDeliveryDue(ctx); ok {
				t.Fatal("notifications left after the rule was deleted")
			}
			_, err := db.FindAlert(ctx, "acme", alertID)
			wantCode(t, err, fleet.ENOTFOUND)
		})
	})
}
