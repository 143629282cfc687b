// Package broker is the MQTT broker embedded in fleetd (Server): it speaks
// MQTT 3.1, 3.1.1 and 5.0 to devices on the topics of package mqtt and does
// only what devices need, which keeps a connection in a few kilobytes.
package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/mqtt"
	"github.com/fleetd/fleet/ratelimit"
)

// Server is the MQTT broker embedded in fleetd. Devices connect to it; fleetd
// reaches them through SendAction and hears from them through its Handler.
//
// It is a broker for devices and nothing more: each device may subscribe to
// its own actions topic and publish on its own status and stream topics, so
// there is no topic tree, no retained message, no session that outlives its
// connection and no fan-out. A connection is one goroutine that reads and
// handles its packets in order; whoever writes to it (that goroutine's
// acknowledgements, SendAction) writes directly under the connection's lock.
// A connection silent for ParkAfter parks: its goroutine ends and a poller
// starts another when the device sends again (park.go). That keeps an idle
// device in about 3 KB, where a general broker's two goroutines and queues
// per connection cost tens of kilobytes.
type Server struct {
	cfg Config
	h   mqtt.Handler
	log *slog.Logger

	lns    []*listener     // the plain listener, then the TLS one, as configured
	gate   *gate           // caps connections across both
	ctx    context.Context // of Handler calls; cancelled when Close gives up waiting
	cancel context.CancelFunc
	// publishCtx is the context publishes are handled in, shared by those
	// of a few milliseconds (publishContext).
	publishCtx atomic.Pointer[sharedDeadline]

	authFailures *ratelimit.Limiter // failed CONNECTs by source address
	poller       *poller            // watches parked connections; nil: none park

	mu      sync.RWMutex
	opened  bool
	closing bool
	devices map[string]*device // connected devices by session id, "{tenant}/{device}"
	tenants map[string]int     // connected devices by tenant
	busy    sync.WaitGroup     // publishes with the Handler
	tasks   sync.WaitGroup     // DeviceSubscribed calls
	connSeq atomic.Uint64      // numbers connections, for assigned client ids
	// oversized holds, by session id, the publish too large to read for
	// which an MQTT 3.1.1 device was last disconnected (oversizedPublish).
	oversized sync.Map
	// revocations counts CredentialsChanged calls, so that a connection
	// being admitted can tell whether one came while it was checked.
	revocations atomic.Uint64

	stats struct {
		connects, authFailures, disconnects, aclViolations, oversized,
		messagesIn, messagesOut, delivered, handlerErrors, unacked,
		limitRefusals, publishFloods, credentialChecks, revoked,
		actionsFailed, unacknowledgedActions, parkedPings atomic.Uint64
	}
}

var _ mqtt.Channel = (*Server)(nil)

// NewServer returns a server for cfg and h; Open starts it.
func NewServer(cfg Config, h mqtt.Handler) *Server {
	cfg = cfg.withDefaults()
	return &Server{
		cfg:          cfg,
		h:            h,
		log:          cfg.Logger,
		devices:      make(map[string]*device),
		tenants:      make(map[string]int),
		gate:         &gate{maxTotal: cfg.MaxConnections, maxPending: cfg.MaxPendingPerIP, pending: map[string]int{}},
		authFailures: &ratelimit.Limiter{Rate: cfg.AuthFailureRate, Burst: cfg.AuthFailureBurst, Now: cfg.Now},
	}
}

