package alert

import (
	"context"

	"github.com/fleetd/fleet"
)

// ApplyChange drops what the engine caches of a change another replica
// made (sqlstore.DB.Listen): a rule created or deleted there is picked up
// by a refresh now rather than within RefreshEvery, a device's metadata is
// read again for metadata_filters rather than after MetadataTTL, and a
// deleted device is forgotten. Call it after Load.
func (e *Engine) ApplyChange(ctx context.Context, c fleet.Change) {
	switch c.Kind {
	case fleet.ChangeAlertRule, fleet.ChangeAll:
		if c.Kind == fleet.ChangeAll {
			e.meta.mu.Lock()
			e.meta.m = nil
			e.meta.mu.Unlock()
		}
		if err := e.Refresh(ctx); err != nil && ctx.Err() == nil {
			e.Logger.Warn("alert rules refresh after another replica's change; the periodic refresh will retry", "err", err)
		}
	case fleet.ChangeDevice:
		e.InvalidateMetadata(c.Tenant, c.Key)
	case fleet.ChangeDeviceDelete:
		e.ForgetDevice(c.Tenant, c.Key)
	}
}
