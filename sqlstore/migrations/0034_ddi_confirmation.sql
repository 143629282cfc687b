-- hawkBit DDI (docs/hawkbit.md): a tenant's settings, both off by default,
-- and each device's automatic confirmation of its updates, which the
-- device itself switches on and off. A device without a row confirms
-- nothing by itself; its row goes with it.
ALTER TABLE tenants ADD COLUMN ddi_require_confirmation BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE tenants ADD COLUMN ddi_gateway_registration BOOLEAN NOT NULL DEFAULT FALSE;
CREATE TABLE ddi_auto_confirm (
    tenant       TEXT NOT NULL,
    device_id    TEXT NOT NULL,
    initiator    TEXT NOT NULL DEFAULT '',
    remark       TEXT NOT NULL DEFAULT '',
    activated_at BIGINT NOT NULL,
    PRIMARY KEY (tenant, device_id),
    FOREIGN KEY (tenant, device_id) REFERENCES devices (tenant, id) ON DELETE CASCADE
);
