// Package relay is fleetd's side of remote sessions: it opens a session
// (recorded, capped), asks the device for it with a remote_session action
// (fleet.ActionRemoteSession: the session's id, kind and target), waits
// for the device's leg (a WebSocket or a stream), and relays messages between the two legs
// until one ends, the session idles or outlives its lifetime.
package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/blob"
	"github.com/fleetd/fleet/remote"
)

// Limits bound remote sessions.
type Limits struct {
	PerUser        int           // open sessions of one person (API key or end user) in a tenant; 4
	PerDevice      int           // open sessions of one device; 2
	Idle           time.Duration // a session with no bytes either way this long ends; 10 minutes
	Lifetime       time.Duration // a session ends this long after it started; 8 hours
	ConnectTimeout time.Duration // how long the device has to dial back; 15 seconds
	RecordingMax   int64         // bytes of one session's recording, after which it stops; 64 MiB
	// RecordingRetention is how long a recording is kept; 90 days.
	RecordingRetention time.Duration
	// RecordingFlush is how often what a recording gained goes to the
	// blob store while its session is open (recording.go); 10 seconds.
	RecordingFlush time.Duration
	// ReplicaTimeout is how long a replica may go without a heartbeat
	// before the others end the sessions it relays (heartbeat.go); 30
	// seconds.
	ReplicaTimeout time.Duration
}

// DefaultLimits are the documented defaults.
var DefaultLimits = Limits{PerUser: 4, PerDevice: 2, Idle: 10 * time.Minute, Lifetime: 8 * time.Hour, ConnectTimeout: 15 * time.Second,
	RecordingMax: 64 << 20, RecordingRetention: 90 * 24 * time.Hour, RecordingFlush: 10 * time.Second, ReplicaTimeout: 30 * time.Second}

// Dispatcher sends an action to a device.
type Dispatcher interface {
	DispatchAction(ctx context.Context, tenant string, d *fleet.Dispatch) (*fleet.Action, error)
}

// Hub holds the sessions of this replica.
type Hub struct {
	Sessions fleet.RemoteSessionService
	Actions  Dispatcher
	Limits   Limits
	Logger   *slog.Logger
	Blobs    blob.Store // keeps recordings (recording.go)
	Spool    string     // a directory of this replica's for recordings being made

	relayURL atomic.Pointer[string] // SetRelayURL
	started  time.Time              // when NewHub made it: EndStale ends older sessions
	mu       sync.Mutex
	sessions map[string]*Session // open ones, by id
	stopped  bool                // Close was called (under mu)
	stopping chan struct{}       // closed by Close
	relays   sync.WaitGroup      // Relay calls running

	open    prometheus.Gauge
	refused *prometheus.CounterVec
	bytes   *prometheus.CounterVec
	legs    *prometheus.CounterVec
}

// NewHub returns a hub whose metrics are registered on reg (nil keeps
// them private), keeping recordings in blobs once made in spool.
func NewHub(sessions fleet.RemoteSessionService, actions Dispatcher, blobs blob.Store, spool string, l Limits, log *slog.Logger, reg prometheus.Registerer) *Hub {
	d := DefaultLimits
	if l.PerUser <= 0 {
		l.PerUser = d.PerUser
	}
	if l.PerDevice <= 0 {
		l.PerDevice = d.PerDevice
	}
	if l.Idle <= 0 {
		l.Idle = d.Idle
	}
	if l.Lifetime <= 0 {
		l.Lifetime = d.Lifetime
	}
	if l.ConnectTimeout <= 0 {
		l.ConnectTimeout = d.ConnectTimeout
	}
	if l.RecordingMax <= 0 {
		l.RecordingMax = d.RecordingMax
	}
	if l.RecordingRetention <= 0 {
		l.RecordingRetention = d.RecordingRetention
	}
	if l.RecordingFlush <= 0 {
		l.RecordingFlush = d.RecordingFlush
	}
	if l.ReplicaTimeout <= 0 {
		l.ReplicaTimeout = d.ReplicaTimeout
	}
	h := &Hub{Sessions: sessions, Actions: actions, Blobs: blobs, Spool: spool, Limits: l, Logger: log,
		sessions: map[string]*Session{}, stopping: make(chan struct{}), started: time.Now(),
		open: prometheus.NewGauge(prometheus.GaugeOpts{Name: "fleetd_remote_sessions_open", Help: "Remote sessions open on this replica."}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fleetd_remote_sessions_refused_total",
			Help: "Remote sessions refused by a cap, by which (user, device)."}, []string{"cap"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fleetd_remote_bytes_total",
			Help: "Bytes relayed by remote sessions, by direction (to_device, from_device)."}, []string{"direction"}),
		legs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fleetd_remote_legs_total",
			Help: "Legs of remote sessions joined, by side (operator, device) and protocol (stream, websocket)."}, []string{"side", "protocol"}),
	}
	if reg != nil {
		reg.MustRegister(h.open, h.refused, h.bytes, h.legs)
	}
	return h
}

