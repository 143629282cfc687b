package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"strings"

	"github.com/fleetd/fleet"
)

// A tenant's settings of one kind (DDI, shadows, remote sessions) are
// columns of its row in tenants; tenantSettings names them, and fields
// points at the value of each column, in order, within a T.
type tenantSettings[T any] struct {
	columns  []string
	fields   func(*T) []any
	audit    string // the audit log's action for a change
	resource string // the API's name for them under /api/v1/tenants/{tenant}/
}

// read returns the tenant's settings.
func (k tenantSettings[T]) read(ctx context.Context, db *DB, tenant string) (T, error) {
	var s T
	err := scanTenant(db.queryRow(ctx, "SELECT "+strings.Join(k.columns, ", ")+" FROM tenants WHERE name = ?", tenant), tenant, k.fields(&s)...)
	return s, db.classify(err)
}

// write replaces the tenant's settings, audited with the previous ones.
func (k tenantSettings[T]) write(ctx context.Context, db *DB, tenant string, s T) error {
	return db.update(ctx, func(ctx context.Context, tx *Tx) error {
		var previous T
		row := tx.queryRow(ctx, "SELECT "+strings.Join(k.columns, ", ")+" FROM tenants WHERE name = ?"+tx.db.dialect.forUpdate(), tenant)
		if err := scanTenant(row, tenant, k.fields(&previous)...); err != nil {
			return err
		}
		if _, err := tx.exec(ctx, "UPDATE tenants SET "+strings.Join(k.columns, " = ?, ")+" = ? WHERE name = ?", append(k.fields(&s), tenant)...); err != nil {
			return err
		}
		return tx.audit(ctx, tenant, k.audit, "tenants/"+tenant+"/"+k.resource, map[string]any{"settings": s, "previous": previous})
	})
}

// scanTenant scans a row of tenants, a missing one being ENOTFOUND.
func scanTenant(row *sql.Row, tenant string, dest ...any) error {
	err := row.Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return fleet.Errorf(fleet.ENOTFOUND, "tenant %q not found", tenant)
	}
	return err
}
