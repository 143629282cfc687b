//go:build unix

package broker_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	fleetaction "github.com/fleetd/fleet/action"
	"github.com/fleetd/fleet/mqtt"
	"github.com/fleetd/fleet/mqtt/broker"
	"github.com/fleetd/fleet/mqtt/mqtttest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// BenchmarkPublishQoS1 is the broker's share of an MQTT status report:
// 64 devices (MQTT 3.1.1, plain TCP) each publish a status report at QoS 1
// and wait for its PUBACK, as fleetbench's mqtt-status does, to a handler
// that takes it at once. It reports the process's CPU per publish
// (cpu-µs/op; the devices' side is the same in every build), which moves
// less than the time per publish when the machine is shared.
func BenchmarkPublishQoS1(b *testing.B) {
	const devices = 64
	h := mqtttest.NewHandler()
	for i := range devices {
		h.SetToken(fmt.Sprintf("acme/bench-%d", i), fmt.Sprintf("tok-%d", i))
	}
	go func() {
		for range h.Statuses {
		}
	}()
	defer close(h.Statuses) // after the server closed (deferred below): no handler sends any more
	s := broker.NewServer(broker.Config{Addr: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler)}, h)
	if err := s.Open(); err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	tokens := make([]string, devices)
	for i := range tokens {
		tokens[i] = fmt.Sprintf("tok-%d", i)
	}
	publishLoad(b, s, "acme", "bench-", tokens, func(dev, n int) []byte {
		return fmt.Appendf(nil, `{"action_id":7,"state":"Downloading","progress":%d,"timestamp":%d,"sequence":%d}`, n%100, 1700000000000+n, n)
	})
}

// publishLoad connects a device (MQTT 3.1.1, plain TCP) for each token,
// named prefix and its index in tenant, and has them publish b.N status
// reports at QoS 1 between them, each waiting for its PUBACK; payload
// gives a device's n-th report (n from 1). Before the clock starts each
// device publishes one report of n 0. It reports the process's CPU per
// publish (cpu-µs/op).
func publishLoad(b *testing.B, s *broker.Server, tenant, prefix string, tokens []string, payload func(dev, n int) []byte) {
	conns := make([]net.Conn, len(tokens))
	readers := make([]*bufio.Reader, len(tokens))
	publish := func(i, n int) error {
		topic := mqtt.ActionStatusTopic(tenant, fmt.Sprintf("%s%d", prefix, i))
		if _, err := conns[i].Write(publishPacket(1, n%65535+1, nil, topic, payload(i, n))); err != nil {
			return err
		}
		p, err := readRaw(readers[i])
		if err != nil || p.typ != typePuback {
			return fmt.Errorf("PUBACK: %v, %v", p, err)
		}
		return nil
	}
	for i := range conns {
		c, err := net.Dial("tcp", s.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		dev := fmt.Sprintf("%s%d", prefix, i)
		if _, err := c.Write(connect311(0xC2, dev, tenant+"/"+dev, tokens[i])); err != nil {
			b.Fatal(err)
		}
		readers[i] = bufio.NewReader(c)
		p, err := readRaw(readers[i])
		if err != nil || p.typ != typeConnack || p.body[1] != 0 {
			b.Fatalf("device %d: CONNACK %v, %v", i, p, err)
		}
		conns[i] = c
		if err := publish(i, 0); err != nil {
			b.Fatal(err)
		}
	}
	// Each publish takes a token; the devices stop when none is left.
	next := make(chan struct{}, b.N)
	for range b.N {
		next <- struct{}{}
	}
	close(next)
	var wg sync.WaitGroup
	errs := make(chan error, len(conns))
	b.ResetTimer()
	cpu0 := processCPU()
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 1; ; n++ {
				if _, ok := <-next; !ok {
					return
				}
				if err := publish(i, n); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(processCPU()-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu-µs/op")
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

// BenchmarkStatusReportQoS1 is an MQTT status report through the whole of
// fleetd's path, as fleetbench's mqtt-status sends it: 512 devices of one
// action publish its plain report (the action's id as a string, as the
// uplink agent sends it) at QoS 1, each waiting for its PUBACK, which
// comes once the report is committed; the broker, mqtt.Devices, the action
// service and the store (SQLite; PostgreSQL with FLEETD_TEST_POSTGRES), in
// one process with the devices. It reports the process's CPU per report
// (cpu-µs/op, the devices' side the same in every build) and, with
// -benchmem, the allocations (the devices' included).
//
//	go test ./mqtt/broker -run '^$' -bench StatusReportQoS1 -benchtime 50000x -benchmem
func BenchmarkStatusReportQoS1(b *testing.B) {
	for _, be := range sqlstoretest.Backends() {
		b.Run(be.Name, func(b *testing.B) {
			const devices = 512
			ctx := context.Background()
			db := sqlstoretest.MustOpen(b, be, sqlstoretest.Options{})
			if _, _, err := db.CreateTenant(ctx, "acme"); err != nil {
				b.Fatal(err)
			}
			devs := make([]fleet.NewDevice, devices)
			for i := range devs {
				devs[i] = fleet.NewDevice{ID: fmt.Sprintf("dev-%d", i)}
			}
			toks, err := db.CreateDevices(ctx, "acme", devs)
			if err != nil {
				b.Fatal(err)
			}
			tokens := make([]string, devices)
			for i, t := range toks {
				tokens[i] = t.Token
			}
			actions := &fleetaction.Service{Store: db}
			actions.Open()
			defer actions.Close()
			a, err := actions.DispatchAction(ctx, "acme", &fleet.Dispatch{Action: "reboot", Params: json.RawMessage(`{}`), SearchType: fleet.SearchAll, Timeout: 3600})
			if err != nil {
				b.Fatal(err)
			}
			s := broker.NewServer(broker.Config{Addr: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler)},
				&mqtt.Devices{Registry: db, Actions: actions, Delivery: actions})
			if err := s.Open(); err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			publishLoad(b, s, "acme", "dev-", tokens, func(dev, n int) []byte {
				return fmt.Appendf(nil, `{"id":"%d","state":"Downloading","progress":%d,"timestamp":%d,"sequence":%d}`, a.ID, n%100, 1700000000000+n, n)
			})
		})
	}
}

// readRaw reads one packet the broker sent.
func readRaw(r *bufio.Reader) (rawPacket, error) {
	first, err := r.ReadByte()
	if err != nil {
		return rawPacket{}, err
	}
	n, size := 0, 0
	for shift := 0; ; shift += 7 {
		c, err := r.ReadByte()
		if err != nil {
			return rawPacket{}, err
		}
		n |= int(c&0x7f) << shift
		if size++; c&0x80 == 0 || size == 4 {
			break
		}
	}
	p := rawPacket{typ: first >> 4, flags: first & 0x0f, body: make([]byte, n)}
	_, err = io.ReadFull(r, p.body)
	return p, err
}

// processCPU is the CPU time the process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
