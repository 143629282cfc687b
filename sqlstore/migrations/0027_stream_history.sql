-- Stream history (docs/telemetry.md). Points are kept in chunks: the
-- points of one ingest call that fall in one UTC hour are one row, their
-- data a canonical JSON array compressed with DEFLATE, so that a batch of
-- 100 points costs one row. Rollups keep, per numeric field and minute or hour, the count,
-- min, max, sum and the last value.
--
-- Every table is partitioned by time and expires whole: chunks and
-- minute rollups by UTC day, hour rollups by UTC month. On PostgreSQL the
-- tables below are the parents of declarative range partitions, which the
-- store creates ahead and drops (sqlstore/history.go); on SQLite each
-- partition is a table of its own, named as the PostgreSQL partition is
-- (stream_points_20261128), made by the same code.
{{postgres}}CREATE TABLE stream_points (
{{postgres}}    tenant      TEXT NOT NULL,
{{postgres}}    device_id   TEXT NOT NULL,
{{postgres}}    stream      TEXT NOT NULL,
{{postgres}}    ts_min      BIGINT NOT NULL,
{{postgres}}    ts_max      BIGINT NOT NULL,
{{postgres}}    id          BIGINT NOT NULL,
{{postgres}}    n           INTEGER NOT NULL,
{{postgres}}    received_at BIGINT NOT NULL,
{{postgres}}    points      BYTEA NOT NULL,
{{postgres}}    PRIMARY KEY (tenant, device_id, stream, ts_min, id)
{{postgres}}) PARTITION BY RANGE (ts_min);
{{postgres}}CREATE TABLE stream_rollup_1m (
{{postgres}}    tenant    TEXT NOT NULL,
{{postgres}}    device_id TEXT NOT NULL,
{{postgres}}    stream    TEXT NOT NULL,
{{postgres}}    field     TEXT NOT NULL,
{{postgres}}    bucket    BIGINT NOT NULL,
{{postgres}}    n         BIGINT NOT NULL,
{{postgres}}    vmin      DOUBLE PRECISION NOT NULL,
{{postgres}}    vmax      DOUBLE PRECISION NOT NULL,
{{postgres}}    vsum      DOUBLE PRECISION NOT NULL,
{{postgres}}    vlast     DOUBLE PRECISION NOT NULL,
{{postgres}}    last_ts   BIGINT NOT NULL,
{{postgres}}    last_seq  BIGINT NOT NULL,
{{postgres}}    PRIMARY KEY (tenant, device_id, stream, field, bucket)
{{postgres}}) PARTITION BY RANGE (bucket);
{{postgres}}CREATE TABLE stream_rollup_1h (LIKE stream_rollup_1m INCLUDING ALL) PARTITION BY RANGE (bucket);

-- The rollups of chunks written and not yet added to stream_rollup_1m and
-- _1h: ingest appends here, and a background job claims rows in order,
-- merges them and adds them up, once for many chunks (sqlstore/rollup.go).
CREATE TABLE stream_rollup_queue (
    id        {{id}},
    tenant    TEXT NOT NULL,
    device_id TEXT NOT NULL,
    stream    TEXT NOT NULL,
    rollups   TEXT NOT NULL
);

-- A tenant's own retention of raw points, in milliseconds; NULL: the
-- server's --stream-retention.
ALTER TABLE tenants ADD COLUMN stream_retention_ms BIGINT;
