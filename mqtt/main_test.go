package mqtt_test

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	pahov3 "github.com/eclipse/paho.mqtt.golang"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/mqtt"
)

// wait bounds every wait in these tests; nothing here takes a tenth of it.
const wait = 10 * time.Second

// call is one call to the fake handler.
type call struct {
	Tenant, Device, Stream string
	ActionID               int64
	Payload                []byte
}

// fakeHandler is a Handler that records its calls on channels. Set its fields
// before the server opens.
type fakeHandler struct {
	mu      sync.Mutex
	tokens  map[string]string // "tenant/device" -> token; setToken once the server is open
	authErr error             // when set, AuthenticateDevice returns it
	pubErr  error             // when set, HandleStatus and HandleStream return it
	gate    chan struct{}     // when set, HandleStatus and HandleStream wait for it to close
	// authGate, when set, holds AuthenticateDevice until it is closed;
	// authHold holds it likewise, but after the token was checked.
	authGate, authHold chan struct{}

	authCalls  atomic.Int64
	connected  chan call
	subscribed chan call
	statuses   chan call
	streams    chan call
	delivered  chan call
	failed     chan call // ActionFailed; Stream holds the reason

	// backlog is what the store would hold Queued for each device
	// ("tenant/device"), in action id order; ActionDelivered and
	// ActionFailed take actions out of it, and PendingActions reads it.
	backlog     map[string][]fleet.ActionMessage
	pendingErr  error         // when set, PendingActions returns it; under mu
	pendingGate chan struct{} // when set, PendingActions waits for it to close
	reads       atomic.Int64
}

func newFakeHandler() *fakeHandler {
	return &fakeHandler{
		tokens: map[string]string{
			"acme/dev-1":  "tok-1",
			"acme/dev-2":  "tok-2",
			"other/dev-1": "tok-3",
		},
		connected:  make(chan call, 100),
		subscribed: make(chan call, 100),
		statuses:   make(chan call, 100),
		streams:    make(chan call, 100),
		delivered:  make(chan call, 1000),
		failed:     make(chan call, 100),
		backlog:    map[string][]fleet.ActionMessage{},
	}
}

// queue adds an action to a device's backlog, as a dispatch to a device
// that is offline does.
func (h *fakeHandler) queue(device string, id int64, payload []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	b := append(h.backlog[device], fleet.ActionMessage{ActionID: id, Payload: payload})
	slices.SortFunc(b, func(x, y fleet.ActionMessage) int { return cmp.Compare(x.ActionID, y.ActionID) })
	h.backlog[device] = b
}

// settled takes an action out of the backlog.
func (h *fakeHandler) settled(tenant, device string, id int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	k := tenant + "/" + device
	h.backlog[k] = slices.DeleteFunc(h.backlog[k], func(m fleet.ActionMessage) bool { return m.ActionID == id })
}

