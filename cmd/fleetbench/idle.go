package main

import (
	"context"
	"fmt"
	"time"
)

// idle measures what an idle MQTT connection costs fleetd's resident memory
// as an operator's ps shows it: nothing forced, no collection asked for.
// Devices connect (subscribed to their actions, as delivery's do) in two
// batches of the same size, and VmRSS is read once each batch has parked
// (mqtt/broker/park.go) and stayed idle a while. The figure is the second
// batch's: what one more idle device costs a fleetd that already has
// devices connected. The first batch's also pays what is paid once, not
// per device (SQLite's page caches filled by the first reads of the
// devices table, the runtime's first spans of each size), and is in the
// note. Mosquitto, measured the same way with the same clients, is the
// baseline.
func (r *runner) idle(ctx context.Context) error {
	n, wait := r.sz.idleConns, r.sz.idleFor
	if r.connected != nil { // delivery's devices, kept for memory: their descriptors are needed now
		r.connected.close()
		r.connected = nil
	}
	devIDs := ids("idle-"+r.runID, 2*n)
	toks, err := r.admin.provision(ctx, devIDs, nil, r.p, "idle: provisioned devices")
	if err != nil {
		return err
	}
	unmeasured, err := r.idleBaseline(ctx, toks)
	if err != nil {
		return err
	}
	parked := func(ctx context.Context) (float64, error) {
		const name = "fleetd_mqtt_parked_connections"
		m, err := scrape(ctx, r.t.url, []string{name})
		return m[name], err
	}
	// Beside VmRSS, the Go runtime's own figures say where it went: the
	// heap's spans in use (live objects and the free slots between them),
	// free spans not yet returned to the system, goroutine stacks, and what
	// the runtime holds for itself; the rest of the process is memory Go
	// does not manage, SQLite's page caches most.
	runtimeFigures := []string{"go_memstats_heap_inuse_bytes", "go_memstats_heap_idle_bytes", "go_memstats_heap_released_bytes", "go_memstats_stack_inuse_bytes",
		"go_memstats_sys_bytes", "go_memstats_heap_sys_bytes", "go_memstats_stack_sys_bytes"}
	grown, _, err := idleBatchesOf(ctx, r.p, "fleetd", r.t.mqttAddr, r.t.tenant, toks, n, wait, func(ctx context.Context) ([]float64, error) {
		rss, _, _, err := r.residentMemory(ctx)
		if err != nil {
			return nil, err
		}
		m, err := scrape(ctx, r.t.url, runtimeFigures)
		if err != nil {
			return nil, err
		}
		out := []float64{rss}
		for _, name := range runtimeFigures {
			out = append(out, m[name]/(1<<20))
		}
		return out, nil
	}, parked)
	if err != nil {
		return err
	}
	r.snapshot("idle")
	where := func(g []float64) string {
		heap, free, stacks, runtime := g[1], g[2]-g[3], g[4], g[5]-g[6]-g[7]
		return fmt.Sprintf("heap spans in use %.2f KB, free heap not yet returned %.2f KB, stacks %.2f KB, the runtime's own %.2f KB, the rest (SQLite's page caches most) %.2f KB",
			heap, free, stacks, runtime, g[0]-heap-free-stacks-runtime)
	}
	f := r.rep.add(&figure{Scenario: "idle", Name: fmt.Sprintf("resident memory per idle MQTT connection (%s more beside %s, idle %s, nothing forced)", thousands(float64(n)), thousands(float64(n)), wait),
		Value: grown[1][0], Unit: kilobytes,
		Note: fmt.Sprintf("VmRSS grown ÷ connections once all parked and idle %s, each device pinging every %d s: %s; the first %s, a warm-up, %.2f KB each (with what is paid once, less the provisioning's garbage given back)",
			wait, idleKeepalive, where(grown[1]), thousands(float64(n)), grown[0][0])})
	judge(r.rep.compare(f, "mosquitto-idle"), r.t.dialect, goalIdleConn, "")
	if unmeasured != "" {
		f.Note = joinNotes(f.Note, "Mosquitto: "+unmeasured)
	}
	return nil
}

