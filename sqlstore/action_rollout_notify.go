package sqlstore

// Rollout notifications: the rules that subscribe a tenant's channels to
// its rollouts' changes of state, and their outbox. An event is written to
// the outbox in the transaction that makes the change, so a change is
// never committed without its notifications; RolloutOutbox is the outbox
// as a notify.Worker claims and completes it.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/fleetd/fleet"
	"github.com/google/uuid"
)

const rolloutRuleColumns = "id, channel, subject, body, timezone, events, created_at, updated_at"

func scanRolloutRule(s scanner) (*fleet.RolloutNotificationRule, error) {
	var n fleet.RolloutNotificationRule
	var ch, events string
	var created, updated int64
	if err := s.Scan(&n.ID, &ch, &n.NotificationTemplate.Subject, &n.NotificationTemplate.Body, &n.Timezone, &events, &created, &updated); err != nil {
		return nil, err
	}
	var err error
	if n.ChannelParameters, err = decodeChannel(ch); err != nil {
		return nil, fmt.Errorf("rollout notification rule %s channel: %w", n.ID, err)
	}
	if err := json.Unmarshal([]byte(events), &n.Events); err != nil {
		return nil, fmt.Errorf("rollout notification rule %s events: %w", n.ID, err)
	}
	n.CreatedAt, n.UpdatedAt = fromMillis(created), fromMillis(updated)
	return &n, nil
}

// rolloutRuleAudit is what the audit log says of a rule: never its secret.
func rolloutRuleAudit(n *fleet.RolloutNotificationRule) map[string]any {
	d := notificationAudit(&fleet.NotificationRule{ChannelParameters: n.ChannelParameters, Timezone: n.Timezone})
	d["events"] = n.Events
	return d
}

// CreateRolloutNotificationRule stores a rule and sets its id and times.
func (db *DB) CreateRolloutNotificationRule(ctx context.Context, tenant string, n *fleet.RolloutNotificationRule) error {
	id := uuid.NewString()
	return db.update(ctx, func(ctx context.Context, tx *Tx) error {
		now := tx.now.Truncate(time.Millisecond)
		events, _ := json.Marshal(n.Events)
		if _, err := tx.exec(ctx, `INSERT INTO rollout_notification_rules (id, tenant, channel, subject, body, timezone, events, created_at, updated_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`, id, tenant, encodeChannel(n.ChannelParameters), n.NotificationTemplate.Subject,
			n.NotificationTemplate.Body, n.Timezone, string(events), millis(now), millis(now)); err != nil {
			return err
		}
		n.ID, n.CreatedAt, n.UpdatedAt = id, now, now
		n.ChannelParameters.HasSecret = n.ChannelParameters.Secret != ""
		return tx.audit(ctx, tenant, "rollout_notification_rule.create", "rollout-notification-rules/"+id, rolloutRuleAudit(n))
	})
}