// Open listens on the configured address and starts serving devices.
func (s *Server) Open() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.opened {
		return errors.New("mqtt: server already opened")
	}

	// The flag names are fleetd serve's, but only an error that names one
	// can tell a newcomer which knob to turn.
	type spec struct {
		addr, flag string
		tls        *tls.Config
	}
	var specs []spec
	switch {
	case s.cfg.TLSAddr == "":
		specs = append(specs, spec{s.cfg.Addr, "--mqtt-addr", s.cfg.TLS})
	case s.cfg.TLS == nil:
		return errors.New("mqtt: a TLS listener needs Config.TLS")
	default:
		if s.cfg.Addr != AddrOff {
			specs = append(specs, spec{s.cfg.Addr, "--mqtt-addr", nil})
		}
		specs = append(specs, spec{s.cfg.TLSAddr, "--mqtts-addr", s.cfg.TLS})
	}
	for _, sp := range specs {
		ln, err := s.listen(sp.addr, sp.flag, sp.tls)
		if err != nil {
			for _, l := range s.lns {
				l.ln.Close()
			}
			s.lns = nil
			return err
		}
		s.lns = append(s.lns, ln)
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if s.cfg.ParkAfter > 0 {
		p, err := newPoller()
		if err != nil {
			s.log.Info("mqtt: idle connections keep their goroutine", "err", err)
		}
		s.poller = p
	}
	s.opened = true
	for _, l := range s.lns {
		go l.serve(s.serveConn)
		s.log.Info("mqtt broker listening", "addr", l.ln.Addr().String(), "protocol", l.protocol)
	}
	return nil
}

// listen makes one of the broker's listeners; flag is the setting of its
// address, for the error.
func (s *Server) listen(addr, flag string, tc *tls.Config) (*listener, error) {
	nl, err := net.Listen("tcp", addr)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("listen on %s: %w; choose another port with %s", addr, syscall.EADDRINUSE, flag)
		}
		return nil, fmt.Errorf("listen on %s: %w; check %s", addr, err, flag)
	}
	protocol := "tcp"
	if tc != nil {
		nl = tls.NewListener(nl, tc)
		protocol = "tls"
	}
	return &listener{
		ln:             nl,
		protocol:       protocol,
		connectTimeout: s.cfg.ConnectTimeout,
		log:            s.log,
		gate:           s.gate,
		refused:        &s.stats.limitRefusals,
		done:           make(chan struct{}),
		conns:          make(map[net.Conn]struct{}),
	}, nil
}

// Addr returns the address the server listens on (the plain listener's,
// or the TLS one's when the plain one is off), or nil before Open.
func (s *Server) Addr() net.Addr {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if len(s.lns) == 0 {
		return nil
	}
	return s.lns[0].ln.Addr()
}

// TLSAddr returns the address of the TLS listener, nil without one.
func (s *Server) TLSAddr() net.Addr {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, l := range s.lns {
		if l.protocol == "tls" {
			return l.ln.Addr()
		}
	}
	return nil
}

// Close stops the server gracefully: it stops accepting connections, lets
// publishes already with the Handler commit and be acknowledged (for at most
// ShutdownTimeout), disconnects every device and waits for all of the
// server's goroutines.
func (s *Server) Close() error {
	s.mu.Lock()
	if !s.opened || s.closing {
		s.mu.Unlock()
		return nil
	}
	s.closing = true
	s.mu.Unlock()

	for _, l := range s.lns {
		l.closeListener()
	}

	s.log.Info("mqtt: shutting down: waiting for the publishes being committed")
	done := make(chan struct{})
	go func() { s.busy.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(s.cfg.ShutdownTimeout):
		s.log.Warn("mqtt: handler calls still running at shutdown; cancelling them", "timeout", s.cfg.ShutdownTimeout)
		s.cancel()
		<-done
	}

	s.mu.RLock()
	devices := make([]*device, 0, len(s.devices))
	for _, d := range s.devices {
		devices = append(devices, d)
	}
	s.mu.RUnlock()
	for _, d := range devices {
		d.close(codeServerShuttingDown, nil)
	}
	for _, l := range s.lns {
		l.closeConns() // connections that had not finished CONNECT
	}
	s.cancel() // authentications in progress: refused as unavailable
	for _, l := range s.lns {
		l.wait()
	}
	if s.poller != nil {
		s.poller.close()
	}
	s.tasks.Wait()
	return nil
}

