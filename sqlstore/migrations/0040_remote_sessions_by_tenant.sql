-- A tenant's remote sessions, newest first, for the console's list of every
-- session in the tenant (docs/console.md).
CREATE INDEX remote_sessions_by_tenant ON remote_sessions (tenant, started_at);
