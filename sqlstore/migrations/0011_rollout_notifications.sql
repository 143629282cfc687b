-- Rollout notifications (docs/actions.md, "Rollouts"): a tenant's rules
-- that send its rollouts' changes of state to a channel, and their outbox,
-- written in the transaction of the change and delivered by a notifier
-- like the alerts' (claimed under a lease, retried with backoff).

-- channel holds the channel parameters as JSON, the webhook secret included,
-- as notification_rules does; events is a JSON array of event kinds.
CREATE TABLE rollout_notification_rules (
    id         TEXT PRIMARY KEY,
    tenant     TEXT NOT NULL REFERENCES tenants (name) ON DELETE CASCADE,
    channel    TEXT NOT NULL,
    subject    TEXT NOT NULL,
    body       TEXT NOT NULL,
    timezone   TEXT NOT NULL,
    events     TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
CREATE INDEX rollout_notification_rules_by_time ON rollout_notification_rules (tenant, created_at, id);

-- One row per notification: the event (JSON) for one rule. last_error and
-- last_status are the last attempt's, for operators.
CREATE TABLE rollout_outbox (
    id           {{id}},
    tenant       TEXT NOT NULL,
    rule_id      TEXT NOT NULL REFERENCES rollout_notification_rules (id) ON DELETE CASCADE,
    event        TEXT NOT NULL,
    payload      TEXT NOT NULL,
    status       TEXT NOT NULL,
    due_at       BIGINT NOT NULL,
    attempts     INTEGER NOT NULL,
    lease_owner  TEXT NOT NULL,
    lease_until  BIGINT NOT NULL,
    last_status  INTEGER NOT NULL,
    last_error   TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    delivered_at BIGINT
);
CREATE INDEX rollout_outbox_due ON rollout_outbox (due_at, id) WHERE status = 'pending';
CREATE INDEX rollout_outbox_by_rule ON rollout_outbox (rule_id);
