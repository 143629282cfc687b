-- The serial number (lowercase hex) of the client certificate a device may
-- connect with over mutual TLS; '' when it has none. Only this certificate
-- is accepted: issuing another, rotating the token or deleting the device
-- revokes it.
ALTER TABLE devices ADD COLUMN cert_serial TEXT NOT NULL DEFAULT '';