// SetRelayURL sets this replica's HTTP base as the other replicas reach
// it (--replica-url), recorded on the sessions it opens: a leg of one of
// them that lands on another replica is proxied here (proxy.go).
func (h *Hub) SetRelayURL(u string) { h.relayURL.Store(&u) }

// EndStale ends, recording why, the sessions this replica left open when
// it last stopped without ending them (a crash): those relayed at its
// RelayURL, every one on SQLite, started before this hub. Until then they
// count under the caps, unless another replica found this one silent
// (heartbeat.go). It returns how many, and removes the spool files of
// their recordings: what of them reached the blob store is kept.
func (h *Hub) EndStale(ctx context.Context) (int, error) {
	h.removeSpool()
	// A heartbeat first: a replica that finds this one's last run silent
	// must not take the sessions this run opens for lost.
	if err := h.Sessions.BeatRemoteRelay(ctx, h.RelayURL(), h.Limits.ReplicaTimeout, nil); err != nil {
		return 0, err
	}
	lost, err := h.Sessions.FindLostRemoteSessions(ctx, fleet.RemoteLost{RelayURL: h.RelayURL(), Before: h.started})
	if err != nil {
		return 0, err
	}
	return h.endLost(ctx, lost, "the replica relaying it stopped without ending it")
}

// RelayURL returns what SetRelayURL set, or "".
func (h *Hub) RelayURL() string {
	if u := h.relayURL.Load(); u != nil {
		return *u
	}
	return ""
}

// Session is an open session on this replica.
type Session struct {
	fleet.RemoteSession
	device   chan *remote.Conn // the device's leg, when it dials back
	deadline time.Time         // for both legs to join
	toDevice atomic.Int64
	fromDev  atomic.Int64
	// storedTo and storedFrom are the counts the last heartbeat stored
	// (heartbeat.go; RunHeartbeat's alone).
	storedTo, storedFrom int64
	opener               fleet.Actor // who opened it, for Revoke
	rec                  *recorder   // its output's recording, when it is recorded

	claimed, joined bool // the operator's leg, the device's leg (under Hub.mu)
	done            chan struct{}
	endOnce         sync.Once
	revoked         chan struct{} // closed by Revoke, with revokedFor set
	revokedFor      string
	revokeOnce      sync.Once
}

// Done is closed when the session has ended.
func (s *Session) Done() <-chan struct{} { return s.done }

// OpenedBy reports whether a is the person who opened s.
func OpenedBy(s *fleet.RemoteSession, a *fleet.Actor) bool {
	return s.Tenant == a.Tenant && s.KeyName == a.KeyName && s.UserName == a.UserName && s.UserEmail == a.UserEmail
}

// Open records a session for actor with device and asks the device for
// it. It refuses (ERATELIMITED) a person or a device at its cap, counted
// over every replica in the sessions' store: an open session is a row not
// ended. A row left open by a replica that died counts until the replica
// has been silent for Limits.ReplicaTimeout (heartbeat.go), or, for a
// replica that never beat, until the lifetime has passed since it started,
// which no session outlives.
func (h *Hub) Open(ctx context.Context, actor *fleet.Actor, device, kind, target string) (*Session, error) {
	s := &Session{RemoteSession: fleet.RemoteSession{Tenant: actor.Tenant, DeviceID: device, Kind: kind, Target: target,
		KeyName: actor.KeyName, UserName: actor.UserName, UserEmail: actor.UserEmail, RelayURL: h.RelayURL()},
		device: make(chan *remote.Conn, 1), done: make(chan struct{}), opener: *actor,
		revoked: make(chan struct{})}
	admit := func(open fleet.RemoteOpen) error {
		switch {
		case open.Person >= h.Limits.PerUser:
			h.refused.WithLabelValues("user").Inc()
			return fleet.Errorf(fleet.ERATELIMITED, "you have %d remote sessions open, the most allowed (--remote-max-per-user): end one first", open.Person)
		case open.Device >= h.Limits.PerDevice:
			h.refused.WithLabelValues("device").Inc()
			return fleet.Errorf(fleet.ERATELIMITED, "device %s has %d remote sessions open, the most allowed (--remote-max-per-device): try again when one ends", device, open.Device)
		}
		return nil
	}
	if err := h.Sessions.CreateRemoteSession(ctx, &s.RemoteSession, time.Now().Add(-h.Limits.Lifetime), h.Limits.ReplicaTimeout, admit); err != nil {
		return nil, err
	}
	h.open.Inc()
	if s.Recorded && h.Blobs != nil {
		s.rec = h.record(s)
	}
	s.deadline = time.Now().Add(h.Limits.ConnectTimeout)
	h.mu.Lock()
	h.sessions[s.ID] = s
	h.mu.Unlock()
	time.AfterFunc(h.Limits.ConnectTimeout, func() { h.expire(s) })
	params, _ := json.Marshal(map[string]string{"session_id": s.ID, "kind": kind, "target": target})
	timeout := int64(h.Limits.ConnectTimeout/time.Second) + 1
	if _, err := h.Actions.DispatchAction(ctx, actor.Tenant, &fleet.Dispatch{Action: fleet.ActionRemoteSession, Params: params,
		SearchType: fleet.SearchDefault, DeviceIDs: []string{device}, Timeout: timeout,
		UserName: actor.UserName, UserEmail: actor.UserEmail}); err != nil {
		h.end(s, "the device could not be asked: "+err.Error())
		return nil, err
	}
	return s, nil
}

