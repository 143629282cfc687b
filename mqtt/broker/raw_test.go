package broker_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/fleetd/fleet/mqtt/broker"
	"github.com/fleetd/fleet/mqtt/mqtttest"
)

// rawClient speaks MQTT byte by byte, for what no client library lets a
// test do or see: packets the specifications forbid, the exact bytes and
// order of what the broker sends.
type rawClient struct {
	t    *testing.T
	conn net.Conn
	r    *bufio.Reader
}

// rawPacket is one packet the broker sent.
type rawPacket struct {
	typ, flags byte
	body       []byte
}

func dialRaw(t *testing.T, s *broker.Server) *rawClient {
	t.Helper()
	conn, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &rawClient{t: t, conn: conn, r: bufio.NewReader(conn)}
}

// mstr is an MQTT string (or binary data): two bytes of length, then s.
func mstr(s string) []byte { return append(binary.BigEndian.AppendUint16(nil, uint16(len(s))), s...) }

// u16 is a two-byte integer.
func u16(n int) []byte { return binary.BigEndian.AppendUint16(nil, uint16(n)) }

// u32 is a four-byte integer.
func u32(n int) []byte { return binary.BigEndian.AppendUint32(nil, uint32(n)) }

// props is an MQTT 5 property list: its length, then the properties.
func props(p ...[]byte) []byte {
	b := bytes.Join(p, nil)
	return append(binary.AppendUvarint(nil, uint64(len(b))), b...)
}

// packet is a whole packet: first byte, remaining length, body.
func packet(first byte, body ...[]byte) []byte {
	b := bytes.Join(body, nil)
	return append(binary.AppendUvarint([]byte{first}, uint64(len(b))), b...)
}

// send writes packets to the broker.
func (c *rawClient) send(packets ...[]byte) {
	c.t.Helper()
	if _, err := c.conn.Write(bytes.Join(packets, nil)); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// read reads the next packet the broker sends, or the error that ended
// the connection.
func (c *rawClient) read() (rawPacket, error) {
	c.conn.SetReadDeadline(time.Now().Add(wait))
	first, err := c.r.ReadByte()
	if err != nil {
		return rawPacket{}, err
	}
	n, err := binary.ReadUvarint(c.r)
	if err != nil {
		return rawPacket{}, err
	}
	p := rawPacket{typ: first >> 4, flags: first & 0x0f, body: make([]byte, n)}
	if _, err := io.ReadFull(c.r, p.body); err != nil {
		return rawPacket{}, err
	}
	return p, nil
}

// next returns the next packet, which must be of type typ.
func (c *rawClient) next(typ byte) rawPacket {
	c.t.Helper()
	p, err := c.read()
	if err != nil {
		c.t.Fatalf("waiting for packet type %d: %v", typ, err)
	}
	if p.typ != typ {
		c.t.Fatalf("got packet type %d (% x), want type %d", p.typ, p.body, typ)
	}
	return p
}

// closed checks that the broker closes the connection, after sending
// nothing or, for an MQTT 5 device, a DISCONNECT; it returns the
// DISCONNECT's reason code (0 without one).
func (c *rawClient) closed() byte {
	c.t.Helper()
	p, err := c.read()
	if err == nil && p.typ == typeDisconnect {
		code := p.body[0]
		if _, err := c.read(); !isClosedErr(err) {
			c.t.Fatalf("after DISCONNECT: %v, want the connection closed", err)
		}
		return code
	}
	if err == nil {
		c.t.Fatalf("got packet type %d (% x), want the connection closed", p.typ, p.body)
	}
	if !isClosedErr(err) {
		c.t.Fatalf("want the connection closed, got %v", err)
	}
	return 0
}

func isClosedErr(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, io.ErrUnexpectedEOF) || isReset(err)
}

func isReset(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && !oe.Timeout()
}

// Packet types, as the tests spell them.
const (
	typeConnect     = 1
	typeConnack     = 2
	typePublish     = 3
	typePuback      = 4
	typePubrec      = 5
	typePubrel      = 6
	typePubcomp     = 7
	typeSubscribe   = 8
	typeSuback      = 9
	typeUnsubscribe = 10
	typeUnsuback    = 11
	typePingreq     = 12
	typePingresp    = 13
	typeDisconnect  = 14
)

// connect311 is an MQTT 3.1.1 CONNECT with the flags given (0x02 clean
// session, 0x80 username, 0x40 password, ...).
func connect311(flags byte, clientID, user, pass string, will ...string) []byte {
	body := [][]byte{mstr("MQTT"), {4, flags}, u16(30), mstr(clientID)}
	for _, w := range will {
		body = append(body, mstr(w))
	}
	if flags&0x80 != 0 {
		body = append(body, mstr(user))
	}
	if flags&0x40 != 0 {
		body = append(body, mstr(pass))
	}
	return packet(typeConnect<<4, body...)
}

