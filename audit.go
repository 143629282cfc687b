package fleet

import (
	"context"
	"time"
)

// AuditLog records one change made through the API, written in the same
// transaction as the change. Details never hold a secret.
type AuditLog struct {
	ID        int64          `json:"id"`
	Actor     string         `json:"actor"`
	Role      Role           `json:"role"`
	UserEmail string         `json:"user_email,omitempty"`
	Action    string         `json:"action"`
	Target    string         `json:"target"`
	Details   map[string]any `json:"details"`
	RequestID string         `json:"request_id"`
	CreatedAt time.Time      `json:"created_at"`
}

// AuditFilter selects audit logs: Actor exactly; Action exactly or, for
// a kind such as "apikey", every action of it ("apikey.create",
// "apikey.delete"); and a time range [Since, Until).
type AuditFilter struct {
	Actor  string
	Action string
	Since  *time.Time
	Until  *time.Time
	Page
}

// AuditService reads the audit log.
type AuditService interface {
	FindAuditLogs(ctx context.Context, tenant string, f AuditFilter) ([]*AuditLog, int, error)
}

type requestIDKey struct{}

// NewContextWithRequestID returns ctx carrying the request id, which audit
// logs and log lines share.
func NewContextWithRequestID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, requestIDKey{}, id)
}

// RequestIDFromContext returns the request id, or "".
func RequestIDFromContext(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey{}).(string)
	return id
}
