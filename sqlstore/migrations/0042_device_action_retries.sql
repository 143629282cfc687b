-- Which retry retried each device action (docs/actions.md, Retry): a
-- device action is retried once. The primary key is the claim: two retries
-- of one action at once, on two replicas, each insert the device actions
-- they would retry, and the one that comes second finds them taken (its
-- INSERT … ON CONFLICT DO NOTHING waits for the first to commit), so no
-- device is sent the action twice. Rows of device actions retried before
-- this table existed are not written: those may be retried once more.
CREATE TABLE device_action_retries (
    tenant     TEXT NOT NULL,
    action_id  BIGINT NOT NULL,
    device_id  TEXT NOT NULL,
    retried_by BIGINT NOT NULL,
    PRIMARY KEY (tenant, action_id, device_id),
    FOREIGN KEY (tenant, action_id) REFERENCES actions (tenant, id) ON DELETE CASCADE
);
