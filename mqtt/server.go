package mqtt

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/fleetd/fleet/ratelimit"
)

// Server is the MQTT broker embedded in fleetd. Devices connect to it; fleetd
// reaches them through SendAction and hears from them through its Handler.
type Server struct {
	cfg Config
	h   Handler
	log *slog.Logger

	broker *mochi.Server
	lns    []*listener     // the plain listener, then the TLS one, as configured
	gate   *gate           // caps connections across both
	ctx    context.Context // of Handler calls; cancelled when Close gives up waiting
	cancel context.CancelFunc

	authFailures *ratelimit.Limiter // failed CONNECTs by source address

	mu       sync.RWMutex
	opened   bool
	closing  bool
	devices  map[string]*device        // connected devices by session id, "{tenant}/{device}"
	byClient map[*mochi.Client]*device // every connection, by the broker's client
	tenants  map[string]int            // connected devices by tenant
	busy     sync.WaitGroup            // publishes with the Handler
	tasks    sync.WaitGroup            // DeviceSubscribed calls
	connSeq  atomic.Uint64             // numbers connections, for clientID

	stats struct {
		connects, authFailures, disconnects, aclViolations, oversized,
		messagesIn, messagesOut, delivered, handlerErrors, unacked,
		limitRefusals, publishFloods atomic.Uint64
	}
}

// device is the state of one connected device. A device has one session at
// most, keyed by its username whatever client id it sent: a new connection
// replaces the old.
type device struct {
	tenant, id string
	cl         *mochi.Client

	subscribed atomic.Bool // to its actions topic
	dropped    atomic.Bool // the broker dropped a message for it during SendAction
	sendMu     sync.Mutex  // one SendAction at a time, so the inflight check holds

	mu      sync.Mutex
	pending map[uint16]string // packet id -> action id, awaiting PUBACK

	// Touched only on the device's connection goroutine.
	handling  bool             // a publish is with the Handler, counted in Server.busy
	announced bool             // the SUBACK for its actions topic is going out now
	publishes ratelimit.Bucket // PublishRate
}

// NewServer returns a server for cfg and h; Open starts it.
func NewServer(cfg Config, h Handler) *Server {
	cfg = cfg.withDefaults()
	return &Server{
		cfg:          cfg,
		h:            h,
		log:          cfg.Logger,
		devices:      make(map[string]*device),
		byClient:     make(map[*mochi.Client]*device),
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

	type spec struct {
		addr, id string
		tls      *tls.Config
	}
	var specs []spec
	switch {
	case s.cfg.TLSAddr == "":
		specs = append(specs, spec{s.cfg.Addr, listenerID, s.cfg.TLS})
	case s.cfg.TLS == nil:
		return errors.New("mqtt: a TLS listener needs Config.TLS")
	default:
		if s.cfg.Addr != AddrOff {
			specs = append(specs, spec{s.cfg.Addr, listenerID, nil})
		}
		specs = append(specs, spec{s.cfg.TLSAddr, tlsListenerID, s.cfg.TLS})
	}
	for _, sp := range specs {
		ln, err := s.listen(sp.addr, sp.id, sp.tls)
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

	s.broker = mochi.New(&mochi.Options{
		Capabilities: s.capabilities(),
		// mochi logs every refused or failed client at Info and Warn; the
		// hook logs what matters with tenant and device instead.
		Logger:                 slog.New(levelFloor{s.log.Handler(), slog.LevelError}).With("component", "mochi"),
		InlineClient:           true, // SendAction publishes through it
		SysTopicResendInterval: 60,   // nobody can read $SYS; keep its ticker quiet
	})
	fail := func(err error) error {
		for _, l := range s.lns {
			l.ln.Close()
		}
		s.cancel()
		return err
	}
	if err := s.broker.AddHook(&hook{s: s}, nil); err != nil {
		return fail(fmt.Errorf("mqtt: add hook: %w", err))
	}
	for _, l := range s.lns {
		if err := s.broker.AddListener(l); err != nil {
			return fail(fmt.Errorf("mqtt: add listener: %w", err))
		}
	}
	if err := s.broker.Serve(); err != nil {
		return fail(fmt.Errorf("mqtt: serve: %w", err))
	}
	s.opened = true
	for _, l := range s.lns {
		s.log.Info("mqtt broker listening", "addr", l.ln.Addr().String(), "protocol", l.protocol)
	}
	return nil
}

// listen makes one of the broker's listeners. The flag names are
// cmd/fleetd's, but only this message can tell a newcomer which knob to
// turn.
func (s *Server) listen(addr, id string, tc *tls.Config) (*listener, error) {
	flag := "--mqtt-addr"
	if id == tlsListenerID {
		flag = "--mqtts-addr"
	}
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
		id:             id,
		ln:             nl,
		protocol:       protocol,
		connectTimeout: s.cfg.ConnectTimeout,
		log:            s.log,
		gate:           s.gate,
		refused:        &s.stats.limitRefusals,
		done:           make(chan struct{}),
		conns:          make(map[net.Conn]*connState),
	}, nil
}

// capabilities shapes the broker for devices: bounded per-device memory, no
// state that outlives a connection, nothing shared between devices.
func (s *Server) capabilities() *mochi.Capabilities {
	c := mochi.NewDefaultServerCapabilities()
	c.MaximumPacketSize = uint32(s.cfg.MaxPacketSize)
	c.MaximumInflight = uint16(s.cfg.MaxInflight)
	c.ReceiveMaximum = uint16(s.cfg.MaxInflight)
	// The outbound queue is allocated per client; at mochi's default of 8192
	// it would cost 64 KiB per device.
	c.MaximumClientWritesPending = int32(s.cfg.MaxInflight + 64)
	// fleetd keeps undelivered actions in its database and resends them when
	// a device subscribes, so broker sessions end with their connection.
	c.MaximumSessionExpiryInterval = 0
	c.TopicAliasMaximum = 0
	c.RetainAvailable = 0
	c.SharedSubAvailable = 0
	c.WildcardSubAvailable = 0
	// PUBACKs must not echo a publish's properties (mochi would then also
	// write an invalid reason code).
	c.Compatibilities.NoInheritedPropertiesOnAck = true
	return c
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
		// A device that does not read must not hold up shutdown.
		_ = d.cl.Net.Conn.SetWriteDeadline(time.Now().Add(time.Second))
		s.disconnect(d.cl, packets.ErrServerShuttingDown)
	}
	for _, l := range s.lns {
		l.closeConns() // connections that had not finished CONNECT
	}
	s.cancel() // authentications in progress: refused as unavailable
	for _, l := range s.lns {
		l.wait()
	}
	s.tasks.Wait()

	// Nothing is connected any more, so this only stops mochi's own loop.
	return s.broker.Close()
}

