-- An action's device actions counted per phase and status, so that the
-- console's overview, the actions lists and an action's page read a few
-- rows instead of a GROUP BY over every device action (BENCHMARKS.md, "The
-- console's pages (issue 19)"). Every statement that inserts, moves or
-- deletes device actions changes these counts in the same transaction
-- (counts.go): a transaction's changes are summed and written just before
-- it commits, one row per action, phase, status and slot. On PostgreSQL,
-- where several transactions commit at once, each writes the next of 16
-- slots in turn, so the reports on one action do not wait for each other's
-- commits on one row; a count is the sum of its slots. SQLite has one
-- writer and slot 0.
CREATE TABLE device_action_counts (
    tenant        TEXT NOT NULL,
    action_id     BIGINT NOT NULL,
    phase         INTEGER NOT NULL,
    action_status TEXT NOT NULL,
    slot          INTEGER NOT NULL,
    n             BIGINT NOT NULL,
    PRIMARY KEY (tenant, action_id, phase, action_status, slot)
);
INSERT INTO device_action_counts (tenant, action_id, phase, action_status, slot, n)
    SELECT tenant, action_id, phase, action_status, 0, count(*) FROM device_actions
    GROUP BY tenant, action_id, phase, action_status;
