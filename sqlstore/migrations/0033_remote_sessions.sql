-- Remote sessions with devices through fleetd-agent (docs/agent.md): who,
-- which device, what kind, when, how many bytes each way and why it ended.
-- A row is written when a session opens and completed when it ends; the
-- bytes relayed never pass through the database.
CREATE TABLE remote_sessions (
    id                TEXT PRIMARY KEY,
    tenant            TEXT NOT NULL REFERENCES tenants (name) ON DELETE CASCADE,
    device_id         TEXT NOT NULL,
    kind              TEXT NOT NULL,
    target            TEXT NOT NULL DEFAULT '',
    key_name          TEXT NOT NULL DEFAULT '',
    user_name         TEXT NOT NULL,
    user_email        TEXT NOT NULL DEFAULT '',
    started_at        BIGINT NOT NULL,
    ended_at          BIGINT,
    bytes_to_device   BIGINT NOT NULL DEFAULT 0,
    bytes_from_device BIGINT NOT NULL DEFAULT 0,
    end_reason        TEXT NOT NULL DEFAULT ''
);
CREATE INDEX remote_sessions_by_device ON remote_sessions (tenant, device_id, started_at);
