package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"strings"
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
		if _, err := tx.exec(ctx, `INSERT INTO remote_sessions (id, tenant, device_id, kind, target, key_name, user_name, user_email, started_at, relay_url)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			s.ID, s.Tenant, s.DeviceID, s.Kind, s.Target, s.KeyName, s.UserName, s.UserEmail, millis(s.StartedAt), s.RelayURL); err != nil {
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

// FindRemoteSessions lists a device's sessions, or the tenant's when
// deviceID is "", newest first.
func (db *DB) FindRemoteSessions(ctx context.Context, tenant, deviceID string, p fleet.Page) ([]*fleet.RemoteSession, int, error) {
	where, args := "tenant = ? AND device_id = ?", []any{tenant, deviceID}
	if deviceID == "" {
		where, args = "tenant = ?", []any{tenant}
	}
	return findPage(ctx, db, "SELECT count(*) FROM remote_sessions WHERE "+where,
		`SELECT id, device_id, kind, target, key_name, user_name, user_email, started_at, ended_at, bytes_to_device, bytes_from_device, end_reason
		FROM remote_sessions WHERE `+where+` ORDER BY started_at DESC, id`, args, p,
		func(sc scanner) (*fleet.RemoteSession, error) {
			s := fleet.RemoteSession{Tenant: tenant}
			var started int64
			var ended sql.NullInt64
			if err := sc.Scan(&s.ID, &s.DeviceID, &s.Kind, &s.Target, &s.KeyName, &s.UserName, &s.UserEmail, &started, &ended,
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

// FindOpenRemoteSession returns an open session with its relay URL.
func (db *DB) FindOpenRemoteSession(ctx context.Context, tenant, id string) (*fleet.RemoteSession, error) {
	s := fleet.RemoteSession{ID: id, Tenant: tenant}
	var started int64
	err := db.queryRow(ctx, `SELECT device_id, kind, target, key_name, user_name, user_email, started_at, relay_url
		FROM remote_sessions WHERE id = ? AND tenant = ? AND ended_at IS NULL`, id, tenant).
		Scan(&s.DeviceID, &s.Kind, &s.Target, &s.KeyName, &s.UserName, &s.UserEmail, &started, &s.RelayURL)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fleet.Errorf(fleet.ENOTFOUND, "no open remote session %q", id)
	} else if err != nil {
		return nil, db.classify(err)
	}
	s.StartedAt = fromMillis(started)
	return &s, nil
}

// StopRemoteSession asks whichever replica relays the open session id to
// end it (audited); the replica records the end. by names who asked.
func (db *DB) StopRemoteSession(ctx context.Context, tenant, id, by string) error {
	return db.update(ctx, func(ctx context.Context, tx *Tx) error {
		var device string
		var ended sql.NullInt64
		err := tx.queryRow(ctx, "SELECT device_id, ended_at FROM remote_sessions WHERE id = ? AND tenant = ?", id, tenant).Scan(&device, &ended)
		if errors.Is(err, sql.ErrNoRows) {
			return fleet.Errorf(fleet.ENOTFOUND, "no remote session %q", id)
		} else if err != nil {
			return err
		}
		if ended.Valid {
			return fleet.Errorf(fleet.ECONFLICT, "remote session %s has ended already", id)
		}
		key := id + " " + strings.ReplaceAll(by, "\t", " ")
		if err := tx.changed(ctx, fleet.Change{Kind: fleet.ChangeRemoteSessionStop, Tenant: tenant, Key: key}); err != nil {
			return err
		}
		return tx.audit(ctx, tenant, "remote.session.stop", "devices/"+device+"/remote-sessions/"+id, map[string]any{"device_id": device})
	})
}
