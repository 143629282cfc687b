-- Remote sessions' caps are counted over every replica in this table
-- (docs/agent.md, Caps): its open sessions, by device and by person.
CREATE INDEX remote_sessions_open_by_device ON remote_sessions (tenant, device_id) WHERE ended_at IS NULL;
CREATE INDEX remote_sessions_open_by_person ON remote_sessions (tenant, user_name, key_name) WHERE ended_at IS NULL;
-- A tenant's choice to record its shell sessions' output (docs/agent.md,
-- Recording); a session records whether it was, and the size of its
-- recording in the blob store once stored (NULL: none).
ALTER TABLE tenants ADD COLUMN remote_recording BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE remote_sessions ADD COLUMN recorded BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE remote_sessions ADD COLUMN recording_size BIGINT;
