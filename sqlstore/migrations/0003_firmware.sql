-- Firmware bundles, the component versions (firmwares) they carry, and the
-- links between them. A component version is stored once per tenant and
-- shared by every bundle that carries the same file.

CREATE TABLE firmware_bundles (
    tenant                     TEXT NOT NULL REFERENCES tenants (name) ON DELETE CASCADE,
    id                         TEXT NOT NULL,
    version                    TEXT NOT NULL,
    file_name                  TEXT NOT NULL,
    upload_status              TEXT NOT NULL,
    upload_error               TEXT NOT NULL DEFAULT '',
    -- The stored archive and what the server computed of it; NULL until
    -- the archive is in (and blob_key again once a failed one is deleted).
    blob_key                   TEXT,
    content_length             BIGINT,
    uncompressed_size          BIGINT,
    checksum                   TEXT,
    -- The parsed manifest with each component's computed sizes, kept
    -- until the bundle is completed and its firmwares exist.
    components                 {{json}},
    -- What S5 declared; NULL until it has.
    declared_content_length    BIGINT,
    declared_uncompressed_size BIGINT,
    declared_checksum          TEXT,
    created_at                 BIGINT NOT NULL,
    updated_at                 BIGINT NOT NULL,
    PRIMARY KEY (tenant, id)
);
-- A version belongs to one live bundle; failed ones do not hold it, so the
-- version can be uploaded again.
CREATE UNIQUE INDEX firmware_bundles_version ON firmware_bundles (tenant, version) WHERE upload_status <> 'failed';
CREATE INDEX firmware_bundles_by_time ON firmware_bundles (tenant, created_at, id);

CREATE TABLE firmwares (
    tenant            TEXT NOT NULL REFERENCES tenants (name) ON DELETE CASCADE,
    id                TEXT NOT NULL,
    component_name    TEXT NOT NULL,
    version_number    TEXT NOT NULL,
    file_name         TEXT NOT NULL,
    checksum          TEXT NOT NULL,
    content_length    BIGINT NOT NULL,
    uncompressed_size BIGINT NOT NULL,
    dependencies      {{json}} NOT NULL,
    is_deactivated    BOOLEAN NOT NULL DEFAULT FALSE,
    created_at        BIGINT NOT NULL,
    updated_at        BIGINT NOT NULL,
    PRIMARY KEY (tenant, id),
    UNIQUE (tenant, component_name, version_number)
);

CREATE TABLE firmware_bundle_firmwares (
    tenant      TEXT NOT NULL,
    bundle_id   TEXT NOT NULL,
    firmware_id TEXT NOT NULL,
    position    INTEGER NOT NULL,
    PRIMARY KEY (tenant, bundle_id, firmware_id),
    FOREIGN KEY (tenant, bundle_id) REFERENCES firmware_bundles (tenant, id) ON DELETE CASCADE,
    FOREIGN KEY (tenant, firmware_id) REFERENCES firmwares (tenant, id) ON DELETE CASCADE
);
CREATE INDEX firmware_bundle_firmwares_by_firmware ON firmware_bundle_firmwares (tenant, firmware_id);
