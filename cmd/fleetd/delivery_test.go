package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/fleetd/fleet/action"
	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/mqtt"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestDeviceChannelDelivery drives what
// docs/device-protocol.md#acknowledgements-and-delivery promises through the
// whole of fleetd (HTTP, the action service, the store, the broker) with
// MQTT 5 devices: actions dispatched while the device's window is full reach
// it as the window frees, in dispatch order; an action the device refuses in
// its PUBACK, or that is larger than it accepts, is Failed with the reason.
func TestDeviceChannelDelivery(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := startServer(t, b)
		admin := s.Admin()

		t.Run("window of one", func(t *testing.T) {
			dev := s.MustDevice(t, admin, "narrow", nil)
			rm := uint16(1)
			c := s.connect5(t, "narrow", dev.Token, &paho.ConnectProperties{ReceiveMaximum: &rm})
			var ids []int64
			for i := range 3 {
				ids = append(ids, s.Dispatch(t, admin, map[string]any{"action": fmt.Sprint("step-", i), "params": map[string]any{},
					"search_type": "default", "device_ids": []string{"narrow"}}))
			}
			for _, id := range ids {
				var p *paho.Publish
				select {
				case p = <-c.received:
				case <-time.After(fleetdtest.Bound):
					t.Fatalf("action %d never arrived", id)
				}
				var m action.Message
				json.Unmarshal(p.Payload, &m)
				if m.ID != fmt.Sprint(id) {
					t.Fatalf("received action %s, want %d (dispatch order)", m.ID, id)
				}
				c.Ack(p)
			}
			for _, id := range ids {
				s.AwaitActionStatus(t, admin, "narrow", id, "Initiated")
			}
		})

		t.Run("refused in the PUBACK", func(t *testing.T) {
			dev := s.MustDevice(t, admin, "refuser", nil)
			c := rawDevice5(t, s.MQTTAddr, "refuser", dev.Token)
			id := s.Dispatch(t, admin, map[string]any{"action": "flash", "params": map[string]any{},
				"search_type": "default", "device_ids": []string{"refuser"}})
			pid := c.nextPublish(t)
			const why = "no room for that firmware."
			reason := append(binary.BigEndian.AppendUint16([]byte{0x1F}, uint16(len(why))), why...) // Reason String
			c.write(t, 0x40, binary.BigEndian.AppendUint16(nil, pid), []byte{0x97, byte(len(reason))}, reason)
			da := s.AwaitActionStatus(t, admin, "refuser", id, "Failed")
			errs := strings.Join(da.Errors["Failed"], " ")
			if !strings.Contains(errs, "0x97 (Quota exceeded)") || !strings.Contains(errs, why) {
				t.Fatalf("errors %v, want the reason code and string", da.Errors)
			}
		})

		t.Run("larger than the device accepts", func(t *testing.T) {
			dev := s.MustDevice(t, admin, "small", nil)
			limit := uint32(300)
			c := s.connect5(t, "small", dev.Token, &paho.ConnectProperties{MaximumPacketSize: &limit})
			id := s.Dispatch(t, admin, map[string]any{"action": "configure", "params": map[string]any{"blob": strings.Repeat("x", 1000)},
				"search_type": "default", "device_ids": []string{"small"}})
			da := s.AwaitActionStatus(t, admin, "small", id, "Failed")
			if errs := strings.Join(da.Errors["Failed"], " "); !strings.Contains(errs, "more than the device's Maximum Packet Size of 300") {
				t.Fatalf("errors %v, want the sizes", da.Errors)
			}
			// The next one fits, and arrives.
			next := s.Dispatch(t, admin, map[string]any{"action": "ping", "params": map[string]any{}, "search_type": "default", "device_ids": []string{"small"}})
			select {
			case p := <-c.received:
				var m action.Message
				json.Unmarshal(p.Payload, &m)
				if m.ID != fmt.Sprint(next) {
					t.Fatalf("received action %s, want %d", m.ID, next)
				}
			case <-time.After(fleetdtest.Bound):
				t.Fatal("the next action never arrived")
			}
		})
	})
}

// device5 is an MQTT 5 device through paho.golang that acknowledges
// actions itself (Ack).
type device5 struct {
	*paho.Client
	received chan *paho.Publish
}

