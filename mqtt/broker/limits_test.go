package broker_test

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	pahov3 "github.com/eclipse/paho.mqtt.golang"

	"github.com/fleetd/fleet/internal/poll"
	"github.com/fleetd/fleet/mqtt"
	"github.com/fleetd/fleet/mqtt/broker"
	"github.com/fleetd/fleet/mqtt/mqtttest"
)

// connect5From connects an MQTT 5 device from a local address of its own
// (any of 127.0.0.0/8 on Linux), so that limits per source address can be
// told apart in one test.
func connect5From(t *testing.T, s *broker.Server, local, username, password string) (*mqtttest.Device, *paho.Connack, error) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	conn, err := d.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatalf("dial from %s: %v", local, err)
	}
	c := &mqtttest.Device{Received: make(chan *paho.Publish, 100), Disconnected: make(chan *paho.Disconnect, 1)}
	c.Client = paho.NewClient(paho.ClientConfig{
		Conn:               conn,
		OnServerDisconnect: func(d *paho.Disconnect) { c.Disconnected <- d },
	})
	cp := &paho.Connect{KeepAlive: 30, ClientID: fmt.Sprintf("test-%d", clientIDs.Add(1)), CleanStart: true,
		Username: username, UsernameFlag: username != "", Password: []byte(password), PasswordFlag: password != ""}
	ctx, cancel := mqtttest.Context()
	defer cancel()
	ca, err := c.Connect(ctx, cp)
	if err != nil {
		conn.Close()
		return nil, ca, err
	}
	t.Cleanup(func() { c.Disconnect(&paho.Disconnect{}); <-c.Done() })
	return c, ca, nil
}

// frozen is a clock that does not move unless told.
type frozen struct{ ns atomic.Int64 }

func newFrozen() *frozen {
	f := &frozen{}
	f.ns.Store(time.Unix(1_800_000_000, 0).UnixNano())
	return f
}

func (f *frozen) now() time.Time      { return time.Unix(0, f.ns.Load()) }
func (f *frozen) add(d time.Duration) { f.ns.Add(int64(d)) }

func TestAuthFailureThrottle(t *testing.T) {
	clock := newFrozen()
	h := mqtttest.NewHandler()
	s := MustOpenServer(t, h, func(c *broker.Config) {
		c.AuthFailureRate, c.AuthFailureBurst, c.Now = 1, 3, clock.now
	})
	for i := range 3 {
		if _, ca, err := connect5From(t, s, "127.0.0.1", "acme/dev-1", "guess"); err == nil || ca == nil || ca.ReasonCode != 0x86 {
			t.Fatalf("guess %d: %v, connack %+v; want 0x86", i, err, ca)
		}
	}
	calls := h.AuthCalls.Load()
	// The address has used its failures: even the right token is not
	// looked at now.
	if _, ca, err := connect5From(t, s, "127.0.0.1", "acme/dev-1", "tok-1"); err == nil || ca == nil || ca.ReasonCode != 0x9F {
		t.Fatalf("after the burst: %v, connack %+v; want 0x9F connection rate exceeded", err, ca)
	}
	if h.AuthCalls.Load() != calls {
		t.Error("the Handler was asked while the address was throttled")
	}
	// Other addresses are not affected, devices behind them connect.
	c, ca, err := connect5From(t, s, "127.0.0.2", "acme/dev-2", "tok-2")
	if err != nil {
		t.Fatalf("another address: %v (connack %+v)", err, ca)
	}
	if err := c.Send(mqtt.ActionStatusTopic("acme", "dev-2"), status); err != nil {
		t.Fatalf("publish: %v", err)
	}
	// The bucket refills: one failure's worth a second.
	clock.add(time.Second)
	if _, ca, err := connect5From(t, s, "127.0.0.1", "acme/dev-1", "tok-1"); err != nil {
		t.Fatalf("after a second: %v (connack %+v)", err, ca)
	}
	if got := s.Stats().LimitRefusals; got != 1 {
		t.Errorf("LimitRefusals = %d, want 1", got)
	}
}

