package broker

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/mqtt"
)

// acceptAll is a Handler that admits acme/dev-1 with token tok-1 and takes
// every publish.
type acceptAll struct{}

func (acceptAll) AuthenticateDevice(_ context.Context, tenant, device, token string) error {
	if tenant == "acme" && device == "dev-1" && token == "tok-1" {
		return nil
	}
	return fleet.Errorf(fleet.EUNAUTHENTICATED, "bad device token")
}
func (acceptAll) DeviceConnected(string, string)                               {}
func (acceptAll) DeviceSubscribed(string, string)                              {}
func (acceptAll) HandleStatus(context.Context, string, string, []byte) error   { return nil }
func (acceptAll) HandleReported(context.Context, string, string, []byte) error { return nil }
func (acceptAll) DeltaSubscribed(string, string)                               {}
func (acceptAll) ActionDelivered(string, string, int64)                        {}
func (acceptAll) ActionFailed(string, string, int64, string)                   {}
func (acceptAll) HandleStream(context.Context, string, string, string, mqtt.Compression, []byte) error {
	return nil
}
func (acceptAll) PendingActions(context.Context, string, string, int64, int) ([]fleet.ActionMessage, error) {
	return nil, nil
}

// packet builds a packet from its first byte and body.
func packet(first byte, body ...[]byte) []byte {
	var b []byte
	for _, p := range body {
		b = append(b, p...)
	}
	return append(appendHeader(nil, first, len(b)), b...)
}

func str(s string) []byte { return appendString(nil, s) }

func u16(n uint16) []byte { return binary.BigEndian.AppendUint16(nil, n) }

// connect is a CONNECT of acme/dev-1 at a protocol level, with props (MQTT
// 5) as given.
func connect(version byte, props ...byte) []byte {
	name := "MQTT"
	if version == version31 {
		name = "MQIsdp"
	}
	body := [][]byte{str(name), {version, 0xC2}, u16(30)}
	if version == version5 {
		body = append(body, appendVarint(nil, len(props)), props)
	}
	body = append(body, str("client-1"), str("acme/dev-1"), str("tok-1"))
	return packet(typeConnect<<4, body...)
}

// FuzzConn sends what the fuzzer makes up over a device's connection: the
// broker must answer each byte stream without a panic, a hang or a device
// left registered after the connection ended.
func FuzzConn(f *testing.F) {
	actions := mqtt.ActionsTopic("acme", "dev-1")
	status := mqtt.ActionStatusTopic("acme", "dev-1")
	stream := mqtt.StreamTopic("acme", "dev-1", "gps")
	for _, v := range []byte{version31, version311, version5} {
		var noProps []byte
		if v == version5 {
			noProps = []byte{0}
		}
		c := connect(v)
		f.Add(c)
		f.Add(append(append(c[:len(c):len(c)],
			packet(typeSubscribe<<4|2, u16(1), noProps, str(actions), []byte{1})...),
			packet(typePublish<<4|2, str(status), u16(2), noProps, []byte(`[{"id":"1","state":"Completed"}]`))...))
		f.Add(append(c[:len(c):len(c)], packet(typePublish<<4|4, str(stream), u16(3), noProps, []byte(`[]`))...))
		f.Add(append(c[:len(c):len(c)], packet(typePubrel<<4|2, u16(3))...))
		f.Add(append(c[:len(c):len(c)], packet(typeUnsubscribe<<4|2, u16(4), noProps, str(actions))...))
		f.Add(append(c[:len(c):len(c)], packet(typePingreq<<4)...))
		f.Add(append(c[:len(c):len(c)], packet(typeDisconnect<<4)...))
		f.Add(append(c[:len(c):len(c)], packet(typePuback<<4, u16(1))...))
	}
	f.Add(connect(version5, propSessionExpiry, 0, 0, 0, 10, propReceiveMaximum, 0, 5, propUserProperty, 0, 1, 'k', 0, 1, 'v'))
	f.Add(connect(version5, propAuthMethod, 0, 5, 'S', 'C', 'R', 'A', 'M'))
	f.Add(append(connect(version5, propTopicAliasMaximum, 0, 10),
		packet(typePublish<<4|2, str(""), u16(2), []byte{3, propTopicAlias, 0, 1}, []byte(`[]`))...))

	f.Fuzz(func(t *testing.T, data []byte) {
		s := NewServer(Config{MaxPacketSize: 4096, ConnectTimeout: time.Second}, acceptAll{})
		s.ctx, s.cancel = context.WithCancel(context.Background())
		defer s.cancel()
		done := make(chan struct{})
		go s.serveConn(&scriptConn{in: bytes.NewReader(data)}, "192.0.2.1", func() {}, func(error) { close(done) })
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the connection was not served to its end")
		}
		s.tasks.Wait()
		if n := s.Connections(); n != 0 {
			t.Fatalf("%d devices connected after the connection ended", n)
		}
	})
}

