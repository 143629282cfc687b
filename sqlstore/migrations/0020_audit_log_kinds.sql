-- The audit log's action filter names an action ("apikey.create") or its
-- kind ("apikey": every action of it). Its kind, the action up to its first
-- dot, is a column the database computes, so that one index serves both
-- filters a page at a time, newest first, and counts them, whatever the
-- size of the log (FindAuditLogs; TestAuditLogPlans shows the plans).
-- On SQLite the column is virtual: only the index is written. On PostgreSQL
-- it is stored, so adding it rewrites audit_logs once, under its lock.
-- Older binaries, which name the columns they insert, work on as before.
{{sqlite}}ALTER TABLE audit_logs ADD COLUMN action_kind TEXT GENERATED ALWAYS AS (CASE WHEN instr(action, '.') > 0 THEN substr(action, 1, instr(action, '.') - 1) ELSE action END) VIRTUAL;
{{postgres}}ALTER TABLE audit_logs ADD COLUMN action_kind TEXT GENERATED ALWAYS AS (split_part(action, '.', 1)) STORED;
CREATE INDEX audit_logs_by_kind ON audit_logs (tenant, action_kind, created_at, id);