func TestPublishFlood(t *testing.T) {
	clock := newFrozen()
	h := mqtttest.NewHandler()
	s := MustOpenServer(t, h, func(c *broker.Config) { c.PublishRate, c.PublishBurst, c.Now = 1, 5, clock.now })
	flooder := mustConnect5(t, s, "acme/dev-1", "tok-1", false)
	calm := mustConnect5(t, s, "acme/dev-2", "tok-2", false)
	for i := range 5 {
		if err := flooder.Send(statusT, status); err != nil {
			t.Fatalf("publish %d within the burst: %v", i, err)
		}
	}
	if err := flooder.Send(statusT, status); err == nil {
		t.Fatal("the publish beyond the burst was acknowledged")
	}
	flooder.AwaitServerDisconnect(t, 0x96)
	if got := s.Stats().PublishFloods; got != 1 {
		t.Errorf("PublishFloods = %d, want 1", got)
	}
	// Each connection has its own bucket.
	for i := range 5 {
		if err := calm.Send(mqtt.ActionStatusTopic("acme", "dev-2"), status); err != nil {
			t.Fatalf("the other device's publish %d: %v", i, err)
		}
	}
}

func TestTenantConnectionCap(t *testing.T) {
	h := mqtttest.NewHandler()
	h.Tokens["acme/dev-3"] = "tok-3a"
	s := MustOpenServer(t, h, func(c *broker.Config) { c.MaxTenantConnections = 2 })
	mustConnect5(t, s, "acme/dev-1", "tok-1", false)
	second := mustConnect5(t, s, "acme/dev-2", "tok-2", false)
	if _, ca, err := connect5(t, s, "acme/dev-3", "tok-3a", false); err == nil || ca == nil || ca.ReasonCode != 0x97 {
		t.Fatalf("third device of the tenant: %v, connack %+v; want 0x97 quota exceeded", err, ca)
	}
	if _, err := connect3(t, s, "acme/dev-3", "tok-3a"); err == nil {
		t.Fatal("MQTT 3.1.1: third device of the tenant accepted")
	}
	// Another tenant is not affected; a device replacing its own
	// connection is not a new one.
	mustConnect5(t, s, "other/dev-1", "tok-3", false)
	mustConnect5(t, s, "acme/dev-1", "tok-1", false)
	second.Disconnect(&paho.Disconnect{})
	poll.Until(t, wait, "a free place", func() bool { return s.Connections() == 2 })
	mustConnect5(t, s, "acme/dev-3", "tok-3a", false)
}

// TestTenantConnectionCapConcurrent connects many devices of a tenant at
// once: the cap admits exactly its number, however the CONNECTs interleave
// (at 10129e9 a connection counted only after its CONNACK, so devices
// connecting together overshot it).
func TestTenantConnectionCapConcurrent(t *testing.T) {
	const devices, limit = 30, 5
	h := mqtttest.NewHandler()
	for i := range devices {
		h.Tokens[fmt.Sprintf("crowd/dev-%d", i)] = "tok"
	}
	h.AuthGate = make(chan struct{})
	s := MustOpenServer(t, h, func(c *broker.Config) { c.MaxTenantConnections = limit })
	var wg sync.WaitGroup
	var accepted, refused atomic.Int64
	for i := range devices {
		wg.Go(func() {
			_, ca, err := connect5(t, s, fmt.Sprintf("crowd/dev-%d", i), "tok", false)
			switch {
			case err == nil:
				accepted.Add(1)
			case ca != nil && ca.ReasonCode == 0x97:
				refused.Add(1)
			default:
				t.Errorf("device %d: %v (connack %+v)", i, err, ca)
			}
		})
	}
	// Every CONNECT is past its checks of form before any is admitted.
	poll.Until(t, wait, "every device authenticating", func() bool { return h.AuthCalls.Load() == devices })
	close(h.AuthGate)
	wg.Wait()
	if accepted.Load() != limit || refused.Load() != devices-limit {
		t.Errorf("accepted %d, refused %d; want %d and %d", accepted.Load(), refused.Load(), limit, devices-limit)
	}
}

