package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pahov3 "github.com/eclipse/paho.mqtt.golang"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/mqtt"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestSoak runs fleetd (the built binary) under a steady mixed load for
// FLEETD_SOAK (such as 10m) and samples its resident memory (VmRSS) and
// goroutine count every 10 s; a leak shows as a slope. It runs by hand,
// never in CI:
//
//	FLEETD_SOAK=10m go test ./cmd/fleetd -run TestSoak -v -timeout 30m
//
// with FLEETD_TEST_POSTGRES set, on PostgreSQL as well. The figures go to
// docs/reliability.md.
func TestSoak(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv("FLEETD_SOAK"))
	if err != nil {
		t.Skip("a soak runs by hand: FLEETD_SOAK=10m")
	}
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		soak(t, b, d)
	})
}

func soak(t *testing.T, b sqlstoretest.Backend, d time.Duration) {
	s := newServer(t, b)
	p := startProcess(t, s, "--rate-limit", "-1", "--notify-backoff", "100ms", "--notify-max-backoff", "1s")
	admin := s.Admin()
	hook := newCountingHook(t)

	// A steady fleet: 100 devices over MQTT, each reporting and sending data;
	// alert rules that open and close; the rest through the API.
	const fleetSize = 100
	var toks []fleetdtest.Device
	for i := range fleetSize {
		toks = append(toks, s.MustDevice(t, admin, fmt.Sprintf("soak-%d", i), map[string]string{"site": fmt.Sprint(i % 5)}))
	}
	rule := s.MustAlertRule(t, admin, map[string]any{"name": "hot", "stream": "env", "deactivation_threshold_seconds": 1,
		"condition": map[string]any{"field": "temp", "operator": ">", "value": 80}})
	s.Do(t, admin, "POST", "/api/v1/alert-rules/"+rule.ID+"/alert-notification-rules", map[string]any{
		"channel_parameters": map[string]any{"type": "webhook", "url": hook.URL}}).Want(t, 201)
	s.MustAlertRule(t, admin, map[string]any{"name": "quiet", "stream": "env", "condition": map[string]any{"no_data_seconds": 5}})

	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var ops, errs atomic.Int64
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 30 * time.Second}
	call := func(method, path, body string) (int, []byte) {
		hr, _ := http.NewRequestWithContext(ctx, method, s.URL+path, strings.NewReader(body))
		if body != "" {
			hr.Header.Set("Content-Type", "application/json")
		}
		hr.Header.Set("X-Service-Tenant", "default")
		hr.Header.Set("X-Service-Api-Key", s.Key)
		resp, err := client.Do(hr)
		if err != nil {
			if ctx.Err() == nil {
				errs.Add(1)
			}
			return 0, nil
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		ops.Add(1)
		if resp.StatusCode >= 500 {
			errs.Add(1)
		}
		return resp.StatusCode, out
	}
	every := func(interval time.Duration, f func(i int)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
					f(i)
				}
			}
		}()
	}

	// MQTT: each device subscribes to its actions, completes them, and
	// sends a point every 500 ms; a tenth reconnect now and then.
	var lastAction atomic.Int64
	for i, tok := range toks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := 0; ctx.Err() == nil; round++ {
				soakDevice(ctx, s.MQTTAddr, tok, i, round, &ops, &errs)
			}
		}()
	}
	every(200*time.Millisecond, func(i int) { // dispatch to part of the fleet, with a timeout
		code, body := call("POST", "/api/v1/actions", fmt.Sprintf(`{"action": "soak", "params": {"n": %d}, "search_type": "metadata", "search_key": "site", "search_query": "%d", "timeout": 60}`, i, i%5))
		var out struct{ ID int64 }
		if code == 201 && json.Unmarshal(body, &out) == nil {
			lastAction.Store(out.ID)
		}
	})
	every(20*time.Millisecond, func(i int) { // S10 over HTTP
		if id := lastAction.Load(); id > 0 {
			call("POST", "/api/v1/devices/action/status", fmt.Sprintf(`{"device_id": "soak-%d", "action_id": %d, "state": "Progress", "progress": %d}`, (i%20)*5, id, i%100))
		}
	})
	every(50*time.Millisecond, func(i int) { // HTTP ingest
		call("POST", fmt.Sprintf("/api/v1/devices/soak-%d/streams/http", i%fleetSize), fmt.Sprintf(`[{"timestamp": %d, "v": %d}]`, time.Now().UnixMilli(), i))
	})
	every(100*time.Millisecond, func(i int) { // reads
		switch i % 6 {
		case 0:
			call("GET", fmt.Sprintf("/api/v1/devices/soak-%d/actions?sort_by=updated_at&limit=50", i%fleetSize), "")
		case 1:
			call("GET", "/api/v1/devices?search=soak-1&limit=100", "")
		case 2:
			call("GET", "/api/v1/alerts?state=active", "")
		case 3:
			call("GET", "/api/v1/actions?limit=20", "")
		case 4:
			call("GET", "/api/v1/audit-logs?limit=20", "")
		case 5:
			call("GET", "/metrics", "")
		}
	})
	every(time.Second, func(i int) { // provisioning churn
		id := fmt.Sprintf("churn-%d", i)
		call("POST", "/api/v1/devices", `{"id": "`+id+`"}`)
		call("PATCH", "/api/v1/devices/"+id, `{"metadata": {"k": "v"}}`)
		call("DELETE", "/api/v1/devices/"+id, "")
	})
	every(2*time.Second, func(i int) { // firmware: upload, read, download, delete
		archive := fleetdtest.MakeBundle(t, fmt.Sprintf("3.0.%d", i), fleetdtest.Part{Name: "app", Version: fmt.Sprintf("3.0.%d", i), Body: strings.Repeat("f", 4096)})
		body, ct := fleetdtest.MultipartBody(t, "b.tar.gz", archive)
		hr, _ := http.NewRequestWithContext(ctx, "POST", s.URL+"/api/v1/firmware-bundles", strings.NewReader(string(body)))
		hr.Header.Set("Content-Type", ct)
		hr.Header.Set("X-Service-Tenant", "default")
		hr.Header.Set("X-Service-Api-Key", s.Key)
		resp, err := client.Do(hr)
		if err != nil {
			return
		}
		var bd struct{ ID string }
		json.NewDecoder(resp.Body).Decode(&bd)
		resp.Body.Close()
		if bd.ID != "" {
			call("GET", "/api/v1/firmware-bundles/id/"+bd.ID+"/artifact", "")
			call("DELETE", "/api/v1/firmware-bundles/id/"+bd.ID, "")
		}
	})

	// Samples, every 10 s.
	type sample struct {
		at         time.Duration
		rss        float64 // MiB
		heap       float64 // MiB of Go heap in use: without SQLite's page caches (allocated outside the Go heap) and the runtime's slack
		goroutines float64
		ops        int64
	}
	var samples []sample
	start := time.Now()
	take := func() {
		rss := vmRSS(t, p.cmd.Process.Pid)
		heap := metric(t, s.URL, "go_memstats_heap_inuse_bytes") / (1 << 20)
		g := metric(t, s.URL, "go_goroutines")
		samples = append(samples, sample{time.Since(start), rss, heap, g, ops.Load()})
		t.Logf("%6.0fs  rss %6.1f MiB  heap %6.1f MiB  goroutines %5.0f  requests+messages %d", time.Since(start).Seconds(), rss, heap, g, ops.Load())
	}
	take()
	tick := time.NewTicker(10 * time.Second)
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-tick.C:
			take()
		}
	}
	tick.Stop()
	wg.Wait()
	take()

	// The first minute warms caches and pools; the slope is fitted after,
	// and before the last sample, taken once the load stopped.
	var xs, rss, heap, gs []float64
	for _, sm := range samples[:len(samples)-1] {
		if sm.at >= time.Minute || d < 3*time.Minute {
			xs = append(xs, sm.at.Minutes())
			rss = append(rss, sm.rss)
			heap = append(heap, sm.heap)
			gs = append(gs, sm.goroutines)
		}
	}
	rssSlope, heapSlope, gSlope := slope(xs, rss), slope(xs, heap), slope(xs, gs)
	// RSS also holds what fills up once and stays (SQLite's page caches,
	// outside the Go heap; the runtime's spans): judge it on the second half.
	half := len(xs) / 2
	lateRSS := slope(xs[half:], rss[half:])
	last := samples[len(samples)-1]
	summary := fmt.Sprintf("soak %s on %s: %d requests and messages (%.0f/s), %d errors; RSS %.1f → %.1f MiB (max %.1f), slope %+.2f MiB/min after the first minute, %+.2f over the second half; Go heap in use %.1f → %.1f MiB, slope %+.2f MiB/min; goroutines %.0f → %.0f (max %.0f), slope %+.2f/min",
		d, b.Name, last.ops, float64(last.ops)/last.at.Seconds(), errs.Load(),
		samples[0].rss, last.rss, maxOf(samples, func(s sample) float64 { return s.rss }), rssSlope, lateRSS,
		samples[0].heap, last.heap, heapSlope,
		samples[0].goroutines, last.goroutines, maxOf(samples, func(s sample) float64 { return s.goroutines }), gSlope)
	t.Log(summary)
	if out := os.Getenv("FLEETD_SOAK_OUT"); out != "" {
		f, err := os.OpenFile(out, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err == nil {
			fmt.Fprintln(f, summary)
			for _, sm := range samples {
				fmt.Fprintf(f, "  %s %4.0fs rss=%.1fMiB heap=%.1fMiB goroutines=%.0f ops=%d\n", b.Name, sm.at.Seconds(), sm.rss, sm.heap, sm.goroutines, sm.ops)
			}
			f.Close()
		}
	}
	// Flat: the Go heap, and RSS once warm, grow less than 1 MiB a minute
	// (a leak of 100 bytes per operation would show as 2), and goroutines
	// do not pile up.
	if heapSlope > 1 || lateRSS > 1 || gSlope > 1 {
		t.Errorf("not flat: %s", summary)
	}
	if errs.Load() > last.ops/1000 {
		t.Errorf("%d errors in %d operations", errs.Load(), last.ops)
	}
}

