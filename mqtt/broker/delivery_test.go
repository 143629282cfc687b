package broker_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/internal/poll"
	"github.com/fleetd/fleet/mqtt/broker"
	"github.com/fleetd/fleet/mqtt/mqtttest"
)

// These tests are of what the broker sends devices: every action queued for
// a connected device reaches it, oldest first, as fast as its in-flight
// window allows (docs/device-protocol.md#acknowledgements-and-delivery).

// dispatch does what the action service does for a dispatch: the store
// keeps the action Queued, then the broker is handed it. It returns what
// SendAction said.
func dispatch(h *mqtttest.Handler, s *broker.Server, id int64) bool {
	h.Queue("acme/dev-1", id, mqtttest.Message(id))
	return s.SendAction("acme", "dev-1", id, mqtttest.Message(id))
}

// publish5 is a PUBLISH read by a raw client: its packet identifier and
// payload.
type publish5 struct {
	pid     uint16
	payload []byte
}

// parsePublish reads a PUBLISH the broker sent a raw client.
func parsePublish(t *testing.T, p rawPacket, v5 bool) publish5 {
	t.Helper()
	b := p.body
	n := int(binary.BigEndian.Uint16(b))
	b = b[2+n:]
	var out publish5
	if p.flags>>1&3 > 0 {
		out.pid = binary.BigEndian.Uint16(b)
		b = b[2:]
	}
	if v5 {
		l, k := binary.Uvarint(b)
		b = b[k+int(l):]
	}
	out.payload = b
	return out
}

