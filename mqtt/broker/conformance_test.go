package broker_test

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	"github.com/fleetd/fleet/mqtt"
	"github.com/fleetd/fleet/mqtt/broker"
	"github.com/fleetd/fleet/mqtt/mqtttest"
)

// TestConformance311 checks the normative statements of MQTT 3.1.1 (OASIS
// Standard, 29 October 2014) that bind a server and apply to a broker for
// devices, each by its number; docs/device-protocol.md lists those that do
// not apply, and why. Raw packets: client libraries do not send what the
// statements are about.
func TestConformance311(t *testing.T) {
	h := mqtttest.NewHandler()
	s := MustOpenServer(t, h, func(c *broker.Config) { c.MaxKeepalive = 2 * time.Second })
	good := func() *rawClient {
		c := dialRaw(t, s)
		c.send(connect311(0xC2, "dev-1", "acme/dev-1", "tok-1"))
		if ca := c.next(typeConnack); !bytes.Equal(ca.body, []byte{0, 0}) {
			t.Fatalf("CONNACK % x, want accepted", ca.body)
		}
		return c
	}
	// closedAfter sends packets on a connection that was accepted and
	// checks that the server closes it.
	closedAfter := func(t *testing.T, packets ...[]byte) {
		t.Helper()
		c := good()
		c.send(packets...)
		c.closed()
	}

	t.Run("MQTT-3.1.0-1 first packet must be CONNECT", func(t *testing.T) {
		c := dialRaw(t, s)
		c.send(packet(typePingreq<<4, nil))
		c.closed()
	})
	t.Run("MQTT-3.1.0-2 a second CONNECT is a violation", func(t *testing.T) {
		closedAfter(t, connect311(0xC2, "dev-1", "acme/dev-1", "tok-1"))
	})
	t.Run("MQTT-3.1.2-2 unsupported protocol level: return code 1", func(t *testing.T) {
		c := dialRaw(t, s)
		c.send(packet(typeConnect<<4, mstr("MQTT"), []byte{9, 0xC2}, u16(30), mstr("x")))
		if ca := c.next(typeConnack); !bytes.Equal(ca.body, []byte{0, 1}) {
			t.Fatalf("CONNACK % x, want return code 1", ca.body)
		}
		c.closed()
	})
	t.Run("MQTT-3.1.2-3 reserved connect flag set", func(t *testing.T) {
		c := dialRaw(t, s)
		c.send(connect311(0xC3, "dev-1", "acme/dev-1", "tok-1"))
		c.closed()
	})
	t.Run("MQTT-3.2.2-1 clean session: session present 0", func(t *testing.T) {
		good()
	})
	t.Run("MQTT-3.1.2-24 keepalive: silent for 1.5 times it, closed", func(t *testing.T) {
		c := dialRaw(t, s)
		keepalive := packet(typeConnect<<4, mstr("MQTT"), []byte{4, 0xC2}, u16(1), mstr("dev-1"), mstr("acme/dev-1"), mstr("tok-1"))
		c.send(keepalive)
		c.next(typeConnack)
		start := time.Now()
		c.closed()
		if took := time.Since(start); took < time.Second {
			t.Errorf("closed after %v, before the keepalive of 1 s", took)
		}
	})
	t.Run("MQTT-3.1.3-6 empty client id with clean session: accepted", func(t *testing.T) {
		c := dialRaw(t, s)
		c.send(connect311(0xC2, "", "acme/dev-1", "tok-1"))
		if ca := c.next(typeConnack); !bytes.Equal(ca.body, []byte{0, 0}) {
			t.Fatalf("CONNACK % x, want accepted", ca.body)
		}
	})
	// At 10129e9: CONNACK 0.
	t.Run("MQTT-3.1.3-8 empty client id without clean session: return code 2", func(t *testing.T) {
		c := dialRaw(t, s)
		c.send(connect311(0xC0, "", "acme/dev-1", "tok-1"))
		if ca := c.next(typeConnack); !bytes.Equal(ca.body, []byte{0, 2}) {
			t.Fatalf("CONNACK % x, want return code 2, identifier rejected", ca.body)
		}
		c.closed()
	})
	t.Run("MQTT-3.1.4-2 the same client again: the first is disconnected", func(t *testing.T) {
		first := good()
		good()
		first.closed()
	})
	t.Run("MQTT-3.1.4-5 nothing after a refused CONNECT is processed", func(t *testing.T) {
		c := dialRaw(t, s)
		c.send(connect311(0xC2, "dev-1", "acme/dev-1", "wrong"), publishPacket(1, 1, nil, statusT, status))
		if ca := c.next(typeConnack); !bytes.Equal(ca.body, []byte{0, 5}) {
			t.Fatalf("CONNACK % x, want return code 5", ca.body)
		}
		// MQTT-3.2.2-5: refused, closed.
		c.closed()
		if len(h.Statuses) != 0 {
			t.Fatal("the publish after a refused CONNECT reached the handler")
		}
	})
	t.Run("MQTT-3.2.2-4 a refusal has session present 0", func(t *testing.T) {
		c := dialRaw(t, s)
		c.send(connect311(0xC0, "dev-1", "acme/dev-1", "wrong"))
		if ca := c.next(typeConnack); ca.body[0] != 0 {
			t.Fatalf("CONNACK % x, want session present 0", ca.body)
		}
	})
	t.Run("MQTT-3.3.1-4 PUBLISH with both QoS bits set", func(t *testing.T) {
		closedAfter(t, packet(typePublish<<4|6, mstr(statusT), u16(1), status))
	})
	t.Run("MQTT-3.3.2-2 wildcards in a topic name", func(t *testing.T) {
		closedAfter(t, publishPacket(1, 1, nil, "/tenants/acme/devices/+/action/status", status))
	})
	t.Run("MQTT-3.3.4-1 QoS 1 answered with PUBACK, QoS 2 with PUBREC and PUBCOMP", func(t *testing.T) {
		c := good()
		c.send(publishPacket(1, 3, nil, statusT, status))
		mqtttest.Receive(t, h.Statuses, "HandleStatus")
		if p := c.next(typePuback); !bytes.Equal(p.body, u16(3)) {
			t.Fatalf("PUBACK % x, want of packet 3", p.body)
		}
		c.send(publishPacket(2, 4, nil, statusT, status))
		mqtttest.Receive(t, h.Statuses, "HandleStatus")
		if p := c.next(typePubrec); !bytes.Equal(p.body, u16(4)) {
			t.Fatalf("PUBREC % x, want of packet 4", p.body)
		}
		// 4.3.3: PUBREL is answered with PUBCOMP.
		c.send(packet(typePubrel<<4|2, u16(4)))
		if p := c.next(typePubcomp); !bytes.Equal(p.body, u16(4)) {
			t.Fatalf("PUBCOMP % x, want of packet 4", p.body)
		}
	})
	t.Run("MQTT-3.3.5-2 an unauthorised PUBLISH closes the connection", func(t *testing.T) {
		closedAfter(t, publishPacket(1, 1, nil, mqtt.ActionStatusTopic("acme", "dev-2"), status))
	})
	t.Run("MQTT-2.3.1-1 packet identifier 0", func(t *testing.T) {
		closedAfter(t, publishPacket(1, 0, nil, statusT, status))
	})
	t.Run("MQTT-3.6.1-1 PUBREL with reserved bits wrong", func(t *testing.T) {
		closedAfter(t, packet(typePubrel<<4, u16(4)))
	})
	t.Run("MQTT-3.8.1-1 SUBSCRIBE with reserved bits wrong", func(t *testing.T) {
		closedAfter(t, packet(typeSubscribe<<4, u16(1), mstr(actionsT), []byte{1}))
	})
	t.Run("MQTT-3.8.3-3 SUBSCRIBE without a topic filter", func(t *testing.T) {
		closedAfter(t, packet(typeSubscribe<<4|2, u16(1)))
	})
	t.Run("MQTT-3.8.3-4 SUBSCRIBE with reserved bits of the options set", func(t *testing.T) {
		closedAfter(t, subscribePacket(1, nil, actionsT, 0x05))
	})
	t.Run("MQTT-3.8.4-1 SUBACK for each SUBSCRIBE, with its identifier and a code per filter in order", func(t *testing.T) {
		c := good()
		// MQTT-3.8.4-2, -5; MQTT-3.9.3-2: 0x80 for the filter refused, and
		// the connection stays.
		c.send(packet(typeSubscribe<<4|2, u16(77), mstr("#"), []byte{1}, mstr(actionsT), []byte{2}, mstr("$SYS/#"), []byte{0}))
		if sa := c.next(typeSuback); !bytes.Equal(sa.body, []byte{0, 77, 0x80, 1, 0x80}) {
			t.Fatalf("SUBACK % x, want 00 4d 80 01 80", sa.body)
		}
		mqtttest.Receive(t, h.Subscribed, "DeviceSubscribed")
		c.send(packet(typePingreq<<4, nil))
		c.next(typePingresp)
	})
	t.Run("MQTT-3.10.1-1 UNSUBSCRIBE with reserved bits wrong", func(t *testing.T) {
		closedAfter(t, packet(typeUnsubscribe<<4, u16(1), mstr(actionsT)))
	})
	t.Run("MQTT-3.10.3-2 UNSUBSCRIBE without a topic filter", func(t *testing.T) {
		closedAfter(t, packet(typeUnsubscribe<<4|2, u16(1)))
	})
	t.Run("MQTT-3.10.4-4 UNSUBACK, even for no subscription", func(t *testing.T) {
		c := good()
		// MQTT-3.10.4-5.
		c.send(packet(typeUnsubscribe<<4|2, u16(9), mstr("/nothing")))
		if ua := c.next(typeUnsuback); !bytes.Equal(ua.body, u16(9)) {
			t.Fatalf("UNSUBACK % x, want of packet 9", ua.body)
		}
	})
	t.Run("MQTT-3.12.4-1 PINGREQ answered", func(t *testing.T) {
		c := good()
		c.send(packet(typePingreq<<4, nil))
		c.next(typePingresp)
	})
	t.Run("MQTT-3.14.4-3 DISCONNECT: the will is discarded and the connection closed", func(t *testing.T) {
		closedAfter(t, packet(typeDisconnect<<4, nil))
	})
	t.Run("MQTT-1.5.3-1 a string that is not UTF-8", func(t *testing.T) {
		closedAfter(t, publishPacket(1, 1, nil, "/tenants/acme/\xff", status))
	})
	t.Run("MQTT-1.5.3-2 a string with U+0000", func(t *testing.T) {
		closedAfter(t, subscribePacket(1, nil, actionsT+"\x00", 1))
	})
	t.Run("MQTT-2.2.2-2 reserved flags of a fixed header", func(t *testing.T) {
		closedAfter(t, []byte{typePingreq<<4 | 1, 0})
	})
	t.Run("MQTT-4.8.0-1 malformed remaining length", func(t *testing.T) {
		closedAfter(t, []byte{typePingreq << 4, 0x80, 0x80, 0x80, 0x80, 0x01})
	})
}

