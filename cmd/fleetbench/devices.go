package main

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/fleetd/fleet/mqtt"
)

// simDevice is a simulated device: an MQTT 5 connection (paho.golang, the
// client fleetd's own tests and simulator use) as one provisioned device.
type simDevice struct {
	tenant, id string
	c          *paho.Client
	// received is when the device last received an action message, in
	// UnixNano; 0 before the first.
	received atomic.Int64
	actions  atomic.Int64 // action messages received
	// deltaAt and deltas are received's and actions' twins for the
	// shadow's delta topic.
	deltaAt atomic.Int64
	deltas  atomic.Int64
}

// topicFunc is a device's topic of package mqtt.
type topicFunc func(tenant, device string) string

// subscribeActions subscribes a device to its actions, as a real device
// does.
var subscribeActions = []topicFunc{mqtt.ActionsTopic}

// fleetConn connects many devices and disconnects them together.
type fleetConn struct {
	devices []*simDevice
}

// sourceAddrs are the loopback addresses connections come from when fleetd
// is on loopback: each has its own ephemeral ports.
var sourceAddrs = func() []*net.TCPAddr {
	var out []*net.TCPAddr
	for i := 2; i <= 9; i++ {
		out = append(out, &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(i))})
	}
	return out
}()

// connectDevices connects every device, workers at a time, with a
// keepalive of defaultKeepalive; each subscribes to the topics of subs
// and records what it receives (paho acknowledges each at QoS 1).
func connectDevices(ctx context.Context, addr, tenant string, toks []deviceToken, subs []topicFunc, p *progress, what string) (*fleetConn, error) {
	return connectDevicesPinging(ctx, addr, tenant, toks, subs, defaultKeepalive, p, what)
}

// defaultKeepalive is the devices' MQTT keepalive, in seconds: they ping
// (PINGREQ) when they have sent nothing for that long.
const defaultKeepalive = 120

// connectDevicesPinging is connectDevices with a keepalive of keepalive
// seconds.
func connectDevicesPinging(ctx context.Context, addr, tenant string, toks []deviceToken, subs []topicFunc, keepalive uint16, p *progress, what string) (*fleetConn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("MQTT address %q: %w", addr, err)
	}
	ip := net.ParseIP(host)
	loopback := ip != nil && ip.IsLoopback() || host == "localhost"
	fc := &fleetConn{devices: make([]*simDevice, len(toks))}
	var done atomic.Int64
	err = parallel(ctx, len(toks), 64, func(ctx context.Context, i int) error {
		var d net.Dialer
		if loopback {
			d.LocalAddr = sourceAddrs[i%len(sourceAddrs)]
		}
		dev, err := dialDevice(ctx, &d, addr, tenant, toks[i], subs, keepalive)
		if err != nil {
			return err
		}
		fc.devices[i] = dev
		p.count(what, int(done.Add(1)), len(toks))
		return nil
	})
	if err != nil {
		fc.close()
		return nil, err
	}
	return fc, nil
}

func dialDevice(ctx context.Context, d *net.Dialer, addr, tenant string, tok deviceToken, subs []topicFunc, keepalive uint16) (*simDevice, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("device %s: dial %s: %w", tok.ID, addr, err)
	}
	dev := &simDevice{tenant: tenant, id: tok.ID}
	dev.c = paho.NewClient(paho.ClientConfig{
		Conn: conn,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			if strings.HasSuffix(pr.Packet.Topic, "/shadow/delta") {
				dev.deltaAt.Store(time.Now().UnixNano())
				dev.deltas.Add(1)
				return true, nil
			}
			dev.received.Store(time.Now().UnixNano())
			dev.actions.Add(1)
			return true, nil
		}},
	})
	// paho sizes its inbound queue by ReceiveMaximum: at its default of
	// 65,535 that is half a megabyte per device.
	recvMax := uint16(16)
	ca, err := dev.c.Connect(ctx, &paho.Connect{
		KeepAlive: keepalive, ClientID: tok.ID, CleanStart: true,
		Username: tenant + "/" + tok.ID, UsernameFlag: true, Password: []byte(tok.Token), PasswordFlag: true,
		Properties: &paho.ConnectProperties{ReceiveMaximum: &recvMax},
	})
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("device %s: connect: %v (%+v)", tok.ID, err, ca)
	}
	if len(subs) > 0 {
		var so []paho.SubscribeOptions
		for _, topic := range subs {
			so = append(so, paho.SubscribeOptions{Topic: topic(tenant, tok.ID), QoS: 1})
		}
		if _, err := dev.c.Subscribe(ctx, &paho.Subscribe{Subscriptions: so}); err != nil {
			dev.c.Disconnect(&paho.Disconnect{})
			return nil, fmt.Errorf("device %s: subscribe: %w", tok.ID, err)
		}
	}
	return dev, nil
}

// publish sends payload at QoS 1 and returns once fleetd acknowledged it.
func (d *simDevice) publish(ctx context.Context, topic string, payload []byte) error {
	pr, err := d.c.Publish(ctx, &paho.Publish{Topic: topic, QoS: 1, Payload: payload})
	if err != nil {
		return fmt.Errorf("device %s: publish: %w", d.id, err)
	}
	if pr.ReasonCode >= 0x80 {
		return fmt.Errorf("device %s: publish refused, reason code %#x", d.id, pr.ReasonCode)
	}
	return nil
}

func (fc *fleetConn) close() {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for _, d := range fc.devices {
		if d == nil {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			d.c.Disconnect(&paho.Disconnect{})
			select {
			case <-d.c.Done():
			case <-time.After(5 * time.Second):
			}
		}()
	}
	wg.Wait()
}