// TestQueuedActionsSentAsWindowFrees: an action dispatched while the
// device's window is full is sent as soon as the window frees, before any
// later one. (It used to stay Queued for as long as the connection lasted,
// and a later one overtook it.)
func TestQueuedActionsSentAsWindowFrees(t *testing.T) {
	// As reproduced with mosquitto_sub -V mqttv5 -D connect
	// receive-maximum 1 and three dispatches.
	t.Run("receive maximum 1", func(t *testing.T) {
		h := mqtttest.NewHandler()
		s := MustOpenServer(t, h)
		rm := uint16(1)
		c := subscribedWith(t, s, h, true, &paho.ConnectProperties{ReceiveMaximum: &rm})
		for id := int64(1); id <= 3; id++ {
			if !dispatch(h, s, id) {
				t.Fatalf("SendAction %d = false, want true: the connection keeps it until there is room", id)
			}
		}
		for id := int64(1); id <= 3; id++ {
			pb := mqtttest.Receive(t, c.Received, fmt.Sprintf("action %d", id))
			if got := mqtttest.MessageID(t, pb.Payload); got != id {
				t.Fatalf("received action %d, want %d (dispatch order)", got, id)
			}
			if err := c.Ack(pb); err != nil {
				t.Fatal(err)
			}
			if got := mqtttest.Receive(t, h.Delivered, "ActionDelivered"); got.ActionID != id {
				t.Fatalf("ActionDelivered %d, want %d", got.ActionID, id)
			}
		}
	})

	// On 3.1.1 the window is MaxInflight, 256: 260 actions, 256 in flight,
	// and the last four as the device acknowledges (at 10129e9, only after
	// a reconnection).
	t.Run("MQTT 3.1.1, 260 actions", func(t *testing.T) {
		h := mqtttest.NewHandler()
		s := MustOpenServer(t, h)
		c := subscribedRaw(t, s, h, 4)
		for id := int64(1); id <= 260; id++ {
			dispatch(h, s, id) // false: the store has it, and the connection reads it
		}
		var pids []uint16
		for id := int64(1); id <= 256; id++ {
			p := parsePublish(t, c.next(typePublish), false)
			if got := mqtttest.MessageID(t, p.payload); got != id {
				t.Fatalf("received action %d, want %d", got, id)
			}
			pids = append(pids, p.pid)
		}
		// The window is full: what the broker sends next, before any
		// PUBACK, is the answer to this PINGREQ.
		c.send(packet(typePingreq<<4, nil))
		c.next(typePingresp)
		for _, pid := range pids {
			c.send(packet(typePuback<<4, u16(int(pid))))
		}
		for id := int64(257); id <= 260; id++ {
			p := parsePublish(t, c.next(typePublish), false)
			if got := mqtttest.MessageID(t, p.payload); got != id {
				t.Fatalf("received action %d, want %d", got, id)
			}
			c.send(packet(typePuback<<4, u16(int(p.pid))))
		}
	})

	// More than the connection holds: the rest is read from the store as
	// the device acknowledges, still in dispatch order.
	t.Run("beyond the waiting line", func(t *testing.T) {
		h := mqtttest.NewHandler()
		s := MustOpenServer(t, h)
		rm := uint16(1)
		c := subscribedWith(t, s, h, true, &paho.ConnectProperties{ReceiveMaximum: &rm})
		const n = 300
		left := 0
		for id := int64(1); id <= n; id++ {
			if !dispatch(h, s, id) {
				left++
			}
		}
		if left == 0 {
			t.Fatalf("every SendAction = true; want those beyond the connection's waiting line left to the store")
		}
		for id := int64(1); id <= n; id++ {
			pb := mqtttest.Receive(t, c.Received, fmt.Sprintf("action %d", id))
			if got := mqtttest.MessageID(t, pb.Payload); got != id {
				t.Fatalf("received action %d, want %d", got, id)
			}
			c.Ack(pb)
		}
	})

	// The device's backlog, and a dispatch made while it is being sent:
	// the dispatch waits its turn.
	t.Run("backlog and dispatch", func(t *testing.T) {
		h := mqtttest.NewHandler()
		s := MustOpenServer(t, h)
		for id := int64(1); id <= 150; id++ {
			h.Queue("acme/dev-1", id, mqtttest.Message(id))
		}
		rm := uint16(2)
		c := subscribedWith(t, s, h, true, &paho.ConnectProperties{ReceiveMaximum: &rm})
		first := mqtttest.Receive(t, c.Received, "the first of the backlog")
		dispatch(h, s, 1000)
		dispatch(h, s, 1001)
		c.Ack(first)
		want := []int64{2}
		for id := int64(3); id <= 150; id++ {
			want = append(want, id)
		}
		want = append(want, 1000, 1001)
		for _, id := range want {
			pb := mqtttest.Receive(t, c.Received, fmt.Sprintf("action %d", id))
			if got := mqtttest.MessageID(t, pb.Payload); got != id {
				t.Fatalf("received action %d, want %d", got, id)
			}
			c.Ack(pb)
		}
	})

	// A dispatch that finds room in the connection's waiting line while
	// part of the backlog is still only in the store waits behind that
	// part, even when the store cannot be read by the time its turn comes.
	t.Run("dispatch behind a backlog not read yet", func(t *testing.T) {
		h := mqtttest.NewHandler()
		s := MustOpenServer(t, h)
		const backlog = 100 // more than one read of the store (the line and the window)
		for id := int64(1); id <= backlog; id++ {
			h.Queue("acme/dev-1", id, mqtttest.Message(id))
		}
		rm := uint16(1)
		c := subscribedWith(t, s, h, true, &paho.ConnectProperties{ReceiveMaximum: &rm})
		c.Ack(mqtttest.Receive(t, c.Received, "action 1"))
		second := mqtttest.Receive(t, c.Received, "action 2") // the line has room now
		if !dispatch(h, s, 1000) {
			t.Fatal("SendAction = false, want true: the line had room")
		}
		h.Mu.Lock()
		h.PendingErr = fleet.Errorf(fleet.EUNAVAILABLE, "database down")
		h.Mu.Unlock()
		reads := h.Reads.Load()
		c.Ack(second)
		ack := func(from, to int64) {
			for id := from; id <= to; id++ {
				pb := mqtttest.Receive(t, c.Received, fmt.Sprintf("action %d", id))
				if got := mqtttest.MessageID(t, pb.Payload); got != id {
					t.Fatalf("received action %d, want %d: the dispatch overtook the backlog", got, id)
				}
				c.Ack(pb)
			}
		}
		ack(3, 65) // what the first read of the store brought
		poll.Until(t, wait, "a read of the store that failed", func() bool { return h.Reads.Load() > reads })
		h.Mu.Lock()
		h.PendingErr = nil
		h.Mu.Unlock()
		ack(66, backlog)
		ack(1000, 1000)
	})

	// A store that cannot be read when the device subscribes is read again.
	t.Run("store unavailable", func(t *testing.T) {
		h := mqtttest.NewHandler()
		h.PendingErr = fleet.Errorf(fleet.EUNAVAILABLE, "database down")
		h.Queue("acme/dev-1", 1, mqtttest.Message(1))
		s := MustOpenServer(t, h)
		c := subscribedWith(t, s, h, false, nil)
		poll.Until(t, wait, "a read of the store", func() bool { return h.Reads.Load() > 0 })
		h.Mu.Lock()
		h.PendingErr = nil
		h.Mu.Unlock()
		if pb := mqtttest.Receive(t, c.Received, "action 1"); mqtttest.MessageID(t, pb.Payload) != 1 {
			t.Fatalf("received %s, want action 1", pb.Payload)
		}
	})

	// What was in flight when the connection ended comes again on the next.
	t.Run("redelivered after reconnecting", func(t *testing.T) {
		h := mqtttest.NewHandler()
		s := MustOpenServer(t, h)
		rm := uint16(1)
		c := subscribedWith(t, s, h, true, &paho.ConnectProperties{ReceiveMaximum: &rm})
		dispatch(h, s, 1)
		dispatch(h, s, 2)
		mqtttest.Receive(t, c.Received, "action 1")
		if n := s.OnlineCount("acme"); n != 1 {
			t.Fatalf("OnlineCount = %d with one device connected", n)
		}
		c.Disconnect(&paho.Disconnect{})
		// The connection is closed (Online) a moment before its session
		// leaves the tenant's count (OnlineCount): wait for both.
		poll.Until(t, wait, "the device offline, and OnlineCount 0", func() bool {
			return !s.Online("acme", "dev-1") && s.OnlineCount("acme") == 0
		})
		c = subscribedWith(t, s, h, true, &paho.ConnectProperties{ReceiveMaximum: &rm})
		for id := int64(1); id <= 2; id++ {
			pb := mqtttest.Receive(t, c.Received, fmt.Sprintf("action %d again", id))
			if got := mqtttest.MessageID(t, pb.Payload); got != id {
				t.Fatalf("received action %d, want %d", got, id)
			}
			c.Ack(pb)
		}
	})
}

