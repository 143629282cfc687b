-- A status report on a device action in flight (Progress to Progress, the
-- usual report) changes its status, updated_at and, with errors, its
-- error_count. Three of S7's sort indexes (0009) and the recent failures'
-- index (0016) held those columns, and PostgreSQL updates a row in place
-- (a heap-only tuple, HOT: no new index entries) only when no column of any
-- index changes, partial indexes' predicates or not: every report added an
-- entry to each of device_actions' eleven indexes.
--
-- Those indexes hold final device actions only, whose sort keys never
-- change, so they now hold columns that are the row's status, updated_at
-- and error_count when it is final and NULL while it is not: computed by
-- the database from the row (generated columns), they change once, when the
-- device action becomes final, and reports in flight change no indexed
-- column. S7's final part and the recent failures read them; the store
-- writes none of them. The CASE is the indexes' predicate.
--
-- PostgreSQL needs room on the row's page too: a dispatch fills its pages
-- (fillfactor 100), and a new version that does not fit goes to another
-- page with new index entries. With fillfactor 90 a page keeps a tenth free
-- for the next versions of its rows, and the versions a report left dead
-- are pruned when the page is next read. The ALTER below rewrites the table
-- with it (and computes the new columns); the indexes that held the old
-- columns are dropped before, so that the rewrite does not rebuild them.
--
-- The reports' other write, each reporting device's last_seen_at once a
-- second (TouchDevices), changes no indexed column of devices either, but
-- provisioning fills devices' pages as a dispatch does, and a version moved
-- to another page adds entries to its three indexes, among them the
-- trigram index of the device's search text (0019). Pages written from now
-- on keep a tenth free; the rows already there are not rewritten here (it
-- would lock devices while it ran).
{{postgres}}ALTER TABLE devices SET (fillfactor = 90);
--
-- PostgreSQL 15 stores generated columns; SQLite adds only virtual ones to
-- a table (computed when read, and kept in the indexes that hold them).
DROP INDEX device_actions_final_by_status;
DROP INDEX device_actions_final_by_updated_at;
DROP INDEX device_actions_final_by_errors;
DROP INDEX device_actions_failed_by_time;
{{postgres}}ALTER TABLE device_actions SET (fillfactor = 90),
{{postgres}}    ADD COLUMN final_status TEXT GENERATED ALWAYS AS (CASE WHEN action_status < 'Initiated' THEN status END) STORED,
{{postgres}}    ADD COLUMN final_updated_at BIGINT GENERATED ALWAYS AS (CASE WHEN action_status < 'Initiated' THEN updated_at END) STORED,
{{postgres}}    ADD COLUMN final_error_count INTEGER GENERATED ALWAYS AS (CASE WHEN action_status < 'Initiated' THEN error_count END) STORED;
{{sqlite}}ALTER TABLE device_actions ADD COLUMN final_status TEXT
{{sqlite}}    GENERATED ALWAYS AS (CASE WHEN action_status < 'Initiated' THEN status END) VIRTUAL;
{{sqlite}}ALTER TABLE device_actions ADD COLUMN final_updated_at BIGINT
{{sqlite}}    GENERATED ALWAYS AS (CASE WHEN action_status < 'Initiated' THEN updated_at END) VIRTUAL;
{{sqlite}}ALTER TABLE device_actions ADD COLUMN final_error_count INTEGER
{{sqlite}}    GENERATED ALWAYS AS (CASE WHEN action_status < 'Initiated' THEN error_count END) VIRTUAL;
CREATE INDEX device_actions_final_by_status ON device_actions (tenant, device_id, final_status, action_id)
    WHERE action_status < 'Initiated';
CREATE INDEX device_actions_final_by_updated_at ON device_actions (tenant, device_id, final_updated_at, action_id)
    WHERE action_status < 'Initiated';
CREATE INDEX device_actions_final_by_errors ON device_actions (tenant, device_id, final_error_count, action_id)
    WHERE action_status < 'Initiated';
CREATE INDEX device_actions_failed_by_time ON device_actions (tenant, final_updated_at) WHERE action_status = 'Failed';
