-- Tenants, their API keys, devices and the audit log. Times are epoch
-- milliseconds in both dialects; {{…}} placeholders are filled per dialect.

CREATE TABLE tenants (
    name       TEXT PRIMARY KEY,
    created_at BIGINT NOT NULL
);

CREATE TABLE api_keys (
    tenant     TEXT NOT NULL REFERENCES tenants (name) ON DELETE CASCADE,
    name       TEXT NOT NULL,
    role       TEXT NOT NULL,
    user_email TEXT NOT NULL DEFAULT '',
    key_hash   TEXT NOT NULL UNIQUE,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (tenant, name)
);

CREATE TABLE devices (
    tenant       TEXT NOT NULL REFERENCES tenants (name) ON DELETE CASCADE,
    id           TEXT NOT NULL,
    token_hash   TEXT NOT NULL,
    metadata     {{json}} NOT NULL,
    components   {{json}} NOT NULL,
    created_at   BIGINT NOT NULL,
    last_seen_at BIGINT,
    PRIMARY KEY (tenant, id)
);

CREATE TABLE audit_logs (
    id         {{id}},
    tenant     TEXT NOT NULL,
    actor      TEXT NOT NULL,
    role       TEXT NOT NULL,
    user_email TEXT NOT NULL,
    action     TEXT NOT NULL,
    target     TEXT NOT NULL,
    details    TEXT NOT NULL,
    request_id TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX audit_logs_by_time ON audit_logs (tenant, created_at, id);
CREATE INDEX audit_logs_by_actor ON audit_logs (tenant, actor, created_at, id);

-- Server-wide secrets (such as the key that signs download URLs), made on
-- first use and shared by every replica.
CREATE TABLE server_secrets (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
