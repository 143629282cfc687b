// Package bridge runs fleetd's device channel through an external MQTT
// broker (EMQX, Mosquitto, …): Client is fleetd as one client of that broker,
// serving the same mqtt.Handler as the embedded broker, and BrokerAuth is the
// HTTP API the broker calls to authenticate and authorise devices.
package bridge

import (
	"container/heap"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	"github.com/eclipse/paho.golang/paho/session"
	"github.com/eclipse/paho.golang/paho/session/state"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/mqtt"
)

// Client is fleetd as an MQTT 5 client of an external broker
// (docs/operations.md#the-external-broker): devices connect to the broker,
// which asks fleetd's BrokerAuth endpoints who they are, and fleetd
// publishes actions to them and consumes their status and stream topics
// through shared subscriptions, so that any number of replicas split the
// devices' traffic. It serves the same Handler as the embedded broker
// (broker.Server).
//
// What differs from the embedded broker, and why:
//
//   - A status or stream publish is acknowledged to the broker only after the
//     Handler returned, as the embedded broker acknowledges the device. If
//     the Handler cannot commit (fleet.EUNAVAILABLE) the Client reconnects
//     without acknowledging, so the broker sends it again: MQTT 5 lets a
//     broker resend only on a new connection. The broker acknowledged the
//     device already, so from the device's side a PUBACK means the broker
//     has the message; the session (clean start false, a session expiry)
//     keeps it across a reconnection of fleetd.
//   - fleetd cannot see devices' PUBACKs, so ActionDelivered is never
//     called: an action stays Queued until the device's first report, and is
//     offered again each time the device arrives.
//   - fleetd cannot see connections either. BrokerAuth tells the Client of
//     arrivals (the authentication at CONNECT, the authorisation of the
//     subscription to the actions topic); the Client records each in the
//     RedeliveryStore, due a moment later, and whichever replica claims it
//     calls Handler.DeviceSubscribed. Dispatches are offered to every
//     targeted device (PresenceUnknown); the broker answers "no matching
//     subscribers" for those offline, and SendAction reports false.
type Client struct {
	cfg   ClientConfig
	h     mqtt.Handler
	log   *slog.Logger
	store RedeliveryStore
	seed  maphash.Seed

	ctx    context.Context // of Handler calls; cancelled when Close gives up waiting
	cancel context.CancelFunc
	run    context.Context // of the connection and the redelivery loop
	stop   context.CancelFunc

	cm        *autopaho.ConnectionManager
	mu        sync.Mutex
	opened    bool
	closing   bool
	conn      net.Conn // the current connection, closed to force a reconnection
	everUp    bool     // a connection succeeded once: later ones back off
	connected atomic.Bool
	upCh      chan struct{} // closed at the first connection and subscription
	upOnce    sync.Once

	queues   []chan inbound
	quit     chan struct{} // closed when the workers must stop
	workers  sync.WaitGroup
	inflight sync.WaitGroup // publishes handed to workers and not yet answered
	pending  atomic.Int64   // QoS 1 and 2 publishes received and not yet answered
	acked    atomic.Uint64  // acknowledgements handed to paho, which session counts as written
	session  *ackSession
	unacked  atomic.Bool // a publish was left unacknowledged on purpose
	loops    sync.WaitGroup
	wake     chan struct{}
	timerMu  sync.Mutex
	timers   dueHeap // when the arrivals this process recorded are due
	backlogs backlogs

	stats struct {
		connects, disconnects, messagesIn, messagesOut, handlerErrors,
		unacked, redeliveries atomic.Uint64
	}
}

// ClientConfig configures a Client. Zero values mean the defaults.
type ClientConfig struct {
	// Broker is the broker's URL: mqtt://host:port, or mqtts://host:port
	// for TLS (port 1883 or 8883 when omitted).
	Broker string
	// TLS configures mqtts: the CA to trust, a client certificate. Nil uses
	// the system's roots.
	TLS *tls.Config
	// Username and Password are fleetd's credentials at the broker; give
	// fleetd's username superuser rights there (BrokerAuth does, for these
	// credentials).
	Username string
	Password string
	// ClientID names fleetd's session at the broker; default
	// "fleetd-{hostname}-{random}". Give each replica a stable one (its pod
	// name) so that a replica restarted after a crash resumes its session
	// and handles what the broker kept for it.
	ClientID string
	// ShareGroup is the shared-subscription group the replicas form;
	// default "fleetd".
	ShareGroup string
	// KeepAlive is the MQTT keepalive; default 30s.
	KeepAlive time.Duration
	// SessionExpiry is how long the broker keeps fleetd's session, and the
	// messages routed to it, after the connection drops; default 5m. A
	// graceful Close ends the session at once.
	SessionExpiry time.Duration
	// ReceiveMaximum is how many publishes the broker may send before
	// fleetd acknowledges; default 1024.
	ReceiveMaximum int
	// Workers is how many Handler calls run at once; publishes of one device
	// always go to the same worker, in order. Default 128.
	Workers int
	// HandlerTimeout bounds each Handler call; default 30s. A publish
	// whose Handler timed out is treated like fleet.EUNAVAILABLE.
	HandlerTimeout time.Duration
	// PublishTimeout bounds the broker's acknowledgement of an action;
	// default 10s.
	PublishTimeout time.Duration
	// ShutdownTimeout is how long Close lets Handler calls finish; default
	// 10s.
	ShutdownTimeout time.Duration

	// Redeliveries records device arrivals for any replica to serve; nil
	// keeps them in this process's memory (one replica only).
	Redeliveries RedeliveryStore
	// SubscribeDelay is how long after the broker authorised a device's
	// subscription to its actions topic its queued actions are sent, so that
	// the subscription is in place: the broker asks before it subscribes.
	// Default 500ms.
	SubscribeDelay time.Duration
	// ConnectDelay is how long after a device authenticated its queued
	// actions are sent, should the broker not ask about its subscription
	// (it cached the answer); default 5s.
	ConnectDelay time.Duration
	// RedeliveryLease is how long a claim on an arrival lasts before
	// another replica may take it over; default 30s. Serving one device
	// takes up to about ten seconds when the broker is slow.
	RedeliveryLease time.Duration
	// RedeliveryPoll is how often arrivals recorded by other replicas, or
	// left by a dead one, are looked for; default 1s.
	RedeliveryPoll time.Duration

	// Logger receives connection changes and refusals; default none.
	Logger *slog.Logger
	// Now is the clock of redelivery times; default time.Now.
	Now func() time.Time
}

