-- Alerts (DESIGN §6): rules and their notification rules, the latest point
-- of every device stream, alert sessions, the per-rule, per-device
-- evaluation state that survives restarts, and the notification outbox with
-- each delivery attempt. Ids of rules, notification rules and alerts are
-- UUIDs, unique across tenants; every query still names the tenant.

CREATE TABLE alert_rules (
    id               TEXT PRIMARY KEY,
    tenant           TEXT NOT NULL REFERENCES tenants (name) ON DELETE CASCADE,
    name             TEXT NOT NULL,
    stream           TEXT NOT NULL,
    rule_group       TEXT NOT NULL,
    condition        TEXT NOT NULL,
    metadata_filters TEXT NOT NULL,
    activation_ms    BIGINT NOT NULL,
    deactivation_ms  BIGINT NOT NULL,
    created_at       BIGINT NOT NULL,
    UNIQUE (tenant, name)
);
CREATE INDEX alert_rules_by_time ON alert_rules (tenant, created_at, id);

-- channel holds the channel parameters as JSON, the webhook secret included:
-- signing needs it in the clear. Responses and audit logs never show it.
CREATE TABLE notification_rules (
    id               TEXT PRIMARY KEY,
    tenant           TEXT NOT NULL,
    alert_rule_id    TEXT NOT NULL REFERENCES alert_rules (id) ON DELETE CASCADE,
    channel          TEXT NOT NULL,
    interval_seconds BIGINT NOT NULL,
    subject          TEXT NOT NULL,
    body             TEXT NOT NULL,
    timezone         TEXT NOT NULL,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL
);
CREATE INDEX notification_rules_by_rule ON notification_rules (alert_rule_id, created_at, id);

CREATE TABLE stream_latest (
    tenant      TEXT NOT NULL,
    device_id   TEXT NOT NULL,
    stream      TEXT NOT NULL,
    ts          BIGINT NOT NULL,
    seq         BIGINT NOT NULL,
    data        TEXT NOT NULL,
    received_at BIGINT NOT NULL,
    PRIMARY KEY (tenant, device_id, stream),
    FOREIGN KEY (tenant, device_id) REFERENCES devices (tenant, id) ON DELETE CASCADE
);
CREATE INDEX stream_latest_by_stream ON stream_latest (tenant, stream);

CREATE TABLE alerts (
    id         TEXT PRIMARY KEY,
    tenant     TEXT NOT NULL,
    rule_id    TEXT NOT NULL REFERENCES alert_rules (id) ON DELETE CASCADE,
    device_id  TEXT NOT NULL,
    stream     TEXT NOT NULL,
    started_at BIGINT NOT NULL,
    ended_at   BIGINT,
    value      TEXT,
    FOREIGN KEY (tenant, device_id) REFERENCES devices (tenant, id) ON DELETE CASCADE
);
-- At most one open alert per rule and device, whatever replicas race.
CREATE UNIQUE INDEX alerts_one_open ON alerts (rule_id, device_id) WHERE ended_at IS NULL;
CREATE INDEX alerts_by_time ON alerts (tenant, started_at, id);
CREATE INDEX alerts_by_rule ON alerts (rule_id, started_at, id);
CREATE INDEX alerts_by_device ON alerts (tenant, device_id, started_at, id);

-- Only rules and devices away from the normal phase have a row.
CREATE TABLE alert_states (
    rule_id     TEXT NOT NULL REFERENCES alert_rules (id) ON DELETE CASCADE,
    device_id   TEXT NOT NULL,
    tenant      TEXT NOT NULL,
    phase       TEXT NOT NULL,
    since_data  BIGINT NOT NULL,
    since_clock BIGINT NOT NULL,
    alert_id    TEXT NOT NULL,
    PRIMARY KEY (rule_id, device_id),
    FOREIGN KEY (tenant, device_id) REFERENCES devices (tenant, id) ON DELETE CASCADE
);
CREATE INDEX alert_states_by_device ON alert_states (tenant, device_id);

-- One row per notification to send: written in the transaction that opens
-- or closes the alert, claimed by a worker under a lease, retried with
-- backoff until delivered or dead.
CREATE TABLE alert_outbox (
    id                   {{id}},
    tenant               TEXT NOT NULL,
    alert_id             TEXT NOT NULL REFERENCES alerts (id) ON DELETE CASCADE,
    notification_rule_id TEXT NOT NULL REFERENCES notification_rules (id) ON DELETE CASCADE,
    event                TEXT NOT NULL,
    status               TEXT NOT NULL,
    due_at               BIGINT NOT NULL,
    attempts             INTEGER NOT NULL,
    lease_owner          TEXT NOT NULL,
    lease_until          BIGINT NOT NULL,
    created_at           BIGINT NOT NULL,
    delivered_at         BIGINT
);
CREATE INDEX alert_outbox_due ON alert_outbox (due_at, id) WHERE status = 'pending';
CREATE INDEX alert_outbox_by_alert ON alert_outbox (alert_id, id);
CREATE INDEX alert_outbox_by_notification ON alert_outbox (notification_rule_id);

CREATE TABLE alert_delivery_attempts (
    id           {{id}},
    outbox_id    BIGINT NOT NULL REFERENCES alert_outbox (id) ON DELETE CASCADE,
    attempted_at BIGINT NOT NULL,
    status_code  INTEGER NOT NULL,
    error        TEXT NOT NULL,
    duration_ms  BIGINT NOT NULL
);
CREATE INDEX alert_delivery_attempts_by_outbox ON alert_delivery_attempts (outbox_id, id);