// SendAction publishes payload at QoS 1 on the device's actions topic. It
// returns true if the device is connected and subscribed and the message was
// handed to the broker for delivery; false if the device is offline (or too
// far behind: MaxInflight messages unacknowledged), in which case fleetd keeps
// the action queued and sends it when the device next subscribes.
//
// True is not delivery: ActionDelivered reports that, possibly before
// SendAction returns. Sessions end with their connection, so an action handed
// over but not acknowledged when the device disconnects is lost in the broker:
// fleetd must send it again on the next DeviceSubscribed.
func (s *Server) SendAction(tenant, device string, payload []byte) bool {
	d := s.device(sessionID(tenant, device))
	if d == nil || !d.subscribed.Load() {
		return false
	}
	d.sendMu.Lock()
	defer d.sendMu.Unlock()
	if d.cl.Closed() || s.isClosing() {
		return false
	}
	if n := d.cl.State.Inflight.Len(); n >= s.cfg.MaxInflight {
		s.log.Warn("mqtt: device has too many unacknowledged actions; keeping the action queued",
			"tenant", tenant, "device", device, "inflight", n)
		return false
	}
	topic := ActionsTopic(tenant, device)
	// mochi would drop a packet over the device's limit while writing it,
	// after SendAction returned, and the action would never be delivered.
	if limit := d.cl.Properties.Props.MaximumPacketSize; limit > 0 && publishSize(topic, payload) > int(limit) {
		s.log.Error("mqtt: action larger than the device accepts; not sent",
			"tenant", tenant, "device", device, "bytes", len(payload), "device_maximum_packet_size", limit)
		return false
	}
	d.dropped.Store(false)
	if err := s.broker.Publish(topic, payload, false, 1); err != nil {
		s.log.Error("mqtt: publish action", "tenant", tenant, "device", device, "error", err)
		return false
	}
	// A device that leaves now may not get it, yet true is right: the
	// message was handed over, and ActionDelivered will not follow.
	// (Checking for that here would report false for a device that took the
	// action, acknowledged it and left at once.)
	if d.dropped.Load() {
		return false
	}
	s.stats.messagesOut.Add(1)
	return true
}

// publishSize bounds the size of a QoS 1 PUBLISH packet from above: fixed
// header, topic, packet id, properties (MQTT 5) and payload.
func publishSize(topic string, payload []byte) int {
	return 5 + 2 + len(topic) + 2 + 8 + len(payload)
}

// Online reports whether the device is connected now.
func (s *Server) Online(tenant, device string) bool {
	d := s.device(sessionID(tenant, device))
	return d != nil && !d.cl.Closed()
}

// Disconnect ends the device's connection, if it has one here, with "not
// authorized": its token or certificate was replaced, or it was deleted, and
// a connection made with revoked credentials must not outlive them.
func (s *Server) Disconnect(tenant, device string) {
	if d := s.device(sessionID(tenant, device)); d != nil && !d.cl.Closed() {
		s.log.Info("mqtt: disconnecting a device whose credentials were revoked", "tenant", tenant, "device", device)
		s.disconnect(d.cl, packets.ErrNotAuthorized)
	}
}

// Connections returns the number of devices connected now.
func (s *Server) Connections() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.devices)
}

