package bridge_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/fleetd/fleet/mqtt"
	"github.com/fleetd/fleet/mqtt/bridge"
	"github.com/fleetd/fleet/mqtt/mosquittotest"
	"github.com/fleetd/fleet/mqtt/mqtttest"
)

// BenchmarkClientSendAction measures actions per second that fleetd hands
// to an external broker (mosquitto on loopback) for subscribed devices, 64
// senders at once as the action service's workers send, each waiting for
// the broker's PUBACK; the devices receive every one.
//
//	go test ./mqtt/bridge -run XXX -bench ClientSendAction
func BenchmarkClientSendAction(b *testing.B) {
	broker := mosquittotest.Start(b)
	c, err := bridge.NewClient(bridge.ClientConfig{Broker: broker.URL}, mqtttest.NewHandler())
	if err != nil {
		b.Fatal(err)
	}
	if err := c.Open(); err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := mqtttest.Context()
	defer cancel()
	if err := c.WaitConnected(ctx); err != nil {
		b.Fatal(err)
	}
	const devices = 64
	var received atomic.Int64
	for i := range devices {
		d := dialDevice(b, broker.Addr, fmt.Sprintf("d%d", i))
		go func() {
			for range d.Received {
				received.Add(1)
			}
		}()
		subscribeTB(b, d, mqtt.ActionsTopic("acme", fmt.Sprintf("d%d", i)))
	}
	payload := []byte(`{"id":"1","kind":"process","name":"reboot","payload":"{}"}`)
	var next atomic.Int64
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range devices {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				if !c.SendAction("acme", fmt.Sprintf("d%d", w), 1, payload) {
					b.Error("SendAction = false")
					return
				}
			}
		}()
	}
	wg.Wait()
	for received.Load() < int64(b.N) && time.Since(start) < time.Minute {
		time.Sleep(time.Millisecond)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "actions/s")
}

func subscribeTB(tb testing.TB, d *mqtttest.Device, topic string) {
	tb.Helper()
	ctx, cancel := mqtttest.Context()
	defer cancel()
	if _, err := d.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: topic, QoS: 1}}}); err != nil {
		tb.Fatalf("subscribe %s: %v", topic, err)
	}
}

// countingHandler counts status publishes and does nothing else: what an
// external broker can hand fleetd, without the store.
type countingHandler struct {
	*mqtttest.Handler
	n atomic.Int64
}

func (h *countingHandler) HandleStatus(context.Context, string, string, []byte) error {
	h.n.Add(1)
	return nil
}

// BenchmarkClientReceive measures status publishes per second from 100
// devices through mosquitto to the Client and its Handler, acknowledged,
// with a Handler that does nothing: the ceiling the broker and the client
// put on ingest before any database.
//
//	go test ./mqtt/bridge -run XXX -bench ClientReceive -benchtime 50000x
func BenchmarkClientReceive(b *testing.B) {
	broker := mosquittotest.Start(b)
	h := &countingHandler{Handler: mqtttest.NewHandler()}
	c, err := bridge.NewClient(bridge.ClientConfig{Broker: broker.URL}, h)
	if err != nil {
		b.Fatal(err)
	}
	if err := c.Open(); err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := mqtttest.Context()
	defer cancel()
	if err := c.WaitConnected(ctx); err != nil {
		b.Fatal(err)
	}
	const devices = 100
	ds := make([]*mqtttest.Device, devices)
	for i := range ds {
		ds[i] = dialDevice(b, broker.Addr, fmt.Sprintf("d%d", i))
	}
	per := max(b.N/devices, 1)
	payload := []byte(`{"id":"1","state":"Working","progress":50}`)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for i, d := range ds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range per {
				if _, err := d.Publish(context.Background(), &paho.Publish{Topic: mqtt.ActionStatusTopic("acme", fmt.Sprintf("d%d", i)), QoS: 1, Payload: payload}); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for h.n.Load() < int64(per*devices) && time.Since(start) < time.Minute {
		time.Sleep(time.Millisecond)
	}
	b.ReportMetric(float64(per*devices)/time.Since(start).Seconds(), "reports/s")
}
