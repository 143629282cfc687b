-- hawkBit clients (docs/hawkbit.md) check each component file against its
-- SHA-1 and MD5 as well as its SHA-256; they are computed once, when the
-- bundle is uploaded. Firmwares uploaded before are '' and are not offered
-- to hawkBit clients until a bundle carrying them is uploaded again.
ALTER TABLE firmwares ADD COLUMN md5 TEXT NOT NULL DEFAULT '';
ALTER TABLE firmwares ADD COLUMN sha1 TEXT NOT NULL DEFAULT '';
