package bridge_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/internal/poll"
	"github.com/fleetd/fleet/mqtt"
	"github.com/fleetd/fleet/mqtt/bridge"
	"github.com/fleetd/fleet/mqtt/mosquittotest"
	"github.com/fleetd/fleet/mqtt/mqtttest"
)

// mustOpenClient opens a Client of broker serving h and waits until it is
// connected and subscribed. It is closed when the test ends.
func mustOpenClient(t *testing.T, broker string, h mqtt.Handler, configure ...func(*bridge.ClientConfig)) *bridge.Client {
	t.Helper()
	cfg := bridge.ClientConfig{
		Broker:         broker,
		Logger:         slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
		SubscribeDelay: 50 * time.Millisecond,
		ConnectDelay:   300 * time.Millisecond,
		RedeliveryPoll: 50 * time.Millisecond,
	}
	for _, f := range configure {
		f(&cfg)
	}
	c, err := bridge.NewClient(cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	ctx, cancel := mqtttest.Context()
	defer cancel()
	if err := c.WaitConnected(ctx); err != nil {
		t.Fatalf("client did not connect: %v", err)
	}
	return c
}

// dialDevice connects an MQTT 5 device to the broker at addr. The external
// broker of these tests lets anyone in: the credentials are BrokerAuth's
// business, tested on their own.
func dialDevice(t testing.TB, addr, clientID string) *mqtttest.Device {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	c := &mqtttest.Device{Received: make(chan *paho.Publish, 100), Disconnected: make(chan *paho.Disconnect, 1)}
	c.Client = paho.NewClient(paho.ClientConfig{
		Conn: conn,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){
			func(pr paho.PublishReceived) (bool, error) { c.Received <- pr.Packet; return true, nil },
		},
	})
	ctx, cancel := mqtttest.Context()
	defer cancel()
	if _, err := c.Connect(ctx, &paho.Connect{ClientID: clientID, CleanStart: true, KeepAlive: 30}); err != nil {
		t.Fatalf("device connect: %v", err)
	}
	t.Cleanup(func() {
		_ = c.Disconnect(&paho.Disconnect{ReasonCode: 0})
		<-c.Done()
	})
	return c
}

func TestClient(t *testing.T) {
	broker := mosquittotest.Start(t)
	h := mqtttest.NewHandler()
	c := mustOpenClient(t, broker.URL, h)
	dev := dialDevice(t, broker.Addr, "dev-1")

	t.Run("Status", func(t *testing.T) {
		if err := dev.Send(mqtt.ActionStatusTopic("acme", "dev-1"), []byte(`{"id":"1","state":"Running"}`)); err != nil {
			t.Fatal(err)
		}
		got := mqtttest.Receive(t, h.Statuses, "HandleStatus")
		if got.Tenant != "acme" || got.Device != "dev-1" || string(got.Payload) != `{"id":"1","state":"Running"}` {
			t.Fatalf("HandleStatus got %+v", got)
		}
	})

	t.Run("Stream", func(t *testing.T) {
		if err := dev.Send(mqtt.StreamTopic("acme", "dev-1", "gps"), []byte(`[{"sequence":1,"timestamp":1}]`)); err != nil {
			t.Fatal(err)
		}
		got := mqtttest.Receive(t, h.Streams, "HandleStream")
		if got.Tenant != "acme" || got.Device != "dev-1" || got.Stream != "gps" {
			t.Fatalf("HandleStream got %+v", got)
		}
	})

	t.Run("SendAction", func(t *testing.T) {
		// Not subscribed: the broker has no subscriber for the topic.
		if c.SendAction("acme", "dev-1", 7, []byte(`{"id":"7"}`)) {
			t.Fatal("SendAction = true to a device that has not subscribed")
		}
		dev.MustSubscribe(t, mqtt.ActionsTopic("acme", "dev-1"), 1)
		if !c.SendAction("acme", "dev-1", 7, []byte(`{"id":"7"}`)) {
			t.Fatal("SendAction = false to a subscribed device")
		}
		p := mqtttest.Receive(t, dev.Received, "the action")
		if p.Topic != mqtt.ActionsTopic("acme", "dev-1") || string(p.Payload) != `{"id":"7"}` || p.QoS != 1 {
			t.Fatalf("device got %q %q at QoS %d", p.Topic, p.Payload, p.QoS)
		}
	})

	t.Run("Arrival", func(t *testing.T) {
		ctx, cancel := mqtttest.Context()
		defer cancel()
		// A subscription is served after SubscribeDelay; a CONNECT alone
		// after ConnectDelay, and the later arrival of a device replaces
		// its earlier: one call each.
		if err := c.DeviceArriving(ctx, "acme", "dev-2", false); err != nil {
			t.Fatal(err)
		}
		if err := c.DeviceArriving(ctx, "acme", "dev-2", true); err != nil {
			t.Fatal(err)
		}
		if got := mqtttest.Receive(t, h.Subscribed, "DeviceSubscribed"); got.Device != "dev-2" {
			t.Fatalf("DeviceSubscribed(%+v)", got)
		}
		if err := c.DeviceArriving(ctx, "acme", "dev-3", false); err != nil {
			t.Fatal(err)
		}
		if got := mqtttest.Receive(t, h.Subscribed, "DeviceSubscribed"); got.Device != "dev-3" {
			t.Fatalf("DeviceSubscribed(%+v)", got)
		}
		mqtttest.Quiet(t, h.Subscribed, "another DeviceSubscribed")
	})
}

