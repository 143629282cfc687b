-- SQLite's search rows of migration 0019 (device_texts, its FTS5 index
-- device_search, device_metadata) are written by the store, in the
-- statements that write the devices (indexDevices, unindexDevice), rather
-- than by triggers: a trigger ran for each device, parsed its metadata
-- twice with json_each, and inserted into FTS5 one row at a time, which
-- flushed its pending terms at every statement. Provisioning 100,000
-- devices cost 4x the CPU it had cost before 0019 (BENCHMARKS.md,
-- 2026-11-26). The rows are the same; nothing is rewritten. A binary older
-- than this migration writes devices without their search rows: do not
-- run one on a database migrated to it.
{{sqlite}}DROP TRIGGER devices_search_insert;
{{sqlite}}DROP TRIGGER devices_search_update;
{{sqlite}}DROP TRIGGER devices_search_delete;
{{sqlite}}DROP TRIGGER device_texts_insert;
{{sqlite}}DROP TRIGGER device_texts_update;
{{sqlite}}DROP TRIGGER device_texts_delete;