// connect5Packet is an MQTT 5 CONNECT with the flags and properties given; will,
// when the flags have one, is its properties, topic and payload.
func connect5Packet(flags byte, properties []byte, clientID, user, pass string, will ...[]byte) []byte {
	body := [][]byte{mstr("MQTT"), {5, flags}, u16(30), properties, mstr(clientID)}
	body = append(body, will...)
	if flags&0x80 != 0 {
		body = append(body, mstr(user))
	}
	if flags&0x40 != 0 {
		body = append(body, mstr(pass))
	}
	return packet(typeConnect<<4, body...)
}

// subscribePacket subscribes to filter with the options byte given;
// properties is nil for MQTT 3.1.1.
func subscribePacket(id int, properties []byte, filter string, options byte) []byte {
	return packet(typeSubscribe<<4|2, u16(id), properties, mstr(filter), []byte{options})
}

// publishPacket publishes payload on topic at QoS qos (id is then its
// packet identifier); properties is nil for MQTT 3.1.1.
func publishPacket(qos byte, id int, properties []byte, topic string, payload []byte) []byte {
	body := [][]byte{mstr(topic)}
	if qos > 0 {
		body = append(body, u16(id))
	}
	body = append(body, properties, payload)
	return packet(typePublish<<4|qos<<1, body...)
}

// connectedRaw connects acme/dev-1 with MQTT 3.1.1 (version 4) or 5 and
// reads its CONNACK, which must accept it.
func connectedRaw(t *testing.T, s *broker.Server, version byte) *rawClient {
	t.Helper()
	c := dialRaw(t, s)
	if version == 5 {
		c.send(connect5Packet(0xC2, props(), "raw", "acme/dev-1", "tok-1"))
	} else {
		c.send(connect311(0xC2, "raw", "acme/dev-1", "tok-1"))
	}
	ca := c.next(typeConnack)
	if ca.body[1] != 0 {
		t.Fatalf("CONNACK % x, want success", ca.body)
	}
	return c
}

// subscribedRaw connects acme/dev-1 and subscribes it to its actions at QoS 1.
func subscribedRaw(t *testing.T, s *broker.Server, h *mqtttest.Handler, version byte) *rawClient {
	t.Helper()
	c := connectedRaw(t, s, version)
	var p []byte
	if version == 5 {
		p = props()
	}
	c.send(subscribePacket(1, p, actionsT, 1))
	c.next(typeSuback)
	mqtttest.Receive(t, h.Subscribed, "DeviceSubscribed")
	return c
}

// TestOversizedPublishReplayed checks that an MQTT 3.1.1 device is
// disconnected for a publish too large to read once, not again when it
// replays it after reconnecting (as the uplink agent does with what was
// not acknowledged): the replay is acknowledged, and the connection goes
// on.
func TestOversizedPublishReplayed(t *testing.T) {
	h := mqtttest.NewHandler()
	s := MustOpenServer(t, h, func(c *broker.Config) { c.MaxPacketSize = 1024 })
	big := publishPacket(1, 7, nil, statusT, bytes.Repeat([]byte("x"), 2000))
	c := connectedRaw(t, s, 4)
	c.send(big)
	c.closed()
	// The replay, with DUP set as clients do: acknowledged this time.
	c = connectedRaw(t, s, 4)
	replay := append([]byte{big[0] | 0x08}, big[1:]...)
	c.send(replay)
	if ack := c.next(typePuback); !bytes.Equal(ack.body, u16(7)) {
		t.Fatalf("PUBACK %x, want packet id 7", ack.body)
	}
	c.send(publishPacket(1, 8, nil, statusT, status))
	if ack := c.next(typePuback); !bytes.Equal(ack.body, u16(8)) {
		t.Fatalf("PUBACK %x, want packet id 8", ack.body)
	}
	mqtttest.Receive(t, h.Statuses, "HandleStatus of the publish after it")
	if st := s.Stats(); st.OversizedPackets != 1 || st.HandlerErrors != 1 {
		t.Fatalf("OversizedPackets %d, HandlerErrors %d; want 1, 1", st.OversizedPackets, st.HandlerErrors)
	}
	// Another oversized publish disconnects again.
	c.send(publishPacket(1, 9, nil, statusT, bytes.Repeat([]byte("y"), 2000)))
	c.closed()
}
