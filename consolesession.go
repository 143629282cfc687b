package fleet

import (
	"context"
	"time"
)

// ConsoleSession is a person signed in to the web console (docs/console.md).
// The browser's cookie carries a secret token; the session is valid while
// its row exists, so signing out, an admin's "end" and the deletion of the
// key it signed in with end it on every replica from the next request.
type ConsoleSession struct {
	// ID is the SHA-256 of the cookie's token: pages and forms name a
	// session by it, and it cannot be turned back into a cookie.
	ID        string
	Tenant    string
	KeyName   string // the API key it signed in with; "" for single sign-on
	UserName  string
	UserEmail string
	Role      Role
	CreatedAt time.Time
	ExpiresAt time.Time
}

// ConsoleSessionService stores the console's sessions.
type ConsoleSessionService interface {
	// CreateConsoleSession stores s, fills in s.ID and s.CreatedAt and
	// returns the token for the cookie.
	CreateConsoleSession(ctx context.Context, s *ConsoleSession) (string, error)
	// ConsoleSessionValid reports whether the session of token is open in
	// tenant: not ended and not expired.
	ConsoleSessionValid(ctx context.Context, tenant, token string) (bool, error)
	// FindConsoleSessions lists a tenant's open sessions, newest first.
	FindConsoleSessions(ctx context.Context, tenant string, p Page) ([]*ConsoleSession, int, error)
	// EndConsoleSession ends one session (ENOTFOUND when it is not open).
	// With all, it ends every open session of the same person: the same
	// key, or the same single sign-on user.
	EndConsoleSession(ctx context.Context, tenant, id string, all bool) (int, error)
}