// TestActionRefusedInPuback: an MQTT 5 device that refuses an action in
// its PUBACK (reason code 0x80 or above) has the action failed, with the
// code and its reason string; it is not counted as delivered.
func TestActionRefusedInPuback(t *testing.T) {
	h := mqtttest.NewHandler()
	s := MustOpenServer(t, h)
	c := subscribedRaw(t, s, h, 5)
	dispatch(h, s, 7)
	p := parsePublish(t, c.next(typePublish), true)
	reason := append([]byte{0x1F}, mstr("firmware signature check failed")...)
	c.send(packet(typePuback<<4, u16(int(p.pid)), []byte{0x87}, props(reason)))
	got := mqtttest.Receive(t, h.Failed, "ActionFailed")
	if got.ActionID != 7 || !strings.Contains(got.Stream, "0x87 (Not authorized)") || !strings.Contains(got.Stream, "firmware signature check failed") {
		t.Fatalf("ActionFailed(%d, %q), want action 7 with the reason code and string", got.ActionID, got.Stream)
	}
	// A success after it is a delivery, as before.
	dispatch(h, s, 8)
	p = parsePublish(t, c.next(typePublish), true)
	c.send(packet(typePuback<<4, u16(int(p.pid)), []byte{0x10}, props())) // 0x10: no matching subscribers, a success
	if got := mqtttest.Receive(t, h.Delivered, "ActionDelivered"); got.ActionID != 8 {
		t.Fatalf("ActionDelivered %d, want 8", got.ActionID)
	}
	if len(h.Delivered) != 0 {
		t.Error("the refused action was counted as delivered")
	}
	if st := s.Stats(); st.ActionsFailed != 1 || st.ActionsDelivered != 1 {
		t.Errorf("ActionsFailed %d, ActionsDelivered %d; want 1, 1", st.ActionsFailed, st.ActionsDelivered)
	}
}