// ackInterval is how often paho sends the acknowledgements the workers
// gave it.
const ackInterval = 5 * time.Millisecond

// Defaults of ClientConfig.
const (
	DefaultShareGroup      = "fleetd"
	DefaultKeepAlive       = 30 * time.Second
	DefaultSessionExpiry   = 5 * time.Minute
	DefaultReceiveMaximum  = 1024
	DefaultWorkers         = 128
	DefaultPublishTimeout  = 10 * time.Second
	DefaultSubscribeDelay  = 500 * time.Millisecond
	DefaultConnectDelay    = 5 * time.Second
	DefaultRedeliveryLease = 30 * time.Second
	DefaultRedeliveryPoll  = time.Second
)

// RedeliveryStore keeps device arrivals for whichever replica claims them;
// *sqlstore.DB is one.
type RedeliveryStore interface {
	ScheduleRedelivery(ctx context.Context, tenant, device string, at time.Time) error
	ClaimRedeliveries(ctx context.Context, owner string, lease time.Duration, limit int) ([]fleet.Redelivery, error)
	CompleteRedelivery(ctx context.Context, r fleet.Redelivery, owner string, done bool) error
}

// inbound is a device's publish on its way to the Handler.
type inbound struct {
	cli   *paho.Client // the connection it came on, which acknowledges it
	pub   *paho.Publish
	topic mqtt.Topic
}

var _ mqtt.Channel = (*Client)(nil)

// NewClient returns a client of the broker in cfg, serving h; Open connects.
func NewClient(cfg ClientConfig, h mqtt.Handler) (*Client, error) {
	if cfg.ShareGroup == "" {
		cfg.ShareGroup = DefaultShareGroup
	}
	if strings.ContainsAny(cfg.ShareGroup, "/+#") {
		return nil, fmt.Errorf("mqtt: share group %q: must not contain '/', '+' or '#'", cfg.ShareGroup)
	}
	if cfg.ClientID == "" {
		cfg.ClientID = DefaultClientID()
	}
	if cfg.KeepAlive <= 0 {
		cfg.KeepAlive = DefaultKeepAlive
	}
	if cfg.SessionExpiry <= 0 {
		cfg.SessionExpiry = DefaultSessionExpiry
	}
	if cfg.ReceiveMaximum <= 0 {
		cfg.ReceiveMaximum = DefaultReceiveMaximum
	}
	cfg.ReceiveMaximum = min(cfg.ReceiveMaximum, 65535)
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultWorkers
	}
	if cfg.HandlerTimeout <= 0 {
		cfg.HandlerTimeout = mqtt.DefaultHandlerTimeout
	}
	if cfg.PublishTimeout <= 0 {
		cfg.PublishTimeout = DefaultPublishTimeout
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = mqtt.DefaultShutdownTimeout
	}
	if cfg.SubscribeDelay <= 0 {
		cfg.SubscribeDelay = DefaultSubscribeDelay
	}
	if cfg.ConnectDelay <= 0 {
		cfg.ConnectDelay = DefaultConnectDelay
	}
	if cfg.RedeliveryLease <= 0 {
		cfg.RedeliveryLease = DefaultRedeliveryLease
	}
	if cfg.RedeliveryPoll <= 0 {
		cfg.RedeliveryPoll = DefaultRedeliveryPoll
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if _, err := ParseBrokerURL(cfg.Broker); err != nil {
		return nil, err
	}
	c := &Client{
		cfg:   cfg,
		h:     h,
		log:   cfg.Logger.With("broker", redactURL(cfg.Broker)),
		store: cfg.Redeliveries,
		seed:  maphash.MakeSeed(),
		wake:  make(chan struct{}, 1),
		upCh:  make(chan struct{}),
		quit:  make(chan struct{}),
		// autopaho would make the same state; this one also counts the
		// acknowledgements written, for Close.
		session: &ackSession{SessionManager: state.NewInMemory(), wrote: make(chan struct{}, 1)},
	}
	if c.store == nil {
		c.store = newMemoryRedeliveries(cfg.Now)
	}
	return c, nil
}

