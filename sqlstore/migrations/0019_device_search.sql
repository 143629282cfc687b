-- Device search, the metadata filter and the devices count served by
-- indexes rather than by reading every device of the tenant (issue 19;
-- docs/operations.md, "Device search"). Search keeps its meaning: the
-- device id or a metadata value contains the term, ignoring case. The
-- indexes below serve terms of three characters or more; shorter terms
-- read the tenant's devices as before.

-- How many devices each tenant has, written by the store in the
-- transactions that create and delete devices.
CREATE TABLE device_counts (
    tenant  TEXT PRIMARY KEY REFERENCES tenants (name) ON DELETE CASCADE,
    devices BIGINT NOT NULL
);
INSERT INTO device_counts (tenant, devices) SELECT tenant, count(*) FROM devices GROUP BY tenant;

-- PostgreSQL: a trigram index over each device's id and the JSON array of
-- its metadata values, lowercased, kept in a generated column (the index
-- is lossy: each candidate's text is read again, and computing it costs
-- more than reading it), which LIKE '%term%' reads for terms without the
-- characters JSON escapes. pg_trgm is a trusted extension (PostgreSQL 13
-- and later): a role that may create objects in the database may create
-- it; otherwise this migration fails and a superuser must run CREATE
-- EXTENSION pg_trgm once. Where it exists already, in whatever schema, it
-- is used from there.
{{postgres}}CREATE EXTENSION IF NOT EXISTS pg_trgm;
{{postgres}}ALTER TABLE devices ADD COLUMN search_text TEXT GENERATED ALWAYS AS (lower(id || E'\n' || jsonb_path_query_array(metadata, '$.*')::text)) STORED;
{{postgres}}DO $$ BEGIN
{{postgres}}    EXECUTE format('CREATE INDEX devices_text ON devices USING GIN (search_text %I.gin_trgm_ops)',
{{postgres}}        (SELECT nspname FROM pg_extension JOIN pg_namespace ON pg_namespace.oid = extnamespace WHERE extname = 'pg_trgm'));
{{postgres}}END $$;
-- and the metadata filter, metadata @> {"key": "value"}, reads this one.
{{postgres}}CREATE INDEX devices_metadata ON devices USING GIN (metadata jsonb_path_ops);

-- SQLite: each device's id and metadata values, one a line, in
-- device_texts (a rowid of its own: VACUUM may renumber the devices
-- table's), indexed by an FTS5 trigram index, and the metadata's keys and
-- values as rows. Triggers keep them in step with the devices table in the
-- same transaction.
{{sqlite}}CREATE TABLE device_texts (
{{sqlite}}    row    INTEGER PRIMARY KEY,
{{sqlite}}    tenant TEXT NOT NULL,
{{sqlite}}    id     TEXT NOT NULL,
{{sqlite}}    text   TEXT NOT NULL,
{{sqlite}}    UNIQUE (tenant, id)
{{sqlite}});
{{sqlite}}CREATE VIRTUAL TABLE device_search USING fts5 (text, tokenize = 'trigram', content = 'device_texts', content_rowid = 'row');
{{sqlite}}CREATE TRIGGER device_texts_insert AFTER INSERT ON device_texts BEGIN
{{sqlite}}    INSERT INTO device_search (rowid, text) VALUES (new.row, new.text);
{{sqlite}}END;
{{sqlite}}CREATE TRIGGER device_texts_update AFTER UPDATE ON device_texts BEGIN
{{sqlite}}    INSERT INTO device_search (device_search, rowid, text) VALUES ('delete', old.row, old.text);
{{sqlite}}    INSERT INTO device_search (rowid, text) VALUES (new.row, new.text);
{{sqlite}}END;
{{sqlite}}CREATE TRIGGER device_texts_delete AFTER DELETE ON device_texts BEGIN
{{sqlite}}    INSERT INTO device_search (device_search, rowid, text) VALUES ('delete', old.row, old.text);
{{sqlite}}END;
{{sqlite}}CREATE TABLE device_metadata (
{{sqlite}}    tenant TEXT NOT NULL,
{{sqlite}}    id     TEXT NOT NULL,
{{sqlite}}    key    TEXT NOT NULL,
{{sqlite}}    value  TEXT NOT NULL,
{{sqlite}}    PRIMARY KEY (tenant, key, value, id)
{{sqlite}}) WITHOUT ROWID;
{{sqlite}}CREATE TRIGGER devices_search_insert AFTER INSERT ON devices BEGIN
{{sqlite}}    INSERT INTO device_texts (tenant, id, text)
{{sqlite}}        VALUES (new.tenant, new.id, new.id || char(10) || coalesce((SELECT group_concat(value, char(10)) FROM json_each(new.metadata)), ''));
{{sqlite}}    INSERT INTO device_metadata (tenant, id, key, value) SELECT new.tenant, new.id, key, value FROM json_each(new.metadata);
{{sqlite}}END;
{{sqlite}}CREATE TRIGGER devices_search_update AFTER UPDATE OF metadata ON devices BEGIN
{{sqlite}}    UPDATE device_texts SET text = new.id || char(10) || coalesce((SELECT group_concat(value, char(10)) FROM json_each(new.metadata)), '')
{{sqlite}}        WHERE tenant = new.tenant AND id = new.id;
{{sqlite}}    DELETE FROM device_metadata WHERE (tenant, key, value, id) IN (SELECT old.tenant, key, value, old.id FROM json_each(old.metadata));
{{sqlite}}    INSERT INTO device_metadata (tenant, id, key, value) SELECT new.tenant, new.id, key, value FROM json_each(new.metadata);
{{sqlite}}END;
{{sqlite}}CREATE TRIGGER devices_search_delete AFTER DELETE ON devices BEGIN
{{sqlite}}    DELETE FROM device_texts WHERE tenant = old.tenant AND id = old.id;
{{sqlite}}    DELETE FROM device_metadata WHERE (tenant, key, value, id) IN (SELECT old.tenant, key, value, old.id FROM json_each(old.metadata));
{{sqlite}}END;
{{sqlite}}INSERT INTO device_texts (tenant, id, text)
{{sqlite}}    SELECT tenant, id, id || char(10) || coalesce((SELECT group_concat(value, char(10)) FROM json_each(metadata)), '') FROM devices;
{{sqlite}}INSERT INTO device_metadata (tenant, id, key, value) SELECT d.tenant, d.id, e.key, e.value FROM devices d, json_each(d.metadata) e;
