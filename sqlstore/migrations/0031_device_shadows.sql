-- Device shadows (docs/twin.md): what operators want a device to be
-- (desired) and what it says it is (reported). The delta is computed on
-- every read; in_sync, the fact that it is empty, is kept with each write
-- so that the registry can list the devices out of sync without reading
-- every shadow. A device without a row has an empty shadow at version 0.
CREATE TABLE device_shadows (
    tenant              TEXT NOT NULL,
    device_id           TEXT NOT NULL,
    desired             {{json}} NOT NULL,
    reported            {{json}} NOT NULL,
    version             BIGINT NOT NULL,
    in_sync             BOOLEAN NOT NULL,
    desired_updated_at  BIGINT,
    reported_updated_at BIGINT,
    PRIMARY KEY (tenant, device_id),
    FOREIGN KEY (tenant, device_id) REFERENCES devices (tenant, id) ON DELETE CASCADE
);
CREATE INDEX device_shadows_out_of_sync ON device_shadows (tenant, device_id) WHERE NOT in_sync;