// DefaultClientID is "fleetd-{hostname}-{6 random hex digits}": unique even
// for replicas that share a hostname, readable in the broker's logs.
func DefaultClientID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "host"
	}
	b := make([]byte, 3)
	rand.Read(b)
	id := "fleetd-" + host + "-" + hex.EncodeToString(b)
	if len(id) > 64 {
		id = id[len(id)-64:] // MQTT 5 brokers accept longer ids; some 3.1 habits do not
	}
	return id
}

// ParseBrokerURL checks a --mqtt-broker URL: mqtt:// or mqtts:// with a
// host, and nothing else.
func ParseBrokerURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("mqtt broker URL %q: %v", redactURL(s), err)
	}
	switch u.Scheme {
	case "mqtt", "mqtts":
	default:
		return nil, fmt.Errorf("mqtt broker URL %q: the scheme must be mqtt:// or mqtts://", redactURL(s))
	}
	if u.Hostname() == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
		return nil, fmt.Errorf("mqtt broker URL %q: want mqtt://host:port or mqtts://host:port (credentials go in --mqtt-username and --mqtt-password)", redactURL(s))
	}
	return u, nil
}

// redactURL keeps a password someone put in the URL out of the logs.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	return u.Redacted()
}

// Open starts connecting to the broker and returns; the Client keeps
// trying, with backoff, until Close. Use WaitConnected to wait.
func (c *Client) Open() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.opened {
		return errors.New("mqtt: client already opened")
	}
	u, _ := ParseBrokerURL(c.cfg.Broker) // checked by NewClient
	if u.Port() == "" {
		port := "1883"
		if u.Scheme == "mqtts" {
			port = "8883"
		}
		u.Host = net.JoinHostPort(u.Hostname(), port)
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.run, c.stop = context.WithCancel(context.Background())

	c.queues = make([]chan inbound, c.cfg.Workers)
	for i := range c.queues {
		c.queues[i] = make(chan inbound, 16)
		c.workers.Add(1)
		go c.work(c.queues[i])
	}

	expiry := uint32(c.cfg.SessionExpiry / time.Second)
	receiveMax := uint16(c.cfg.ReceiveMaximum)
	cfg := autopaho.ClientConfig{
		ServerUrls:                    []*url.URL{u},
		KeepAlive:                     uint16(c.cfg.KeepAlive / time.Second),
		CleanStartOnInitialConnection: false,
		SessionExpiryInterval:         expiry,
		ConnectTimeout:                10 * time.Second,
		ReconnectBackoff:              c.backoff,
		AttemptConnection:             c.dial,
		ConnectUsername:               c.cfg.Username,
		ConnectPassword:               []byte(c.cfg.Password),
		ConnectPacketBuilder: func(cp *paho.Connect, _ *url.URL) (*paho.Connect, error) {
			if cp.Properties == nil {
				cp.Properties = &paho.ConnectProperties{}
			}
			cp.Properties.ReceiveMaximum = &receiveMax
			return cp, nil
		},
		DisconnectPacketBuilder: c.disconnectPacket,
		OnConnectionUp:          c.onUp,
		OnConnectionDown:        c.onDown,
		OnConnectError:          c.onConnectError,
		ClientConfig: paho.ClientConfig{
			ClientID:                   c.cfg.ClientID,
			Session:                    c.session,
			OnPublishReceived:          []func(paho.PublishReceived) (bool, error){c.onPublish},
			OnServerDisconnect:         c.onServerDisconnect,
			EnableManualAcknowledgment: true,
			// Acknowledgements are sent in order, in batches, on this tick.
			SendAcksInterval: ackInterval,
		},
	}
	cm, err := autopaho.NewConnection(c.run, cfg)
	if err != nil {
		c.stop()
		c.cancel()
		return fmt.Errorf("mqtt: connect to broker: %w", err)
	}
	c.cm = cm
	c.opened = true
	c.loops.Add(1)
	go c.redeliver()
	c.log.Info("mqtt: connecting to the external broker", "client_id", c.cfg.ClientID, "share_group", c.cfg.ShareGroup)
	return nil
}

