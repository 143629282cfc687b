-- Scale out (issue 8): what lets replicas share background work and take
-- turns on a device's alert evaluation.

-- Devices that arrived at an external MQTT broker and are owed the actions
-- queued for them (DESIGN §1, §8). A broker-auth callback records the
-- arrival, due a moment later so that the device's subscription is in
-- place; any replica claims due rows under a lease, sends the device what is
-- queued and deletes the row, unless the device arrived again meanwhile
-- (version moved on), in which case the row stays for another round.
CREATE TABLE device_redeliveries (
    tenant      TEXT NOT NULL,
    device_id   TEXT NOT NULL,
    due_at      BIGINT NOT NULL,
    version     BIGINT NOT NULL,
    lease_owner TEXT NOT NULL,
    lease_until BIGINT NOT NULL,
    PRIMARY KEY (tenant, device_id),
    FOREIGN KEY (tenant, device_id) REFERENCES devices (tenant, id) ON DELETE CASCADE
);
CREATE INDEX device_redeliveries_due ON device_redeliveries (due_at);

-- Every commit of a device stream (its latest point, its alert states)
-- advances its version, so that a replica whose view of the stream is older
-- than the database's learns so when it commits, reads the stream again and
-- evaluates again: replicas take turns on a device's stream whichever of
-- them receives its data.
ALTER TABLE stream_latest ADD COLUMN version BIGINT NOT NULL DEFAULT 1;
