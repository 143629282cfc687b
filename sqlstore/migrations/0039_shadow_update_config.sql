-- A tenant's choice to send its devices each desired change that leaves
-- them out of sync as an update_config action (docs/twin.md).
ALTER TABLE tenants ADD COLUMN shadow_update_config BOOLEAN NOT NULL DEFAULT false;
