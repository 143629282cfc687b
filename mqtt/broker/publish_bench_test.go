//go:build unix

package broker_test

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetd/fleet/mqtt"
	"github.com/fleetd/fleet/mqtt/broker"
	"github.com/fleetd/fleet/mqtt/mqtttest"
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
	conns := make([]net.Conn, devices)
	for i := range conns {
		c, err := net.Dial("tcp", s.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		dev := fmt.Sprintf("bench-%d", i)
		if _, err := c.Write(connect311(0xC2, dev, "acme/"+dev, fmt.Sprintf("tok-%d", i))); err != nil {
			b.Fatal(err)
		}
		p, err := readRaw(bufio.NewReader(c))
		if err != nil || p.typ != typeConnack || p.body[1] != 0 {
			b.Fatalf("device %d: CONNACK %v, %v", i, p, err)
		}
		conns[i] = c
	}
	// Each publish takes a token; the devices stop when none is left.
	next := make(chan struct{}, b.N)
	for range b.N {
		next <- struct{}{}
	}
	close(next)
	var wg sync.WaitGroup
	errs := make(chan error, devices)
	b.ResetTimer()
	cpu0 := processCPU()
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := bufio.NewReader(c)
			topic := mqtt.ActionStatusTopic("acme", fmt.Sprintf("bench-%d", i))
			for n := 1; ; n++ {
				if _, ok := <-next; !ok {
					return
				}
				id := n%65535 + 1
				payload := fmt.Appendf(nil, `{"action_id":7,"state":"Downloading","progress":%d,"timestamp":%d,"sequence":%d}`, n%100, 1700000000000+n, n)
				if _, err := c.Write(publishPacket(1, id, nil, topic, payload)); err != nil {
					errs <- err
					return
				}
				p, err := readRaw(r)
				if err != nil || p.typ != typePuback {
					errs <- fmt.Errorf("PUBACK: %v, %v", p, err)
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
