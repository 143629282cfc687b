package broker_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	pahov3 "github.com/eclipse/paho.mqtt.golang"

	"github.com/fleetd/fleet/mqtt"
	"github.com/fleetd/fleet/mqtt/broker"
	"github.com/fleetd/fleet/mqtt/mqtttest"
)

// wait bounds every wait in these tests.
const wait = mqtttest.Wait

// MustOpenServer opens a server on a free loopback port and closes it when
// the test ends.
func MustOpenServer(t *testing.T, h mqtt.Handler, configure ...func(*broker.Config)) *broker.Server {
	t.Helper()
	cfg := broker.Config{
		Addr: "127.0.0.1:0",
		// Connections park as soon as they are silent, so that every test
		// drives parked connections as well as reading ones.
		ParkAfter: time.Millisecond,
		Logger:    slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	for _, f := range configure {
		f(&cfg)
	}
	s := broker.NewServer(cfg, h)
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

// watchLog makes cfg's logger send the message of each line it logs to the
// channel returned, besides the test's output.
func watchLog(t *testing.T, cfg *broker.Config) <-chan string {
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
		if mqtttest.Receive(t, logs, "log line "+msg) == msg {
			return
		}
	}
}

var clientIDs atomic.Int64

// connect5 connects an MQTT 5 device; with manualAck the test sends the
// PUBACKs of actions itself, with Ack.
func connect5(t *testing.T, s *broker.Server, username, password string, manualAck bool, configure ...func(*paho.Connect)) (*mqtttest.Device, *paho.Connack, error) {
	t.Helper()
	conn, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	c := mqtttest.NewDevice(conn, manualAck)
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
func mustConnect5(t *testing.T, s *broker.Server, username, password string, manualAck bool) *mqtttest.Device {
	t.Helper()
	c, ca, err := connect5(t, s, username, password, manualAck)
	if err != nil {
		t.Fatalf("connect %s: %v (connack %+v)", username, err, ca)
	}
	return c
}

// client3 is a device speaking MQTT 3.1.1 through paho.mqtt.golang.
type client3 struct {
	pahov3.Client
	received chan pahov3.Message
	lost     chan error
}

func connect3(t *testing.T, s *broker.Server, username, password string, configure ...func(*pahov3.ClientOptions)) (*client3, error) {
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

func mustConnect3(t *testing.T, s *broker.Server, username, password string) *client3 {
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
