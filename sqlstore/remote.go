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

// CreateRemoteSession stores s as open, unless admit refuses the open
// sessions of its person and its device. On PostgreSQL the count and the
// insert hold the tenant's remote-sessions lock, so that two replicas
// opening sessions at once take turns and enforce one cap; SQLite's one
// writer serialises them already.
func (db *DB) CreateRemoteSession(ctx context.Context, s *fleet.RemoteSession, since time.Time, silent time.Duration, admit func(fleet.RemoteOpen) error) error {
	s.ID = uuid.NewString()
	// A session whose replica is lost counts under no cap: ended as soon
	// as a replica's sweep (or an end request) gets to it.
	live, liveArgs := "", []any{}
	if db.dialect == postgres {
		live = ` AND NOT EXISTS (SELECT 1 FROM remote_relays r WHERE r.relay_url = remote_sessions.relay_url AND r.seen_at < ` + pgNowMillis + ` - ?)`
		liveArgs = []any{silent.Milliseconds()}
	}
	return db.updateAlone(ctx, func(ctx context.Context, tx *Tx) error {
		if tx.db.dialect == postgres {
			// 1919250802 is "remo" in the lock's first key; lockTargets
			// has "fleet".
			if _, err := tx.exec(ctx, "SELECT pg_advisory_xact_lock(1919250802, hashtext(?))", s.Tenant); err != nil {
				return err
			}
		}
		var open fleet.RemoteOpen
		if err := tx.queryRow(ctx, `SELECT count(*) FROM remote_sessions
			WHERE tenant = ? AND user_name = ? AND key_name = ? AND user_email = ? AND ended_at IS NULL AND started_at >= ?`+live,
			append([]any{s.Tenant, s.UserName, s.KeyName, s.UserEmail, millis(since)}, liveArgs...)...).Scan(&open.Person); err != nil {
			return err
		}
		if err := tx.queryRow(ctx, `SELECT count(*) FROM remote_sessions WHERE tenant = ? AND device_id = ? AND ended_at IS NULL AND started_at >= ?`+live,
			append([]any{s.Tenant, s.DeviceID, millis(since)}, liveArgs...)...).Scan(&open.Device); err != nil {
			return err
		}
		if err := admit(open); err != nil {
			return err
		}
		var record bool
		err := tx.queryRow(ctx, "SELECT remote_recording FROM tenants WHERE name = ?", s.Tenant).Scan(&record)
		if errors.Is(err, sql.ErrNoRows) {
			return fleet.Errorf(fleet.ENOTFOUND, "tenant %q not found", s.Tenant)
		} else if err != nil {
			return err
		}
		s.Recorded = record && s.Kind == fleet.RemoteShell
		s.StartedAt = tx.now.Truncate(time.Millisecond)
		if _, err := tx.exec(ctx, `INSERT INTO remote_sessions (id, tenant, device_id, kind, target, key_name, user_name, user_email, started_at, relay_url, recorded)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			s.ID, s.Tenant, s.DeviceID, s.Kind, s.Target, s.KeyName, s.UserName, s.UserEmail, millis(s.StartedAt), s.RelayURL, s.Recorded); err != nil {
			return err
		}
		return tx.audit(ctx, s.Tenant, "remote.session.start", "devices/"+s.DeviceID+"/remote-sessions/"+s.ID,
			map[string]any{"device_id": s.DeviceID, "kind": s.Kind, "target": s.Target, "user_name": s.UserName, "recorded": s.Recorded})
	})
}

// EndRemoteSession records s's end once; a session already ended is left
// as it is.
func (db *DB) EndRemoteSession(ctx context.Context, s *fleet.RemoteSession) error {
	return db.update(ctx, func(ctx context.Context, tx *Tx) error {
		end := tx.now.Truncate(time.Millisecond)
		var size sql.NullInt64
		if s.RecordingSize > 0 {
			size = sql.NullInt64{Int64: s.RecordingSize, Valid: true}
		}
		n, err := tx.execCount(ctx, `UPDATE remote_sessions SET ended_at = ?, bytes_to_device = ?, bytes_from_device = ?, end_reason = ?, recording_size = ?
			WHERE id = ? AND tenant = ? AND ended_at IS NULL`,
			millis(end), s.BytesToDevice, s.BytesFromDevice, s.EndReason, size, s.ID, s.Tenant)
		if err != nil || n == 0 {
			return err
		}
		s.EndedAt = &end
		return tx.audit(ctx, s.Tenant, "remote.session.end", "devices/"+s.DeviceID+"/remote-sessions/"+s.ID,
			map[string]any{"device_id": s.DeviceID, "kind": s.Kind, "user_name": s.UserName, "end_reason": s.EndReason,
				"bytes_to_device": s.BytesToDevice, "bytes_from_device": s.BytesFromDevice, "recording_size": s.RecordingSize})
	})
}

// remoteSessionColumns are what scanRemoteSession reads.
const remoteSessionColumns = `id, device_id, kind, target, key_name, user_name, user_email, started_at, ended_at,
	bytes_to_device, bytes_from_device, end_reason, recorded, recording_size`

func scanRemoteSession(sc scanner, tenant string) (*fleet.RemoteSession, error) {
	s := fleet.RemoteSession{Tenant: tenant}
	var started int64
	var ended, size sql.NullInt64
	if err := sc.Scan(&s.ID, &s.DeviceID, &s.Kind, &s.Target, &s.KeyName, &s.UserName, &s.UserEmail, &started, &ended,
		&s.BytesToDevice, &s.BytesFromDevice, &s.EndReason, &s.Recorded, &size); err != nil {
		return nil, err
	}
	s.StartedAt = fromMillis(started)
	if ended.Valid {
		t := fromMillis(ended.Int64)
		s.EndedAt = &t
	}
	if size.Valid {
		s.RecordingSize = size.Int64
		s.Recording = "/api/v1/devices/" + s.DeviceID + "/remote-sessions/" + s.ID + "/recording"
	}
	return &s, nil
}

// FindRemoteSessions lists the tenant's sessions that f chooses, newest
// first.
func (db *DB) FindRemoteSessions(ctx context.Context, tenant string, f fleet.RemoteSessionFilter) ([]*fleet.RemoteSession, int, error) {
	where, args := "tenant = ?", []any{tenant}
	if f.DeviceID != "" {
		where, args = where+" AND device_id = ?", append(args, f.DeviceID)
	}
	if f.Open {
		where += " AND ended_at IS NULL"
	}
	return findPage(ctx, db, "SELECT count(*) FROM remote_sessions WHERE "+where,
		`SELECT `+remoteSessionColumns+` FROM remote_sessions WHERE `+where+` ORDER BY started_at DESC, id`, args, f.Page,
		func(sc scanner) (*fleet.RemoteSession, error) { return scanRemoteSession(sc, tenant) })
}

// FindRemoteSession returns one session of a device.
func (db *DB) FindRemoteSession(ctx context.Context, tenant, deviceID, id string) (*fleet.RemoteSession, error) {
	s, err := scanRemoteSession(db.queryRow(ctx, `SELECT `+remoteSessionColumns+` FROM remote_sessions
		WHERE tenant = ? AND device_id = ? AND id = ?`, tenant, deviceID, id), tenant)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fleet.Errorf(fleet.ENOTFOUND, "device %s has no remote session %q", deviceID, id)
	}
	return s, db.classify(err)
}

// pgNowMillis is PostgreSQL's clock in Unix milliseconds: replicas' heartbeats
// are written and judged on it, so that their own clocks need not agree.
const pgNowMillis = "(extract(epoch from clock_timestamp()) * 1000)::bigint"

// BeatRemoteRelay records that the replica at relayURL is alive and the
// byte counts of its open sessions, in one transaction. On SQLite, which
// one process serves, there is nobody to tell of the beat, but the counts
// are kept for a session its replica's next start ends (a crash).
func (db *DB) BeatRemoteRelay(ctx context.Context, relayURL string, silent time.Duration, counts []fleet.RemoteBytes) error {
	if db.dialect != postgres && len(counts) == 0 {
		return nil
	}
	return db.update(ctx, func(ctx context.Context, tx *Tx) error {
		if err := tx.storeRemoteBytes(ctx, relayURL, counts); err != nil {
			return err
		}
		if db.dialect != postgres {
			return nil
		}
		if _, err := tx.exec(ctx, `INSERT INTO remote_relays (relay_url, seen_at) VALUES (?, `+pgNowMillis+`)
			ON CONFLICT (relay_url) DO UPDATE SET seen_at = excluded.seen_at`, relayURL); err != nil {
			return err
		}
		// A replica gone for good (a pod replaced) leaves a row; once its
		// sessions are ended nothing needs it.
		_, err := tx.exec(ctx, `DELETE FROM remote_relays r WHERE r.seen_at < `+pgNowMillis+` - ?
			AND NOT EXISTS (SELECT 1 FROM remote_sessions s WHERE s.relay_url = r.relay_url AND s.ended_at IS NULL)`, silent.Milliseconds())
		return err
	})
}

// remoteBytesBatch is how many sessions' counts one statement stores on
// SQLite (three parameters each; its limit is 32,766).
const remoteBytesBatch = 500

// storeRemoteBytes writes the counts of relayURL's open sessions, with
// one statement (a batch of them on SQLite): an ended session, or one
// another replica relays, is left as it is.
func (tx *Tx) storeRemoteBytes(ctx context.Context, relayURL string, counts []fleet.RemoteBytes) error {
	cols, types := []string{"id", "to_device", "from_device"}, []string{"TEXT", "BIGINT", "BIGINT"}
	const set = `UPDATE remote_sessions SET bytes_to_device = v.to_device, bytes_from_device = v.from_device FROM `
	const where = ` WHERE remote_sessions.id = v.id AND remote_sessions.relay_url = ? AND remote_sessions.ended_at IS NULL`
	for len(counts) > 0 {
		batch := counts
		if tx.db.dialect != postgres {
			batch = counts[:min(len(counts), remoteBytesBatch)]
		}
		counts = counts[len(batch):]
		args := make([]any, 0, 3*len(batch)+1)
		for _, c := range batch {
			args = append(args, c.ID, c.ToDevice, c.FromDevice)
		}
		var err error
		if tx.db.dialect == postgres {
			from, arrays := unnestTable("v", cols, types, args)
			_, err = tx.exec(ctx, set+from+where, append(arrays, relayURL)...)
		} else {
			_, err = tx.exec(ctx, set+tx.db.dialect.valuesTable("v", cols, types, len(batch))+where, append(args, relayURL)...)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// FindLostRemoteSessions lists the open sessions whose replica is gone:
// one that started again (q.RelayURL) or one silent for q.Silent.
func (db *DB) FindLostRemoteSessions(ctx context.Context, q fleet.RemoteLost) ([]*fleet.RemoteSession, error) {
	var where string
	var args []any
	switch {
	case q.RelayURL != "" && db.dialect == postgres:
		where, args = "s.relay_url = ? AND s.started_at < ?", []any{q.RelayURL, millis(q.Before)}
	case q.RelayURL != "":
		where, args = "s.started_at < ?", []any{millis(q.Before)}
	case db.dialect == postgres:
		where, args = `s.relay_url IN (SELECT relay_url FROM remote_relays WHERE seen_at < `+pgNowMillis+` - ?)`, []any{q.Silent.Milliseconds()}
	default:
		return nil, nil
	}
	if q.Tenant != "" {
		where, args = where+" AND s.tenant = ?", append(args, q.Tenant)
	}
	if q.ID != "" {
		where, args = where+" AND s.id = ?", append(args, q.ID)
	}
	rows, err := db.query(ctx, `SELECT s.tenant, s.relay_url, `+remoteSessionColumns+` FROM remote_sessions s
		WHERE s.ended_at IS NULL AND `+where+` ORDER BY s.started_at`, args...)
	if err != nil {
		return nil, db.classify(err)
	}
	defer rows.Close()
	var lost []*fleet.RemoteSession
	for rows.Next() {
		var tenant, relay string
		s, err := scanRemoteSession(leading{rows, []any{&tenant, &relay}}, "")
		if err != nil {
			return nil, err
		}
		s.Tenant, s.RelayURL = tenant, relay
		lost = append(lost, s)
	}
	return lost, db.classify(rows.Err())
}

// leading scans columns before those of another scanner's.
type leading struct {
	sc    scanner
	first []any
}

func (p leading) Scan(dest ...any) error { return p.sc.Scan(append(p.first, dest...)...) }

// ForgetRemoteRecording clears session id's recording, whose retention
// passed: fleetd's own housekeeping, not audited.
func (db *DB) ForgetRemoteRecording(ctx context.Context, tenant, id string) error {
	return db.update(ctx, func(ctx context.Context, tx *Tx) error {
		_, err := tx.exec(ctx, "UPDATE remote_sessions SET recording_size = NULL WHERE tenant = ? AND id = ?", tenant, id)
		return err
	})
}

// remoteSettings are a tenant's choices about remote sessions.
var remoteSettings = tenantSettings[fleet.RemoteSettings]{
	columns:  []string{"remote_recording"},
	fields:   func(s *fleet.RemoteSettings) []any { return []any{&s.Recording} },
	audit:    "tenant.remote_settings",
	resource: "remote-settings",
}

// RemoteSettings reads a tenant's choices about remote sessions.
func (db *DB) RemoteSettings(ctx context.Context, tenant string) (fleet.RemoteSettings, error) {
	return remoteSettings.read(ctx, db, tenant)
}

// SetRemoteSettings replaces a tenant's choices about remote sessions,
// audited with the previous ones. Sessions open already keep what they
// opened with.
func (db *DB) SetRemoteSettings(ctx context.Context, tenant string, s fleet.RemoteSettings) error {
	return remoteSettings.write(ctx, db, tenant, s)
}

// FindOpenRemoteSession returns an open session with its relay URL.
func (db *DB) FindOpenRemoteSession(ctx context.Context, tenant, id string) (*fleet.RemoteSession, error) {
	s := fleet.RemoteSession{ID: id, Tenant: tenant}
	var started int64
	err := db.queryRow(ctx, `SELECT device_id, kind, target, key_name, user_name, user_email, started_at, relay_url, recorded
		FROM remote_sessions WHERE id = ? AND tenant = ? AND ended_at IS NULL`, id, tenant).
		Scan(&s.DeviceID, &s.Kind, &s.Target, &s.KeyName, &s.UserName, &s.UserEmail, &started, &s.RelayURL, &s.Recorded)
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
