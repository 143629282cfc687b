-- Groups (docs/twin.md): saved selectors over the devices' metadata and
-- reported state. Membership is not stored: the selector is evaluated by
-- every read, so a device joins or leaves as it changes.
CREATE TABLE device_groups (
    tenant      TEXT NOT NULL REFERENCES tenants (name) ON DELETE CASCADE,
    name        TEXT NOT NULL,
    selector    TEXT NOT NULL,
    description TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL,
    PRIMARY KEY (tenant, name)
);
