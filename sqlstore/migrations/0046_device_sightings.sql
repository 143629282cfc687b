-- Each device's last_seen_at in a narrow table of its own. The action
-- service writes the last_seen_at of every device heard from once a second
-- (TouchDevices; docs/actions.md, "Status reports"), and in devices each of
-- those writes made a new version of a wide row (metadata, token hash and,
-- on PostgreSQL, the search text): 42-63% of them stayed on their page
-- (HOT), the rest added entries to devices' three indexes, among them the
-- search text's trigram index, and spread the table over two to three times
-- its pages; on SQLite each sighting appended a wide row's page to the WAL
-- (docs/benchmarks-notebook.md, "A second's sightings spread on
-- PostgreSQL"). Here a sighting is a row of a device's key and a number,
-- under the one index of its key, which it never changes.
--
-- A device without a row has never been seen. The rows go with their
-- device (and so with its tenant) by the foreign key, as device_shadows'
-- do; the store writes only rows of devices that exist.
--
-- PostgreSQL: a page keeps half its room free (fillfactor 50), so a
-- second's sightings, 256 neighbouring devices to a transaction, find room
-- on their own page for every row's new version (a transaction cannot
-- reuse the room of versions it made dead itself; the next second's read
-- of the page prunes them). The foreign key is added after the copy: as a
-- constraint of the table it would check, and lock, each device for each
-- row copied; added, it is checked by one join.
{{sqlite}}CREATE TABLE device_sightings (
{{sqlite}}    tenant       TEXT NOT NULL,
{{sqlite}}    device_id    TEXT NOT NULL,
{{sqlite}}    last_seen_at BIGINT NOT NULL,
{{sqlite}}    PRIMARY KEY (tenant, device_id),
{{sqlite}}    FOREIGN KEY (tenant, device_id) REFERENCES devices (tenant, id) ON DELETE CASCADE
{{sqlite}}) WITHOUT ROWID;
{{postgres}}CREATE TABLE device_sightings (
{{postgres}}    tenant       TEXT NOT NULL,
{{postgres}}    device_id    TEXT NOT NULL,
{{postgres}}    last_seen_at BIGINT NOT NULL,
{{postgres}}    PRIMARY KEY (tenant, device_id)
{{postgres}}) WITH (fillfactor = 50);
INSERT INTO device_sightings (tenant, device_id, last_seen_at)
    SELECT tenant, id, last_seen_at FROM devices WHERE last_seen_at IS NOT NULL;
{{postgres}}ALTER TABLE device_sightings ADD FOREIGN KEY (tenant, device_id) REFERENCES devices (tenant, id) ON DELETE CASCADE;

-- SQLite drops the column (3.35 and later rewrite each row of devices once,
-- here): one process serves a SQLite database, so nothing older reads it.
-- PostgreSQL keeps it, no longer written or read by this version, so that
-- replicas older than this migration keep working while they are replaced
-- one at a time (they read and write the old column meanwhile; see
-- docs/operations.md, "Upgrades"). A later migration drops it.
{{sqlite}}ALTER TABLE devices DROP COLUMN last_seen_at;