// FindRolloutNotificationRule reads one rule.
func (db *DB) FindRolloutNotificationRule(ctx context.Context, tenant, id string) (*fleet.RolloutNotificationRule, error) {
	n, err := scanRolloutRule(db.queryRow(ctx, "SELECT "+rolloutRuleColumns+" FROM rollout_notification_rules WHERE tenant = ? AND id = ?", tenant, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fleet.Errorf(fleet.ENOTFOUND, "rollout notification rule %s not found", id)
	}
	return n, db.classify(err)
}

// FindRolloutNotificationRules lists a tenant's rules, oldest first.
func (db *DB) FindRolloutNotificationRules(ctx context.Context, tenant string, p fleet.Page) ([]*fleet.RolloutNotificationRule, int, error) {
	return findPage(ctx, db, "SELECT count(*) FROM rollout_notification_rules WHERE tenant = ?",
		"SELECT "+rolloutRuleColumns+" FROM rollout_notification_rules WHERE tenant = ? ORDER BY created_at, id", []any{tenant}, p, scanRolloutRule)
}

// UpdateRolloutNotificationRule applies u to a rule.
func (db *DB) UpdateRolloutNotificationRule(ctx context.Context, tenant, id string, u fleet.RolloutNotificationRuleUpdate) (*fleet.RolloutNotificationRule, error) {
	var out *fleet.RolloutNotificationRule
	err := db.update(ctx, func(ctx context.Context, tx *Tx) error {
		n, err := scanRolloutRule(tx.queryRow(ctx, "SELECT "+rolloutRuleColumns+" FROM rollout_notification_rules WHERE tenant = ? AND id = ?", tenant, id))
		if errors.Is(err, sql.ErrNoRows) {
			return fleet.Errorf(fleet.ENOTFOUND, "rollout notification rule %s not found", id)
		} else if err != nil {
			return err
		}
		n.Apply(u)
		n.UpdatedAt = tx.now.Truncate(time.Millisecond)
		events, _ := json.Marshal(n.Events)
		if _, err := tx.exec(ctx, `UPDATE rollout_notification_rules SET channel = ?, subject = ?, body = ?, timezone = ?, events = ?, updated_at = ?
			WHERE tenant = ? AND id = ?`, encodeChannel(n.ChannelParameters), n.NotificationTemplate.Subject, n.NotificationTemplate.Body,
			n.Timezone, string(events), millis(n.UpdatedAt), tenant, id); err != nil {
			return err
		}
		out = n
		return tx.audit(ctx, tenant, "rollout_notification_rule.update", "rollout-notification-rules/"+id, rolloutRuleAudit(n))
	})
	return out, err
}

// DeleteRolloutNotificationRule removes a rule and its pending
// notifications.
func (db *DB) DeleteRolloutNotificationRule(ctx context.Context, tenant, id string) error {
	return db.update(ctx, func(ctx context.Context, tx *Tx) error {
		n, err := tx.execCount(ctx, "DELETE FROM rollout_notification_rules WHERE tenant = ? AND id = ?", tenant, id)
		if err != nil {
			return err
		}
		if n == 0 {
			return fleet.Errorf(fleet.ENOTFOUND, "rollout notification rule %s not found", id)
		}
		return tx.audit(ctx, tenant, "rollout_notification_rule.delete", "rollout-notification-rules/"+id, nil)
	})
}

// notifyRollout writes ev to the outbox of every rule of the tenant that
// wants it.
func (tx *Tx) notifyRollout(ctx context.Context, tenant string, ev *fleet.RolloutEvent) error {
	if ev == nil {
		return nil
	}
	rows, err := tx.query(ctx, "SELECT "+rolloutRuleColumns+" FROM rollout_notification_rules WHERE tenant = ?", tenant)
	if err != nil {
		return err
	}
	rules, err := scanAll(rows, scanRolloutRule)
	if err != nil {
		return err
	}
	payload, _ := json.Marshal(ev) // plain fields always encode
	now := millis(tx.now)
	for _, r := range rules {
		if !r.Wants(ev.Event) {
			continue
		}
		if _, err := tx.exec(ctx, `INSERT INTO rollout_outbox (tenant, rule_id, event, payload, status, due_at, attempts, lease_owner, lease_until,
			last_status, last_error, created_at) VALUES (?, ?, ?, ?, ?, ?, 0, '', 0, 0, '', ?)`,
			tenant, r.ID, "rollout."+ev.Event, string(payload), fleet.DeliveryPending, now, now); err != nil {
			return err
		}
	}
	return nil
}

// claimOutbox locks the outbox rows a claim reads, not the rules it joins,
// and skips those another replica is claiming.
func (d dialect) claimOutbox() string {
	if d == postgres {
		return " FOR UPDATE OF o SKIP LOCKED"
	}
	return ""
}

// RolloutOutbox is the rollout notifications' outbox as a notify.Worker
// sees it.
type RolloutOutbox struct{ db *DB }

// RolloutOutbox returns the outbox of rollout notifications.
func (db *DB) RolloutOutbox() *RolloutOutbox { return &RolloutOutbox{db} }

// ClaimDeliveries leases up to limit due notifications to owner.
func (o *RolloutOutbox) ClaimDeliveries(ctx context.Context, owner string, lease time.Duration, limit int) ([]*fleet.Delivery, error) {
	var out []*fleet.Delivery
	err := o.db.update(ctx, func(ctx context.Context, tx *Tx) error {
		out = out[:0]
		now := millis(tx.now)
		rows, err := tx.query(ctx, `SELECT o.id, o.tenant, o.rule_id, o.event, o.payload, o.due_at, o.attempts, o.created_at,
			r.channel, r.subject, r.body, r.timezone
			FROM rollout_outbox o JOIN rollout_notification_rules r ON r.id = o.rule_id
			WHERE o.status = ? AND o.due_at <= ? AND o.lease_until < ? ORDER BY o.due_at, o.id`+limitClause(limit)+tx.db.dialect.claimOutbox(),
			fleet.DeliveryPending, now, now)
		if err != nil {
			return err
		}
		ds, err := scanAll(rows, func(s scanner) (*fleet.Delivery, error) {
			d := &fleet.Delivery{Notification: &fleet.NotificationRule{}, Rollout: &fleet.RolloutEvent{}}
			var payload, ch string
			var due, created int64
			n := d.Notification
			if err := s.Scan(&d.ID, &d.Tenant, &d.NotificationRuleID, &d.Event, &payload, &due, &d.AttemptCount, &created,
				&ch, &n.NotificationTemplate.Subject, &n.NotificationTemplate.Body, &n.Timezone); err != nil {
				return nil, err
			}
			d.Status, d.DueAt, d.CreatedAt, n.ID = fleet.DeliveryPending, fromMillis(due), fromMillis(created), d.NotificationRuleID
			if err := json.Unmarshal([]byte(payload), d.Rollout); err != nil {
				return nil, fmt.Errorf("rollout notification %d: %w", d.ID, err)
			}
			var err error
			n.ChannelParameters, err = decodeChannel(ch)
			return d, err
		})
		if err != nil {
			return err
		}
		for _, d := range ds {
			if _, err := tx.exec(ctx, "UPDATE rollout_outbox SET lease_owner = ?, lease_until = ? WHERE id = ?", owner, now+lease.Milliseconds(), d.ID); err != nil {
				return err
			}
		}
		out = ds
		return nil
	})
	return out, err
}

// CompleteDelivery records an attempt of owner's claim: the notification
// is delivered, dead, or pending again at next.
func (o *RolloutOutbox) CompleteDelivery(ctx context.Context, id int64, owner string, at fleet.DeliveryAttempt, status string, next time.Time) error {
	return o.db.update(ctx, func(ctx context.Context, tx *Tx) error {
		var delivered any
		if status == fleet.DeliveryDelivered {
			delivered = millis(at.At)
		}
		_, err := tx.exec(ctx, `UPDATE rollout_outbox SET status = ?, due_at = ?, attempts = attempts + 1, lease_owner = '', lease_until = 0,
			last_status = ?, last_error = ?, delivered_at = ? WHERE id = ? AND lease_owner = ? AND status = ?`,
			status, millis(next), at.StatusCode, at.Error, delivered, id, owner, fleet.DeliveryPending)
		return err
	})
}

// NextDeliveryDue returns when the earliest pending notification is due,
// or false when none is pending.
func (o *RolloutOutbox) NextDeliveryDue(ctx context.Context) (time.Time, bool, error) {
	var due sql.NullInt64
	if err := o.db.queryRow(ctx, nextDueQuery("rollout_outbox"), fleet.DeliveryPending).Scan(&due); err != nil {
		return time.Time{}, false, o.db.classify(err)
	}
	return fromMillis(due.Int64), due.Valid, nil
}
