-- SQLite's search rows of migration 0019 (device_texts, its FTS5 index
-- device_search, device_metadata) are written by the store, in the
-- transaction that writes the devices (indexDevices, unindexDevice), rather
-- than by triggers, which ran for each device and parsed its metadata twice
-- with json_each; FTS5 was written a row at a time and flushed its pending
-- terms at every statement. Provisioning cost 2.5-4x the CPU it had cost
-- before 0019, and about 1.7x with the store writing the rows (BENCHMARKS.md,
-- "Provisioning and the search rows"). The rows are the same; nothing is
-- rewritten. A binary older than this migration writes devices without
-- their search rows: do not run one on a database migrated to it.
{{sqlite}}DROP TRIGGER devices_search_insert;
{{sqlite}}DROP TRIGGER devices_search_update;
{{sqlite}}DROP TRIGGER devices_search_delete;
{{sqlite}}DROP TRIGGER device_texts_insert;
{{sqlite}}DROP TRIGGER device_texts_update;
{{sqlite}}DROP TRIGGER device_texts_delete;
