package fleet

import (
	"context"
	"time"
)

// The kinds of remote session (docs/agent.md, Remote access).
const (
	RemoteShell   = "shell"   // a shell on a pty, or one command and its exit status
	RemoteForward = "forward" // a TCP connection to a port on the device
	RemoteGet     = "get"     // a file from the device
	RemotePut     = "put"     // a file to the device
)

// RemoteSession is an operator's session with a device through
// fleetd-agent: the device dials a WebSocket back to fleetd, which joins it
// to the operator's. The row records who, what and how much; the bytes
// themselves never touch the database.
type RemoteSession struct {
	ID        string     `json:"id"`
	Tenant    string     `json:"-"`
	DeviceID  string     `json:"device_id"`
	Kind      string     `json:"kind"`
	Target    string     `json:"target"` // the command, the port or the path; "" for an interactive shell
	KeyName   string     `json:"key_name,omitempty"`
	UserName  string     `json:"user_name"`
	UserEmail string     `json:"user_email,omitempty"`
	StartedAt time.Time  `json:"started_at"`
	EndedAt   *time.Time `json:"ended_at"`
	// BytesToDevice and BytesFromDevice count the data relayed each way.
	BytesToDevice   int64  `json:"bytes_to_device"`
	BytesFromDevice int64  `json:"bytes_from_device"`
	EndReason       string `json:"end_reason"`
	// RelayURL is the replica that relays the session, as other replicas
	// reach it: a leg that lands elsewhere is proxied there.
	RelayURL string `json:"-"`
}

// RemoteSessionService stores remote sessions.
type RemoteSessionService interface {
	// CreateRemoteSession stores s (audited) and fills in s.ID and
	// s.StartedAt.
	CreateRemoteSession(ctx context.Context, s *RemoteSession) error
	// EndRemoteSession records s's end, bytes and reason (audited).
	EndRemoteSession(ctx context.Context, s *RemoteSession) error
	// FindRemoteSessions lists a device's sessions, or the tenant's when
	// deviceID is "", newest first.
	FindRemoteSessions(ctx context.Context, tenant, deviceID string, p Page) ([]*RemoteSession, int, error)
	// StopRemoteSession asks whichever replica relays the open session id
	// to end it (audited): ENOTFOUND for no such session, ECONFLICT for
	// one that has ended. by names who asked, for the end's reason.
	StopRemoteSession(ctx context.Context, tenant, id, by string) error
	// FindOpenRemoteSession returns the open session id (ENOTFOUND when
	// there is none), with its RelayURL.
	FindOpenRemoteSession(ctx context.Context, tenant, id string) (*RemoteSession, error)
}