// Waiting returns the open session of id.
func (h *Hub) Waiting(id string) (*Session, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.sessions[id]
	return s, ok
}

// JoinOperator joins a, the person who opened session id, as its
// operator's leg, once: r must ask for a WebSocket. Refusals are errors
// for the caller to answer; after the upgrade it returns nil, and the
// session is relayed until it ends. The API and the console both serve it.
func (h *Hub) JoinOperator(w http.ResponseWriter, r *http.Request, a *fleet.Actor, id string) error {
	s, ok := h.Waiting(id)
	if !ok || s.Tenant != a.Tenant {
		return fleet.Errorf(fleet.ENOTFOUND, "no remote session %q waits to be joined", id)
	}
	if !OpenedBy(&s.RemoteSession, a) {
		return fleet.Errorf(fleet.EFORBIDDEN, "remote session %s is another person's", s.ID)
	}
	if !remote.IsUpgrade(r) {
		return fleet.Errorf(fleet.EINVALID, "this is a WebSocket or a stream: connect with an Upgrade request")
	}
	if !h.claim(s) {
		return fleet.Errorf(fleet.ECONFLICT, "remote session %s was joined already", s.ID)
	}
	c, err := remote.Upgrade(w, r)
	if err != nil {
		h.end(s, "the operator's leg failed: "+err.Error())
		return nil // Upgrade answered
	}
	h.joined("operator", c)
	// The relay outlives the request: once its handler returns, the HTTP
	// server lets go of what it kept for the request and of this
	// goroutine, which an idle session would hold for nothing.
	go h.Relay(context.WithoutCancel(r.Context()), s, c)
	return nil
}

// claim marks the operator's leg as joined; false if it was already.
func (h *Hub) claim(s *Session) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s.claimed || h.sessions[s.ID] != s {
		return false
	}
	s.claimed = true
	return true
}

// Join hands the device's leg to its session; false if the session has
// one already, or has ended.
func (h *Hub) Join(s *Session, c *remote.Conn) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s.joined || h.sessions[s.ID] != s {
		return false
	}
	s.joined = true
	s.device <- c
	h.joined("device", c)
	return true
}

// joined counts a leg by its side and protocol.
func (h *Hub) joined(side string, c *remote.Conn) {
	p := "websocket"
	if c.Stream() {
		p = "stream"
	}
	h.legs.WithLabelValues(side, p).Inc()
}

// expire ends a session whose operator did not join in time (Relay ends
// one whose device did not).
func (h *Hub) expire(s *Session) {
	h.mu.Lock()
	claimed := s.claimed
	h.mu.Unlock()
	if claimed {
		return
	}
	h.end(s, fmt.Sprintf("the operator did not connect within %s", h.Limits.ConnectTimeout))
}