// TestClientBacklog checks that a device arriving at the external broker
// gets its backlog in order, all of it whatever its window (the broker
// holds what the device has no room for), and that a dispatch made while
// the backlog is being sent comes after it.
func TestClientBacklog(t *testing.T) {
	broker := mosquittotest.Start(t)
	h := mqtttest.NewHandler()
	h.PendingGate = make(chan struct{})
	for id := int64(1); id <= 100; id++ {
		h.Queue("acme/dev-4", id, mqtttest.Message(id))
	}
	c := mustOpenClient(t, broker.URL, h)

	conn, err := net.Dial("tcp", broker.Addr)
	if err != nil {
		t.Fatal(err)
	}
	dev := &mqtttest.Device{Received: make(chan *paho.Publish, 200)}
	dev.Client = paho.NewClient(paho.ClientConfig{
		Conn: conn,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){
			func(pr paho.PublishReceived) (bool, error) { dev.Received <- pr.Packet; return true, nil },
		},
		EnableManualAcknowledgment: true,
		SendAcksInterval:           time.Millisecond,
	})
	ctx, cancel := mqtttest.Context()
	defer cancel()
	rm := uint16(1)
	if _, err := dev.Connect(ctx, &paho.Connect{ClientID: "dev-4", CleanStart: true, KeepAlive: 30, Properties: &paho.ConnectProperties{ReceiveMaximum: &rm}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Disconnect(&paho.Disconnect{}) })
	dev.MustSubscribe(t, mqtt.ActionsTopic("acme", "dev-4"), 1)

	if err := c.DeviceArriving(ctx, "acme", "dev-4", true); err != nil {
		t.Fatal(err)
	}
	mqtttest.Receive(t, h.Subscribed, "DeviceSubscribed")
	// The backlog is being read: a dispatch now waits its turn.
	h.Queue("acme/dev-4", 500, mqtttest.Message(500))
	if c.SendAction("acme", "dev-4", 500, mqtttest.Message(500)) {
		t.Fatal("SendAction during the backlog = true, want it left to the backlog")
	}
	close(h.PendingGate)
	for id := int64(1); id <= 101; id++ {
		want := id
		if id == 101 {
			want = 500
		}
		p := mqtttest.Receive(t, dev.Received, fmt.Sprintf("action %d", want))
		if got := mqtttest.MessageID(t, p.Payload); got != want {
			t.Fatalf("received action %d, want %d", got, want)
		}
		dev.Ack(p)
	}
}

// TestClientAcknowledgesAfterHandler checks that a publish the Handler
// could not commit is not acknowledged: the Client reconnects and the
// broker sends it again.
func TestClientAcknowledgesAfterHandler(t *testing.T) {
	broker := mosquittotest.Start(t)
	h := &flakyHandler{Handler: mqtttest.NewHandler(), failures: 2}
	c := mustOpenClient(t, broker.URL, h)
	dev := dialDevice(t, broker.Addr, "dev-1")
	if err := dev.Send(mqtt.ActionStatusTopic("acme", "dev-1"), []byte(`{"id":"1","state":"Running"}`)); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		got := mqtttest.Receive(t, h.Statuses, fmt.Sprintf("HandleStatus call %d", i+1))
		if string(got.Payload) != `{"id":"1","state":"Running"}` {
			t.Fatalf("call %d: %s", i+1, got.Payload)
		}
	}
	mqtttest.Quiet(t, h.Statuses, "a fourth HandleStatus")
	if s := c.Stats(); s.Unacknowledged != 2 || s.Connects < 3 {
		t.Fatalf("stats %+v: want 2 unacknowledged, 3 connections", s)
	}
}

// flakyHandler fails its first HandleStatus calls as unavailable.
type flakyHandler struct {
	*mqtttest.Handler
	mu       sync.Mutex
	failures int
}

func (h *flakyHandler) HandleStatus(ctx context.Context, tenant, device string, payload []byte) error {
	h.Handler.HandleStatus(ctx, tenant, device, payload)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.failures > 0 {
		h.failures--
		return fleet.Errorf(fleet.EUNAVAILABLE, "database down")
	}
	return nil
}

