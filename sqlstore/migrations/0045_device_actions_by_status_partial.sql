-- device_actions_by_status leaves out Queued device actions. A dispatch
-- inserts every one of its device actions Queued, and each was an entry of
-- this index too: on SQLite a descent of its B-tree from the root for each
-- row, a third of the CPU of a dispatch to a million devices and a sixth of
-- its WAL (docs/benchmarks-notebook.md, "The dispatch's third index"). The
-- reads of an action's Queued device actions (its delivery after the
-- dispatch, a cancel, a cancel_action's own rows, the console's Queued
-- list) read the action's rows through the primary key, in which they are
-- together; the counts of live device actions come from
-- device_action_counts. Every other read of one status of an action names
-- the predicate (notQueued in sqlstore) and reads this index as before; a
-- first report on a Queued device action now adds its entry instead of
-- moving it.
DROP INDEX device_actions_by_status;
CREATE INDEX device_actions_by_status ON device_actions (tenant, action_id, action_status, phase, initiated_at)
    WHERE action_status <> 'Queued';