// WaitConnected waits until the Client is connected and subscribed for the
// first time, or ctx ends.
func (c *Client) WaitConnected(ctx context.Context) error {
	select {
	case <-c.upCh:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// backoff is the wait before connection attempt n: none for the very first
// connection, then from one second doubling to thirty, with jitter, so that
// replicas do not storm a broker that comes back.
func (c *Client) backoff(n int) time.Duration {
	c.mu.Lock()
	first := !c.everUp
	c.mu.Unlock()
	if first && n == 0 {
		return 0
	}
	d := time.Second << min(n, 5)
	d = min(d, 30*time.Second)
	var b [1]byte
	rand.Read(b[:])
	return d/2 + d*time.Duration(b[0])/512
}

// dial opens a connection to the broker and remembers it.
func (c *Client) dial(ctx context.Context, cfg autopaho.ClientConfig, u *url.URL) (net.Conn, error) {
	d := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	var conn net.Conn
	var err error
	if u.Scheme == "mqtts" {
		tc := c.cfg.TLS.Clone()
		if tc == nil {
			tc = &tls.Config{}
		}
		if tc.ServerName == "" {
			tc.ServerName = u.Hostname()
		}
		conn, err = (&tls.Dialer{NetDialer: d, Config: tc}).DialContext(ctx, "tcp", u.Host)
	} else {
		conn, err = d.DialContext(ctx, "tcp", u.Host)
	}
	if err != nil {
		return nil, err
	}
	// paho writes from several goroutines; TLS connections are not safe
	// for that.
	conn = packets.NewThreadSafeConn(conn)
	c.mu.Lock()
	c.conn = conn
	c.mu.Unlock()
	return conn, nil
}

// reconnect drops the connection so that the broker sends again what was
// not acknowledged.
func (c *Client) reconnect(conn net.Conn) {
	c.mu.Lock()
	cur := c.conn
	c.mu.Unlock()
	if conn != nil && cur == conn {
		conn.Close()
	}
}

func (c *Client) onUp(cm *autopaho.ConnectionManager, ca *paho.Connack) {
	c.mu.Lock()
	c.everUp = true
	c.mu.Unlock()
	c.stats.connects.Add(1)
	c.log.Info("mqtt: connected to the external broker", "client_id", c.cfg.ClientID, "session_present", ca.SessionPresent)
	// OnConnectionUp must not block; subscribing waits for the SUBACK.
	go c.subscribe(cm, ca.SessionPresent)
}

// subscribe makes the shared subscriptions, again on every connection: a
// resumed session has them, and subscribing again only replaces them.
func (c *Client) subscribe(cm *autopaho.ConnectionManager, resumed bool) {
	ctx, cancel := context.WithTimeout(c.run, 30*time.Second)
	defer cancel()
	filters := c.filters()
	sub := &paho.Subscribe{}
	for _, f := range filters {
		sub.Subscriptions = append(sub.Subscriptions, paho.SubscribeOptions{Topic: f, QoS: 1})
	}
	sa, err := cm.Subscribe(ctx, sub)
	if err != nil && (sa == nil || len(sa.Reasons) == 0) {
		if c.run.Err() == nil {
			c.log.Error("mqtt: subscribe to the devices' topics failed; reconnecting", "err", err)
			c.mu.Lock()
			conn := c.conn
			c.mu.Unlock()
			c.reconnect(conn)
		}
		return
	}
	ok := true
	for i, code := range sa.Reasons {
		if code >= 0x80 {
			ok = false
			c.log.Error("mqtt: the broker refused fleetd's subscription; fleetd receives no device messages on it. Give fleetd's username the right to subscribe to shared subscriptions (superuser: see docs/operations.md)",
				"filter", filters[i], "reason_code", fmt.Sprintf("0x%02x", code), "username", c.cfg.Username)
		}
	}
	c.connected.Store(true)
	if ok {
		c.log.Debug("mqtt: subscribed", "filters", filters, "session_resumed", resumed)
	}
	c.upOnce.Do(func() { close(c.upCh) })
	c.signal() // arrivals waited for the connection
}

// filters are the shared subscriptions of the devices' publishes.
func (c *Client) filters() []string {
	g := c.cfg.ShareGroup
	return append(append([]string{mqtt.StatusFilter(g)}, mqtt.StreamFilters(g)...), mqtt.ReportedFilter(g))
}

func (c *Client) onDown() bool {
	c.connected.Store(false)
	c.stats.disconnects.Add(1)
	c.mu.Lock()
	closing := c.closing
	c.mu.Unlock()
	if !closing {
		c.log.Warn("mqtt: connection to the external broker lost; reconnecting")
	}
	return true
}

func (c *Client) onConnectError(err error) {
	if c.run.Err() != nil {
		return
	}
	var ce *autopaho.ConnackError
	if errors.As(err, &ce) {
		c.log.Error("mqtt: the external broker refused fleetd's connection; check --mqtt-username, --mqtt-password and the broker's authentication of fleetd",
			"reason_code", fmt.Sprintf("0x%02x", ce.ReasonCode), "reason", ce.Reason)
		return
	}
	c.log.Warn("mqtt: cannot connect to the external broker; retrying", "err", err)
}

func (c *Client) onServerDisconnect(d *paho.Disconnect) {
	level := slog.LevelWarn
	msg := "mqtt: the external broker disconnected fleetd"
	if d.ReasonCode == 0x8E {
		level = slog.LevelError
		msg = "mqtt: the external broker disconnected fleetd: another client uses the same client id; give each replica its own --mqtt-client-id"
	}
	reason := ""
	if d.Properties != nil {
		reason = d.Properties.ReasonString
	}
	c.log.Log(context.Background(), level, msg, "reason_code", fmt.Sprintf("0x%02x", d.ReasonCode), "reason", reason)
}

// disconnectPacket ends the session with the connection at a graceful
// Close, so that the broker routes nothing more to it, unless a publish is
// still unacknowledged: then the session waits for a replica with the same
// client id.
func (c *Client) disconnectPacket() *paho.Disconnect {
	d := &paho.Disconnect{ReasonCode: 0}
	if !c.unacked.Load() && c.pending.Load() == 0 {
		zero := uint32(0)
		d.Properties = &paho.DisconnectProperties{SessionExpiryInterval: &zero}
	}
	return d
}

// onPublish hands a publish to the worker of its device. It runs on
// paho's one receiving goroutine, which it blocks when that worker is
// behind: the broker then waits for acknowledgements.
func (c *Client) onPublish(pr paho.PublishReceived) (bool, error) {
	p := pr.Packet
	t, ok := mqtt.ParseTopic(p.Topic)
	if !ok || t.Kind == mqtt.TopicActions || t.Kind == mqtt.TopicShadowDelta {
		// Not a topic fleetd subscribed to; nothing to redo.
		c.log.Warn("mqtt: message on an unexpected topic acknowledged and dropped", "topic", mqtt.Truncate(p.Topic, 200))
		_ = pr.Client.Ack(p)
		return true, nil
	}
	var h maphash.Hash
	h.SetSeed(c.seed)
	h.WriteString(t.Tenant)
	h.WriteByte('/')
	h.WriteString(t.Device)
	if p.QoS > 0 {
		c.pending.Add(1)
	}
	c.inflight.Add(1)
	select {
	case c.queues[h.Sum64()%uint64(len(c.queues))] <- inbound{cli: pr.Client, pub: p, topic: t}:
	case <-c.quit:
		// Shutting down: left unacknowledged, the session keeps it.
		c.inflight.Done()
	}
	return true, nil
}

// work runs the Handler on one queue's publishes, in order, and
// acknowledges each after the Handler returned.
func (c *Client) work(q chan inbound) {
	defer c.workers.Done()
	for {
		select {
		case in := <-q:
			c.handle(in)
			if in.pub.QoS > 0 {
				c.pending.Add(-1)
			}
			c.inflight.Done()
		case <-c.quit:
			return
		}
	}
}

func (c *Client) handle(in inbound) {
	t := in.topic
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.HandlerTimeout)
	defer cancel()
	var err error
	switch t.Kind {
	case mqtt.TopicStream:
		err = c.h.HandleStream(ctx, t.Tenant, t.Device, t.Stream, t.Compression, in.pub.Payload)
	case mqtt.TopicShadowReported:
		err = c.h.HandleReported(ctx, t.Tenant, t.Device, in.pub.Payload)
	default:
		err = c.h.HandleStatus(ctx, t.Tenant, t.Device, in.pub.Payload)
	}
	c.stats.messagesIn.Add(1)
	if err != nil && mqtt.Unavailable(ctx, err) && in.pub.QoS > 0 {
		c.stats.unacked.Add(1)
		c.unacked.Store(true) // the session must keep it, even at Close
		c.log.Warn("mqtt: publish not acknowledged, fleetd cannot commit it now; reconnecting so that the broker sends it again",
			"tenant", t.Tenant, "device", t.Device, "topic", in.pub.Topic, "err", err)
		// Acknowledgements go out in order, so none after this one would
		// leave either: the broker resends them all on the new connection,
		// and reports already applied are ignored. The new connection waits
		// out its backoff (half a second at least: see backoff), which
		// gives a database that is down time to come back.
		c.mu.Lock()
		conn := c.conn
		closing := c.closing
		c.mu.Unlock()
		if !closing {
			c.reconnect(conn)
		}
		return
	}
	if err != nil {
		c.stats.handlerErrors.Add(1)
		mqtt.LogRejected(ctx, c.log, err, t.Tenant, t.Device, in.pub.Topic, in.pub.QoS)
	}
	if err := in.cli.Ack(in.pub); err != nil {
		if !errors.Is(err, paho.ErrPacketNotFound) {
			c.log.Debug("mqtt: acknowledge", "err", err)
		}
	} else if in.pub.QoS > 0 {
		c.acked.Add(1)
	}
}

// SendAction publishes payload at QoS 1 on the device's actions topic and
// reports whether the broker took it for at least one subscriber. False
// means the device is not subscribed now ("no matching subscribers"), the
// broker is unreachable, or the device's backlog is being sent (the
// action's turn comes in it): the action stays queued and is sent in its
// turn, or when the device next arrives. True is not delivery; the
// device's first report is.
func (c *Client) SendAction(tenant, device string, actionID int64, payload []byte) bool {
	if c.backlogs.behind(tenant, device, actionID) {
		return false
	}
	return c.publish(tenant, device, payload) == published
}

// SendDelta publishes the delta of the device's shadow on its shadow
// delta topic as the topic's retained message, at QoS 1: fleetd cannot see
// the devices' subscriptions here, so the broker keeps the delta for the
// device and hands it over whenever it subscribes. An empty delta clears
// the retained message (an empty retained payload, which MQTT hands to
// the subscribers of the moment as well). It reports whether the broker
// took the message.
func (c *Client) SendDelta(tenant, device string, delta []byte) bool {
	if !c.connected.Load() {
		return false
	}
	ctx, cancel := context.WithTimeout(c.run, c.cfg.PublishTimeout)
	defer cancel()
	r, err := c.cm.Publish(ctx, &paho.Publish{Topic: mqtt.ShadowDeltaTopic(tenant, device), QoS: 1, Retain: true, Payload: delta})
	if err != nil {
		if c.run.Err() == nil {
			c.log.Warn("mqtt: publish a shadow delta", "tenant", tenant, "device", device, "err", err)
		}
		return false
	}
	// 0x10, no matching subscribers: retained all the same.
	if r != nil && r.ReasonCode >= 0x80 {
		c.log.Error("mqtt: the broker refused a shadow delta; give fleetd's username the right to publish retained messages on the devices' shadow delta topics",
			"tenant", tenant, "device", device, "reason_code", fmt.Sprintf("0x%02x", r.ReasonCode))
		return false
	}
	return true
}

// publishResult is what became of an action handed to the broker.
type publishResult int

const (
	published     publishResult = iota
	noSubscribers               // the device is not subscribed now
	unreachable                 // the broker did not take it
)

// publish hands an action to the broker.
func (c *Client) publish(tenant, device string, payload []byte) publishResult {
	if !c.connected.Load() {
		return unreachable
	}
	ctx, cancel := context.WithTimeout(c.run, c.cfg.PublishTimeout)
	defer cancel()
	r, err := c.cm.Publish(ctx, &paho.Publish{Topic: mqtt.ActionsTopic(tenant, device), QoS: 1, Payload: payload})
	if r != nil && r.ReasonCode == 0x10 {
		return noSubscribers
	}
	if err != nil {
		if c.run.Err() == nil {
			c.log.Warn("mqtt: publish action", "tenant", tenant, "device", device, "err", err)
		}
		return unreachable
	}
	if r != nil && r.ReasonCode >= 0x80 {
		c.log.Error("mqtt: the broker refused an action; give fleetd's username the right to publish on the devices' actions topics",
			"tenant", tenant, "device", device, "reason_code", fmt.Sprintf("0x%02x", r.ReasonCode))
		return unreachable
	}
	c.stats.messagesOut.Add(1)
	return published
}

// backlogBatch is how many queued actions a backlog reads at once.
const backlogBatch = 64

// sendBacklog publishes the actions queued for a device that arrived at
// the broker, oldest first, each once the broker took the one before; a
// dispatch to the device meanwhile waits its turn in the backlog (SendAction
// leaves it to the store). The broker holds the device's in-flight window
// and its waiting line. It reports false when the broker could not take
// them: the arrival is served again.
func (c *Client) sendBacklog(tenant, device string) bool {
	run, first := c.backlogs.start(tenant, device)
	if !first {
		return true // a run under way reads again when it is done
	}
	after := int64(0)
	patience := time.Now().Add(c.cfg.ConnectDelay)
	for {
		ctx, cancel := context.WithTimeout(c.run, c.cfg.HandlerTimeout)
		msgs, err := c.h.PendingActions(ctx, tenant, device, after, backlogBatch)
		cancel()
		if err != nil {
			c.backlogs.end(tenant, device, run)
			if c.run.Err() == nil {
				c.log.Warn("mqtt: cannot read the actions queued for a device now; they are sent when it next arrives", "tenant", tenant, "device", device, "err", err)
			}
			return false
		}
		for i := 0; i < len(msgs); {
			switch c.publish(tenant, device, msgs[i].Payload) {
			case unreachable:
				c.backlogs.end(tenant, device, run)
				return false
			case noSubscribers:
				// The broker authorises a subscription before it makes it:
				// give the first message a moment. A device that left gets
				// its backlog when it next arrives.
				if i > 0 || after > 0 || time.Now().After(patience) || !c.wait(100*time.Millisecond) {
					c.backlogs.end(tenant, device, run)
					return true
				}
				continue
			}
			after = msgs[i].ActionID
			i++
		}
		if len(msgs) == backlogBatch {
			continue
		}
		if next, again := c.backlogs.finish(tenant, device, run, after); again {
			after = next
			continue
		}
		return true
	}
}

// wait waits d, or until the Client closes; it reports false then.
func (c *Client) wait(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-c.run.Done():
		return false
	}
}