// TestActionOverDeviceMaximumPacketSize: an action larger than the device
// accepts fails at once, with a message that says why, once; it is not
// retried or logged at ERROR (at 10129e9 it stayed Queued, retried with
// backoff and logged at ERROR on every try).
func TestActionOverDeviceMaximumPacketSize(t *testing.T) {
	h := mqtttest.NewHandler()
	var errorsLogged atomic.Int64
	s := MustOpenServer(t, h, func(c *broker.Config) {
		c.Logger = slog.New(&levelCounter{Handler: c.Logger.Handler(), level: slog.LevelError, n: &errorsLogged})
	})
	limit := uint32(300)
	c := subscribedWith(t, s, h, false, &paho.ConnectProperties{MaximumPacketSize: &limit})
	// The subscription reads the backlog after DeviceSubscribed: queued
	// before that read, action 9 would also be sent by it, and fail twice.
	poll.Until(t, wait, "the subscription's read of the store", func() bool { return h.ReadsDone.Load() > 0 })

	big := fmt.Appendf(nil, `{"id": "9", "name": "x", "payload": %q}`, strings.Repeat("p", 1000))
	h.Queue("acme/dev-1", 9, big)
	if !s.SendAction("acme", "dev-1", 9, big) {
		t.Error("SendAction of an action over the device's maximum packet size = false, want true: it is settled")
	}
	got := mqtttest.Receive(t, h.Failed, "ActionFailed")
	size := 1 + 2 + 2 + len(actionsT) + 2 + 1 + len(big) // fixed header, topic, packet id, no properties
	want := fmt.Sprintf("the action's message is %d,%03d bytes as an MQTT packet, more than the device's Maximum Packet Size of 300", size/1000, size%1000)
	if got.ActionID != 9 || !strings.HasPrefix(got.Stream, want) {
		t.Fatalf("ActionFailed(%d, %q), want action 9: %q", got.ActionID, got.Stream, want)
	}
	// The next action goes through; subscribing again (which reads the
	// store) does not bring the failed one back.
	dispatch(h, s, 10)
	if pb := mqtttest.Receive(t, c.Received, "action 10"); mqtttest.MessageID(t, pb.Payload) != 10 {
		t.Fatalf("received %s, want action 10", pb.Payload)
	}
	c.MustSubscribe(t, actionsT, 1)
	mqtttest.Receive(t, h.Subscribed, "DeviceSubscribed")
	dispatch(h, s, 11)
	if pb := mqtttest.Receive(t, c.Received, "action 11"); mqtttest.MessageID(t, pb.Payload) != 11 {
		t.Fatalf("received %s, want action 11", pb.Payload)
	}
	if len(h.Failed) != 0 || errorsLogged.Load() != 0 {
		t.Errorf("%d more failures, %d lines at ERROR; want none", len(h.Failed), errorsLogged.Load())
	}
}

// levelCounter counts the lines logged at level or above.
type levelCounter struct {
	slog.Handler
	level slog.Level
	n     *atomic.Int64
}

func (l *levelCounter) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= l.level {
		l.n.Add(1)
	}
	return l.Handler.Handle(ctx, r)
}

func (l *levelCounter) WithAttrs(as []slog.Attr) slog.Handler {
	return &levelCounter{Handler: l.Handler.WithAttrs(as), level: l.level, n: l.n}
}

