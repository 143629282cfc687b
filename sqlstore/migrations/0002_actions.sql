-- Actions and each device's record of one (DESIGN §4).

-- The last action id handed out in each tenant: action ids are small
-- integers counted per tenant, taken in the dispatch's own transaction.
CREATE TABLE action_counters (
    tenant  TEXT PRIMARY KEY REFERENCES tenants (name) ON DELETE CASCADE,
    last_id BIGINT NOT NULL
);

CREATE TABLE actions (
    tenant        TEXT NOT NULL REFERENCES tenants (name) ON DELETE CASCADE,
    id            BIGINT NOT NULL,
    action        TEXT NOT NULL,
    params        TEXT NOT NULL, -- JSON text, kept as written: devices receive it verbatim
    device_params TEXT,          -- what devices receive instead, for special actions
    search_type   TEXT NOT NULL,
    search_key    TEXT NOT NULL,
    search_query  TEXT NOT NULL,
    metadata      TEXT NOT NULL,
    timeout       BIGINT NOT NULL, -- seconds
    user_email    TEXT NOT NULL,
    user_name     TEXT NOT NULL,
    created_at    BIGINT NOT NULL,
    targeted      BIGINT NOT NULL,
    PRIMARY KEY (tenant, id)
);
CREATE INDEX actions_by_name ON actions (tenant, action, id);

-- One row per targeted device. type, user_email and user_name repeat the
-- action's so that S7 sorts without a join. deadline is initiated_at plus
-- the timeout while the row is not final, NULL otherwise, so the sweeper's
-- index holds only rows that can time out. last_ts and last_seq are the key
-- of the last status report applied.
CREATE TABLE device_actions (
    tenant          TEXT NOT NULL,
    action_id       BIGINT NOT NULL,
    device_id       TEXT NOT NULL,
    type            TEXT NOT NULL,
    status          TEXT NOT NULL,
    action_status   TEXT NOT NULL,
    progress        INTEGER NOT NULL,
    errors          {{json}} NOT NULL,
    error_count     INTEGER NOT NULL,
    user_email      TEXT NOT NULL,
    user_name       TEXT NOT NULL,
    serial_metadata {{json}} NOT NULL,
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL,
    initiated_at    BIGINT,
    deadline        BIGINT,
    last_ts         BIGINT,
    last_seq        BIGINT,
    PRIMARY KEY (tenant, action_id, device_id),
    FOREIGN KEY (tenant, device_id) REFERENCES devices (tenant, id) ON DELETE CASCADE
);
-- S7, redelivery on subscribe, and the cascade from devices.
CREATE INDEX device_actions_by_device ON device_actions (tenant, device_id, action_id);
-- Per-status counts of an action, read from the index alone.
CREATE INDEX device_actions_by_status ON device_actions (tenant, action_id, action_status);
-- The timeout sweeper.
CREATE INDEX device_actions_by_deadline ON device_actions (deadline) WHERE deadline IS NOT NULL;
