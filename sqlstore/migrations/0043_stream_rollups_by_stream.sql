-- A fleet-wide aggregate (docs/telemetry.md) reads one stream's field of
-- every device of a tenant over a range of buckets: the rollups' primary
-- key starts with the device, so without this index it read every rollup
-- of the tenant in the range, of every stream and field. Updates of a
-- rollup's values leave the index alone (its columns are the key's); a new
-- bucket's row adds an entry.
--
-- On PostgreSQL each partition has it from its parent. On SQLite each
-- partition is a table of its own: the store makes the index with the
-- table (createPartition in sqlstore/history.go), and its maintenance,
-- which runs at start, on the partitions made before.
{{postgres}}CREATE INDEX stream_rollup_1m_by_stream ON stream_rollup_1m (tenant, stream, field, bucket);
{{postgres}}CREATE INDEX stream_rollup_1h_by_stream ON stream_rollup_1h (tenant, stream, field, bucket);
