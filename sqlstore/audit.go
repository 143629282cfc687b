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
	return tx.auditMany(ctx, tenant, []auditEntry{{action: action, target: target, details: details}})
}

// auditEntry is one change to record.
type auditEntry struct {
	action, target string
	details        map[string]any
	// by is the context of the request that made the change, whose actor
	// and request id are recorded; nil is auditMany's. A batch of shadow
	// writes records the changes of several requests in one statement.
	by context.Context
}

// auditChunk is how many records one statement inserts: 9 parameters a
// row, within both databases' limits.
const auditChunk = 500

// auditMany records changes made in one transaction, as audit does each,
// a chunk a statement: a change to ten thousand devices is not ten
// thousand round trips. On PostgreSQL the statement takes a column's
// values as an array (unnestTable), so that it has one text whatever the
// number of records, prepared once per connection.
func (tx *Tx) auditMany(ctx context.Context, tenant string, entries []auditEntry) error {
	now := millis(tx.now)
	cols := []string{"actor", "role", "user_email", "action", "target", "details", "request_id"}
	for start := 0; start < len(entries); start += auditChunk {
		chunk := entries[start:min(start+auditChunk, len(entries))]
		args := make([]any, 0, len(cols)*len(chunk))
		for _, e := range chunk {
			by := e.by
			if by == nil {
				by = ctx
			}
			actor, role, email := "cli", string(fleet.RoleAdmin), ""
			if a := fleet.ActorFromContext(by); a != nil {
				actor, role, email = a.UserName, string(a.Role), a.UserEmail
			}
			details := e.details
			if details == nil {
				details = map[string]any{}
			}
			b, err := fleet.MarshalCanonical(details)
			if err != nil {
				return err
			}
			args = append(args, actor, role, email, e.action, e.target, string(b), fleet.RequestIDFromContext(by))
		}
		const insert = "INSERT INTO audit_logs (tenant, actor, role, user_email, action, target, details, request_id, created_at) "
		var err error
		if tx.db.dialect == postgres {
			table, arrays := unnestTable("u", cols, []string{"TEXT", "TEXT", "TEXT", "TEXT", "TEXT", "TEXT", "TEXT"}, args)
			_, err = tx.exec(ctx, insert+"SELECT CAST(? AS TEXT), u.*, CAST(? AS BIGINT) FROM "+table, append([]any{tenant, now}, arrays...)...)
		} else {
			values := make([]any, 0, len(args)+2*len(chunk))
			for r := range chunk {
				values = append(append(append(values, tenant), args[r*len(cols):(r+1)*len(cols)]...), now)
			}
			_, err = tx.exec(ctx, insert+"VALUES "+strings.TrimSuffix(strings.Repeat("(?, ?, ?, ?, ?, ?, ?, ?, ?), ", len(chunk)), ", "), values...)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// FindAuditLogs lists a tenant's audit logs, newest first.
func (db *DB) FindAuditLogs(ctx context.Context, tenant string, f fleet.AuditFilter) ([]*fleet.AuditLog, int, error) {
	count, list, args := auditQueries(tenant, f)
	return findPage(ctx, db, count, list, args, f.Page, scanAuditLog)
}

// auditQueries are FindAuditLogs' count and page queries (without the
// page's LIMIT) with their arguments.
func auditQueries(tenant string, f fleet.AuditFilter) (count, list string, args []any) {
	where := []string{"tenant = ?"}
	args = []any{tenant}
	if f.Actor != "" {
		where = append(where, "actor = ?")
		args = append(args, f.Actor)
	}
	if f.Action != "" {
		// The action or its kind: "apikey" is "apikey.create" and the
		// rest, "tenant.auth" is "tenant.auth.update". The kind, the
		// action up to its first dot (migration 0020), is indexed; a
		// longer prefix is compared without LIKE's wildcards (_ is one).
		kind, _, dotted := strings.Cut(f.Action, ".")
		where = append(where, "action_kind = ?")
		args = append(args, kind)
		if dotted {
			where = append(where, "(action = ? OR substr(action, 1, ?) = ?)")
			args = append(args, f.Action, len(f.Action)+1, f.Action+".")
		}
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
	return "SELECT count(*) FROM audit_logs WHERE " + cond,
		`SELECT id, actor, role, user_email, action, target, details, request_id, created_at
		FROM audit_logs WHERE ` + cond + ` ORDER BY created_at DESC, id DESC`, args
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
