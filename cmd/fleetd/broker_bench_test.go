package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/action"
	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/mqtt"
	"github.com/fleetd/fleet/mqtt/bridge"
	"github.com/fleetd/fleet/mqtt/mosquittotest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// BenchmarkExternalBrokerReports measures status reports per second from
// devices through an external broker (mosquitto on loopback) into the
// store, committed: 100 devices publish single reports at QoS 1 as fast as
// the broker acknowledges them; the clock stops when fleetd has applied the
// last report of every device. One replica; both databases.
//
//	FLEETD_TEST_POSTGRES=... go test ./cmd/fleetd -run XXX -bench ExternalBrokerReports -benchtime 20000x
func BenchmarkExternalBrokerReports(b *testing.B) {
	for _, be := range sqlstoretest.Backends() {
		b.Run(be.Name, func(b *testing.B) { benchExternalReports(b, be) })
	}
}

func benchExternalReports(b *testing.B, be sqlstoretest.Backend) {
	ctx := context.Background()
	db := sqlstoretest.MustOpen(b, be, sqlstoretest.Options{})
	if _, _, err := db.CreateTenant(ctx, "acme"); err != nil {
		b.Fatal(err)
	}
	const devices = 1000
	var devs []fleet.NewDevice
	for i := range devices {
		devs = append(devs, fleet.NewDevice{ID: fmt.Sprintf("d%03d", i)})
	}
	if _, err := db.CreateDevices(ctx, "acme", devs); err != nil {
		b.Fatal(err)
	}
	actions := &action.Service{Store: db}
	actions.Open()
	defer actions.Close()
	a, err := actions.DispatchAction(ctx, "acme", &fleet.Dispatch{Action: "run", Params: json.RawMessage(`{}`), SearchType: fleet.SearchAll, Timeout: 3600})
	if err != nil {
		b.Fatal(err)
	}
	broker := mosquittotest.Start(b)
	client, err := bridge.NewClient(bridge.ClientConfig{Broker: broker.URL, Redeliveries: db, Workers: 256},
		&mqtt.Devices{Registry: db, Actions: actions, Delivery: actions})
	if err != nil {
		b.Fatal(err)
	}
	if err := client.Open(); err != nil {
		b.Fatal(err)
	}
	defer client.Close()
	wctx, cancel := context.WithTimeout(ctx, fleetdtest.Bound)
	defer cancel()
	if err := client.WaitConnected(wctx); err != nil {
		b.Fatal(err)
	}
	conns := make([]*paho.Client, devices)
	for i := range conns {
		conn, err := net.Dial("tcp", broker.Addr)
		if err != nil {
			b.Fatal(err)
		}
		c := paho.NewClient(paho.ClientConfig{Conn: conn})
		if _, err := c.Connect(wctx, &paho.Connect{ClientID: devs[i].ID, CleanStart: true, KeepAlive: 30}); err != nil {
			b.Fatal(err)
		}
		conns[i] = c
		defer func() { c.Disconnect(&paho.Disconnect{}); <-c.Done() }()
	}
	per := max(b.N/devices, 1)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 1; k <= per; k++ {
				body, _ := json.Marshal(map[string]any{"id": fmt.Sprint(a.ID), "state": fmt.Sprint("S", k), "progress": k % 100, "timestamp": k, "sequence": k})
				if _, err := c.Publish(ctx, &paho.Publish{Topic: mqtt.ActionStatusTopic("acme", devs[i].ID), QoS: 1, Payload: body}); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		das, _, err := db.FindDeviceActions(ctx, "acme", fleet.DeviceActionFilter{ActionID: a.ID, Page: fleet.Page{Page: 1, Limit: 1000}})
		if err != nil {
			b.Fatal(err)
		}
		done := 0
		for _, da := range das {
			if da.Status == fmt.Sprint("S", per) {
				done++
			}
		}
		if done == devices {
			break
		}
		time.Sleep(100 * time.Millisecond) // reading 1,000 rows is work too
	}
	b.ReportMetric(float64(per*devices)/time.Since(start).Seconds(), "reports/s")
}
