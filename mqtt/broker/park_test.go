package broker_test

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/poll"
	"github.com/fleetd/fleet/mqtt"
	"github.com/fleetd/fleet/mqtt/mqtttest"
)

// TestIdleConnectionsPark: an idle connection holds no goroutine (a
// goroutine's stack and a read buffer were most of the 10 KB an idle device
// cost before parking), and a parked connection still does all a connection
// does: it is written to, its device's packets wake it, and it ends when the
// device goes, when its keepalive runs out and when the server closes.
func TestIdleConnectionsPark(t *testing.T) {
	const n = 100
	h := mqtttest.NewHandler()
	for i := range n {
		h.Tokens[fmt.Sprintf("acme/idle-%d", i)] = "tok"
	}
	h.Tokens["acme/brief"] = "tok"
	s := MustOpenServer(t, h)
	before := runtime.NumGoroutine()

	devices := make([]*rawClient, n)
	for i := range devices {
		c := dialRaw(t, s)
		id := fmt.Sprintf("idle-%d", i)
		c.send(connect311(0xC2, id, "acme/"+id, "tok"), subscribePacket(1, nil, mqtt.ActionsTopic("acme", id), 1))
		c.next(typeConnack)
		c.next(typeSuback)
		mqtttest.Receive(t, h.Connected, "DeviceConnected")
		mqtttest.Receive(t, h.Subscribed, "DeviceSubscribed")
		devices[i] = c
	}
	poll.Until(t, wait, "every idle connection parked", func() bool { return s.Stats().Parked == n })
	if grown := runtime.NumGoroutine() - before; grown >= n/4 {
		t.Errorf("%d idle connections hold %d goroutines, want none", n, grown)
	}

	t.Run("pinged", func(t *testing.T) {
		// A lone PINGREQ, what an idle device sends once a keepalive, is
		// answered by the poller: the connection stays parked.
		pings := s.Stats().ParkedPings
		for _, c := range devices {
			c.send(packet(typePingreq<<4, nil))
		}
		for _, c := range devices {
			c.next(typePingresp)
		}
		// The poller counts a ping once its answer is written, and watches
		// the socket again after that: the device may read the PINGRESP
		// before either. A ping answered by a woken connection is never
		// counted, and the wait fails.
		poll.Until(t, wait, "every ping answered to its parked connection", func() bool { return s.Stats().ParkedPings-pings >= n })
		if got := s.Stats().ParkedPings - pings; got != n {
			t.Errorf("%d pings answered to %d parked connections", got, n)
		}
		poll.Until(t, wait, "every connection parked after its ping", func() bool { return s.Stats().Parked == n })
		// A PINGREQ with more behind it wakes the connection, which answers
		// each packet in turn.
		devices[0].send(append(packet(typePingreq<<4, nil), packet(typePingreq<<4, nil)...))
		devices[0].next(typePingresp)
		devices[0].next(typePingresp)
		poll.Until(t, wait, "the connection parked again", func() bool { return s.Stats().Parked == n })
	})

	t.Run("written to and woken", func(t *testing.T) {
		for i := range devices {
			if !s.SendAction("acme", fmt.Sprintf("idle-%d", i), int64(i+1), []byte(`{}`)) {
				t.Fatalf("SendAction to idle-%d: false", i)
			}
		}
		for _, c := range devices {
			p := c.next(typePublish)
			n := int(binary.BigEndian.Uint16(p.body)) // the topic's length
			c.send(packet(typePuback<<4, p.body[2+n:4+n]))
		}
		for range n {
			mqtttest.Receive(t, h.Delivered, "ActionDelivered")
		}
		poll.Until(t, wait, "the connections parked again", func() bool { return s.Stats().Parked == n })
	})

	t.Run("the device goes", func(t *testing.T) {
		devices[0].conn.Close()
		poll.Until(t, wait, "the connection's end", func() bool { return s.Connections() == n-1 })
	})

	t.Run("keepalive", func(t *testing.T) {
		c := dialRaw(t, s)
		c.send(packet(typeConnect<<4, mstr("MQTT"), []byte{4, 0xC2}, u16(1), mstr("brief"), mstr("acme/brief"), mstr("tok")))
		c.next(typeConnack)
		poll.Until(t, wait, "the connection parked", func() bool { return s.Stats().Parked == n })
		c.closed() // after one and a half keepalives
	})

	t.Run("keepalive kept by pings", func(t *testing.T) {
		// Pings answered in place push the keepalive's deadline back, as
		// any packet does: a device that pings every 0.6 s with a keepalive
		// of 1 s stays connected past one and a half keepalives.
		c := dialRaw(t, s)
		c.send(packet(typeConnect<<4, mstr("MQTT"), []byte{4, 0xC2}, u16(1), mstr("brief"), mstr("acme/brief"), mstr("tok")))
		c.next(typeConnack)
		pings := s.Stats().ParkedPings
		for range 4 {
			poll.Until(t, wait, "the connection parked", func() bool { return s.Stats().Parked == n })
			<-time.After(600 * time.Millisecond) // the device's own pace, not a condition
			c.send(packet(typePingreq<<4, nil))
			c.next(typePingresp)
		}
		if s.Stats().ParkedPings == pings {
			t.Error("no ping was answered to the parked connection")
		}
		c.closed() // once it stops pinging
	})

	t.Run("server closes", func(t *testing.T) {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		for _, c := range devices[1:] {
			c.closed()
		}
	})
}
