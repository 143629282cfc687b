-- A retry (POST /api/v1/actions/{id}/retry) is a new action dispatched to
-- the devices of an earlier one whose device actions ended in the statuses
-- asked for; this table says which action each retry retried. A table of
-- its own rather than a column of actions: a dispatch that is not a retry
-- writes nothing new, so older binaries, and the store on the schemas the
-- migration tests stop at, write actions as before.
CREATE TABLE action_retries (
    tenant    TEXT NOT NULL,
    action_id BIGINT NOT NULL,
    retry_of  BIGINT NOT NULL,
    PRIMARY KEY (tenant, action_id),
    FOREIGN KEY (tenant, action_id) REFERENCES actions (tenant, id) ON DELETE CASCADE
);
