-- The console's overview shows a tenant's latest failures, live: the newest
-- Failed device actions of any action, read from this small partial index
-- several times a second rather than from the rows of every action.
CREATE INDEX device_actions_failed_by_time ON device_actions (tenant, updated_at) WHERE action_status = 'Failed';