// Relay joins the operator's leg to the device's once it dials back, and
// relays until the session ends; then it records the end, and only then
// closes the operator's leg: an operator that reads its leg to its close
// (remote.Conn.Finish, as fleetctl does) knows that the session no longer
// counts under the caps (docs/agent.md, Caps). It owns op.
func (h *Hub) Relay(ctx context.Context, s *Session, op *remote.Conn) {
	h.mu.Lock()
	if h.stopped {
		h.mu.Unlock()
		h.end(s, "fleetd is stopping")
		op.Close()
		return
	}
	h.relays.Add(1)
	h.mu.Unlock()
	defer h.relays.Done()
	var dev *remote.Conn
	wait := time.NewTimer(time.Until(s.deadline))
	defer wait.Stop()
	// The operator's leg is read meanwhile: an operator that leaves
	// (fleetctl interrupted) ends the session at once; what it sends is
	// held for the device.
	w := watchOperator(op)
	for {
		select {
		case dev = <-s.device:
		case r := <-w.reads:
			if r.err == nil {
				w.held = append(w.held, r)
				continue
			}
			w.drop()
			h.end(s, closedByOperator+" before the device connected")
			op.Close()
			return
		case <-wait.C:
		case <-ctx.Done():
		case <-h.stopping:
		case <-s.revoked:
			w.drop()
			op.Send(remote.Control{Type: remote.TypeError, Message: "session ended: " + s.revokedFor})
			h.end(s, s.revokedFor)
			op.Close()
			return
		}
		break
	}
	if dev == nil {
		w.drop()
		reason := fmt.Sprintf("the device did not connect back within %s: is fleetd-agent running there, with --remote?", h.Limits.ConnectTimeout)
		op.Send(remote.Control{Type: remote.TypeError, Message: reason})
		h.end(s, reason)
		op.Close()
		return
	}
	reason := h.pipe(ctx, s, op, dev, w)
	dev.Close()
	h.end(s, reason)
	op.Close()
}

// writeFailed is a copier's end when the other side took no more.
const writeFailed = "write failed"

// closedByOperator is a session's end when the operator's leg ended.
const closedByOperator = "closed by the operator"

// pipe copies messages both ways and returns why it stopped. What w
// read of the operator's leg while the device was awaited is passed on
// first.
func (h *Hub) pipe(ctx context.Context, s *Session, op, dev *remote.Conn, w *opWatch) string {
	ended := make(chan string, 3)
	var last atomic.Int64 // unix nanoseconds of the last message either way
	last.Store(time.Now().UnixNano())
	// A recorded session's messages are read into memory, to be
	// recorded; others' bytes may be spliced (remote.Relay).
	recorded := func() bool { return s.rec != nil }
	seen := func(from *remote.Conn, count *atomic.Int64, dir string) func(binary bool, n int, b []byte) {
		bytes := h.bytes.WithLabelValues(dir)
		deviceSide := from == dev
		return func(binary bool, n int, b []byte) {
			last.Store(time.Now().UnixNano())
			if binary {
				count.Add(int64(n))
				bytes.Add(float64(n))
			}
			if s.rec != nil {
				s.rec.message(deviceSide, binary, b)
			}
		}
	}
	endOf := func(err error, closedBy string) string {
		var wf *remote.WriteError
		switch {
		case errors.As(err, &wf):
			return writeFailed
		case remote.Closed(err):
			return closedBy
		default:
			return closedBy + ": " + err.Error()
		}
	}
	toDevice := seen(op, &s.toDevice, "to_device")
	pass := func(binary bool, b []byte) error {
		if err := dev.WriteRaw(binary, b); err != nil {
			return err
		}
		toDevice(binary, len(b), b)
		return nil
	}
	// What the operator sent while the device was awaited is passed on
	// first, then what the watch's reader read before it stopped; the
	// leg is relayed from there.
	if err := w.handOver(pass); err != nil {
		ended <- writeFailed
	} else {
		go func() {
			err := w.rest(pass)
			if err == nil {
				err = remote.Relay(dev, op, recorded, toDevice)
			}
			ended <- endOf(err, closedByOperator)
		}()
	}
	go func() {
		ended <- endOf(remote.Relay(op, dev, recorded, seen(dev, &s.fromDev, "from_device")), "closed by the device")
	}()
	lifetime := time.NewTimer(h.Limits.Lifetime)
	defer lifetime.Stop()
	idle := time.NewTimer(h.Limits.Idle)
	defer idle.Stop()
	for {
		select {
		case r := <-ended:
			if r != writeFailed {
				return r
			}
			// The other side is closing: its last messages (an error
			// saying why) are still to be relayed, and its reader ends
			// with its reason.
			select {
			case r = <-ended:
				return r
			case <-time.After(time.Second):
				return "a side stopped reading"
			}
		case <-lifetime.C:
			return fmt.Sprintf("the session reached its maximum lifetime of %s", h.Limits.Lifetime)
		case <-idle.C:
			quiet := time.Since(time.Unix(0, last.Load()))
			if quiet >= h.Limits.Idle {
				msg := fmt.Sprintf("idle for %s", h.Limits.Idle)
				op.Send(remote.Control{Type: remote.TypeError, Message: "session ended: " + msg})
				return msg
			}
			idle.Reset(h.Limits.Idle - quiet)
		case <-ctx.Done():
			return "fleetd is stopping"
		case <-h.stopping:
			op.Send(remote.Control{Type: remote.TypeError, Message: "session ended: fleetd is stopping"})
			return "fleetd is stopping"
		case <-s.revoked:
			op.Send(remote.Control{Type: remote.TypeError, Message: "session ended: " + s.revokedFor})
			return s.revokedFor
		}
	}
}

