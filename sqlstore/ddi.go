package sqlstore

import (
	"context"
	"database/sql"
	"errors"

	"github.com/fleetd/fleet"
)

// hawkBit DDI's settings and confirmations (docs/hawkbit.md).

var _ fleet.DDIService = (*DB)(nil)

// ddiSettings are a tenant's DDI settings.
var ddiSettings = tenantSettings[fleet.DDISettings]{
	columns:  []string{"ddi_require_confirmation", "ddi_gateway_registration"},
	fields:   func(s *fleet.DDISettings) []any { return []any{&s.RequireConfirmation, &s.GatewayRegistration} },
	audit:    "tenant.ddi.update",
	resource: "ddi",
}

// DDISettings reads a tenant's DDI settings.
func (db *DB) DDISettings(ctx context.Context, tenant string) (fleet.DDISettings, error) {
	return ddiSettings.read(ctx, db, tenant)
}

// SetDDISettings replaces a tenant's DDI settings, audited with the
// previous ones.
func (db *DB) SetDDISettings(ctx context.Context, tenant string, s fleet.DDISettings) error {
	return ddiSettings.write(ctx, db, tenant, s)
}

// AutoConfirm returns a device's automatic confirmation.
func (db *DB) AutoConfirm(ctx context.Context, tenant, device string) (fleet.AutoConfirm, error) {
	var a fleet.AutoConfirm
	var at int64
	err := db.queryRow(ctx, "SELECT initiator, remark, activated_at FROM ddi_auto_confirm WHERE tenant = ? AND device_id = ?", tenant, device).
		Scan(&a.Initiator, &a.Remark, &at)
	if errors.Is(err, sql.ErrNoRows) {
		return a, nil
	} else if err != nil {
		return a, db.classify(err)
	}
	a.Active, a.ActivatedAt = true, fromMillis(at)
	return a, nil
}

// SetAutoConfirm activates or deactivates a device's automatic
// confirmation. Deactivating an inactive one changes nothing, as upstream.
func (db *DB) SetAutoConfirm(ctx context.Context, tenant, device string, a fleet.AutoConfirm) error {
	return db.update(ctx, func(ctx context.Context, tx *Tx) error {
		if !a.Active {
			_, err := tx.exec(ctx, "DELETE FROM ddi_auto_confirm WHERE tenant = ? AND device_id = ?", tenant, device)
			return err
		}
		n, err := tx.execCount(ctx, `INSERT INTO ddi_auto_confirm (tenant, device_id, initiator, remark, activated_at)
			SELECT tenant, id, ?, ?, ? FROM devices WHERE tenant = ? AND id = ? ON CONFLICT DO NOTHING`,
			a.Initiator, a.Remark, millis(tx.now), tenant, device)
		if err != nil {
			return err
		}
		if n == 0 {
			var one int
			err := tx.queryRow(ctx, "SELECT 1 FROM devices WHERE tenant = ? AND id = ?", tenant, device).Scan(&one)
			if errors.Is(err, sql.ErrNoRows) {
				return fleet.Errorf(fleet.ENOTFOUND, "device %q not found", device)
			} else if err != nil {
				return err
			}
			return fleet.Errorf(fleet.ECONFLICT, "device %s has automatic confirmation active already; deactivate it first", device)
		}
		return nil
	})
}

// ConfirmDeviceAction records a device's confirmation or denial of a
// Queued device action.
func (db *DB) ConfirmDeviceAction(ctx context.Context, tenant, device string, actionID int64, confirmed bool) error {
	m := moveDenied
	if confirmed {
		m = moveConfirmed
	}
	return db.update(ctx, func(ctx context.Context, tx *Tx) error {
		n, err := tx.applyMove(ctx, m, "UPDATE device_actions SET "+m.set+", updated_at = ? WHERE tenant = ? AND action_id = ? AND device_id = ? AND {from}",
			millis(tx.now), tenant, actionID, device)
		if err != nil || n > 0 {
			return err
		}
		var status fleet.ActionStatus
		err = tx.queryRow(ctx, "SELECT action_status FROM device_actions WHERE tenant = ? AND action_id = ? AND device_id = ?", tenant, actionID, device).Scan(&status)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return fleet.Errorf(fleet.ENOTFOUND, "device %s has no action %d", device, actionID)
		case err != nil:
			return err
		case status.Final():
			return fleet.Errorf(fleet.EGONE, "action %d is finished on device %s (%s); it takes no confirmation", actionID, device, status)
		}
		return fleet.Errorf(fleet.ENOTFOUND, "action %d is %s on device %s: it does not wait for a confirmation", actionID, status, device)
	})
}