func (h *fakeHandler) PendingActions(ctx context.Context, tenant, device string, after int64, limit int) ([]fleet.ActionMessage, error) {
	h.reads.Add(1)
	if h.pendingGate != nil {
		select {
		case <-h.pendingGate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.pendingErr != nil {
		return nil, h.pendingErr
	}
	var out []fleet.ActionMessage
	for _, m := range h.backlog[tenant+"/"+device] {
		if m.ActionID > after && len(out) < limit {
			out = append(out, m)
		}
	}
	return out, nil
}

func (h *fakeHandler) ActionFailed(tenant, device string, actionID int64, reason string) {
	h.settled(tenant, device, actionID)
	h.failed <- call{Tenant: tenant, Device: device, ActionID: actionID, Stream: reason}
}

func (h *fakeHandler) AuthenticateDevice(ctx context.Context, tenant, device, token string) error {
	h.authCalls.Add(1)
	if h.authGate != nil {
		select {
		case <-h.authGate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if h.authErr != nil {
		return h.authErr
	}
	h.mu.Lock()
	want, ok := h.tokens[tenant+"/"+device]
	h.mu.Unlock()
	if h.authHold != nil {
		select {
		case <-h.authHold:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if !ok || want != token {
		return fleet.Errorf(fleet.EUNAUTHENTICATED, "bad device token")
	}
	return nil
}

// setToken gives a device a new token, or none ("").
func (h *fakeHandler) setToken(device, token string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if token == "" {
		delete(h.tokens, device)
		return
	}
	h.tokens[device] = token
}

func (h *fakeHandler) DeviceConnected(tenant, device string) {
	h.connected <- call{Tenant: tenant, Device: device}
}

func (h *fakeHandler) DeviceSubscribed(tenant, device string) {
	h.subscribed <- call{Tenant: tenant, Device: device}
}

func (h *fakeHandler) HandleStatus(ctx context.Context, tenant, device string, payload []byte) error {
	h.statuses <- call{Tenant: tenant, Device: device, Payload: payload}
	return h.publish(ctx)
}

func (h *fakeHandler) HandleStream(ctx context.Context, tenant, device, stream string, payload []byte) error {
	h.streams <- call{Tenant: tenant, Device: device, Stream: stream, Payload: payload}
	return h.publish(ctx)
}

func (h *fakeHandler) publish(ctx context.Context) error {
	if h.gate != nil {
		select {
		case <-h.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return h.pubErr
}

func (h *fakeHandler) ActionDelivered(tenant, device string, actionID int64) {
	h.settled(tenant, device, actionID)
	h.delivered <- call{Tenant: tenant, Device: device, ActionID: actionID}
}

// MustOpenServer opens a server on a free loopback port and closes it when
// the test ends.
func MustOpenServer(t *testing.T, h mqtt.Handler, configure ...func(*mqtt.Config)) *mqtt.Server {
	t.Helper()
	cfg := mqtt.Config{
		Addr: "127.0.0.1:0",
		// Connections park as soon as they are silent, so that every test
		// drives parked connections as well as reading ones.
		ParkAfter: time.Millisecond,
		Logger:    slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	for _, f := range configure {
		f(&cfg)
	}
	s := mqtt.NewServer(cfg, h)
	if err := s.Open(); err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return s
}

func contextWithWait() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), wait)
}

// receive returns the next value from ch, failing the test if none comes.
func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(wait):
		t.Fatalf("timed out waiting for %s", what)
	}
	panic("unreachable")
}

// quiet asserts that nothing arrives on ch for a moment: the absence of an
// event cannot be awaited, only given time to show. Only the external
// broker's tests use it, where no event of fleetd's orders what the broker
// does.
func quiet[T any](t *testing.T, ch <-chan T, what string) {
	t.Helper()
	select {
	case v := <-ch:
		t.Fatalf("got %s too early: %+v", what, v)
	case <-time.After(200 * time.Millisecond):
	}
}

// watchLog makes cfg's logger send the message of each line it logs to the
// channel returned, besides the test's output.
func watchLog(t *testing.T, cfg *mqtt.Config) <-chan string {
	ch := make(chan string, 1000)
	cfg.Logger = slog.New(&logWatcher{Handler: cfg.Logger.Handler(), ch: ch})
	return ch
}

type logWatcher struct {
	slog.Handler
	ch chan string
}

func (w *logWatcher) Handle(ctx context.Context, r slog.Record) error {
	select {
	case w.ch <- r.Message:
	default:
	}
	return w.Handler.Handle(ctx, r)
}

func (w *logWatcher) WithAttrs(as []slog.Attr) slog.Handler {
	return &logWatcher{Handler: w.Handler.WithAttrs(as), ch: w.ch}
}

func (w *logWatcher) WithGroup(name string) slog.Handler {
	return &logWatcher{Handler: w.Handler.WithGroup(name), ch: w.ch}
}

// awaitLog waits until the server logs msg.
func awaitLog(t *testing.T, logs <-chan string, msg string) {
	t.Helper()
	for {
		if receive(t, logs, "log line "+msg) == msg {
			return
		}
	}
}

// client5 is a device speaking MQTT 5 through paho.golang.
type client5 struct {
	*paho.Client
	received     chan *paho.Publish
	disconnected chan *paho.Disconnect // DISCONNECT from the server
}

var clientIDs atomic.Int64

// connect5 connects an MQTT 5 device; with manualAck the test sends the
// PUBACKs of actions itself, with Ack.
func connect5(t *testing.T, s *mqtt.Server, username, password string, manualAck bool, configure ...func(*paho.Connect)) (*client5, *paho.Connack, error) {
	t.Helper()
	conn, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	c := &client5{
		received:     make(chan *paho.Publish, 100),
		disconnected: make(chan *paho.Disconnect, 1),
	}
	c.Client = paho.NewClient(paho.ClientConfig{
		Conn: conn,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){
			func(pr paho.PublishReceived) (bool, error) {
				c.received <- pr.Packet
				return true, nil
			},
		},
		OnServerDisconnect:         func(d *paho.Disconnect) { c.disconnected <- d },
		EnableManualAcknowledgment: manualAck,
		SendAcksInterval:           time.Millisecond, // paho's default, 50 ms, would pace the tests that acknowledge one by one
	})
	cp := &paho.Connect{
		KeepAlive:  30,
		ClientID:   fmt.Sprintf("test-%d", clientIDs.Add(1)),
		CleanStart: true,
	}
	if username != "" {
		cp.Username, cp.UsernameFlag = username, true
	}
	if password != "" {
		cp.Password, cp.PasswordFlag = []byte(password), true
	}
	for _, f := range configure {
		f(cp)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	ca, err := c.Connect(ctx, cp)
	if err != nil {
		conn.Close()
		return nil, ca, err
	}
	t.Cleanup(func() {
		_ = c.Disconnect(&paho.Disconnect{ReasonCode: 0})
		<-c.Done()
	})
	return c, ca, nil
}

// mustConnect5 connects an MQTT 5 device that must be accepted.
func mustConnect5(t *testing.T, s *mqtt.Server, username, password string, manualAck bool) *client5 {
	t.Helper()
	c, ca, err := connect5(t, s, username, password, manualAck)
	if err != nil {
		t.Fatalf("connect %s: %v (connack %+v)", username, err, ca)
	}
	return c
}

func (c *client5) subscribe(t *testing.T, topic string, qos byte) *paho.Suback {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	sa, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: topic, QoS: qos}}})
	if err != nil {
		t.Fatalf("subscribe %s: %v", topic, err)
	}
	return sa
}