// Stats returns the server's counters.
func (s *Server) Stats() Stats {
	return Stats{
		Connections:      s.Connections(),
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
	}
}

func (s *Server) device(id string) *device {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.devices[id]
}

func (s *Server) deviceOf(cl *mochi.Client) *device {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.byClient[cl]
}

func (s *Server) isClosing() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.closing
}

// disconnect ends a device's connection with a reason. MQTT 3.1.1 has no
// DISCONNECT from the server, so there closing the connection is the signal.
func (s *Server) disconnect(cl *mochi.Client, code packets.Code) {
	if cl.Properties.ProtocolVersion >= 5 {
		_ = s.broker.DisconnectClient(cl, code)
		return
	}
	cl.Stop(code)
}

// sessionID keys a device's session: its username.
func sessionID(tenant, device string) string { return tenant + usernameDivider + device }

// clientID is the broker's id for one connection of a device: its username
// and a number unique to the connection. Tenant names and device ids contain
// neither '/' nor '#', so it collides with no other connection, nor with
// mochi's inline client.
//
// mochi's own takeover of a client id races: the old connection's cleanup
// can remove the new one from the broker's client list or the topic index,
// after which its actions vanish. With one id per connection mochi never
// takes over; the Server replaces a device's connection itself.
func clientID(tenant, device string, n uint64) string {
	return sessionID(tenant, device) + "#" + strconv.FormatUint(n, 10)
}

func splitClientID(id string) (tenant, device string) {
	id, _, _ = strings.Cut(id, "#")
	tenant, device, _ = strings.Cut(id, usernameDivider)
	return tenant, device
}

// listener is one of the broker's network listeners. It is ours rather than
// mochi's so that Open reports a taken port at once, a silent connection
// cannot hold a goroutine forever, connections are capped, and Close can
// wait for every connection it accepted.
type listener struct {
	id             string
	ln             net.Listener
	protocol       string
	connectTimeout time.Duration
	log            *slog.Logger
	gate           *gate
	refused        *atomic.Uint64
	done           chan struct{} // closed when Serve returns

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]*connState
	wg     sync.WaitGroup // one per connection, for the broker's whole handling of it
}

// connState is what the gate knows of a connection.
type connState struct {
	ip      string
	pending bool // CONNECT not read yet
}

const (
	listenerID    = "devices"
	tlsListenerID = "devices-tls"
)

// Init implements listeners.Listener; Open has listened already.
func (l *listener) Init(*slog.Logger) error { return nil }

// ID implements listeners.Listener.
func (l *listener) ID() string { return l.id }

// Address implements listeners.Listener.
func (l *listener) Address() string { return l.ln.Addr().String() }

// Protocol implements listeners.Listener.
func (l *listener) Protocol() string { return l.protocol }

// Close implements listeners.Listener. Server.Close has closed everything by
// the time mochi calls it.
func (l *listener) Close(listeners.CloseFn) {}

// Serve implements listeners.Listener: it accepts connections until the
// listener is closed and hands each to the broker on a goroutine of its own.
func (l *listener) Serve(establish listeners.EstablishFn) {
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
			l.log.Error("mqtt: accept", "error", err, "retry_in", backoff)
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
		// mochi sets the keepalive deadline only after CONNECT.
		_ = conn.SetDeadline(time.Now().Add(l.connectTimeout))

		st := &connState{ip: ip, pending: true}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			l.gate.leave(ip, true)
			conn.Close()
			continue
		}
		l.conns[conn] = st
		l.wg.Add(1)
		l.mu.Unlock()

		go func() {
			defer l.wg.Done()
			err := establish(l.id, conn)
			l.mu.Lock()
			delete(l.conns, conn)
			pending := st.pending
			st.pending = false
			l.mu.Unlock()
			l.gate.leave(ip, pending)
			conn.Close()
			if err != nil {
				l.log.Debug("mqtt: connection ended", "remote", conn.RemoteAddr().String(), "error", err)
			}
		}()
	}
}

// connectRead tells the gate that conn sent its CONNECT.
func (l *listener) connectRead(conn net.Conn) {
	l.mu.Lock()
	st := l.conns[conn]
	pending := st != nil && st.pending
	if pending {
		st.pending = false
	}
	l.mu.Unlock()
	if pending {
		l.gate.connected(st.ip)
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

// connectRead tells the gate that cl's connection sent its CONNECT.
func (s *Server) connectRead(cl *mochi.Client) {
	for _, l := range s.lns {
		if l.id == cl.Net.Listener {
			l.connectRead(cl.Net.Conn)
		}
	}
}

// closeListener stops accepting connections and waits for Serve to return.
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

// levelFloor drops records below min, to quiet a library's logger.
type levelFloor struct {
	slog.Handler
	min slog.Level
}

func (h levelFloor) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h levelFloor) WithAttrs(attrs []slog.Attr) slog.Handler {
	return levelFloor{h.Handler.WithAttrs(attrs), h.min}
}

func (h levelFloor) WithGroup(name string) slog.Handler {
	return levelFloor{h.Handler.WithGroup(name), h.min}
}