// TestClientSharedSubscription checks that replicas split the devices'
// publishes, each handled once, and that one that closes gracefully takes
// its session with it: the broker then routes everything to the others.
func TestClientSharedSubscription(t *testing.T) {
	broker := mosquittotest.Start(t)
	ha, hb := mqtttest.NewHandler(), mqtttest.NewHandler()
	a := mustOpenClient(t, broker.URL, ha, func(c *bridge.ClientConfig) { c.ClientID = "replica-a" })
	mustOpenClient(t, broker.URL, hb, func(c *bridge.ClientConfig) { c.ClientID = "replica-b" })
	dev := dialDevice(t, broker.Addr, "dev-1")

	const n = 20
	for i := range n {
		if err := dev.Send(mqtt.ActionStatusTopic("acme", "dev-1"), fmt.Appendf(nil, `{"id":"%d"}`, i)); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]int{}
	var fromA, fromB int
	for range n {
		select {
		case got := <-ha.Statuses:
			seen[string(got.Payload)]++
			fromA++
		case got := <-hb.Statuses:
			seen[string(got.Payload)]++
			fromB++
		case <-time.After(mqtttest.Wait):
			t.Fatalf("timed out: %d from a, %d from b", fromA, fromB)
		}
	}
	mqtttest.Quiet(t, ha.Statuses, "a duplicate on a")
	mqtttest.Quiet(t, hb.Statuses, "a duplicate on b")
	if len(seen) != n || fromA == 0 || fromB == 0 {
		t.Fatalf("%d distinct of %d; a handled %d, b %d: want every message once, on both", len(seen), n, fromA, fromB)
	}

	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := dev.Send(mqtt.ActionStatusTopic("acme", "dev-1"), fmt.Appendf(nil, `{"id":"after-%d"}`, i)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		mqtttest.Receive(t, hb.Statuses, fmt.Sprintf("message %d after a left", i))
	}
}

// TestClientBrokerRestart checks that the Client reconnects after the
// broker restarted, resumes its session, and that what devices published
// while it was away reaches the Handler.
func TestClientBrokerRestart(t *testing.T) {
	broker := mosquittotest.Start(t)
	h := mqtttest.NewHandler()
	c := mustOpenClient(t, broker.URL, h, func(c *bridge.ClientConfig) { c.ClientID = "replica-a" })
	broker.Restart(t)
	poll.Until(t, mqtttest.Wait, "the client to reconnect", func() bool { return c.Connected() && c.Stats().Connects >= 2 })
	dev := dialDevice(t, broker.Addr, "dev-1")
	if err := dev.Send(mqtt.ActionStatusTopic("acme", "dev-1"), []byte(`{"id":"1"}`)); err != nil {
		t.Fatal(err)
	}
	mqtttest.Receive(t, h.Statuses, "HandleStatus after the restart")
}

func TestClientConfig(t *testing.T) {
	for _, bad := range []string{"", "tcp://x:1883", "mqtt://", "mqtt://u:p@host:1883", "mqtt://host:1883/path", "http://host"} {
		if _, err := bridge.NewClient(bridge.ClientConfig{Broker: bad}, mqtttest.NewHandler()); err == nil {
			t.Errorf("NewClient accepted broker %q", bad)
		}
	}
	if _, err := bridge.NewClient(bridge.ClientConfig{Broker: "mqtt://h", ShareGroup: "a/b"}, mqtttest.NewHandler()); err == nil {
		t.Error("NewClient accepted a share group with '/'")
	}
	if got, want := mqtt.StatusFilter("fleetd"), "$share/fleetd//tenants/+/devices/+/action/status"; got != want {
		t.Errorf("StatusFilter = %q, want %q", got, want)
	}
	if got, want := fmt.Sprint(mqtt.StreamFilters("fleetd")), "[$share/fleetd//tenants/+/devices/+/events/+/jsonarray $share/fleetd//tenants/+/devices/+/events/+/jsonarray/lz4 "+
		"$share/fleetd//tenants/+/devices/+/+/jsonarray $share/fleetd//tenants/+/devices/+/+/jsonarray/lz4]"; got != want {
		t.Errorf("StreamFilters = %q, want %q", got, want)
	}
}

// TestClientTLS connects to the broker over mqtts://, trusting its CA.
func TestClientTLS(t *testing.T) {
	cert, pool := mqtttest.SelfSigned(t)
	key, err := x509.MarshalECPrivateKey(cert.PrivateKey.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	broker := mosquittotest.Start(t, mosquittotest.WithTLS(
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: key})))
	h := mqtttest.NewHandler()
	mustOpenClient(t, broker.TLSURL, h, func(c *bridge.ClientConfig) { c.TLS = &tls.Config{RootCAs: pool} })
	dev := dialDevice(t, broker.Addr, "dev-1")
	if err := dev.Send(mqtt.ActionStatusTopic("acme", "dev-1"), []byte(`{"id":"1"}`)); err != nil {
		t.Fatal(err)
	}
	mqtttest.Receive(t, h.Statuses, "HandleStatus over TLS")

	// A broker whose certificate fleetd does not trust is refused.
	c, err := bridge.NewClient(bridge.ClientConfig{Broker: broker.TLSURL}, mqtttest.NewHandler())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Open(); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := c.WaitConnected(ctx); err == nil {
		t.Fatal("connected to a broker with an untrusted certificate")
	}
}
