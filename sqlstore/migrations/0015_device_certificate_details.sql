-- What the console shows of a device's current certificate: its subject,
-- SHA-256 fingerprint and validity (epoch milliseconds; 0 for certificates
-- issued before these were recorded, which show their serial only).
ALTER TABLE devices ADD COLUMN cert_subject TEXT NOT NULL DEFAULT '';
ALTER TABLE devices ADD COLUMN cert_fingerprint TEXT NOT NULL DEFAULT '';
ALTER TABLE devices ADD COLUMN cert_not_before BIGINT NOT NULL DEFAULT 0;
ALTER TABLE devices ADD COLUMN cert_not_after BIGINT NOT NULL DEFAULT 0;