// scriptConn is a device's connection that sends in, then ends (EOF), and
// keeps what the broker writes until the broker closes it: every packet of
// in is served, whatever the broker answered before it.
type scriptConn struct {
	in *bytes.Reader

	mu     sync.Mutex
	out    bytes.Buffer
	closed bool
}

func (c *scriptConn) Read(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, net.ErrClosed
	}
	return c.in.Read(b)
}

func (c *scriptConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, net.ErrClosed
	}
	return c.out.Write(b)
}

func (c *scriptConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	return nil
}

// written returns what the broker wrote.
func (c *scriptConn) written() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.out.Bytes())
}

func (*scriptConn) LocalAddr() net.Addr { return &net.TCPAddr{IP: net.IPv4(192, 0, 2, 2), Port: 1883} }
func (*scriptConn) RemoteAddr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 50000}
}
func (*scriptConn) SetDeadline(time.Time) error      { return nil }
func (*scriptConn) SetReadDeadline(time.Time) error  { return nil }
func (*scriptConn) SetWriteDeadline(time.Time) error { return nil }

// exchange serves one connection that sends data and returns all the
// broker wrote back.
func exchange(t *testing.T, data []byte) []byte {
	t.Helper()
	s := NewServer(Config{MaxPacketSize: 4096}, acceptAll{})
	s.ctx, s.cancel = context.WithCancel(context.Background())
	defer s.cancel()
	c := &scriptConn{in: bytes.NewReader(data)}
	s.serveConn(c, "192.0.2.1", func() {}, func(error) {})
	s.tasks.Wait()
	return c.written()
}