// soakDevice is one connection of a soak device: it takes its actions and
// completes them, sends a point every 500 ms, and after a while (for one
// device in ten) disconnects, so that connections churn.
func soakDevice(ctx context.Context, addr string, tok fleetdtest.Device, i, round int, ops, errs *atomic.Int64) {
	opts := pahov3.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(tok.ID).
		SetUsername("default/" + tok.ID).SetPassword(tok.Token).SetProtocolVersion(4).SetCleanSession(true).
		SetAutoReconnect(false).SetConnectTimeout(10 * time.Second).SetKeepAlive(30 * time.Second)
	c := pahov3.NewClient(opts)
	if t := c.Connect(); !t.WaitTimeout(10*time.Second) || t.Error() != nil {
		if ctx.Err() == nil {
			errs.Add(1)
		}
		time.Sleep(time.Second)
		return
	}
	defer c.Disconnect(0)
	status := mqtt.ActionStatusTopic("default", tok.ID)
	c.Subscribe(mqtt.ActionsTopic("default", tok.ID), 1, func(cl pahov3.Client, m pahov3.Message) {
		var a struct{ ID string }
		if json.Unmarshal(m.Payload(), &a) == nil {
			go cl.Publish(status, 1, false, fmt.Sprintf(`{"id": %q, "state": "Completed", "progress": 100}`, a.ID))
			ops.Add(1)
		}
	}).WaitTimeout(10 * time.Second)
	life := time.Duration(1<<62 - 1)
	if i%10 == round%10 {
		life = 20 * time.Second
	}
	end := time.After(life)
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for k := 0; ; k++ {
		select {
		case <-ctx.Done():
			return
		case <-end:
			return
		case <-tick.C:
			temp := 70
			if (k/20)%2 == 1 && i%7 == 0 {
				temp = 90 // some devices run hot for 10 s, then cool: alerts open and close
			}
			t := c.Publish(mqtt.StreamTopic("default", tok.ID, "env"), 1, false,
				fmt.Sprintf(`[{"timestamp": %d, "sequence": %d, "temp": %d}]`, time.Now().UnixMilli(), k, temp))
			if !t.WaitTimeout(10*time.Second) || t.Error() != nil {
				if ctx.Err() == nil {
					errs.Add(1)
				}
				return
			}
			ops.Add(1)
		}
	}
}

// vmRSS reads a process's resident memory in MiB.
func vmRSS(t *testing.T, pid int) float64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// metric reads one unlabelled series from /metrics.
func metric(t *testing.T, base, name string) float64 {
	t.Helper()
	return fleetdtest.Metric(t, base, name)
}

// slope is the least-squares slope of ys over xs.
func slope(xs, ys []float64) float64 {
	n := float64(len(xs))
	if n < 2 {
		return 0
	}
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
		sxx += xs[i] * xs[i]
		sxy += xs[i] * ys[i]
	}
	den := n*sxx - sx*sx
	if den == 0 {
		return 0
	}
	return (n*sxy - sx*sy) / den
}

func maxOf[T any](xs []T, f func(T) float64) float64 {
	m := 0.0
	for _, x := range xs {
		m = max(m, f(x))
	}
	return m
}

// countingHook is a webhook receiver that answers 200.
type countingHook struct {
	URL string
	n   atomic.Int64
}

func newCountingHook(t *testing.T) *countingHook {
	h := &countingHook{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		h.n.Add(1)
	}))
	t.Cleanup(srv.Close)
	h.URL = srv.URL
	return h
}
