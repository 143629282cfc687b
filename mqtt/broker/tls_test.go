package broker_test

import (
	"crypto/tls"
	"testing"

	"github.com/eclipse/paho.golang/paho"
	"github.com/fleetd/fleet/mqtt/broker"
	"github.com/fleetd/fleet/mqtt/mqtttest"
)

func TestTLS(t *testing.T) {
	cert, pool := mqtttest.SelfSigned(t)
	h := mqtttest.NewHandler()
	s := MustOpenServer(t, h, func(c *broker.Config) {
		c.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	})
	conn, err := tls.Dial("tcp", s.Addr().String(), &tls.Config{RootCAs: pool})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	c := paho.NewClient(paho.ClientConfig{Conn: conn})
	ctx, cancel := mqtttest.Context()
	defer cancel()
	// Keepalive 0: paho.golang's pinger sends its first PINGREQ at once, on
	// another goroutine, and over TLS its packets are written in pieces that
	// can interleave with the PUBLISH.
	if _, err := c.Connect(ctx, &paho.Connect{
		KeepAlive: 0, ClientID: "dev-1", CleanStart: true,
		Username: "acme/dev-1", UsernameFlag: true, Password: []byte("tok-1"), PasswordFlag: true,
	}); err != nil {
		t.Fatalf("connect over TLS: %v", err)
	}
	defer func() { c.Disconnect(&paho.Disconnect{}); <-c.Done() }()
	if _, err := c.Publish(ctx, &paho.Publish{Topic: statusT, QoS: 1, Payload: status}); err != nil {
		t.Fatalf("publish over TLS: %v", err)
	}
	mqtttest.Receive(t, h.Statuses, "HandleStatus")

	// The listener speaks TLS only.
	if _, _, err := connect5(t, s, "acme/dev-1", "tok-1", false); err == nil {
		t.Error("plain MQTT accepted on a TLS listener")
	}
}
