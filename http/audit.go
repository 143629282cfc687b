package fleethttp

import (
	"net/http"

	"github.com/fleetd/fleet"
)

type auditLogList struct {
	AuditLogs []*fleet.AuditLog `json:"audit_logs"`
	Count     int               `json:"count"`
}

func (s *Server) handleListAuditLogs(w http.ResponseWriter, r *http.Request) error {
	q := newQuery(r)
	f := fleet.AuditFilter{Actor: q.String("actor"), Action: q.String("action"), Since: q.Time("since"), Until: q.Time("until"), Page: q.Page()}
	if err := q.Err(); err != nil {
		return err
	}
	logs, n, err := s.Audit.FindAuditLogs(r.Context(), tenantOf(r), f)
	if err != nil {
		return err
	}
	s.respond(w, r, http.StatusOK, auditLogList{AuditLogs: logs, Count: n})
	return nil
}
