package sqlstore

import (
	"context"
	"database/sql"
	"errors"

	"github.com/fleetd/fleet"
)

var _ fleet.DeviceCertificateStore = (*DB)(nil)

// SetDeviceCertificate records c as the only certificate the device may
// connect with.
func (db *DB) SetDeviceCertificate(ctx context.Context, tenant, id string, c fleet.IssuedCertificate) error {
	return db.update(ctx, func(ctx context.Context, tx *Tx) error {
		res, err := tx.exec(ctx, `UPDATE devices SET cert_serial = ?, cert_subject = ?, cert_fingerprint = ?,
			cert_not_before = ?, cert_not_after = ? WHERE tenant = ? AND id = ?`,
			c.Serial, c.Subject, c.Fingerprint, c.NotBefore.UnixMilli(), c.NotAfter.UnixMilli(), tenant, id)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return fleet.Errorf(fleet.ENOTFOUND, "device %q not found", id)
		}
		if err := tx.changed(ctx, fleet.Change{Kind: fleet.ChangeDeviceCredentials, Tenant: tenant, Key: id}); err != nil {
			return err
		}
		return tx.audit(ctx, tenant, "device.issue_certificate", "devices/"+id,
			map[string]any{"serial": c.Serial, "not_after": c.NotAfter.UTC().Format("2006-01-02T15:04:05Z")})
	})
}

// DeviceCertificateSerial returns the serial of the device's current
// certificate, "" when it has none.
func (db *DB) DeviceCertificateSerial(ctx context.Context, tenant, id string) (string, error) {
	var serial string
	err := db.queryRow(ctx, "SELECT cert_serial FROM devices WHERE tenant = ? AND id = ?", tenant, id).Scan(&serial)
	if errors.Is(err, sql.ErrNoRows) {
		return "", fleet.Errorf(fleet.ENOTFOUND, "device %q not found", id)
	}
	return serial, db.classify(err)
}

// FindDeviceCertificate returns what is recorded of the device's current
// certificate, nil when it has none. A token rotation revokes the
// certificate by clearing its serial alone: the rest is not read then.
func (db *DB) FindDeviceCertificate(ctx context.Context, tenant, id string) (*fleet.IssuedCertificate, error) {
	var c fleet.IssuedCertificate
	var notBefore, notAfter int64
	err := db.queryRow(ctx, `SELECT cert_serial, cert_subject, cert_fingerprint, cert_not_before, cert_not_after
		FROM devices WHERE tenant = ? AND id = ?`, tenant, id).Scan(&c.Serial, &c.Subject, &c.Fingerprint, &notBefore, &notAfter)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fleet.Errorf(fleet.ENOTFOUND, "device %q not found", id)
	} else if err != nil {
		return nil, db.classify(err)
	}
	if c.Serial == "" {
		return nil, nil
	}
	if notAfter != 0 {
		c.NotBefore, c.NotAfter = fromMillis(notBefore), fromMillis(notAfter)
	}
	return &c, nil
}

// ServerValue returns the server-wide value under name, made by create on
// first use. Replicas racing to make it agree on whichever row was inserted
// first, so every replica ends up with the same value (a CA, a signing key).
func (db *DB) ServerValue(ctx context.Context, name string, create func() (string, error)) (string, error) {
	var value string
	err := db.queryRow(ctx, "SELECT value FROM server_secrets WHERE name = ?", name).Scan(&value)
	if errors.Is(err, sql.ErrNoRows) {
		v, cerr := create()
		if cerr != nil {
			return "", cerr
		}
		err = db.update(ctx, func(ctx context.Context, tx *Tx) error {
			if _, err := tx.exec(ctx, "INSERT INTO server_secrets (name, value) VALUES (?, ?) ON CONFLICT (name) DO NOTHING", name, v); err != nil {
				return err
			}
			return tx.queryRow(ctx, "SELECT value FROM server_secrets WHERE name = ?", name).Scan(&value)
		})
	}
	return value, db.classify(err)
}