// idleBaseline measures Mosquitto's resident memory per idle connection
// as idle measures fleetd's, with the same clients.
func (r *runner) idleBaseline(ctx context.Context, toks []deviceToken) (unmeasured string, err error) {
	return r.withMosquitto(ctx, func(m *mosquitto) error {
		// Mosquitto allocates as it goes and collects nothing: a few
		// seconds settle it.
		first, second, err := idleBatches(ctx, r.p, "Mosquitto", m.addr, r.t.tenant, toks, len(toks)/2, 2*time.Second, func(context.Context) (float64, error) {
			rss, _, err := vmRSS(m.pid)
			return rss, err
		}, nil)
		if err != nil {
			return err
		}
		r.rep.addBaseline("mosquitto-idle", "Mosquitto", &figure{Name: fmt.Sprintf("Mosquitto %s, the same clients, resident memory per idle connection", m.version),
			Value: second, Unit: kilobytes, Note: fmt.Sprintf("the first %s, a warm-up, %.2f KB each", thousands(float64(len(toks)/2)), first)})
		return nil
	})
}

// idleBatches connects toks[:n] and then toks[n:2n] to the broker at addr,
// reads its resident memory (rss, in MB) before the first and once each
// batch has settled (every connection parked, by parked, if given; then
// wait), and returns each batch's growth per connection in KB. The
// connections are closed on return.
func idleBatches(ctx context.Context, p *progress, name, addr, tenant string, toks []deviceToken, n int, wait time.Duration,
	rss func(context.Context) (float64, error), parked func(context.Context) (float64, error)) (first, second float64, err error) {
	grown, _, err := idleBatchesOf(ctx, p, name, addr, tenant, toks, n, wait, func(ctx context.Context) ([]float64, error) {
		v, err := rss(ctx)
		return []float64{v}, err
	}, parked)
	return grown[0][0], grown[1][0], err
}

// idleBatchesOf is idleBatches for several figures read at once, each in
// MB (the first is the resident memory): it returns each batch's growth of
// each figure per connection, in KB.
func idleBatchesOf(ctx context.Context, p *progress, name, addr, tenant string, toks []deviceToken, n int, wait time.Duration,
	read func(context.Context) ([]float64, error), parked func(context.Context) (float64, error)) (grown [2][]float64, last []float64, err error) {
	var start float64
	if parked != nil {
		if start, err = parked(ctx); err != nil {
			return grown, nil, err
		}
	}
	if last, err = read(ctx); err != nil {
		return grown, nil, err
	}
	for b := range 2 {
		fc, err := connectDevicesPinging(ctx, addr, tenant, toks[b*n:(b+1)*n], subscribeActions, idleKeepalive, p, fmt.Sprintf("idle: devices connected to %s, batch %d", name, b+1))
		if err != nil {
			return grown, nil, err
		}
		defer fc.close()
		if parked != nil {
			want := start + float64((b+1)*n)
			if err := waitFor(ctx, time.Minute, func() (bool, error) {
				got, err := parked(ctx)
				return got >= want, err
			}); err != nil {
				return grown, nil, fmt.Errorf("%s: waiting for %d connections to park: %w", name, (b+1)*n, err)
			}
		}
		p.say("idle: %s, batch %d connected; idle %s", name, b+1, wait)
		select {
		case <-time.After(wait): // what an idle while leaves is the measure, not a condition
		case <-ctx.Done():
			return grown, nil, ctx.Err()
		}
		now, err := read(ctx)
		if err != nil {
			return grown, nil, err
		}
		grown[b] = make([]float64, len(now))
		for i := range now {
			grown[b][i] = (now[i] - last[i]) * 1024 / float64(n)
		}
		last = now
	}
	return grown, last, nil
}

// idleKeepalive is the idle devices' keepalive, in seconds: each pings
// twice a minute, as an idle device does, so the figure is of a fleet that
// is idle, not of sockets that are silent.
const idleKeepalive = 30

// waitFor polls ok every 100 ms until it holds, for at most limit.
func waitFor(ctx context.Context, limit time.Duration, ok func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		done, err := ok()
		if err != nil || done {
			return err
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
