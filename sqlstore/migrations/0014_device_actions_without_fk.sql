-- PostgreSQL checked device_actions' foreign key to devices with a trigger
-- per inserted row: 4.3 s of a dispatch to a million devices. The store
-- keeps the rule itself instead (docs/actions.md, "Storage"): deleting a
-- device deletes its device actions in the same transaction, a dispatch and
-- a deletion in one tenant take a lock that orders them, and an hourly
-- sweep removes any orphan. SQLite, with one writer, keeps the key.
{{postgres}}ALTER TABLE device_actions DROP CONSTRAINT IF EXISTS device_actions_tenant_device_id_fkey;
