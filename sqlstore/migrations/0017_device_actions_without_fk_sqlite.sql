-- SQLite too loses device_actions' foreign key to devices: checking it is a
-- lookup of the device for every inserted row, a quarter of the CPU of a
-- dispatch's INSERT … SELECT (BENCHMARKS.md, "Dispatch and S7 on a busy
-- machine"). The store keeps the rule on both databases as on PostgreSQL
-- since migration 0014: deleting a device deletes its device actions in the
-- same transaction, and SQLite's one writer runs a dispatch and a deletion
-- one after the other. SQLite cannot drop a constraint, so the table is
-- rebuilt with its rows and indexes: this migration reads and writes every
-- device action once.
{{sqlite}}CREATE TABLE device_actions_new (
{{sqlite}}    tenant          TEXT NOT NULL,
{{sqlite}}    action_id       BIGINT NOT NULL,
{{sqlite}}    device_id       TEXT NOT NULL,
{{sqlite}}    type            TEXT NOT NULL,
{{sqlite}}    status          TEXT NOT NULL,
{{sqlite}}    action_status   TEXT NOT NULL,
{{sqlite}}    progress        INTEGER NOT NULL,
{{sqlite}}    errors          TEXT NOT NULL,
{{sqlite}}    error_count     INTEGER NOT NULL,
{{sqlite}}    user_email      TEXT NOT NULL,
{{sqlite}}    user_name       TEXT NOT NULL,
{{sqlite}}    serial_metadata TEXT NOT NULL,
{{sqlite}}    created_at      BIGINT NOT NULL,
{{sqlite}}    updated_at      BIGINT NOT NULL,
{{sqlite}}    initiated_at    BIGINT,
{{sqlite}}    deadline        BIGINT,
{{sqlite}}    last_ts         BIGINT,
{{sqlite}}    last_seq        BIGINT,
{{sqlite}}    phase           INTEGER NOT NULL DEFAULT 0,
{{sqlite}}    PRIMARY KEY (tenant, action_id, device_id)
{{sqlite}});
{{sqlite}}INSERT INTO device_actions_new SELECT tenant, action_id, device_id, type, status, action_status, progress, errors, error_count,
{{sqlite}}    user_email, user_name, serial_metadata, created_at, updated_at, initiated_at, deadline, last_ts, last_seq, phase FROM device_actions;
{{sqlite}}DROP TABLE device_actions;
{{sqlite}}ALTER TABLE device_actions_new RENAME TO device_actions;
{{sqlite}}CREATE INDEX device_actions_by_device ON device_actions (tenant, device_id, action_status, action_id);
{{sqlite}}CREATE INDEX device_actions_by_status ON device_actions (tenant, action_id, action_status, phase);
{{sqlite}}CREATE INDEX device_actions_by_deadline ON device_actions (deadline) WHERE deadline IS NOT NULL;
{{sqlite}}CREATE INDEX device_actions_final_by_id ON device_actions (tenant, device_id, action_id)
{{sqlite}}    WHERE action_status < 'Initiated';
{{sqlite}}CREATE INDEX device_actions_final_by_type ON device_actions (tenant, device_id, type, action_id)
{{sqlite}}    WHERE action_status < 'Initiated';
{{sqlite}}CREATE INDEX device_actions_final_by_status ON device_actions (tenant, device_id, status, action_id)
{{sqlite}}    WHERE action_status < 'Initiated';
{{sqlite}}CREATE INDEX device_actions_final_by_user_email ON device_actions (tenant, device_id, user_email, action_id)
{{sqlite}}    WHERE action_status < 'Initiated';
{{sqlite}}CREATE INDEX device_actions_final_by_user_name ON device_actions (tenant, device_id, user_name, action_id)
{{sqlite}}    WHERE action_status < 'Initiated';
{{sqlite}}CREATE INDEX device_actions_final_by_updated_at ON device_actions (tenant, device_id, updated_at, action_id)
{{sqlite}}    WHERE action_status < 'Initiated';
{{sqlite}}CREATE INDEX device_actions_final_by_errors ON device_actions (tenant, device_id, error_count, action_id)
{{sqlite}}    WHERE action_status < 'Initiated';
{{sqlite}}CREATE INDEX device_actions_failed_by_time ON device_actions (tenant, updated_at) WHERE action_status = 'Failed';
