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
)

// Server is the MQTT broker embedded in fleetd. Devices connect to it; fleetd
// reaches them through SendAction and hears from them through its Handler.
type Server struct {
	cfg Config
	h   Handler
	log *slog.Logger

	broker *mochi.Server
	ln     *listener
	ctx    context.Context // of Handler calls; cancelled when Close gives up waiting
	cancel context.CancelFunc

	mu       sync.RWMutex
	opened   bool
	closing  bool
	devices  map[string]*device        // connected devices by session id, "{tenant}/{device}"
	byClient map[*mochi.Client]*device // every connection, by the broker's client
	busy     sync.WaitGroup            // publishes with the Handler
	tasks    sync.WaitGroup            // DeviceSubscribed calls
	connSeq  atomic.Uint64             // numbers connections, for clientID

	stats struct {
		connects, authFailures, disconnects, aclViolations, oversized,
		messagesIn, messagesOut, delivered, handlerErrors, unacked atomic.Uint64
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
	handling  bool // a publish is with the Handler, counted in Server.busy
	announced bool // the SUBACK for its actions topic is going out now
}

// NewServer returns a server for cfg and h; Open starts it.
func NewServer(cfg Config, h Handler) *Server {
	cfg = cfg.withDefaults()
	return &Server{
		cfg:      cfg,
		h:        h,
		log:      cfg.Logger,
		devices:  make(map[string]*device),
		byClient: make(map[*mochi.Client]*device),
	}
}

// Open listens on the configured address and starts serving devices.
func (s *Server) Open() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.opened {
		return errors.New("mqtt: server already opened")
	}

	nl, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		// The flag name is cmd/fleetd's, but only this message can tell a
		// newcomer which knob to turn.
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("listen on %s: %w; choose another port with --mqtt-addr", s.cfg.Addr, syscall.EADDRINUSE)
		}
		return fmt.Errorf("listen on %s: %w; check --mqtt-addr", s.cfg.Addr, err)
	}
	protocol := "tcp"
	if s.cfg.TLS != nil {
		nl = tls.NewListener(nl, s.cfg.TLS)
		protocol = "tls"
	}
	s.ln = &listener{
		ln:             nl,
		protocol:       protocol,
		connectTimeout: s.cfg.ConnectTimeout,
		log:            s.log,
		done:           make(chan struct{}),
		conns:          make(map[net.Conn]struct{}),
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
	if err := s.broker.AddHook(&hook{s: s}, nil); err != nil {
		nl.Close()
		s.cancel()
		return fmt.Errorf("mqtt: add hook: %w", err)
	}
	if err := s.broker.AddListener(s.ln); err != nil {
		nl.Close()
		s.cancel()
		return fmt.Errorf("mqtt: add listener: %w", err)
	}
	if err := s.broker.Serve(); err != nil {
		nl.Close()
		s.cancel()
		return fmt.Errorf("mqtt: serve: %w", err)
	}
	s.opened = true
	s.log.Info("mqtt broker listening", "addr", nl.Addr().String(), "protocol", protocol)
	return nil
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

// Addr returns the address the server listens on, or nil before Open.
func (s *Server) Addr() net.Addr {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.ln == nil {
		return nil
	}
	return s.ln.ln.Addr()
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

	s.ln.closeListener()

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
	s.ln.closeConns() // connections that had not finished CONNECT
	s.cancel()        // authentications in progress: refused as unavailable
	s.ln.wait()
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

// listener is the broker's network listener. It is ours rather than mochi's
// so that Open reports a taken port at once, a silent connection cannot hold a
// goroutine forever, and Close can wait for every connection it accepted.
type listener struct {
	ln             net.Listener
	protocol       string
	connectTimeout time.Duration
	log            *slog.Logger
	done           chan struct{} // closed when Serve returns

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup // one per connection, for the broker's whole handling of it
}

const listenerID = "devices"

// Init implements listeners.Listener; Open has listened already.
func (l *listener) Init(*slog.Logger) error { return nil }

// ID implements listeners.Listener.
func (l *listener) ID() string { return listenerID }

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
		// mochi sets the keepalive deadline only after CONNECT.
		_ = conn.SetDeadline(time.Now().Add(l.connectTimeout))

		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			conn.Close()
			continue
		}
		l.conns[conn] = struct{}{}
		l.wg.Add(1)
		l.mu.Unlock()

		go func() {
			defer l.wg.Done()
			err := establish(listenerID, conn)
			l.mu.Lock()
			delete(l.conns, conn)
			l.mu.Unlock()
			conn.Close()
			if err != nil {
				l.log.Debug("mqtt: connection ended", "remote", conn.RemoteAddr().String(), "error", err)
			}
		}()
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
