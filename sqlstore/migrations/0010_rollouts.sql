-- Rollouts (docs/actions.md, "Rollouts"): actions dispatched with a
-- schedule, whose targets are partitioned into phases released one after
-- another.

-- The index of the phase that releases the device action; 0 for an action
-- without a schedule. Set at dispatch and never changed.
ALTER TABLE device_actions ADD COLUMN phase INTEGER NOT NULL DEFAULT 0;

-- Per-status counts of an action, now per phase too, from the index alone;
-- and a phase's device actions in one status (a release, a gate's counts).
-- phase never changes, so the index costs status reports nothing more.
DROP INDEX device_actions_by_status;
CREATE INDEX device_actions_by_status ON device_actions (tenant, action_id, action_status, phase);

-- One row per action with a schedule. schedule is the schedule as
-- dispatched, appended phases included (JSON); maintenance_window repeats
-- its window (JSON, NULL for none) for the device channel's reads.
-- triggered_at lists when each phase before next_phase triggered (JSON
-- array of epoch ms). waived_phase is the phase whose gate an operator
-- waived by resuming (-1: none); window_opened the last window occurrence
-- (yyyymmdd of its local start) whose released device actions were sent.
CREATE TABLE rollouts (
    tenant             TEXT NOT NULL,
    action_id          BIGINT NOT NULL,
    schedule           TEXT NOT NULL,
    maintenance_window TEXT,
    status             TEXT NOT NULL,
    next_phase         INTEGER NOT NULL,
    triggered_at       TEXT NOT NULL,
    pause_reason       TEXT NOT NULL,
    gate_paused        BOOLEAN NOT NULL,
    waived_phase       INTEGER NOT NULL,
    ended              BOOLEAN NOT NULL,
    window_opened      BIGINT NOT NULL,
    updated_at         BIGINT NOT NULL,
    PRIMARY KEY (tenant, action_id),
    FOREIGN KEY (tenant, action_id) REFERENCES actions (tenant, id) ON DELETE CASCADE
);
-- The rollout driver looks at the rollouts that may still change.
CREATE INDEX rollouts_active ON rollouts (status) WHERE status IN ('scheduled', 'running', 'paused');