// TestUnacknowledgedActionEndsConnection: a device that leaves an action
// unacknowledged for the write timeout is disconnected, though its socket
// takes what is written and its keepalive is long; the action comes again
// on its next connection (at 10129e9 only the keepalive found it).
func TestUnacknowledgedActionEndsConnection(t *testing.T) {
	for _, version := range []byte{4, 5} {
		t.Run(fmt.Sprintf("protocol level %d", version), func(t *testing.T) {
			h := mqtttest.NewHandler()
			s := MustOpenServer(t, h, func(c *broker.Config) { c.WriteTimeout = 300 * time.Millisecond })
			c := subscribedRaw(t, s, h, version)
			dispatch(h, s, 5)
			c.next(typePublish) // and no PUBACK
			code := c.closed()
			if version == 5 && code != 0x80 {
				t.Errorf("DISCONNECT reason code %#x, want 0x80", code)
			}
			poll.Until(t, wait, "the device offline", func() bool { return !s.Online("acme", "dev-1") })
			if st := s.Stats(); st.UnackedActions != 1 {
				t.Errorf("UnackedActions %d, want 1", st.UnackedActions)
			}
			c = subscribedRaw(t, s, h, version)
			if p := parsePublish(t, c.next(typePublish), version == 5); mqtttest.MessageID(t, p.payload) != 5 {
				t.Fatalf("received %s, want action 5 again", p.payload)
			}
		})
	}

	// A device that acknowledges, however many actions it is sent, stays.
	t.Run("acknowledging", func(t *testing.T) {
		h := mqtttest.NewHandler()
		s := MustOpenServer(t, h, func(c *broker.Config) { c.WriteTimeout = 300 * time.Millisecond })
		c := subscribedRaw(t, s, h, 4)
		for id := int64(1); id <= 20; id++ {
			dispatch(h, s, id)
			p := parsePublish(t, c.next(typePublish), false)
			c.send(packet(typePuback<<4, u16(int(p.pid))))
			mqtttest.Receive(t, h.Delivered, "ActionDelivered")
		}
		if !s.Online("acme", "dev-1") {
			t.Fatal("a device that acknowledges was disconnected")
		}
	})
}

// TestSlowDeviceCutOff checks that a device that reads nothing cannot hold
// up SendAction: once its socket buffers are full, the write times out and
// the device is disconnected.
func TestSlowDeviceCutOff(t *testing.T) {
	h := mqtttest.NewHandler()
	s := MustOpenServer(t, h, func(c *broker.Config) { c.WriteTimeout = 200 * time.Millisecond; c.MaxInflight = 65535 })
	rawConnect311(t, s)
	mqtttest.Receive(t, h.Subscribed, "DeviceSubscribed")
	payload := fmt.Appendf(nil, `{"id": "1", "name": "x", "payload": %q}`, strings.Repeat("x", 64<<10))
	// Actions are queued faster than the socket takes them, so a count of
	// sends ends nothing: on a loaded machine they were all queued before
	// the stuck write's deadline passed. Send until the device is cut off.
	var id int64
	poll.Until(t, wait, "a device that reads nothing cut off", func() bool {
		for range 1000 {
			if !s.Online("acme", "dev-1") {
				return true
			}
			id++
			s.SendAction("acme", "dev-1", id, payload)
		}
		return !s.Online("acme", "dev-1")
	})
	poll.Until(t, wait, "device gone", func() bool { return s.Connections() == 0 })
	if s.SendAction("acme", "dev-1", 1, payload) {
		t.Error("SendAction to the device cut off = true")
	}
}

// TestReceiveMaximum checks that an MQTT 5 device's Receive Maximum bounds
// the actions in flight to it, below MaxInflight.
func TestReceiveMaximum(t *testing.T) {
	h := mqtttest.NewHandler()
	s := MustOpenServer(t, h)
	rm := 2
	c := dialRaw(t, s)
	c.send(connect5Packet(0xC2, props(append([]byte{0x21}, u16(rm)...)), "raw", "acme/dev-1", "tok-1"))
	c.next(typeConnack)
	c.send(subscribePacket(1, props(), actionsT, 1))
	c.next(typeSuback)
	mqtttest.Receive(t, h.Subscribed, "DeviceSubscribed")
	for id := int64(1); id <= 3; id++ {
		dispatch(h, s, id)
	}
	first := parsePublish(t, c.next(typePublish), true)
	parsePublish(t, c.next(typePublish), true)
	c.send(packet(typePingreq<<4, nil))
	c.next(typePingresp) // not the third action
	c.send(packet(typePuback<<4, u16(int(first.pid))))
	if p := parsePublish(t, c.next(typePublish), true); mqtttest.MessageID(t, p.payload) != 3 {
		t.Fatalf("received %s, want action 3", p.payload)
	}
	if !bytes.Equal(first.payload, mqtttest.Message(1)) {
		t.Errorf("first action %s, want %s", first.payload, mqtttest.Message(1))
	}
}
