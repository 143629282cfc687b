package sqlstore

import (
	"context"
	"strings"

	"github.com/fleetd/fleet"
)

var _ fleet.AuditService = (*DB)(nil)

// audit records a change in the transaction that makes it. The actor and
// request id come from ctx; changes made from the command line have the
// actor "cli".
func (tx *Tx) audit(ctx context.Context, tenant, action, target string, details map[string]any) error {
	actor, role, email := "cli", string(fleet.RoleAdmin), ""
	if a := fleet.ActorFromContext(ctx); a != nil {
		actor, role, email = a.UserName, string(a.Role), a.UserEmail
	}
	if details == nil {
		details = map[string]any{}
	}
	b, err := fleet.MarshalCanonical(details)
	if err != nil {
		return err
	}
	_, err = tx.exec(ctx, `INSERT INTO audit_logs (tenant, actor, role, user_email, action, target, details, request_id, created_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		tenant, actor, role, email, action, target, string(b), fleet.RequestIDFromContext(ctx), millis(tx.now))
	return err
}

// FindAuditLogs lists a tenant's audit logs, newest first.
func (db *DB) FindAuditLogs(ctx context.Context, tenant string, f fleet.AuditFilter) ([]*fleet.AuditLog, int, error) {
	where := []string{"tenant = ?"}
	args := []any{tenant}
	if f.Actor != "" {
		where = append(where, "actor = ?")
		args = append(args, f.Actor)
	}
	if f.Action != "" {
		// The action or its kind: "apikey" is "apikey.create" and the
		// rest, compared as a prefix without LIKE's wildcards (_ is one).
		where = append(where, "(action = ? OR substr(action, 1, ?) = ?)")
		args = append(args, f.Action, len(f.Action)+1, f.Action+".")
	}
	if f.Since != nil {
		where = append(where, "created_at >= ?")
		args = append(args, millis(*f.Since))
	}
	if f.Until != nil {
		where = append(where, "created_at < ?")
		args = append(args, millis(*f.Until))
	}
	cond := strings.Join(where, " AND ")
	return findPage(ctx, db, "SELECT count(*) FROM audit_logs WHERE "+cond,
		`SELECT id, actor, role, user_email, action, target, details, request_id, created_at
		FROM audit_logs WHERE `+cond+` ORDER BY created_at DESC, id DESC`, args, f.Page, scanAuditLog)
}

func scanAuditLog(s scanner) (*fleet.AuditLog, error) {
	var l fleet.AuditLog
	var details string
	var created int64
	if err := s.Scan(&l.ID, &l.Actor, &l.Role, &l.UserEmail, &l.Action, &l.Target, &details, &l.RequestID, &created); err != nil {
		return nil, err
	}
	v, err := decodeCanonical(details)
	if err != nil {
		return nil, err
	}
	l.Details, _ = v.(map[string]any)
	l.CreatedAt = fromMillis(created)
	return &l, nil
}