// TestConformance5 checks the normative statements of MQTT 5.0 (OASIS
// Standard, 7 March 2019) that bind a server and apply to a broker for
// devices, beyond those 3.1.1 shares.
func TestConformance5(t *testing.T) {
	h := mqtttest.NewHandler()
	s := MustOpenServer(t, h)
	good := func(p []byte) (*rawClient, rawPacket) {
		c := dialRaw(t, s)
		c.send(connect5Packet(0xC2, p, "dev-1", "acme/dev-1", "tok-1"))
		ca := c.next(typeConnack)
		if ca.body[1] != 0 {
			t.Fatalf("CONNACK % x, want success", ca.body)
		}
		return c, ca
	}
	disconnectedWith := func(t *testing.T, code byte, packets ...[]byte) {
		t.Helper()
		c, _ := good(props())
		c.send(packets...)
		if got := c.closed(); got != code {
			t.Fatalf("DISCONNECT reason code %#x, want %#x", got, code)
		}
	}

	t.Run("3.2.2.3 CONNACK says what this server does not do", func(t *testing.T) {
		_, ca := good(props())
		p := connackProperties(t, ca)
		for id, want := range map[byte][]byte{0x25: {0}, 0x28: {0}, 0x29: {0}, 0x2A: {0}} {
			if !bytes.Equal(p[id], want) {
				t.Errorf("property %#x = % x, want % x", id, p[id], want)
			}
		}
		if p[0x27] == nil || p[0x21] == nil {
			t.Errorf("CONNACK without Maximum Packet Size or Receive Maximum: %v", p)
		}
	})
	t.Run("MQTT-3.2.2-16 empty client id: Assigned Client Identifier", func(t *testing.T) {
		c := dialRaw(t, s)
		c.send(connect5Packet(0xC2, props(), "", "acme/dev-1", "tok-1"))
		if p := connackProperties(t, c.next(typeConnack)); len(p[0x12]) < 3 {
			t.Fatalf("CONNACK properties %v, want an Assigned Client Identifier", p)
		}
	})
	// At 10129e9: accepted.
	t.Run("MQTT-3.2.2-13 retained will refused: 0x9A", func(t *testing.T) {
		c := dialRaw(t, s)
		will := [][]byte{props(), mstr(statusT), mstr("gone")}
		c.send(connect5Packet(0xC2|0x04|0x20, props(), "dev-1", "acme/dev-1", "tok-1", will...))
		if ca := c.next(typeConnack); ca.body[1] != 0x9A {
			t.Fatalf("CONNACK % x, want 0x9A retain not supported", ca.body)
		}
		c.closed()
	})
	t.Run("3.1.3.2 a will that is not retained is accepted", func(t *testing.T) {
		c := dialRaw(t, s)
		will := [][]byte{props(), mstr(statusT), mstr("gone")}
		c.send(connect5Packet(0xC2|0x04, props(), "dev-1", "acme/dev-1", "tok-1", will...))
		if ca := c.next(typeConnack); ca.body[1] != 0 {
			t.Fatalf("CONNACK % x, want success", ca.body)
		}
	})
	t.Run("3.3.1.3 a retained PUBLISH, Retain Available 0: DISCONNECT 0x9A", func(t *testing.T) {
		disconnectedWith(t, 0x9A, packet(typePublish<<4|3, mstr(statusT), u16(1), props(), status))
	})
	t.Run("3.3.2.3.4 a topic alias above Topic Alias Maximum (0): DISCONNECT 0x94", func(t *testing.T) {
		disconnectedWith(t, 0x94, publishPacket(1, 1, props(append([]byte{0x23}, u16(1)...)), statusT, status))
	})
	t.Run("3.8.2.1.2 a subscription identifier, not available: DISCONNECT 0xA1", func(t *testing.T) {
		disconnectedWith(t, 0xA1, subscribePacket(1, props([]byte{0x0B, 1}), actionsT, 1))
	})
	t.Run("MQTT-3.1.2-25 an action larger than the device's Maximum Packet Size is not sent", func(t *testing.T) {
		c, _ := good(props(append([]byte{0x27}, u32(200)...)))
		c.send(subscribePacket(1, props(), actionsT, 1))
		c.next(typeSuback)
		mqtttest.Receive(t, h.Subscribed, "DeviceSubscribed")
		h.Queue("acme/dev-1", 1, []byte(`{"id": "1", "payload": "`+string(bytes.Repeat([]byte("x"), 300))+`"}`))
		h.Queue("acme/dev-1", 2, mqtttest.Message(2))
		s.SendAction("acme", "dev-1", 1, []byte(`{"id": "1", "payload": "`+string(bytes.Repeat([]byte("x"), 300))+`"}`))
		s.SendAction("acme", "dev-1", 2, mqtttest.Message(2))
		if p := parsePublish(t, c.next(typePublish), true); mqtttest.MessageID(t, p.payload) != 2 {
			t.Fatalf("received %s, want action 2 only", p.payload)
		}
		mqtttest.Receive(t, h.Failed, "ActionFailed of action 1")
	})
	t.Run("MQTT-3.3.4-7 no more unacknowledged PUBLISHes than the client's Receive Maximum", func(t *testing.T) {
		h.Mu.Lock()
		clear(h.Backlog) // what the subtests before left unacknowledged
		h.Mu.Unlock()
		c, _ := good(props(append([]byte{0x21}, u16(1)...)))
		c.send(subscribePacket(1, props(), actionsT, 1))
		c.next(typeSuback)
		mqtttest.Receive(t, h.Subscribed, "DeviceSubscribed")
		dispatch(h, s, 10)
		dispatch(h, s, 11)
		p := parsePublish(t, c.next(typePublish), true)
		c.send(packet(typePingreq<<4, nil))
		c.next(typePingresp) // not action 11
		c.send(packet(typePuback<<4, u16(int(p.pid))))
		if p := parsePublish(t, c.next(typePublish), true); mqtttest.MessageID(t, p.payload) != 11 {
			t.Fatalf("received %s, want action 11", p.payload)
		}
	})
	t.Run("MQTT-3.8.4-6 SUBACK 0x87 for a filter not authorised; the connection stays", func(t *testing.T) {
		c, _ := good(props())
		c.send(subscribePacket(5, props(), mqtt.ActionsTopic("acme", "dev-2"), 1))
		if sa := c.next(typeSuback); !bytes.Equal(sa.body, []byte{0, 5, 0, 0x87}) {
			t.Fatalf("SUBACK % x, want 00 05 00 87", sa.body)
		}
		c.send(packet(typePingreq<<4, nil))
		c.next(typePingresp)
	})
	t.Run("MQTT-4.13.1-1 malformed packet: DISCONNECT 0x81", func(t *testing.T) {
		disconnectedWith(t, 0x81, packet(typePublish<<4|6, mstr(statusT), u16(1), props(), status))
	})
	t.Run("4.12 AUTH without an authentication method: DISCONNECT 0x82", func(t *testing.T) {
		disconnectedWith(t, 0x82, packet(0xF0, []byte{0}))
	})
}

// connackProperties returns an MQTT 5 CONNACK's properties by identifier
// (each holds one value here).
func connackProperties(t *testing.T, ca rawPacket) map[byte][]byte {
	t.Helper()
	b := ca.body[2:]
	n, k := binary.Uvarint(b)
	b = b[k : k+int(n)]
	out := map[byte][]byte{}
	for len(b) > 0 {
		id := b[0]
		b = b[1:]
		var v []byte
		switch id {
		case 0x25, 0x28, 0x29, 0x2A:
			v, b = b[:1], b[1:]
		case 0x21, 0x13:
			v, b = b[:2], b[2:]
		case 0x27, 0x11:
			v, b = b[:4], b[4:]
		case 0x12, 0x1F:
			l := int(binary.BigEndian.Uint16(b))
			v, b = b[2:2+l], b[2+l:]
		default:
			t.Fatalf("CONNACK property %#x not known to the test", id)
		}
		out[id] = v
	}
	return out
}