// SendAction hands action actionID, whose message is payload, to the
// device's connection, which publishes it on the device's actions topic at
// QoS 1 (or 0 if the device subscribed so) as soon as the device's
// in-flight window has room and no older action waits (delivery.go). It
// returns true if the connection took it: written, waiting, or failed
// because the device accepts no packet so large (ActionFailed says so);
// false if the device is offline or not subscribed, or if the connection
// holds as many waiting actions as it may, in which case the connection
// reads it from the store (Handler.PendingActions) when its turn comes.
//
// True is not delivery: ActionDelivered reports that, possibly before
// SendAction returns. Sessions end with their connection: an action not
// acknowledged when the device disconnects is read from the store again
// after the device next subscribes.
func (s *Server) SendAction(tenant, device string, actionID int64, payload []byte) bool {
	d := s.device(sessionID(tenant, device))
	if d == nil || !d.subscribed.Load() || s.isClosing() {
		return false
	}
	return d.offer(fleet.ActionMessage{ActionID: actionID, Payload: payload})
}

// SendDelta publishes the delta of the device's shadow (a JSON object) on
// its shadow delta topic, at QoS 0, if the device is connected and
// subscribed to it. An empty delta is not sent. It reports whether the
// delta was written to the connection.
func (s *Server) SendDelta(tenant, device string, delta []byte) bool {
	d := s.device(sessionID(tenant, device))
	if d == nil || len(delta) == 0 || !d.deltaSubscribed.Load() || s.isClosing() {
		return false
	}
	topic := mqtt.ShadowDeltaTopic(tenant, device)
	if size := publishSize(d.version, topic, 0, delta); d.maxPacketSize > 0 && size > d.maxPacketSize {
		s.log.Warn("mqtt: a shadow delta is larger than the device accepts; not sent", "tenant", tenant, "device", device,
			"size", size, "max_packet_size", d.maxPacketSize)
		return false
	}
	return d.write(appendPublish(nil, d.version, topic, 0, 0, delta)) == nil
}

// goTask runs f on a goroutine Close waits for, unless the server is
// closing.
func (s *Server) goTask(f func()) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closing {
		return false
	}
	s.tasks.Add(1)
	go func() {
		defer s.tasks.Done()
		f()
	}()
	return true
}

// Online reports whether the device is connected now.
func (s *Server) Online(tenant, device string) bool {
	d := s.device(sessionID(tenant, device))
	return d != nil && !d.isClosed()
}

// OnlineCount is how many of the tenant's devices are connected now.
func (s *Server) OnlineCount(tenant string) int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.tenants[tenant]
}

// CredentialsChanged is told that the device's token or certificate was
// replaced, or the device deleted: a connection made with revoked
// credentials must not outlive them. The credentials the device's
// connection authenticated with are checked again, in the background, and
// the connection ends ("not authorized") unless they still admit it: a
// device that already reconnected with its new credentials keeps its
// connection.
func (s *Server) CredentialsChanged(tenant, device string) {
	s.revocations.Add(1)
	d := s.device(sessionID(tenant, device))
	if d == nil || d.isClosed() {
		return
	}
	s.goTask(func() {
		defer s.stats.credentialChecks.Add(1)
		if s.stillAdmitted(d) {
			return
		}
		s.stats.revoked.Add(1)
		s.log.Info("mqtt: disconnecting a device whose credentials were revoked", "tenant", tenant, "device", device, "remote", d.remote())
		d.close(codeNotAuthorized, nil)
	})
}

// Connections returns the number of devices connected now.
func (s *Server) Connections() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.devices)
}

// Stats returns the server's counters.
func (s *Server) Stats() mqtt.Stats {
	return mqtt.Stats{
		Connections:      s.Connections(),
		Parked:           s.parked(),
		ParkedPings:      s.stats.parkedPings.Load(),
		Connects:         s.stats.connects.Load(),
		AuthFailures:     s.stats.authFailures.Load(),
		Disconnects:      s.stats.disconnects.Load(),
		ACLViolations:    s.stats.aclViolations.Load(),
		OversizedPackets: s.stats.oversized.Load(),
		MessagesIn:       s.stats.messagesIn.Load(),
		MessagesOut:      s.stats.messagesOut.Load(),
		ActionsDelivered: s.stats.delivered.Load(),
		HandlerErrors:    s.stats.handlerErrors.Load(),
		Unacknowledged:   s.stats.unacked.Load(),
		LimitRefusals:    s.stats.limitRefusals.Load(),
		PublishFloods:    s.stats.publishFloods.Load(),
		CredentialChecks: s.stats.credentialChecks.Load(),
		Revoked:          s.stats.revoked.Load(),
		ActionsFailed:    s.stats.actionsFailed.Load(),
		UnackedActions:   s.stats.unacknowledgedActions.Load(),
	}
}

