package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/fleetd/fleet"
)

var _ fleet.ConsoleSessionService = (*DB)(nil)

// A console session is checked on every console request by one read of
// its row by primary key: 9 µs on SQLite and 66 µs on PostgreSQL over
// loopback (BenchmarkConsoleSessionValid), against the 100 ms a console
// page may take (BENCHMARKS.md). So nothing is cached, and an ended
// session is refused by every replica from its next request.

// CreateConsoleSession stores s and returns its token. The tenant's expired
// sessions go in the same transaction, so the table holds open sessions and
// those of at most one TTL.
func (db *DB) CreateConsoleSession(ctx context.Context, s *fleet.ConsoleSession) (string, error) {
	token := fleet.NewSecret("")
	s.ID = fleet.HashSecret(token)
	err := db.update(ctx, func(ctx context.Context, tx *Tx) error {
		s.CreatedAt = tx.now.Truncate(time.Millisecond)
		if _, err := tx.exec(ctx, "DELETE FROM console_sessions WHERE tenant = ? AND expires_at <= ?", s.Tenant, millis(tx.now)); err != nil {
			return err
		}
		if _, err := tx.exec(ctx, `INSERT INTO console_sessions (id, tenant, key_name, user_name, user_email, role, created_at, expires_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
			s.ID, s.Tenant, s.KeyName, s.UserName, s.UserEmail, string(s.Role), millis(s.CreatedAt), millis(s.ExpiresAt)); err != nil {
			return err
		}
		return tx.audit(ctx, s.Tenant, "console.session.start", "console-sessions/"+s.ID, sessionDetails(s))
	})
	if err != nil {
		return "", err
	}
	return token, nil
}

func sessionDetails(s *fleet.ConsoleSession) map[string]any {
	d := map[string]any{"user_name": s.UserName, "role": s.Role}
	if s.KeyName != "" {
		d["key_name"] = s.KeyName
	}
	if s.UserEmail != "" {
		d["user_email"] = s.UserEmail
	}
	return d
}

// ConsoleSessionValid reads the session's row.
func (db *DB) ConsoleSessionValid(ctx context.Context, tenant, token string) (bool, error) {
	var expires int64
	err := db.queryRow(ctx, "SELECT expires_at FROM console_sessions WHERE id = ? AND tenant = ?", fleet.HashSecret(token), tenant).Scan(&expires)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	} else if err != nil {
		return false, db.classify(err)
	}
	return db.now().UnixMilli() < expires, nil
}

// FindConsoleSessions lists a tenant's open sessions, newest first.
func (db *DB) FindConsoleSessions(ctx context.Context, tenant string, p fleet.Page) ([]*fleet.ConsoleSession, int, error) {
	now := millis(db.now())
	return findPage(ctx, db, "SELECT count(*) FROM console_sessions WHERE tenant = ? AND expires_at > ?",
		`SELECT id, key_name, user_name, user_email, role, created_at, expires_at FROM console_sessions
		WHERE tenant = ? AND expires_at > ? ORDER BY created_at DESC, id`, []any{tenant, now}, p,
		func(sc scanner) (*fleet.ConsoleSession, error) {
			s := fleet.ConsoleSession{Tenant: tenant}
			var created, expires int64
			if err := sc.Scan(&s.ID, &s.KeyName, &s.UserName, &s.UserEmail, &s.Role, &created, &expires); err != nil {
				return nil, err
			}
			s.CreatedAt, s.ExpiresAt = fromMillis(created), fromMillis(expires)
			return &s, nil
		})
}

// EndConsoleSession deletes the session's row, or with all the rows of
// every session of the same key or single sign-on user.
func (db *DB) EndConsoleSession(ctx context.Context, tenant, id string, all bool) (int, error) {
	var n int
	err := db.update(ctx, func(ctx context.Context, tx *Tx) error {
		s := fleet.ConsoleSession{ID: id, Tenant: tenant}
		err := tx.queryRow(ctx, "SELECT key_name, user_name, user_email, role FROM console_sessions WHERE id = ? AND tenant = ? AND expires_at > ?",
			id, tenant, millis(tx.now)).Scan(&s.KeyName, &s.UserName, &s.UserEmail, &s.Role)
		if errors.Is(err, sql.ErrNoRows) {
			return fleet.Errorf(fleet.ENOTFOUND, "no open console session %q", id)
		} else if err != nil {
			return err
		}
		ids := []string{id}
		if all {
			if ids, err = tx.consoleSessionsOf(ctx, &s); err != nil {
				return err
			}
		}
		for _, id := range ids {
			if _, err := tx.exec(ctx, "DELETE FROM console_sessions WHERE id = ? AND tenant = ?", id, tenant); err != nil {
				return err
			}
			// What the session opened that outlives a request (a remote
			// session) ends with it, on every replica.
			if err := tx.changed(ctx, fleet.Change{Kind: fleet.ChangeConsoleSession, Tenant: tenant, Key: id}); err != nil {
				return err
			}
		}
		n = len(ids)
		d := sessionDetails(&s)
		d["sessions"] = n
		return tx.audit(ctx, tenant, "console.session.end", "console-sessions/"+id, d)
	})
	return n, err
}

// consoleSessionsOf returns the ids of every session of s's key or single
// sign-on user, expired ones included.
func (tx *Tx) consoleSessionsOf(ctx context.Context, s *fleet.ConsoleSession) ([]string, error) {
	rows, err := tx.query(ctx, "SELECT id FROM console_sessions WHERE tenant = ? AND key_name = ? AND user_name = ? AND user_email = ?",
		s.Tenant, s.KeyName, s.UserName, s.UserEmail)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}
