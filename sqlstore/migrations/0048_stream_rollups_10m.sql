-- 10-minute rollups (docs/telemetry.md): a chart of a day in 10-minute
-- buckets read 1440 minute rollups of each field, which took most of a
-- console chart page's time on PostgreSQL; it reads 144 of these. The
-- rollup job adds them from the minute rollups it adds (sqlstore/rollup.go),
-- partitioned by UTC day as the minute rollups are, and kept 180 days.
{{postgres}}CREATE TABLE stream_rollup_10m (LIKE stream_rollup_1m INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY RANGE (bucket);
{{postgres}}ALTER TABLE stream_rollup_10m ADD PRIMARY KEY (tenant, device_id, stream, field, bucket);
{{postgres}}CREATE INDEX stream_rollup_10m_by_stream ON stream_rollup_10m (tenant, stream, field, bucket);

-- The rollups of 10 minutes are whole from this bucket on: those of
-- points rolled up before this migration are not in them. A point is
-- kept no more than a day ahead of the clock (fleet.FutureHorizon), so a
-- bucket that starts over a day from now holds only points rolled up
-- after it; a database without rollups yet has them whole from the start.
-- Reads of earlier buckets read the minute rollups (sqlstore/history_read.go).
CREATE TABLE stream_rollups_10m_from (bucket BIGINT NOT NULL);
{{postgres}}INSERT INTO stream_rollups_10m_from SELECT CASE WHEN EXISTS (SELECT 1 FROM stream_rollup_1m)
{{postgres}}    THEN (CAST(extract(epoch FROM now()) * 1000 AS BIGINT) + 86400000) / 600000 * 600000 + 600000 ELSE 0 END;
{{sqlite}}INSERT INTO stream_rollups_10m_from SELECT CASE WHEN EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name LIKE 'stream\_rollup\_1m\_%' ESCAPE '\')
{{sqlite}}    THEN (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) + 86400000) / 600000 * 600000 + 600000 ELSE 0 END;