// backlogs are the devices whose backlog this process is sending.
type backlogs struct {
	mu sync.Mutex
	m  map[string]*backlogRun
}

// backlogRun is one device's backlog being sent.
type backlogRun struct {
	again   bool  // a dispatch was left to the backlog, or the device arrived again
	missed  int64 // the lowest id of those dispatches; 0: none
	arrived bool  // the device arrived again: its new session needs everything
}

func (b *backlogs) start(tenant, device string) (*backlogRun, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	k := mqtt.Username(tenant, device)
	if r := b.m[k]; r != nil {
		r.again, r.arrived = true, true
		return r, false
	}
	if b.m == nil {
		b.m = map[string]*backlogRun{}
	}
	r := &backlogRun{}
	b.m[k] = r
	return r, true
}

// behind reports whether the device's backlog is being sent, noting that
// action id is left to it.
func (b *backlogs) behind(tenant, device string, id int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.m[mqtt.Username(tenant, device)]
	if r == nil {
		return false
	}
	r.again = true
	if r.missed == 0 || id < r.missed {
		r.missed = id
	}
	return true
}

// finish ends a run that read everything above after, unless something
// was left to it meanwhile: then it reads again, from the returned id.
func (b *backlogs) finish(tenant, device string, r *backlogRun, after int64) (int64, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r.again {
		switch {
		case r.arrived:
			after = 0
		case r.missed != 0:
			after = min(after, r.missed-1)
		}
		r.again, r.missed, r.arrived = false, 0, false
		return after, true
	}
	delete(b.m, mqtt.Username(tenant, device))
	return 0, false
}