// publish publishes at QoS 1 and returns when the PUBACK arrived, or the
// error.
func (c *client5) publish(topic string, payload []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	// paho keeps an unacknowledged message for a next connection; here the
	// test wants to know that this one got no PUBACK.
	go func() {
		select {
		case <-c.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	pr, err := c.Publish(ctx, &paho.Publish{Topic: topic, QoS: 1, Payload: payload})
	if err != nil {
		return err
	}
	if pr.ReasonCode >= 0x80 {
		return fmt.Errorf("puback reason code %#x", pr.ReasonCode)
	}
	return nil
}

// awaitServerDisconnect waits until the server closed the connection with
// the reason code want.
func (c *client5) awaitServerDisconnect(t *testing.T, want byte) {
	t.Helper()
	d := receive(t, c.disconnected, "DISCONNECT from the server")
	if d.ReasonCode != want {
		t.Errorf("DISCONNECT reason code: got %#x, want %#x", d.ReasonCode, want)
	}
	receive(t, c.Done(), "connection closed")
}

// client3 is a device speaking MQTT 3.1.1 through paho.mqtt.golang.
type client3 struct {
	pahov3.Client
	received chan pahov3.Message
	lost     chan error
}

func connect3(t *testing.T, s *mqtt.Server, username, password string, configure ...func(*pahov3.ClientOptions)) (*client3, error) {
	t.Helper()
	c := &client3{received: make(chan pahov3.Message, 100), lost: make(chan error, 1)}
	opts := pahov3.NewClientOptions().
		AddBroker("tcp://" + s.Addr().String()).
		SetClientID(fmt.Sprintf("test-%d", clientIDs.Add(1))).
		SetUsername(username).
		SetPassword(password).
		SetProtocolVersion(4).
		SetCleanSession(true).
		SetAutoReconnect(false).
		SetConnectRetry(false).
		SetConnectTimeout(wait).
		SetConnectionLostHandler(func(_ pahov3.Client, err error) { c.lost <- err }).
		SetDefaultPublishHandler(func(_ pahov3.Client, m pahov3.Message) { c.received <- m })
	for _, f := range configure {
		f(opts)
	}
	c.Client = pahov3.NewClient(opts)
	tok := c.Connect()
	if !tok.WaitTimeout(wait) {
		t.Fatalf("connect %s: timed out", username)
	}
	if err := tok.Error(); err != nil {
		return nil, err
	}
	t.Cleanup(func() { c.Disconnect(100) })
	return c, nil
}

func mustConnect3(t *testing.T, s *mqtt.Server, username, password string) *client3 {
	t.Helper()
	c, err := connect3(t, s, username, password)
	if err != nil {
		t.Fatalf("connect %s: %v", username, err)
	}
	return c
}

func (c *client3) subscribe(t *testing.T, topic string, qos byte) {
	t.Helper()
	tok := c.Subscribe(topic, qos, nil)
	if !tok.WaitTimeout(wait) {
		t.Fatalf("subscribe %s: timed out", topic)
	}
	if err := tok.Error(); err != nil {
		t.Fatalf("subscribe %s: %v", topic, err)
	}
}

func (c *client3) publish(t *testing.T, topic string, payload []byte) {
	t.Helper()
	tok := c.Publish(topic, 1, false, payload)
	if !tok.WaitTimeout(wait) {
		t.Fatalf("publish %s: timed out", topic)
	}
	if err := tok.Error(); err != nil {
		t.Fatalf("publish %s: %v", topic, err)
	}
}
