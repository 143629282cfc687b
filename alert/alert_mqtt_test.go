package alert_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/alert"
	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/mqtt"
	"github.com/fleetd/fleet/mqtt/broker"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestAlertsOverMQTT publishes data over MQTT and receives the webhook.
func TestAlertsOverMQTT(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b, fleetdtest.AlertFlags...)
		if s.MQTTAddr == "" {
			t.Fatal("fleetd did not report its MQTT address")
		}
		admin := s.Admin()
		dev := s.MustDevice(t, admin, "pump-1", nil)
		other := s.NewTenant(t, "beta")
		s.MustDevice(t, other, "pump-1", nil)
		hot := map[string]any{"field": "temp", "operator": ">", "value": 80}
		rule := s.MustAlertRule(t, admin, map[string]any{"name": "hot", "stream": "env", "condition": hot})
		s.MustAlertRule(t, other, map[string]any{"name": "hot", "stream": "env", "condition": hot})
		hook := fleetdtest.NewReceiver(t, 1)
		s.Do(t, admin, "POST", "/api/v1/alert-rules/"+rule.ID+"/alert-notification-rules", map[string]any{
			"channel_parameters": map[string]any{"type": "webhook", "url": hook.URL, "secret": "k"}}).Want(t, 201)

		d := fleetdtest.DialStreamDevice(t, s.MQTTAddr, "default", "pump-1", dev.Token)
		start := time.Now().UTC()
		// One bad point among good ones: it is dropped, the others count.
		batch := []any{fleetdtest.Points(start, 70)[0], "garbage", fleetdtest.Points(start.Add(time.Second), 91)[0]}
		d.PublishStream(t, "env", batch)

		active := s.Alerts(t, admin, "?state=active")
		if len(active) != 1 || active[0].DeviceID != "pump-1" || active[0].Value.Data["temp"] != 91.0 {
			t.Fatalf("active alerts after the MQTT publish: %+v", active)
		}
		if n := len(s.Alerts(t, other, "")); n != 0 {
			t.Fatalf("tenant beta has %d alerts from default's data", n)
		}
		var latest struct{ Data map[string]any }
		s.Do(t, admin, "GET", "/api/v1/devices/pump-1/streams/env/latest", nil).Want(t, 200).Decode(t, &latest)
		if latest.Data["temp"] != 91.0 {
			t.Fatalf("latest %+v", latest)
		}
		fleetdtest.Eventually(t, "the webhook, after one 503", func() bool { return len(hook.Got()) >= 2 })
		got := hook.Got()[1]
		if !strings.Contains(string(got.Body), `"event":"opened"`) || got.Header.Get("X-Fleet-Signature") == "" {
			t.Fatalf("webhook %s", got.Body)
		}
		d.PublishStream(t, "env", fleetdtest.Points(start.Add(time.Minute), 40))
		if ended := s.Alerts(t, admin, "?state=ended"); len(ended) != 1 {
			t.Fatalf("ended alerts %+v", ended)
		}
	})
}

// BenchmarkStreamsOverMQTT measures points per second from devices over
// MQTT, through evaluation, committed before each PUBACK: 64 devices, each
// publishing batches of 100 (or 10) points at QoS 1, on each database. fleetd's
// pieces are wired as serve wires them, on loopback.
func BenchmarkStreamsOverMQTT(b *testing.B) {
	for _, be := range sqlstoretest.Backends() {
		for _, perBatch := range []int{100, 10} {
			b.Run(fmt.Sprintf("%s/batch=%d", be.Name, perBatch), func(b *testing.B) { benchStreamsOverMQTT(b, be, perBatch) })
		}
	}
}

func benchStreamsOverMQTT(b *testing.B, be sqlstoretest.Backend, perBatch int) {
	ctx := context.Background()
	db := sqlstoretest.MustOpen(b, be, sqlstoretest.Options{})
	if _, _, err := db.CreateTenant(ctx, "acme"); err != nil {
		b.Fatal(err)
	}
	const devices = 64
	var devs []fleet.NewDevice
	for i := range devices {
		devs = append(devs, fleet.NewDevice{ID: fmt.Sprintf("d%d", i)})
	}
	toks, err := db.CreateDevices(ctx, "acme", devs)
	if err != nil {
		b.Fatal(err)
	}
	for _, r := range []map[string]any{
		{"field": "temp", "operator": ">", "value": int64(80)},
		{"all": []any{map[string]any{"field": "humidity", "operator": ">=", "value": int64(90)}, map[string]any{"no_data_seconds": int64(300)}}},
	} {
		if err := db.CreateAlertRule(ctx, "acme", &fleet.AlertRule{Name: fmt.Sprint(r), Stream: "env", Condition: r}); err != nil {
			b.Fatal(err)
		}
	}
	engine := &alert.Engine{Store: db, Devices: db}
	if err := engine.Load(ctx); err != nil {
		b.Fatal(err)
	}
	svc := &alert.Service{ServiceStore: db, Engine: engine}
	broker := broker.NewServer(broker.Config{Addr: "127.0.0.1:0"}, &mqtt.Devices{Registry: db, Streams: svc})
	if err := broker.Open(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { broker.Close() })
	clients := make([]*fleetdtest.StreamDevice, devices)
	for i, tok := range toks {
		clients[i] = fleetdtest.DialStreamDevice(b, broker.Addr().String(), "acme", tok.ID, tok.Token)
	}
	base := time.Now().UnixMilli()
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	t0 := time.Now()
	for _, c := range clients {
		wg.Add(1)
		go func(c *fleetdtest.StreamDevice) {
			defer wg.Done()
			for seq := 0; ; seq++ {
				if next.Add(1) > int64(b.N) {
					return
				}
				p := payload(base, seq*perBatch, perBatch)
				pr, err := c.Publish(ctx, &paho.Publish{Topic: mqtt.StreamTopic("acme", c.ID, "env"), QoS: 1, Payload: p})
				if err != nil || pr.ReasonCode >= 0x80 {
					b.Errorf("publish: %v %v", err, pr)
					return
				}
			}
		}(c)
	}
	wg.Wait()
	b.ReportMetric(float64(b.N*perBatch)/time.Since(t0).Seconds(), "points/s")
}

// payload is a batch of n points from the k-th on, written directly: a
// device's work, kept cheap so the benchmark measures fleetd. The
// temperature crosses the threshold once in 500 points.
func payload(base int64, k, n int) []byte {
	b := make([]byte, 0, n*80)
	b = append(b, '[')
	for i := k; i < k+n; i++ {
		if i > k {
			b = append(b, ',')
		}
		b = append(b, `{"timestamp":`...)
		b = strconv.AppendInt(b, base+int64(i), 10)
		b = append(b, `,"sequence":`...)
		b = strconv.AppendInt(b, int64(i), 10)
		b = append(b, `,"temp":`...)
		b = strconv.AppendInt(b, int64(70+i%500/40), 10)
		b = append(b, `,"humidity":`...)
		b = strconv.AppendInt(b, int64(85+i%1000/100), 10)
		b = append(b, `,"status":"ok"}`...)
	}
	return append(b, ']')
}