func (b *backlogs) end(tenant, device string, r *backlogRun) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m[mqtt.Username(tenant, device)] == r {
		delete(b.m, mqtt.Username(tenant, device))
	}
}

// Online reports whether the Client is connected to the broker: it cannot
// tell whether the device is.
func (c *Client) Online(tenant, device string) bool { return c.connected.Load() }

// CredentialsChanged does nothing: devices are the external broker's
// connections, not fleetd's. A device whose credentials were revoked is refused by the
// broker-auth endpoints at its next connection; to end a session at once,
// use the broker's own administration (EMQX: kick the client).
func (c *Client) CredentialsChanged(tenant, device string) {}

// PresenceUnknown tells the action service that this channel cannot list
// connected devices: a dispatch is offered to every targeted device.
func (c *Client) PresenceUnknown() bool { return true }

// Connected reports whether the Client is connected and subscribed now.
func (c *Client) Connected() bool { return c.connected.Load() }

// DeviceArriving records that a device is arriving at the broker, so that
// what is queued for it is sent once its subscription is in place:
// subscribing says the broker is authorising its subscription to its
// actions topic, otherwise it is authenticating at CONNECT. BrokerAuth
// calls it.
func (c *Client) DeviceArriving(ctx context.Context, tenant, device string, subscribing bool) error {
	d := c.cfg.ConnectDelay
	if subscribing {
		d = c.cfg.SubscribeDelay
	}
	at := c.cfg.Now().Add(d)
	if err := c.store.ScheduleRedelivery(ctx, tenant, device, at); err != nil {
		return err
	}
	c.timerMu.Lock()
	if len(c.timers) == 0 || at.Before(c.timers[0]) {
		c.signal()
	}
	heap.Push(&c.timers, at)
	c.timerMu.Unlock()
	return nil
}

