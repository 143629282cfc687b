package fleetdtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pahov3 "github.com/eclipse/paho.mqtt.golang"

	"github.com/eclipse/paho.golang/paho"
	"github.com/fleetd/fleet/action"
	"github.com/fleetd/fleet/mqtt"
	"github.com/fleetd/fleet/mqtt/mosquittotest"
)

// MQTTDevice is a device connected over MQTT 3.1.1 with the paho client,
// subscribed to its actions, acknowledging each (QoS 1) as it arrives. Like
// any device it ignores an action id it has seen: delivery is at least once
// (a device that subscribes while a dispatch commits may get it twice).
type MQTTDevice struct {
	Tenant, ID string
	Client     pahov3.Client
	Actions    chan action.Message
	Seen       sync.Map // action id -> true
}

// ConnectDevice connects device id of tenant to s's broker as an
// MQTTDevice.
func (s *Server) ConnectDevice(t *testing.T, tenant, id, token string) *MQTTDevice {
	t.Helper()
	d := &MQTTDevice{Tenant: tenant, ID: id, Actions: make(chan action.Message, 100)}
	opts := pahov3.NewClientOptions().
		AddBroker("tcp://" + s.MQTTAddr).
		SetClientID(id).
		SetUsername(tenant + "/" + id).
		SetPassword(token).
		SetProtocolVersion(4).
		SetCleanSession(true).
		SetAutoReconnect(false).
		SetConnectTimeout(Bound)
	d.Client = pahov3.NewClient(opts)
	if tok := d.Client.Connect(); !tok.WaitTimeout(Bound) || tok.Error() != nil {
		t.Fatalf("connect %s: %v", id, tok.Error())
	}
	t.Cleanup(func() { d.Client.Disconnect(100) })
	tok := d.Client.Subscribe(mqtt.ActionsTopic(tenant, id), 1, func(_ pahov3.Client, m pahov3.Message) {
		var a action.Message
		if err := json.Unmarshal(m.Payload(), &a); err != nil {
			panic(fmt.Sprintf("action message %s: %v", m.Payload(), err))
		}
		if _, dup := d.Seen.LoadOrStore(a.ID, true); !dup {
			d.Actions <- a
		}
	})
	if !tok.WaitTimeout(Bound) || tok.Error() != nil {
		t.Fatalf("subscribe %s: %v", id, tok.Error())
	}
	return d
}

// Next returns the next action message the device received.
func (d *MQTTDevice) Next(t *testing.T) action.Message {
	t.Helper()
	select {
	case a := <-d.Actions:
		return a
	case <-time.After(Bound):
		t.Fatalf("%s received no action", d.ID)
	}
	panic("unreachable")
}

// Nothing asserts that no action arrives for a moment.
func (d *MQTTDevice) Nothing(t *testing.T) {
	t.Helper()
	select {
	case a := <-d.Actions:
		t.Fatalf("%s received %+v", d.ID, a)
	case <-time.After(200 * time.Millisecond):
	}
}

// Report publishes a payload on the device's status topic at QoS 1 and
// returns when it is acknowledged, that is committed.
func (d *MQTTDevice) Report(t *testing.T, payload any) {
	t.Helper()
	b, err := json.Marshal(payload)
	if err != nil {
		t.Fatal(err)
	}
	tok := d.Client.Publish(mqtt.ActionStatusTopic(d.Tenant, d.ID), 1, false, b)
	if !tok.WaitTimeout(Bound) || tok.Error() != nil {
		t.Fatalf("publish status of %s: %v", d.ID, tok.Error())
	}
}

// StreamDevice is a device connected to fleetd's broker with paho.golang.
type StreamDevice struct {
	*paho.Client
	Tenant, ID string
}

var streamClientIDs atomic.Int64

// DialStreamDevice connects a device to the broker at addr with
// paho.golang (MQTT 5).
func DialStreamDevice(tb testing.TB, addr, tenant, id, token string) *StreamDevice {
	tb.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		tb.Fatalf("dial broker: %v", err)
	}
	c := paho.NewClient(paho.ClientConfig{Conn: conn})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	ca, err := c.Connect(ctx, &paho.Connect{KeepAlive: 30, ClientID: fmt.Sprintf("alerts-%d", streamClientIDs.Add(1)), CleanStart: true,
		Username: tenant + "/" + id, UsernameFlag: true, Password: []byte(token), PasswordFlag: true})
	if err != nil {
		conn.Close()
		tb.Fatalf("connect %s: %v (%+v)", id, err, ca)
	}
	tb.Cleanup(func() {
		_ = c.Disconnect(&paho.Disconnect{})
		<-c.Done()
	})
	return &StreamDevice{Client: c, Tenant: tenant, ID: id}
}

// PublishStream sends a batch at QoS 1 and returns once fleetd acknowledged it,
// which it does after the batch is committed.
func (d *StreamDevice) PublishStream(tb testing.TB, stream string, body any) {
	tb.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	pr, err := d.Publish(ctx, &paho.Publish{Topic: mqtt.StreamTopic(d.Tenant, d.ID, stream), QoS: 1, Payload: b})
	if err != nil {
		tb.Fatalf("publish: %v", err)
	}
	if pr.ReasonCode >= 0x80 {
		tb.Fatalf("publish refused: reason code %#x", pr.ReasonCode)
	}
}

// BrokerSecret is the broker-auth secret of ExternalBrokerFlags.
const BrokerSecret = "broker-secret"

// ExternalBrokerFlags run fleetd as a client of broker, with the
// broker-auth endpoints on.
func ExternalBrokerFlags(broker *mosquittotest.Broker, extra ...string) []string {
	return append([]string{"--mqtt-broker", broker.URL, "--broker-auth-secret", BrokerSecret,
		"--mqtt-username", "fleetd", "--mqtt-password", "fleetd-pw"}, extra...)
}

// PublishJSON publishes payload as JSON at QoS 1 and returns once it is
// acknowledged.
func PublishJSON(t *testing.T, c *paho.Client, topic string, payload any) {
	t.Helper()
	b, _ := json.Marshal(payload)
	ctx, cancel := context.WithTimeout(context.Background(), Bound)
	defer cancel()
	if _, err := c.Publish(ctx, &paho.Publish{Topic: topic, QoS: 1, Payload: b}); err != nil {
		t.Fatalf("publish %s: %v", topic, err)
	}
}

// GoAuth calls a mosquitto-go-auth endpoint as its HTTP backend does, the
// secret in the query, and returns the status.
func (s *Server) GoAuth(t *testing.T, path string, params map[string]any) int {
	t.Helper()
	b, _ := json.Marshal(params)
	rq, _ := http.NewRequest("POST", s.URL+path+"?secret="+url.QueryEscape(BrokerSecret), bytes.NewReader(b))
	rq.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(rq)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
