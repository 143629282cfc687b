package sqlstore

import (
	"context"
	"database/sql"
	"time"

	"github.com/google/uuid"

	"github.com/fleetd/fleet"
)

var _ fleet.RemoteSessionService = (*DB)(nil)

// CreateRemoteSession stores s as open.
func (db *DB) CreateRemoteSession(ctx context.Context, s *fleet.RemoteSession) error {
	s.ID = uuid.NewString()
	return db.update(ctx, func(ctx context.Context, tx *Tx) error {
		s.StartedAt = tx.now.Truncate(time.Millisecond)
		if _, err := tx.exec(ctx, `INSERT INTO remote_sessions (id, tenant, device_id, kind, target, key_name, user_name, user_email, started_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			s.ID, s.Tenant, s.DeviceID, s.Kind, s.Target, s.KeyName, s.UserName, s.UserEmail, millis(s.StartedAt)); err != nil {
			return err
		}
		return tx.audit(ctx, s.Tenant, "remote.session.start", "devices/"+s.DeviceID+"/remote-sessions/"+s.ID,
			map[string]any{"device_id": s.DeviceID, "kind": s.Kind, "target": s.Target, "user_name": s.UserName})
	})
}

// EndRemoteSession records s's end once; a session already ended is left
// as it is.
func (db *DB) EndRemoteSession(ctx context.Context, s *fleet.RemoteSession) error {
	return db.update(ctx, func(ctx context.Context, tx *Tx) error {
		end := tx.now.Truncate(time.Millisecond)
		n, err := tx.execCount(ctx, `UPDATE remote_sessions SET ended_at = ?, bytes_to_device = ?, bytes_from_device = ?, end_reason = ?
			WHERE id = ? AND tenant = ? AND ended_at IS NULL`,
			millis(end), s.BytesToDevice, s.BytesFromDevice, s.EndReason, s.ID, s.Tenant)
		if err != nil || n == 0 {
			return err
		}
		s.EndedAt = &end
		return tx.audit(ctx, s.Tenant, "remote.session.end", "devices/"+s.DeviceID+"/remote-sessions/"+s.ID,
			map[string]any{"device_id": s.DeviceID, "kind": s.Kind, "user_name": s.UserName, "end_reason": s.EndReason,
				"bytes_to_device": s.BytesToDevice, "bytes_from_device": s.BytesFromDevice})
	})
}

// FindRemoteSessions lists a device's sessions, newest first.
func (db *DB) FindRemoteSessions(ctx context.Context, tenant, deviceID string, p fleet.Page) ([]*fleet.RemoteSession, int, error) {
	return findPage(ctx, db, "SELECT count(*) FROM remote_sessions WHERE tenant = ? AND device_id = ?",
		`SELECT id, kind, target, key_name, user_name, user_email, started_at, ended_at, bytes_to_device, bytes_from_device, end_reason
		FROM remote_sessions WHERE tenant = ? AND device_id = ? ORDER BY started_at DESC, id`, []any{tenant, deviceID}, p,
		func(sc scanner) (*fleet.RemoteSession, error) {
			s := fleet.RemoteSession{Tenant: tenant, DeviceID: deviceID}
			var started int64
			var ended sql.NullInt64
			if err := sc.Scan(&s.ID, &s.Kind, &s.Target, &s.KeyName, &s.UserName, &s.UserEmail, &started, &ended,
				&s.BytesToDevice, &s.BytesFromDevice, &s.EndReason); err != nil {
				return nil, err
			}
			s.StartedAt = fromMillis(started)
			if ended.Valid {
				t := fromMillis(ended.Int64)
				s.EndedAt = &t
			}
			return &s, nil
		})
}