func (c *Client) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// redeliver claims due arrivals and serves them until Close: the Handler
// sends each device its queued actions.
func (c *Client) redeliver() {
	defer c.loops.Done()
	const batch = 64
	sem := make(chan struct{}, 16)
	var tasks sync.WaitGroup
	defer tasks.Wait()
	for c.run.Err() == nil {
		var rs []fleet.Redelivery
		if c.connected.Load() {
			var err error
			rs, err = c.store.ClaimRedeliveries(c.run, c.cfg.ClientID, c.cfg.RedeliveryLease, batch)
			if err != nil && c.run.Err() == nil {
				c.log.Warn("mqtt: claim device arrivals", "err", err)
			}
		}
		for _, r := range rs {
			sem <- struct{}{}
			tasks.Add(1)
			go func(r fleet.Redelivery) {
				defer func() { <-sem; tasks.Done() }()
				c.h.DeviceSubscribed(r.Tenant, r.DeviceID)
				// While the broker was unreachable nothing could be sent:
				// leave the arrival for the next claim.
				done := c.sendBacklog(r.Tenant, r.DeviceID)
				c.stats.redeliveries.Add(1)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := c.store.CompleteRedelivery(ctx, r, c.cfg.ClientID, done); err != nil {
					c.log.Warn("mqtt: record a device served; it is served again after the lease", "tenant", r.Tenant, "device", r.DeviceID, "err", err)
				}
			}(r)
		}
		if len(rs) == batch {
			continue
		}
		wait := c.cfg.RedeliveryPoll
		c.timerMu.Lock()
		now := c.cfg.Now()
		for len(c.timers) > 0 && !c.timers[0].After(now) {
			heap.Pop(&c.timers)
			wait = 0
		}
		if wait > 0 && len(c.timers) > 0 {
			wait = min(wait, c.timers[0].Sub(now))
		}
		c.timerMu.Unlock()
		if wait == 0 {
			continue
		}
		t := time.NewTimer(wait)
		select {
		case <-c.run.Done():
		case <-c.wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// Close stops gracefully: it stops serving arrivals, unsubscribes so that
// the broker routes nothing more to this replica, lets the publishes it has
// finish and acknowledges them (for at most ShutdownTimeout), then
// disconnects, ending its session unless a publish is left unacknowledged.
func (c *Client) Close() error {
	c.mu.Lock()
	if !c.opened || c.closing {
		c.mu.Unlock()
		return nil
	}
	c.closing = true
	c.mu.Unlock()

	if c.connected.Load() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := c.cm.Unsubscribe(ctx, &paho.Unsubscribe{Topics: c.filters()})
		cancel()
		if err != nil {
			c.log.Debug("mqtt: unsubscribe at shutdown", "err", err)
		}
	}

	done := make(chan struct{})
	go func() { c.inflight.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(c.cfg.ShutdownTimeout):
		c.log.Warn("mqtt: handler calls still running at shutdown; cancelling them", "timeout", c.cfg.ShutdownTimeout)
		c.cancel()
		<-done
	}
	c.awaitAcks()

	c.stop() // the redelivery loop, and the connection: autopaho disconnects
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := c.cm.Disconnect(ctx)
	c.loops.Wait()
	close(c.quit)
	c.workers.Wait()
	c.cancel()
	c.connected.Store(false)
	c.log.Info("mqtt: disconnected from the external broker")
	if err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("mqtt: disconnect: %w", err)
	}
	return nil
}

// awaitAcks waits until paho has written the acknowledgements the workers
// gave it, which it does on its own tick: without them the broker would
// send those publishes again to the next replica. Acknowledgements paho
// dropped with a lost connection are never written: the wait ends after a
// second all the same.
func (c *Client) awaitAcks() {
	bound := time.NewTimer(time.Second)
	defer bound.Stop()
	for c.session.written.Load() < c.acked.Load() && c.connected.Load() {
		select {
		case <-c.session.wrote:
		case <-bound.C:
			c.log.Debug("mqtt: acknowledgements not written at shutdown; the broker sends those publishes again",
				"count", c.acked.Load()-c.session.written.Load())
			return
		}
	}
}

// ackSession is paho's session state, counting the acknowledgements of
// publishes it writes (paho's Ack only queues them).
type ackSession struct {
	session.SessionManager
	written atomic.Uint64
	wrote   chan struct{} // signalled after each
}

func (s *ackSession) Ack(pb *packets.Publish) error {
	err := s.SessionManager.Ack(pb)
	if pb.QoS > 0 {
		s.written.Add(1)
		select {
		case s.wrote <- struct{}{}:
		default:
		}
	}
	return err
}

// Stats returns the client's counters; Connections is 1 while connected.
func (c *Client) Stats() mqtt.Stats {
	n := 0
	if c.connected.Load() {
		n = 1
	}
	return mqtt.Stats{
		Connections:    n,
		Connects:       c.stats.connects.Load(),
		Disconnects:    c.stats.disconnects.Load(),
		MessagesIn:     c.stats.messagesIn.Load(),
		MessagesOut:    c.stats.messagesOut.Load(),
		HandlerErrors:  c.stats.handlerErrors.Load(),
		Unacknowledged: c.stats.unacked.Load(),
	}
}

// Addr describes where the Client connects, for the startup line.
func (c *Client) Addr() string { return redactURL(c.cfg.Broker) }

// dueHeap orders the times at which this process's arrivals are due, so
// that it serves them on time rather than at its next poll.
type dueHeap []time.Time

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].Before(h[j]) }
func (h dueHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *dueHeap) Push(x any)        { *h = append(*h, x.(time.Time)) }
func (h *dueHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	*h = old[:len(old)-1]
	return t
}

