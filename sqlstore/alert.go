package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fleetd/fleet"
	"github.com/google/uuid"
)

// CreateAlertRule stores a rule; r.ID and r.CreatedAt are filled in. The
// caller has compiled it.
func (db *DB) CreateAlertRule(ctx context.Context, tenant string, r *fleet.AlertRule) error {
	cond, filters, mf, err := encodeRule(r)
	if err != nil {
		return err
	}
	id := uuid.NewString()
	return db.update(ctx, func(ctx context.Context, tx *Tx) error {
		created := tx.now.Truncate(time.Millisecond)
		if err := tx.checkDeviceGroup(ctx, tenant, r.DeviceGroup); err != nil {
			return err
		}
		_, err := tx.exec(ctx, `INSERT INTO alert_rules (id, tenant, name, stream, rule_group, device_group, condition, metadata_filters,
			activation_ms, deactivation_ms, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			id, tenant, r.Name, r.Stream, r.Group, r.DeviceGroup, string(cond), string(mf),
			r.ActivationThreshold().Milliseconds(), r.DeactivationThreshold().Milliseconds(), millis(created))
		if isUniqueViolation(err) {
			return fleet.Errorf(fleet.ECONFLICT, "an alert rule named %q exists already", r.Name)
		} else if isForeignKeyViolation(err) {
			return fleet.Errorf(fleet.ENOTFOUND, "tenant %q does not exist", tenant)
		} else if err != nil {
			return err
		}
		r.Tenant, r.ID, r.CreatedAt, r.MetadataFilters = tenant, id, created, filters
		if err := tx.changed(ctx, fleet.Change{Kind: fleet.ChangeAlertRule, Tenant: tenant, Key: id}); err != nil {
			return err
		}
		return tx.audit(ctx, tenant, "alert_rule.create", "alert-rules/"+id, ruleAudit(r))
	})
}

// checkDeviceGroup refuses a rule's device group that the tenant does not
// have; "" is none.
func (tx *Tx) checkDeviceGroup(ctx context.Context, tenant, group string) error {
	if group == "" {
		return nil
	}
	_, err := groupSelector(ctx, tx, tenant, group)
	if fleet.ErrorCode(err) == fleet.ENOTFOUND {
		return fleet.FieldErrors(map[string]string{"device_group": fmt.Sprintf("no group is named %q", group)})
	}
	return err
}

// encodeRule returns the stored forms of r's condition and metadata filters,
// and the filters themselves (an empty map for none).
func encodeRule(r *fleet.AlertRule) (cond []byte, filters map[string]any, mf []byte, err error) {
	if cond, err = fleet.MarshalCanonical(r.Condition); err != nil {
		return nil, nil, nil, fleet.Errorf(fleet.EINVALID, "the condition cannot be stored: %v", err)
	}
	if filters = r.MetadataFilters; filters == nil {
		filters = map[string]any{}
	}
	if mf, err = fleet.MarshalCanonical(filters); err != nil {
		return nil, nil, nil, fleet.Errorf(fleet.EINVALID, "the metadata filters cannot be stored: %v", err)
	}
	return cond, filters, mf, nil
}

// UpdateAlertRule replaces the fields of rule id with r's; r.ID, r.Tenant
// and r.CreatedAt are filled in. The caller has compiled it. Its stream
// cannot change: the rule's alerts and evaluation state are of its stream.
func (db *DB) UpdateAlertRule(ctx context.Context, tenant, id string, r *fleet.AlertRule) error {
	cond, filters, mf, err := encodeRule(r)
	if err != nil {
		return err
	}
	return db.update(ctx, func(ctx context.Context, tx *Tx) error {
		var stream string
		var created int64
		err := tx.queryRow(ctx, "SELECT stream, created_at FROM alert_rules WHERE tenant = ? AND id = ?", tenant, id).Scan(&stream, &created)
		if errors.Is(err, sql.ErrNoRows) {
			return fleet.Errorf(fleet.ENOTFOUND, "alert rule %s not found", id)
		} else if err != nil {
			return err
		}
		if stream != r.Stream {
			return fleet.FieldErrors(map[string]string{"stream": fmt.Sprintf("cannot change: this rule watches %q; create a new rule for another stream", stream)})
		}
		if err := tx.checkDeviceGroup(ctx, tenant, r.DeviceGroup); err != nil {
			return err
		}
		_, err = tx.exec(ctx, `UPDATE alert_rules SET name = ?, rule_group = ?, device_group = ?, condition = ?, metadata_filters = ?, activation_ms = ?,
			deactivation_ms = ? WHERE tenant = ? AND id = ?`, r.Name, r.Group, r.DeviceGroup, string(cond), string(mf),
			r.ActivationThreshold().Milliseconds(), r.DeactivationThreshold().Milliseconds(), tenant, id)
		if isUniqueViolation(err) {
			return fleet.Errorf(fleet.ECONFLICT, "an alert rule named %q exists already", r.Name)
		} else if err != nil {
			return err
		}
		r.Tenant, r.ID, r.CreatedAt, r.MetadataFilters = tenant, id, fromMillis(created), filters
		if err := tx.changed(ctx, fleet.Change{Kind: fleet.ChangeAlertRule, Tenant: tenant, Key: id}); err != nil {
			return err
		}
		return tx.audit(ctx, tenant, "alert_rule.update", "alert-rules/"+id, ruleAudit(r))
	})
}

// ruleAudit is what the audit log says of a rule.
func ruleAudit(r *fleet.AlertRule) map[string]any {
	return map[string]any{
		"name": r.Name, "stream": r.Stream, "group": r.Group, "device_group": r.DeviceGroup, "condition": r.Condition, "metadata_filters": r.MetadataFilters,
		"activation_threshold_seconds": r.ActivationThresholdSeconds, "deactivation_threshold_seconds": r.DeactivationThresholdSeconds,
	}
}

const ruleColumns = "r.tenant, r.id, r.name, r.stream, r.rule_group, r.device_group, r.condition, r.metadata_filters, r.activation_ms, r.deactivation_ms, r.created_at"

func scanRule(s scanner) (*fleet.AlertRule, error) {
	var r fleet.AlertRule
	var cond, mf string
	var act, deact, created int64
	if err := s.Scan(&r.Tenant, &r.ID, &r.Name, &r.Stream, &r.Group, &r.DeviceGroup, &cond, &mf, &act, &deact, &created); err != nil {
		return nil, err
	}
	var err error
	if r.Condition, err = decodeCanonical(cond); err != nil {
		return nil, fmt.Errorf("alert rule %s condition: %w", r.ID, err)
	}
	filters, err := decodeCanonical(mf)
	if err != nil {
		return nil, fmt.Errorf("alert rule %s metadata filters: %w", r.ID, err)
	}
	r.MetadataFilters, _ = filters.(map[string]any)
	r.ActivationThresholdSeconds = float64(act) / 1000
	r.DeactivationThresholdSeconds = float64(deact) / 1000
	r.CreatedAt = fromMillis(created)
	return &r, nil
}

// FindAlertRule returns one rule of the tenant, not compiled.
func (db *DB) FindAlertRule(ctx context.Context, tenant, id string) (*fleet.AlertRule, error) {
	r, err := scanRule(db.queryRow(ctx, "SELECT "+ruleColumns+" FROM alert_rules r WHERE r.tenant = ? AND r.id = ?", tenant, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fleet.Errorf(fleet.ENOTFOUND, "alert rule %s not found", id)
	}
	return r, db.classify(err)
}

// FindAlertRules lists a tenant's rules, oldest first.
func (db *DB) FindAlertRules(ctx context.Context, tenant string, p fleet.Page) ([]*fleet.AlertRule, int, error) {
	return findPage(ctx, db, "SELECT count(*) FROM alert_rules WHERE tenant = ?",
		"SELECT "+ruleColumns+" FROM alert_rules r WHERE r.tenant = ? ORDER BY r.created_at, r.id", []any{tenant}, p, scanRule)
}

// FindAllAlertRules returns every rule of every tenant, for the evaluation
// engine to compile and index.
func (db *DB) FindAllAlertRules(ctx context.Context) ([]*fleet.AlertRule, error) {
	return db.findRules(ctx, "SELECT "+ruleColumns+" FROM alert_rules r ORDER BY r.tenant, r.created_at, r.id")
}

func (db *DB) findRules(ctx context.Context, q string, args ...any) ([]*fleet.AlertRule, error) {
	rows, err := db.query(ctx, q, args...)
	if err != nil {
		return nil, db.classify(err)
	}
	return scanAll(rows, scanRule)
}

// DeleteAlertRule removes a rule; its notification rules, alerts, states and
// outbox go with it.
func (db *DB) DeleteAlertRule(ctx context.Context, tenant, id string) error {
	return db.update(ctx, func(ctx context.Context, tx *Tx) error {
		res, err := tx.exec(ctx, "DELETE FROM alert_rules WHERE tenant = ? AND id = ?", tenant, id)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return fleet.Errorf(fleet.ENOTFOUND, "alert rule %s not found", id)
		}
		if err := tx.changed(ctx, fleet.Change{Kind: fleet.ChangeAlertRule, Tenant: tenant, Key: id}); err != nil {
			return err
		}
		return tx.audit(ctx, tenant, "alert_rule.delete", "alert-rules/"+id, nil)
	})
}

// storedChannel is how channel parameters are kept: the secret included.
type storedChannel struct {
	Type    string            `json:"type"`
	URL     string            `json:"url,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
	Secret  string            `json:"secret,omitempty"`
	To      []string          `json:"to,omitempty"`
}

func encodeChannel(c fleet.ChannelParameters) string {
	b, _ := json.Marshal(storedChannel{c.Type, c.URL, c.Headers, c.Secret, c.To}) // strings only: always encodes
	return string(b)
}

func decodeChannel(s string) (fleet.ChannelParameters, error) {
	var sc storedChannel
	if err := json.Unmarshal([]byte(s), &sc); err != nil {
		return fleet.ChannelParameters{}, err
	}
	return fleet.ChannelParameters{Type: sc.Type, URL: sc.URL, Headers: sc.Headers, Secret: sc.Secret, HasSecret: sc.Secret != "", To: sc.To}, nil
}

// notificationAudit is what the audit log says of a notification rule:
// never the secret, header values or a URL's credentials.
func notificationAudit(n *fleet.NotificationRule) map[string]any {
	red := n.ChannelParameters.Redacted()
	ch := map[string]any{"type": red.Type, "has_secret": red.HasSecret}
	if red.URL != "" {
		ch["url"] = red.URL
	}
	if len(red.Headers) > 0 {
		names := make([]string, 0, len(red.Headers))
		for k := range red.Headers {
			names = append(names, k)
		}
		ch["headers"] = names
	}
	if len(red.To) > 0 {
		ch["to"] = red.To
	}
	return map[string]any{"alert_rule_id": n.AlertRuleID, "channel_parameters": ch, "interval_seconds": n.IntervalSeconds,
		"notification_template": n.NotificationTemplate, "timezone": n.Timezone}
}

// CreateNotificationRule stores a notification rule of an alert rule of the
// tenant; n.ID and the times are filled in. Alerts of the rule open now get
// their reminders when IntervalSeconds is set.
func (db *DB) CreateNotificationRule(ctx context.Context, tenant string, n *fleet.NotificationRule) error {
	id := uuid.NewString()
	return db.update(ctx, func(ctx context.Context, tx *Tx) error {
		if err := tx.alertRuleExists(ctx, tenant, n.AlertRuleID); err != nil {
			return err
		}
		now := tx.now.Truncate(time.Millisecond)
		_, err := tx.exec(ctx, `INSERT INTO notification_rules (id, tenant, alert_rule_id, channel, interval_seconds, subject, body, timezone, created_at, updated_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			id, tenant, n.AlertRuleID, encodeChannel(n.ChannelParameters), n.IntervalSeconds,
			n.NotificationTemplate.Subject, n.NotificationTemplate.Body, n.Timezone, millis(now), millis(now))
		if err != nil {
			return err
		}
		n.ID, n.CreatedAt, n.UpdatedAt = id, now, now
		n.ChannelParameters.HasSecret = n.ChannelParameters.Secret != ""
		if n.IntervalSeconds > 0 {
			if err := tx.startReminders(ctx, tenant, id, n.AlertRuleID, n.IntervalSeconds); err != nil {
				return err
			}
		}
		return tx.audit(ctx, tenant, "notification_rule.create", "alert-rules/"+n.AlertRuleID+"/alert-notification-rules/"+id, notificationAudit(n))
	})
}

func (tx *Tx) alertRuleExists(ctx context.Context, tenant, id string) error {
	var one int
	err := tx.queryRow(ctx, "SELECT 1 FROM alert_rules WHERE tenant = ? AND id = ?", tenant, id).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return fleet.Errorf(fleet.ENOTFOUND, "alert rule %s not found", id)
	}
	return err
}

// startReminders schedules the first reminder of every open alert of rule
// for notification rule nid.
func (tx *Tx) startReminders(ctx context.Context, tenant, nid, ruleID string, interval int64) error {
	now := millis(tx.now)
	_, err := tx.exec(ctx, `INSERT INTO alert_outbox (tenant, alert_id, notification_rule_id, event, status, due_at, attempts, lease_owner, lease_until, created_at)
		SELECT ?, a.id, ?, ?, ?, ?, 0, '', 0, ? FROM alerts a WHERE a.rule_id = ? AND a.tenant = ? AND a.ended_at IS NULL`,
		tenant, nid, fleet.EventRepeat, fleet.DeliveryPending, now+interval*1000, now, ruleID, tenant)
	return err
}

const notificationColumns = "n.id, n.alert_rule_id, n.channel, n.interval_seconds, n.subject, n.body, n.timezone, n.created_at, n.updated_at"

func scanNotification(s scanner) (*fleet.NotificationRule, error) {
	var n fleet.NotificationRule
	var ch string
	var created, updated int64
	if err := s.Scan(&n.ID, &n.AlertRuleID, &ch, &n.IntervalSeconds, &n.NotificationTemplate.Subject, &n.NotificationTemplate.Body,
		&n.Timezone, &created, &updated); err != nil {
		return nil, err
	}
	var err error
	if n.ChannelParameters, err = decodeChannel(ch); err != nil {
		return nil, fmt.Errorf("notification rule %s channel: %w", n.ID, err)
	}
	n.CreatedAt, n.UpdatedAt = fromMillis(created), fromMillis(updated)
	return &n, nil
}

// UpdateNotificationRule applies a partial update to notification rule id of
// alert rule ruleID. A reminder interval that appears starts reminders for
// open alerts; one that goes to 0 cancels those pending.
func (db *DB) UpdateNotificationRule(ctx context.Context, tenant, ruleID, id string, u fleet.NotificationRuleUpdate) (*fleet.NotificationRule, error) {
	var out *fleet.NotificationRule
	err := db.update(ctx, func(ctx context.Context, tx *Tx) error {
		n, err := scanNotification(tx.queryRow(ctx, "SELECT "+notificationColumns+" FROM notification_rules n WHERE n.tenant = ? AND n.alert_rule_id = ? AND n.id = ?",
			tenant, ruleID, id))
		if errors.Is(err, sql.ErrNoRows) {
			return fleet.Errorf(fleet.ENOTFOUND, "alert rule %s has no notification rule %s", ruleID, id)
		} else if err != nil {
			return err
		}
		before := n.IntervalSeconds
		n.Apply(u)
		n.UpdatedAt = tx.now.Truncate(time.Millisecond)
		if _, err := tx.exec(ctx, `UPDATE notification_rules SET channel = ?, interval_seconds = ?, subject = ?, body = ?, timezone = ?, updated_at = ?
			WHERE tenant = ? AND id = ?`, encodeChannel(n.ChannelParameters), n.IntervalSeconds, n.NotificationTemplate.Subject,
			n.NotificationTemplate.Body, n.Timezone, millis(n.UpdatedAt), tenant, id); err != nil {
			return err
		}
		switch {
		case before == 0 && n.IntervalSeconds > 0:
			if err := tx.startReminders(ctx, tenant, id, ruleID, n.IntervalSeconds); err != nil {
				return err
			}
		case before > 0 && n.IntervalSeconds == 0:
			if _, err := tx.exec(ctx, "UPDATE alert_outbox SET status = ? WHERE notification_rule_id = ? AND event = ? AND status = ? AND lease_until < ?",
				fleet.DeliveryCancelled, id, fleet.EventRepeat, fleet.DeliveryPending, millis(tx.now)); err != nil {
				return err
			}
		}
		details := notificationAudit(n)
		details["fields"] = updatedFields(u)
		out = n
		return tx.audit(ctx, tenant, "notification_rule.update", "alert-rules/"+ruleID+"/alert-notification-rules/"+id, details)
	})
	return out, err
}

func updatedFields(u fleet.NotificationRuleUpdate) []string {
	var f []string
	if u.ChannelParameters != nil {
		f = append(f, "channel_parameters")
	}
	if u.IntervalSeconds != nil {
		f = append(f, "interval_seconds")
	}
	if u.NotificationTemplate != nil {
		f = append(f, "notification_template")
	}
	if u.Timezone != nil {
		f = append(f, "timezone")
	}
	return f
}

// FindNotificationRules lists the notification rules of an alert rule,
// oldest first, secrets included: callers redact.
func (db *DB) FindNotificationRules(ctx context.Context, tenant, ruleID string, p fleet.Page) ([]*fleet.NotificationRule, int, error) {
	if _, err := db.FindAlertRule(ctx, tenant, ruleID); err != nil {
		return nil, 0, err
	}
	return findPage(ctx, db, "SELECT count(*) FROM notification_rules WHERE tenant = ? AND alert_rule_id = ?",
		"SELECT "+notificationColumns+" FROM notification_rules n WHERE n.tenant = ? AND n.alert_rule_id = ? ORDER BY n.created_at, n.id",
		[]any{tenant, ruleID}, p, scanNotification)
}

// DeleteNotificationRule removes a notification rule and its pending
// notifications.
func (db *DB) DeleteNotificationRule(ctx context.Context, tenant, ruleID, id string) error {
	return db.update(ctx, func(ctx context.Context, tx *Tx) error {
		res, err := tx.exec(ctx, "DELETE FROM notification_rules WHERE tenant = ? AND alert_rule_id = ? AND id = ?", tenant, ruleID, id)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return fleet.Errorf(fleet.ENOTFOUND, "alert rule %s has no notification rule %s", ruleID, id)
		}
		return tx.audit(ctx, tenant, "notification_rule.delete", "alert-rules/"+ruleID+"/alert-notification-rules/"+id, nil)
	})
}

const alertColumns = "a.id, a.rule_id, r.name, a.device_id, a.stream, a.started_at, a.ended_at, a.value"

func scanAlert(s scanner) (*fleet.Alert, error) {
	var a fleet.Alert
	var started int64
	var ended sql.NullInt64
	var value sql.NullString
	if err := s.Scan(&a.ID, &a.RuleID, &a.RuleName, &a.DeviceID, &a.Stream, &started, &ended, &value); err != nil {
		return nil, err
	}
	a.StartedAt = fromMillis(started)
	a.State = fleet.AlertActive
	if ended.Valid {
		t := fromMillis(ended.Int64)
		a.EndedAt, a.State = &t, fleet.AlertEnded
	}
	var err error
	if a.Value, err = decodePoint(value); err != nil {
		return nil, fmt.Errorf("alert %s value: %w", a.ID, err)
	}
	return &a, nil
}

// FindAlerts lists a tenant's alerts, newest first.
func (db *DB) FindAlerts(ctx context.Context, tenant string, f fleet.AlertFilter) ([]*fleet.Alert, int, error) {
	where := []string{"a.tenant = ?"}
	args := []any{tenant}
	switch f.State {
	case fleet.AlertActive:
		where = append(where, "a.ended_at IS NULL")
	case fleet.AlertEnded:
		where = append(where, "a.ended_at IS NOT NULL")
	}
	if f.RuleID != "" {
		where = append(where, "a.rule_id = ?")
		args = append(args, f.RuleID)
	}
	if f.DeviceID != "" {
		where = append(where, "a.device_id = ?")
		args = append(args, f.DeviceID)
	}
	cond := strings.Join(where, " AND ")
	return findPage(ctx, db, "SELECT count(*) FROM alerts a WHERE "+cond,
		"SELECT "+alertColumns+" FROM alerts a JOIN alert_rules r ON r.id = a.rule_id WHERE "+cond+" ORDER BY a.started_at DESC, a.id DESC",
		args, f.Page, scanAlert)
}

// FindAlert returns one alert of the tenant.
func (db *DB) FindAlert(ctx context.Context, tenant, id string) (*fleet.Alert, error) {
	a, err := scanAlert(db.queryRow(ctx, "SELECT "+alertColumns+" FROM alerts a JOIN alert_rules r ON r.id = a.rule_id WHERE a.tenant = ? AND a.id = ?", tenant, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fleet.Errorf(fleet.ENOTFOUND, "alert %s not found", id)
	}
	return a, db.classify(err)
}

// FindAlertStates returns every persisted evaluation state, of every
// tenant, for the engine to resume after a restart.
func (db *DB) FindAlertStates(ctx context.Context) ([]*fleet.AlertState, error) {
	rows, err := db.query(ctx, "SELECT tenant, rule_id, device_id, phase, since_data, since_clock, alert_id FROM alert_states ORDER BY tenant, rule_id, device_id")
	if err != nil {
		return nil, db.classify(err)
	}
	defer rows.Close()
	var states []*fleet.AlertState
	for rows.Next() {
		var s fleet.AlertState
		var sinceData, sinceClock int64
		if err := rows.Scan(&s.Tenant, &s.RuleID, &s.DeviceID, &s.Phase, &sinceData, &sinceClock, &s.AlertID); err != nil {
			return nil, err
		}
		if sinceData >= 0 {
			s.SinceData = fromMillis(sinceData)
		}
		s.SinceClock = fromMillis(sinceClock)
		states = append(states, &s)
	}
	return states, rows.Err()
}

// enqueueOpened writes the notifications of an alert that opened: one per
// notification rule, and the first reminder of those with an interval.
func (tx *Tx) enqueueOpened(ctx context.Context, tenant, alertID, ruleID string) error {
	now := millis(tx.now)
	if _, err := tx.exec(ctx, `INSERT INTO alert_outbox (tenant, alert_id, notification_rule_id, event, status, due_at, attempts, lease_owner, lease_until, created_at)
		SELECT ?, ?, n.id, ?, ?, ?, 0, '', 0, ? FROM notification_rules n WHERE n.alert_rule_id = ?`,
		tenant, alertID, fleet.EventOpened, fleet.DeliveryPending, now, now, ruleID); err != nil {
		return err
	}
	_, err := tx.exec(ctx, `INSERT INTO alert_outbox (tenant, alert_id, notification_rule_id, event, status, due_at, attempts, lease_owner, lease_until, created_at)
		SELECT ?, ?, n.id, ?, ?, ? + n.interval_seconds * 1000, 0, '', 0, ? FROM notification_rules n WHERE n.alert_rule_id = ? AND n.interval_seconds > 0`,
		tenant, alertID, fleet.EventRepeat, fleet.DeliveryPending, now, now, ruleID)
	return err
}

// enqueueClosed writes the notifications of an alert that closed and
// cancels its pending reminders.
func (tx *Tx) enqueueClosed(ctx context.Context, tenant, alertID, ruleID string) error {
	now := millis(tx.now)
	if _, err := tx.exec(ctx, "UPDATE alert_outbox SET status = ? WHERE alert_id = ? AND event = ? AND status = ?",
		fleet.DeliveryCancelled, alertID, fleet.EventRepeat, fleet.DeliveryPending); err != nil {
		return err
	}
	_, err := tx.exec(ctx, `INSERT INTO alert_outbox (tenant, alert_id, notification_rule_id, event, status, due_at, attempts, lease_owner, lease_until, created_at)
		SELECT ?, ?, n.id, ?, ?, ?, 0, '', 0, ? FROM notification_rules n WHERE n.alert_rule_id = ?`,
		tenant, alertID, fleet.EventClosed, fleet.DeliveryPending, now, now, ruleID)
	return err
}

// ClaimDeliveries leases up to limit notifications that are due to owner
// for lease, and returns them with their alert, rule and notification rule.
// Another replica's lease is respected until it runs out, so a replica that
// dies mid-delivery leaves its work to the others. Claiming a reminder
// schedules the next one.
func (db *DB) ClaimDeliveries(ctx context.Context, owner string, lease time.Duration, limit int) ([]*fleet.Delivery, error) {
	var out []*fleet.Delivery
	err := db.update(ctx, func(ctx context.Context, tx *Tx) error {
		out = out[:0]
		now := millis(tx.now)
		rows, err := tx.query(ctx, `SELECT id FROM alert_outbox WHERE status = ? AND due_at <= ? AND lease_until < ?
			ORDER BY due_at, id`+limitClause(limit)+claimLock(db.dialect), fleet.DeliveryPending, now, now)
		if err != nil {
			return err
		}
		var ids []int64
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return err
			}
			ids = append(ids, id)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for _, id := range ids {
			d, err := tx.loadDelivery(ctx, id)
			if err != nil {
				return err
			}
			if d.Event == fleet.EventRepeat {
				if d.Alert.EndedAt != nil || d.Notification.IntervalSeconds <= 0 {
					if _, err := tx.exec(ctx, "UPDATE alert_outbox SET status = ? WHERE id = ?", fleet.DeliveryCancelled, id); err != nil {
						return err
					}
					continue
				}
				step := d.Notification.IntervalSeconds * 1000
				next := millis(d.DueAt) + step
				if next <= now {
					next = now + step
				}
				if _, err := tx.exec(ctx, `INSERT INTO alert_outbox (tenant, alert_id, notification_rule_id, event, status, due_at, attempts, lease_owner, lease_until, created_at)
					VALUES (?, ?, ?, ?, ?, ?, 0, '', 0, ?)`, d.Tenant, d.AlertID, d.NotificationRuleID, fleet.EventRepeat, fleet.DeliveryPending, next, now); err != nil {
					return err
				}
			}
			if _, err := tx.exec(ctx, "UPDATE alert_outbox SET lease_owner = ?, lease_until = ? WHERE id = ?", owner, now+lease.Milliseconds(), id); err != nil {
				return err
			}
			out = append(out, d)
		}
		return nil
	})
	return out, err
}

func (tx *Tx) loadDelivery(ctx context.Context, id int64) (*fleet.Delivery, error) {
	d := &fleet.Delivery{ID: id}
	var due, created int64
	var ended sql.NullInt64
	var value sql.NullString
	var started int64
	var ch string
	var cond, mf string
	var act, deact, ruleCreated, nCreated, nUpdated int64
	a := &fleet.Alert{}
	r := &fleet.AlertRule{}
	n := &fleet.NotificationRule{}
	err := tx.queryRow(ctx, `SELECT o.tenant, o.alert_id, o.notification_rule_id, o.event, o.status, o.due_at, o.attempts, o.created_at,
			a.rule_id, a.device_id, a.stream, a.started_at, a.ended_at, a.value,
			r.name, r.stream, r.rule_group, r.condition, r.metadata_filters, r.activation_ms, r.deactivation_ms, r.created_at,
			n.channel, n.interval_seconds, n.subject, n.body, n.timezone, n.created_at, n.updated_at
		FROM alert_outbox o JOIN alerts a ON a.id = o.alert_id JOIN alert_rules r ON r.id = a.rule_id
			JOIN notification_rules n ON n.id = o.notification_rule_id
		WHERE o.id = ?`, id).Scan(
		&d.Tenant, &d.AlertID, &d.NotificationRuleID, &d.Event, &d.Status, &due, &d.AttemptCount, &created,
		&a.RuleID, &a.DeviceID, &a.Stream, &started, &ended, &value,
		&r.Name, &r.Stream, &r.Group, &cond, &mf, &act, &deact, &ruleCreated,
		&ch, &n.IntervalSeconds, &n.NotificationTemplate.Subject, &n.NotificationTemplate.Body, &n.Timezone, &nCreated, &nUpdated)
	if err != nil {
		return nil, err
	}
	d.DueAt, d.CreatedAt = fromMillis(due), fromMillis(created)
	a.ID, a.RuleName, a.StartedAt, a.State = d.AlertID, r.Name, fromMillis(started), fleet.AlertActive
	if ended.Valid {
		t := fromMillis(ended.Int64)
		a.EndedAt, a.State = &t, fleet.AlertEnded
	}
	if a.Value, err = decodePoint(value); err != nil {
		return nil, err
	}
	r.Tenant, r.ID = d.Tenant, a.RuleID
	if r.Condition, err = decodeCanonical(cond); err != nil {
		return nil, err
	}
	filters, err := decodeCanonical(mf)
	if err != nil {
		return nil, err
	}
	r.MetadataFilters, _ = filters.(map[string]any)
	r.ActivationThresholdSeconds, r.DeactivationThresholdSeconds = float64(act)/1000, float64(deact)/1000
	r.CreatedAt = fromMillis(ruleCreated)
	n.ID, n.AlertRuleID = d.NotificationRuleID, a.RuleID
	if n.ChannelParameters, err = decodeChannel(ch); err != nil {
		return nil, err
	}
	n.CreatedAt, n.UpdatedAt = fromMillis(nCreated), fromMillis(nUpdated)
	d.Alert, d.Rule, d.Notification = a, r, n
	return d, nil
}

// CompleteDelivery records an attempt at a claimed notification and what
// follows it: status delivered or dead, or pending again at next. An owner
// whose lease another replica has taken over records the attempt only.
func (db *DB) CompleteDelivery(ctx context.Context, id int64, owner string, at fleet.DeliveryAttempt, status string, next time.Time) error {
	return db.update(ctx, func(ctx context.Context, tx *Tx) error {
		if _, err := tx.exec(ctx, "INSERT INTO alert_delivery_attempts (outbox_id, attempted_at, status_code, error, duration_ms) VALUES (?, ?, ?, ?, ?)",
			id, millis(at.At), at.StatusCode, at.Error, at.DurationMS); err != nil {
			if isForeignKeyViolation(err) {
				return nil // deleted with its rule meanwhile
			}
			return err
		}
		var delivered any
		if status == fleet.DeliveryDelivered {
			delivered = millis(at.At)
		}
		_, err := tx.exec(ctx, `UPDATE alert_outbox SET status = ?, due_at = ?, attempts = attempts + 1, lease_owner = '', lease_until = 0, delivered_at = ?
			WHERE id = ? AND lease_owner = ? AND status = ?`, status, millis(next), delivered, id, owner, fleet.DeliveryPending)
		return err
	})
}

// NextDeliveryDue returns when the earliest pending notification can be
// claimed, or false when none is pending: the worker sleeps until then.
func (db *DB) NextDeliveryDue(ctx context.Context) (time.Time, bool, error) {
	var due sql.NullInt64
	if err := db.queryRow(ctx, nextDueQuery("alert_outbox"), fleet.DeliveryPending).Scan(&due); err != nil {
		return time.Time{}, false, db.classify(err)
	}
	return fromMillis(due.Int64), due.Valid, nil
}

// nextDueQuery is when the earliest pending notification of an outbox can
// be claimed: when it is due, or when its lease runs out if that is later.
// Without the lease a worker would see a notification another is
// delivering as due now, claim nothing, and look again at once, for as
// long as that delivery takes.
func nextDueQuery(table string) string {
	return "SELECT min(CASE WHEN lease_until >= due_at THEN lease_until + 1 ELSE due_at END) FROM " + table + " WHERE status = ?"
}

// FindNotificationRule reads one notification rule of an alert rule of
// the tenant, secret included: callers redact.
func (db *DB) FindNotificationRule(ctx context.Context, tenant, ruleID, id string) (*fleet.NotificationRule, error) {
	n, err := scanNotification(db.queryRow(ctx, "SELECT "+notificationColumns+" FROM notification_rules n WHERE n.tenant = ? AND n.alert_rule_id = ? AND n.id = ?",
		tenant, ruleID, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fleet.Errorf(fleet.ENOTFOUND, "alert rule %s has no notification rule %s", ruleID, id)
	}
	return n, db.classify(err)
}

// FindDeliveries lists the notifications f selects, a page at a time, each
// with its attempts (read for that page only) and its alert's device.
func (db *DB) FindDeliveries(ctx context.Context, tenant string, f fleet.DeliveryFilter) ([]*fleet.Delivery, int, error) {
	var where, order string
	var args []any
	if f.AlertID != "" {
		if _, err := db.FindAlert(ctx, tenant, f.AlertID); err != nil {
			return nil, 0, err
		}
		where, order, args = "o.tenant = ? AND o.alert_id = ?", "o.id", []any{tenant, f.AlertID}
	} else {
		if _, err := db.FindNotificationRule(ctx, tenant, f.AlertRuleID, f.NotificationRuleID); err != nil {
			return nil, 0, err
		}
		where, order, args = "o.tenant = ? AND o.notification_rule_id = ?", "o.id DESC", []any{tenant, f.NotificationRuleID}
	}
	ds, count, err := findPage(ctx, db, "SELECT count(*) FROM alert_outbox o WHERE "+where,
		`SELECT o.id, o.alert_id, a.device_id, o.notification_rule_id, o.event, o.status, o.due_at, o.created_at, o.delivered_at
		FROM alert_outbox o JOIN alerts a ON a.id = o.alert_id WHERE `+where+" ORDER BY "+order,
		args, f.Page, func(s scanner) (*fleet.Delivery, error) {
			d := &fleet.Delivery{Attempts: []fleet.DeliveryAttempt{}, Alert: &fleet.Alert{}}
			var due, created int64
			var delivered sql.NullInt64
			if err := s.Scan(&d.ID, &d.AlertID, &d.Alert.DeviceID, &d.NotificationRuleID, &d.Event, &d.Status, &due, &created, &delivered); err != nil {
				return nil, err
			}
			d.Alert.ID = d.AlertID
			d.DueAt, d.CreatedAt = fromMillis(due), fromMillis(created)
			if delivered.Valid {
				t := fromMillis(delivered.Int64)
				d.DeliveredAt = &t
			}
			return d, nil
		})
	if err != nil || len(ds) == 0 {
		return ds, count, err
	}
	byID := make(map[int64]*fleet.Delivery, len(ds))
	ids := make([]any, 0, len(ds)+1)
	ids = append(ids, tenant)
	for _, d := range ds {
		byID[d.ID] = d
		ids = append(ids, d.ID)
	}
	rows, err := db.query(ctx, `SELECT t.outbox_id, t.attempted_at, t.status_code, t.error, t.duration_ms FROM alert_delivery_attempts t
		JOIN alert_outbox o ON o.id = t.outbox_id WHERE o.tenant = ? AND t.outbox_id IN (?`+strings.Repeat(", ?", len(ds)-1)+`) ORDER BY t.id`, ids...)
	if err != nil {
		return nil, 0, db.classify(err)
	}
	defer rows.Close()
	for rows.Next() {
		var oid, at int64
		var a fleet.DeliveryAttempt
		if err := rows.Scan(&oid, &at, &a.StatusCode, &a.Error, &a.DurationMS); err != nil {
			return nil, 0, err
		}
		a.At = fromMillis(at)
		if d, ok := byID[oid]; ok {
			d.Attempts = append(d.Attempts, a)
		}
	}
	return ds, count, rows.Err()
}

// claimLock ends the SELECT that claims outbox rows: on PostgreSQL rows
// another replica is claiming are skipped rather than waited for; SQLite's
// single writer makes the claim safe as it is.
func claimLock(d dialect) string {
	if d == postgres {
		return " FOR UPDATE SKIP LOCKED"
	}
	return ""
}
