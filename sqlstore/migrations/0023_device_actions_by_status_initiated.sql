-- A device action's first report (Queued to Progress, or Initiated to
-- Progress) moves its device_actions_by_status entry from one status's
-- range of the action to another's. Within a range the entries followed
-- the row's position in the table (SQLite's rowid, PostgreSQL's heap
-- tuple), so reports on random devices of a large action inserted each
-- entry on a random page of the new range: on SQLite 0.7 of the 4.3 WAL
-- frames a first report wrote (BENCHMARKS.md, "SQLite's random reports").
--
-- initiated_at is set, to the time of the write, by the write that first
-- sends a device action to its device or applies a report on it (either
-- moves it out of Queued), and never changes after: after phase, it orders
-- each range of the index by the time its entries arrived, so that the
-- entries a batch moves land together at the end of their range, on the
-- page the last batch wrote. Every read of the index names a prefix of (tenant, action_id,
-- action_status, phase) and reads it as before; no report in flight
-- changes initiated_at, so on PostgreSQL they stay heap-only (0022).
DROP INDEX device_actions_by_status;
CREATE INDEX device_actions_by_status ON device_actions (tenant, action_id, action_status, phase, initiated_at);