// memoryRedeliveries keeps arrivals in memory when no store is given: the
// single-process form of RedeliveryStore.
type memoryRedeliveries struct {
	now func() time.Time
	mu  sync.Mutex
	m   map[[2]string]*memoryRedelivery
}

type memoryRedelivery struct {
	due, leaseUntil time.Time
	version         int64
}

func newMemoryRedeliveries(now func() time.Time) *memoryRedeliveries {
	return &memoryRedeliveries{now: now, m: map[[2]string]*memoryRedelivery{}}
}

func (s *memoryRedeliveries) ScheduleRedelivery(_ context.Context, tenant, device string, at time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := [2]string{tenant, device}
	r := s.m[k]
	if r == nil {
		r = &memoryRedelivery{}
		s.m[k] = r
	}
	r.due = at
	r.version++
	return nil
}

func (s *memoryRedeliveries) ClaimRedeliveries(_ context.Context, _ string, lease time.Duration, limit int) ([]fleet.Redelivery, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var out []fleet.Redelivery
	for k, r := range s.m {
		if len(out) == limit {
			break
		}
		if !r.due.After(now) && r.leaseUntil.Before(now) {
			r.leaseUntil = now.Add(lease)
			out = append(out, fleet.Redelivery{Tenant: k[0], DeviceID: k[1], Version: r.version})
		}
	}
	return out, nil
}

func (s *memoryRedeliveries) CompleteRedelivery(_ context.Context, rd fleet.Redelivery, _ string, done bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := [2]string{rd.Tenant, rd.DeviceID}
	r := s.m[k]
	if r == nil {
		return nil
	}
	if done && r.version == rd.Version {
		delete(s.m, k)
		return nil
	}
	r.leaseUntil = time.Time{}
	return nil
}