// idle opens a connection that never sends CONNECT.
func idle(t *testing.T, addr, local string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedByServer waits until the server closed c.
func closedByServer(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(wait))
	if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("connection not closed by the server: %v", err)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

func TestConnectionCaps(t *testing.T) {
	t.Run("pending per address", func(t *testing.T) {
		h := mqtttest.NewHandler()
		s := MustOpenServer(t, h, func(c *broker.Config) { c.MaxPendingPerIP = 5 })
		var held []net.Conn
		for range 5 {
			held = append(held, idle(t, s.Addr().String(), "127.0.0.1"))
		}
		closedByServer(t, idle(t, s.Addr().String(), "127.0.0.1"))
		// Another address is not affected.
		if _, ca, err := connect5From(t, s, "127.0.0.2", "acme/dev-2", "tok-2"); err != nil {
			t.Fatalf("device from another address: %v (connack %+v)", err, ca)
		}
		for _, c := range held {
			c.Close()
		}
		poll.Until(t, wait, "the address to have room", func() bool {
			_, _, err := connect5From(t, s, "127.0.0.1", "acme/dev-1", "tok-1")
			return err == nil
		})
	})
	t.Run("total", func(t *testing.T) {
		h := mqtttest.NewHandler()
		s := MustOpenServer(t, h, func(c *broker.Config) { c.MaxConnections = 3 })
		dev := mustConnect5(t, s, "acme/dev-1", "tok-1", false)
		idle(t, s.Addr().String(), "127.0.0.2")
		idle(t, s.Addr().String(), "127.0.0.3")
		closedByServer(t, idle(t, s.Addr().String(), "127.0.0.4"))
		if err := dev.Send(statusT, status); err != nil {
			t.Fatalf("the connected device's publish: %v", err)
		}
		if got := s.Stats().LimitRefusals; got != 1 {
			t.Errorf("LimitRefusals = %d, want 1", got)
		}
	})
	t.Run("connect deadline", func(t *testing.T) {
		h := mqtttest.NewHandler()
		s := MustOpenServer(t, h, func(c *broker.Config) { c.ConnectTimeout = 200 * time.Millisecond })
		var conns []net.Conn
		for range 200 {
			conns = append(conns, idle(t, s.Addr().String(), "127.0.0.1"))
		}
		dev := mustConnect5(t, s, "acme/dev-1", "tok-1", false)
		for _, c := range conns {
			closedByServer(t, c)
		}
		if err := dev.Send(statusT, status); err != nil {
			t.Fatalf("the device's publish after the idle ones were cut: %v", err)
		}
	})
}

func TestKeepaliveEnforced(t *testing.T) {
	h := mqtttest.NewHandler()
	s := MustOpenServer(t, h, func(c *broker.Config) { c.MaxKeepalive = time.Second })
	t.Run("MQTT5 told", func(t *testing.T) {
		_, ca, err := connect5(t, s, "acme/dev-1", "tok-1", false, func(c *paho.Connect) { c.KeepAlive = 0 })
		if err != nil {
			t.Fatal(err)
		}
		if ca.Properties == nil || ca.Properties.ServerKeepAlive == nil || *ca.Properties.ServerKeepAlive != 1 {
			t.Fatalf("CONNACK properties %+v: want Server Keep Alive 1", ca.Properties)
		}
	})
	t.Run("MQTT311 silent device cut", func(t *testing.T) {
		c, err := connect3(t, s, "acme/dev-2", "tok-2", func(o *pahov3.ClientOptions) { o.SetKeepAlive(0) })
		if err != nil {
			t.Fatal(err)
		}
		mqtttest.Receive(t, c.lost, "the silent connection to be closed")
	})
}