// Revoke ends the open sessions that c takes the right from: those of a
// deleted device, or one whose credentials were replaced; those opened
// with a deleted API key, through an ended console session, or by an end
// user when the tenant's sign-in settings change. Each replica hears every
// change (sqlstore.DB.Listen), so a session ends wherever it is relayed;
// the reason is recorded on it and told to the operator.
func (h *Hub) Revoke(c fleet.Change) {
	h.mu.Lock()
	var hit []*Session
	for _, s := range h.sessions {
		if s.Tenant == c.Tenant && revokes(c, s) != "" {
			hit = append(hit, s)
		}
	}
	h.mu.Unlock()
	for _, s := range hit {
		h.revoke(s, revokes(c, s))
	}
}

// revokes returns why c ends s, or "".
func revokes(c fleet.Change, s *Session) string {
	a := &s.opener
	switch {
	case c.Kind == fleet.ChangeDeviceDelete && c.Key == s.DeviceID:
		return "the device was deleted"
	case c.Kind == fleet.ChangeDeviceCredentials && c.Key == s.DeviceID:
		return "the device's credentials were replaced"
	case c.Kind == fleet.ChangeAPIKey && a.KeyHash != "" && c.Key == a.KeyHash:
		return fmt.Sprintf("API key %q, which opened it, was deleted", a.KeyName)
	case c.Kind == fleet.ChangeConsoleSession && a.ConsoleSession != "" && c.Key == a.ConsoleSession:
		return "the console session that opened it ended"
	case c.Kind == fleet.ChangeTenantAuth && a.KeyName == "":
		return "the tenant's sign-in settings changed"
	case c.Kind == fleet.ChangeRemoteSessionStop:
		if id, by, _ := strings.Cut(c.Key, " "); id == s.ID {
			return "ended by " + by
		}
	}
	return ""
}

// revoke ends s for reason: through its relay if the operator joined,
// else at once.
func (h *Hub) revoke(s *Session, reason string) {
	s.revokeOnce.Do(func() {
		s.revokedFor = reason
		close(s.revoked)
	})
	h.mu.Lock()
	claimed := s.claimed
	h.mu.Unlock()
	if !claimed {
		h.end(s, reason)
	}
}

// Close ends every session being relayed, telling the operators why, and
// returns once their ends are recorded. Sessions opened after it end at
// once.
func (h *Hub) Close() {
	h.mu.Lock()
	if !h.stopped {
		h.stopped = true
		close(h.stopping)
	}
	waiting := make([]*Session, 0, len(h.sessions))
	for _, s := range h.sessions {
		if !s.claimed {
			waiting = append(waiting, s)
		}
	}
	h.mu.Unlock()
	for _, s := range waiting {
		h.end(s, "fleetd is stopping")
	}
	h.relays.Wait()
}

// endPause is waited before a session's end is recorded: none, but in
// tests that widen the moment between the legs' end and the end's record
// (SetEndPause, export_test.go).
var endPause atomic.Int64

// end records the session's end, once, which frees its places under the
// caps. A device's leg that joined a session nobody relays is closed.
func (h *Hub) end(s *Session, reason string) {
	s.endOnce.Do(func() { h.ended(s, reason) })
}

func (h *Hub) ended(s *Session, reason string) {
	h.mu.Lock()
	delete(h.sessions, s.ID)
	h.mu.Unlock()
	select {
	case dev := <-s.device:
		dev.Send(remote.Control{Type: remote.TypeError, Message: "session ended: " + reason})
		dev.Close()
	default:
	}
	close(s.done)
	s.BytesToDevice, s.BytesFromDevice, s.EndReason = s.toDevice.Load(), s.fromDev.Load(), reason
	if s.rec != nil {
		s.RecordingSize = s.rec.finish(h, s)
	}
	if d := endPause.Load(); d > 0 {
		time.Sleep(time.Duration(d))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.Sessions.EndRemoteSession(ctx, &s.RemoteSession); err != nil && h.Logger != nil {
		h.Logger.Error("a remote session's end could not be recorded", "session", s.ID, "err", err)
	}
	h.open.Dec()
}
