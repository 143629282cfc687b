-- The web console's sessions (docs/console.md): a session is valid while
-- its row exists, so ending one is deleting it. The cookie carries a token;
-- the row keeps only its SHA-256. Every console request reads its row by
-- the primary key.
CREATE TABLE console_sessions (
    id         TEXT PRIMARY KEY,
    tenant     TEXT NOT NULL REFERENCES tenants (name) ON DELETE CASCADE,
    key_name   TEXT NOT NULL DEFAULT '',
    user_name  TEXT NOT NULL,
    user_email TEXT NOT NULL DEFAULT '',
    role       TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
CREATE INDEX console_sessions_by_tenant ON console_sessions (tenant, created_at);
