-- An alert rule may watch only the devices of a group (docs/alerts.md);
-- '' for every device.
ALTER TABLE alert_rules ADD COLUMN device_group TEXT NOT NULL DEFAULT '';