func (s *Server) parked() int {
	if s.poller == nil {
		return 0
	}
	return s.poller.count()
}

func (s *Server) device(id string) *device {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.devices[id]
}

func (s *Server) isClosing() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.closing
}

// sessionID keys a device's session: its username.
func sessionID(tenant, device string) string { return mqtt.Username(tenant, device) }

// listener is one of the broker's network listeners: it caps connections,
// gives each a deadline for its CONNECT and lets Close wait for every
// connection it accepted.
type listener struct {
	ln             net.Listener
	protocol       string
	connectTimeout time.Duration
	log            *slog.Logger
	gate           *gate
	refused        *atomic.Uint64
	done           chan struct{} // closed when serve returns

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup // one per connection, for its whole handling
}

// serve accepts connections until the listener is closed and hands each to
// handle on a goroutine of its own; handle calls connected once the
// connection has sent its CONNECT, which the gate then stops counting
// against its source address.
func (l *listener) serve(handle func(nc net.Conn, ip string, connected func(), done func(error))) {
	defer close(l.done)
	var backoff time.Duration
	for {
		conn, err := l.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors, most likely: wait, as net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			l.log.Error("mqtt: accept", "err", err, "retry_in", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		ip := remoteIP(conn)
		if why := l.gate.enter(ip); why != "" {
			l.refused.Add(1)
			l.log.Debug("mqtt: connection closed at once: "+why, "remote", conn.RemoteAddr().String())
			conn.Close()
			continue
		}
		_ = conn.SetDeadline(time.Now().Add(l.connectTimeout))

		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			l.gate.leave(ip, true)
			conn.Close()
			continue
		}
		l.conns[conn] = struct{}{}
		l.wg.Add(1)
		l.mu.Unlock()

		// pending: CONNECT not read yet. Only the connection's goroutine
		// touches it, before done.
		pending := true
		go handle(conn, ip, func() {
			if pending {
				pending = false
				l.gate.connected(ip)
			}
		}, func(err error) {
			l.mu.Lock()
			delete(l.conns, conn)
			l.mu.Unlock()
			l.gate.leave(ip, pending)
			conn.Close()
			if err != nil {
				l.log.Debug("mqtt: connection ended", "remote", conn.RemoteAddr().String(), "err", err)
			}
			l.wg.Done()
		})
	}
}

func remoteIP(c net.Conn) string {
	host, _, err := net.SplitHostPort(c.RemoteAddr().String())
	if err != nil {
		return c.RemoteAddr().String()
	}
	return host
}

// gate counts the broker's open connections, and per source address those
// that have not sent CONNECT yet, against their caps.
type gate struct {
	maxTotal, maxPending int

	mu      sync.Mutex
	total   int
	pending map[string]int
}

// enter admits a new connection from ip, or says why not.
func (g *gate) enter(ip string) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.total >= g.maxTotal {
		return "the broker has its maximum of connections"
	}
	if g.pending[ip] >= g.maxPending {
		return "too many connections from this address have not sent CONNECT yet"
	}
	g.total++
	g.pending[ip]++
	return ""
}

// connected moves a connection of ip from pending to established.
func (g *gate) connected(ip string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.dropPending(ip)
}

// leave forgets a connection of ip.
func (g *gate) leave(ip string, pending bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.total--
	if pending {
		g.dropPending(ip)
	}
}

func (g *gate) dropPending(ip string) {
	if g.pending[ip]--; g.pending[ip] <= 0 {
		delete(g.pending, ip)
	}
}

// closeListener stops accepting connections and waits for serve to return.
func (l *listener) closeListener() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.ln.Close()
	<-l.done
}

// closeConns closes every connection still open.
func (l *listener) closeConns() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.conns {
		c.Close()
	}
}

// wait waits until the broker is done with every connection.
func (l *listener) wait() { l.wg.Wait() }