// TestWire checks the bytes the broker answers a device with, for the
// seeds of FuzzConn: the paho-based tests see them through a client
// library, which forgives some things.
func TestWire(t *testing.T) {
	actions := mqtt.ActionsTopic("acme", "dev-1")
	status := mqtt.ActionStatusTopic("acme", "dev-1")
	t.Run("MQTT311", func(t *testing.T) {
		in := append(connect(version311), packet(typeSubscribe<<4|2, u16(1), str(actions), []byte{1})...)
		in = append(in, packet(typePublish<<4|2, str(status), u16(7), []byte(`[]`))...)
		in = append(in, packet(typePingreq<<4)...)
		want := []byte{0x20, 2, 0, 0, 0x90, 3, 0, 1, 1, 0x40, 2, 0, 7, 0xD0, 0}
		if got := exchange(t, in); string(got) != string(want) {
			t.Errorf("got % x, want % x", got, want)
		}
	})
	t.Run("MQTT5", func(t *testing.T) {
		in := append(connect(version5), packet(typeSubscribe<<4|2, u16(1), []byte{0}, str(actions), []byte{2})...)
		in = append(in, packet(typePublish<<4|4, str(status), u16(7), []byte{0}, []byte(`[]`))...)
		in = append(in, packet(typePubrel<<4|2, u16(7))...)
		got := exchange(t, in)
		connack := []byte{0x20, 19, 0, 0, 16,
			propRetainAvailable, 0, propWildcardSubs, 0, propSharedSubs, 0, propSubscriptionIDs, 0,
			propMaximumPacketSize, 0, 0, 0x10, 0, propReceiveMaximum, 1, 0}
		rest := []byte{0x90, 4, 0, 1, 0, 1, 0x50, 2, 0, 7, 0x70, 2, 0, 7}
		if want := append(connack, rest...); string(got) != string(want) {
			t.Errorf("got  % x\nwant % x", got, want)
		}
	})
	// Each packet, after a good CONNECT, ends an MQTT 5 connection with a
	// DISCONNECT that says why (docs/device-protocol.md).
	for _, tc := range []struct {
		name   string
		packet []byte
		code   reasonCode
	}{
		{"retained publish", packet(typePublish<<4|3, str(status), u16(7), []byte{0}, []byte(`[]`)), codeRetainNotSupported},
		{"publish at QoS 3", packet(typePublish<<4|6, str(status), u16(7), []byte{0}, []byte(`[]`)), codeMalformedPacket},
		{"bad remaining length", []byte{typePingreq << 4, 0x80, 0x80, 0x80, 0x80, 0x01}, codeMalformedPacket},
		{"topic alias", packet(typePublish<<4|2, str(status), u16(7), []byte{3, propTopicAlias, 0, 1}, []byte(`[]`)), codeTopicAliasInvalid},
		{"property of another packet", packet(typePublish<<4|2, str(status), u16(7), []byte{5, propSessionExpiry, 0, 0, 0, 1}, []byte(`[]`)), codeProtocolError},
		{"subscription identifier", packet(typeSubscribe<<4|2, u16(1), []byte{2, propSubscriptionID, 1}, str(actions), []byte{1}), codeSubscriptionIDsNotUsable},
		{"second CONNECT", connect(version5), codeProtocolError},
		{"another device's topic", packet(typePublish<<4|2, str(mqtt.ActionStatusTopic("acme", "dev-2")), u16(7), []byte{0}, []byte(`[]`)), codeNotAuthorized},
		{"packet too large", packet(typePublish<<4|2, str(status), u16(7), []byte{0}, make([]byte, 5000)), codePacketTooLarge},
	} {
		t.Run("MQTT5 "+tc.name, func(t *testing.T) {
			got := exchange(t, append(connect(version5), tc.packet...))
			if want := []byte{typeDisconnect << 4, 1, byte(tc.code)}; !bytes.HasSuffix(got, want) {
				t.Errorf("got % x, want it to end with DISCONNECT % x", got, want)
			}
		})
	}
	t.Run("UnsupportedVersion", func(t *testing.T) {
		in := packet(typeConnect<<4, str("MQTT"), []byte{6, 0xC2}, u16(30))
		if got, want := exchange(t, in), []byte{0x20, 2, 0, 1}; string(got) != string(want) {
			t.Errorf("got % x, want % x", got, want)
		}
	})
}

// TestReadPacketLarge reads bodies around the size read ahead of their
// bytes, whole and cut short.
func TestReadPacketLarge(t *testing.T) {
	for _, n := range []int{0, 1, bodyChunk - 1, bodyChunk, bodyChunk + 1, 5*bodyChunk + 7, 1 << 20} {
		body := make([]byte, n)
		for i := range body {
			body[i] = byte(i * 7)
		}
		in := appendHeader(nil, typePublish<<4, n)
		header, got, err := readPacket(bufio.NewReader(bytes.NewReader(append(in, body...))), 2<<20)
		if err != nil || header != typePublish<<4 || !bytes.Equal(got, body) {
			t.Errorf("%d bytes: got %d bytes, header %#x, error %v", n, len(got), header, err)
		}
		if n == 0 {
			continue
		}
		_, _, err = readPacket(bufio.NewReader(bytes.NewReader(append(in, body[:n-1]...))), 2<<20)
		if err != io.ErrUnexpectedEOF {
			t.Errorf("%d bytes cut short: error %v, want unexpected EOF", n, err)
		}
	}
}
