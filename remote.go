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
// fleetd-agent: the device dials a leg back to fleetd (a stream or a WebSocket), which joins it
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
	// Recording is the path of the session's output recording (asciicast
	// v2), once it is stored; absent for a session not recorded.
	Recording     string `json:"recording,omitempty"`
	RecordingSize int64  `json:"recording_size,omitempty"`
	// Recorded says the session's output is recorded: the tenant's
	// RemoteSettings.Recording when it opened, for a shell.
	Recorded bool `json:"recorded"`
	// RelayURL is the replica that relays the session, as other replicas
	// reach it: a leg that lands elsewhere is proxied there.
	RelayURL string `json:"-"`
}

// RemoteOpen counts the open sessions, over every replica, that a new
// session would join: its person's in the tenant and its device's.
type RemoteOpen struct{ Person, Device int }

// RemoteLost chooses open sessions whose relaying replica is gone
// (docs/agent.md, Several replicas).
type RemoteLost struct {
	// RelayURL and Before: the sessions that replica opened before it
	// started again (on SQLite, which one process serves, every session
	// opened before Before).
	RelayURL string
	Before   time.Time
	// Silent, without RelayURL: the sessions whose replica's heartbeat is
	// older than this (on PostgreSQL; none on SQLite). A replica that
	// never beat (one older than heartbeats) is never lost this way.
	Silent time.Duration
	// Tenant and ID narrow it to a tenant's, or to one session.
	Tenant, ID string
}

// RemoteBytes are the bytes an open session has relayed so far, each
// way, as its replica stores them with its heartbeat.
type RemoteBytes struct {
	ID                   string
	ToDevice, FromDevice int64
}

// RemoteSettings are a tenant's choices about remote sessions
// (docs/agent.md, Recording).
type RemoteSettings struct {
	// Recording records the output of shell sessions (asciicast v2) into
	// the blob store.
	Recording bool `json:"recording"`
}

// RemoteSessionService stores remote sessions.
// RemoteSessionFilter chooses the sessions a list shows.
type RemoteSessionFilter struct {
	DeviceID string // one device's; "" for every device of the tenant
	Open     bool   // only those not ended
	Page
}

type RemoteSessionService interface {
	// CreateRemoteSession stores s (audited) and fills in s.ID,
	// s.StartedAt and s.Recorded, unless admit refuses what is open
	// already: sessions started since since and not ended, whose replica
	// has been heard from within silent (BeatRemoteRelay), counted in the
	// same transaction as the insert, so that replicas enforce one cap.
	CreateRemoteSession(ctx context.Context, s *RemoteSession, since time.Time, silent time.Duration, admit func(RemoteOpen) error) error
	// EndRemoteSession records s's end, bytes, reason and recording size
	// (audited).
	EndRemoteSession(ctx context.Context, s *RemoteSession) error
	// FindRemoteSessions lists the tenant's sessions that f chooses,
	// newest first.
	FindRemoteSessions(ctx context.Context, tenant string, f RemoteSessionFilter) ([]*RemoteSession, int, error)
	// StopRemoteSession asks whichever replica relays the open session id
	// to end it (audited): ENOTFOUND for no such session, ECONFLICT for
	// one that has ended. by names who asked, for the end's reason.
	StopRemoteSession(ctx context.Context, tenant, id, by string) error
	// FindRemoteSession returns one session of a device.
	FindRemoteSession(ctx context.Context, tenant, deviceID, id string) (*RemoteSession, error)
	// FindLostRemoteSessions lists the open sessions whose replica is
	// gone, as q chooses, with their Tenant and RelayURL.
	FindLostRemoteSessions(ctx context.Context, q RemoteLost) ([]*RemoteSession, error)
	// BeatRemoteRelay records that the replica at relayURL is alive, on
	// the database's clock, and forgets replicas silent for longer than
	// silent that relay no open session. In the same write it stores the
	// byte counts of its open sessions that counts names (those that
	// changed since its last beat), so that a session ended for it once it
	// is lost records what was counted up to then; an ended session keeps
	// what its end recorded.
	BeatRemoteRelay(ctx context.Context, relayURL string, silent time.Duration, counts []RemoteBytes) error
	// ForgetRemoteRecording records that session id no longer has a
	// recording (its retention passed); a session gone is no error.
	ForgetRemoteRecording(ctx context.Context, tenant, id string) error
	// RemoteSettings reads the tenant's choices about remote sessions.
	RemoteSettings(ctx context.Context, tenant string) (RemoteSettings, error)
	// SetRemoteSettings replaces them, audited with the previous ones.
	SetRemoteSettings(ctx context.Context, tenant string, s RemoteSettings) error
	// FindOpenRemoteSession returns the open session id (ENOTFOUND when
	// there is none), with its RelayURL.
	FindOpenRemoteSession(ctx context.Context, tenant, id string) (*RemoteSession, error)
}