// connect5 connects an MQTT 5 device with the CONNECT properties given and
// subscribes it to its actions.
func (s *testServer) connect5(t *testing.T, id, token string, props *paho.ConnectProperties) *device5 {
	t.Helper()
	conn, err := net.Dial("tcp", s.MQTTAddr)
	if err != nil {
		t.Fatal(err)
	}
	d := &device5{received: make(chan *paho.Publish, 100)}
	d.Client = paho.NewClient(paho.ClientConfig{
		Conn: conn,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){
			func(pr paho.PublishReceived) (bool, error) { d.received <- pr.Packet; return true, nil },
		},
		EnableManualAcknowledgment: true,
		SendAcksInterval:           time.Millisecond,
	})
	ctx, cancel := context.WithTimeout(context.Background(), fleetdtest.Bound)
	defer cancel()
	if _, err := d.Connect(ctx, &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30, Username: "default/" + id, UsernameFlag: true,
		Password: []byte(token), PasswordFlag: true, Properties: props}); err != nil {
		t.Fatalf("connect %s: %v", id, err)
	}
	t.Cleanup(func() { d.Disconnect(&paho.Disconnect{}) })
	if _, err := d.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: mqtt.ActionsTopic("default", id), QoS: 1}}}); err != nil {
		t.Fatalf("subscribe %s: %v", id, err)
	}
	return d
}

// raw5 is an MQTT 5 device written byte by byte, for what paho.golang
// cannot send: a PUBACK with a failure reason code.
type raw5 struct {
	conn net.Conn
	r    *bufio.Reader
}

// rawDevice5 connects device id of tenant default with MQTT 5 and
// subscribes it to its actions.
func rawDevice5(t *testing.T, addr, id, token string) *raw5 {
	t.Helper()
	c := rawConnect5(t, addr, id, token)
	c.write(t, 0x82, []byte{0, 1, 0}, mstr(mqtt.ActionsTopic("default", id)), []byte{1})
	if typ, _ := c.read(t); typ != 9 {
		t.Fatalf("packet type %d, want SUBACK", typ)
	}
	return c
}

// rawConnect5 connects device id of tenant default with MQTT 5.
func rawConnect5(t *testing.T, addr, id, token string) *raw5 {
	t.Helper()
	c, err := dialRaw5(addr, id, token)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.conn.Close() })
	return c
}

// dialRaw5 is rawConnect5 for goroutines other than the test's: the caller
// closes the connection.
func dialRaw5(addr, id, token string) (*raw5, error) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	c := &raw5{conn: conn, r: bufio.NewReader(conn)}
	if _, err := conn.Write(packet(0x10, mstr("MQTT"), []byte{5, 0xC2, 0, 30, 0}, mstr(id), mstr("default/"+id), mstr(token))); err != nil {
		conn.Close()
		return nil, err
	}
	if typ, body, err := c.tryRead(); err != nil || typ != 2 || body[1] != 0 {
		conn.Close()
		return nil, fmt.Errorf("%s: CONNACK % x (%v), want success", id, body, err)
	}
	return c, nil
}

// mstr is an MQTT string: two bytes of length, then s.
func mstr(s string) []byte { return append(binary.BigEndian.AppendUint16(nil, uint16(len(s))), s...) }

func (c *raw5) write(t *testing.T, first byte, parts ...[]byte) {
	t.Helper()
	if _, err := c.conn.Write(packet(first, parts...)); err != nil {
		t.Fatal(err)
	}
}

// packet is an MQTT packet of the first byte and the body parts.
func packet(first byte, parts ...[]byte) []byte {
	var body []byte
	for _, p := range parts {
		body = append(body, p...)
	}
	return append(binary.AppendUvarint([]byte{first}, uint64(len(body))), body...)
}

func (c *raw5) read(t *testing.T) (byte, []byte) {
	t.Helper()
	typ, body, err := c.tryRead()
	if err != nil {
		t.Fatal(err)
	}
	return typ, body
}

// tryRead reads the next packet: its type and body.
func (c *raw5) tryRead() (byte, []byte, error) {
	c.conn.SetReadDeadline(time.Now().Add(fleetdtest.Bound))
	first, err := c.r.ReadByte()
	if err != nil {
		return 0, nil, err
	}
	n, err := binary.ReadUvarint(c.r)
	if err != nil {
		return 0, nil, err
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(c.r, body); err != nil {
		return 0, nil, err
	}
	return first >> 4, body, nil
}

// nextPublish reads the next PUBLISH and returns its packet identifier.
func (c *raw5) nextPublish(t *testing.T) uint16 {
	t.Helper()
	typ, body := c.read(t)
	if typ != 3 {
		t.Fatalf("packet type %d, want PUBLISH", typ)
	}
	n := int(binary.BigEndian.Uint16(body))
	return binary.BigEndian.Uint16(body[2+n:])
}
