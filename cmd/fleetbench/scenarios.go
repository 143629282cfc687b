package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetd/fleet/mqtt"
)

// deviceKeyOnce returns a device-role key (the role gateways use for S10),
// made on first use.
func (r *runner) deviceKeyOnce(ctx context.Context) (string, error) {
	if r.deviceKey == "" {
		k, err := r.admin.createKey(ctx, "fleetbench-device-"+r.runID, "device", "")
		if err != nil {
			return "", err
		}
		r.deviceKey = k
	}
	return r.deviceKey, nil
}

// longTimeout keeps benchmark actions from timing out midway.
const longTimeout = 31_536_000

// reportSeq hands out rising report sequences per device action. Each
// device action belongs to one worker, which sends its reports one after
// another, so every report is newer than the last one applied: none is
// ignored as a duplicate.
type reportSeq struct {
	base int64   // epoch ms: timestamp = base + sequence
	last []int64 // per device action, the last sequence sent
}

func newReportSeq(n int) *reportSeq {
	return &reportSeq{base: time.Now().UnixMilli(), last: make([]int64, n)}
}

func (s *reportSeq) next(item int) int64 {
	s.last[item]++
	return s.last[item]
}

// progressOf is the progress of report seq. Reports say "Downloading" with a
// progress that rises and wraps, as a device's do; what the store shows
// afterwards tells whether the last one was applied.
func progressOf(seq int64) int64 { return seq % 101 }

// verifyLast reads every device action of an action and counts those whose
// progress is that of the last report sent to them: as each report is
// newer than the one before, the last one applied means all were.
func (r *runner) verifyLast(ctx context.Context, actionID int64, devIDs []string, seq *reportSeq) (ok, sent int, err error) {
	want := map[string]int64{}
	for i, id := range devIDs {
		if seq.last[i] > 0 {
			want[id] = progressOf(seq.last[i])
		}
	}
	for page := 1; ; page++ {
		var resp struct {
			DeviceActions []struct {
				DeviceID string `json:"device_id"`
				Progress int64  `json:"progress"`
			} `json:"device_actions"`
		}
		if err := r.admin.call(ctx, "GET", fmt.Sprintf("/api/v1/actions/%d/devices?limit=1000&page=%d", actionID, page), nil, http.StatusOK, &resp); err != nil {
			return 0, 0, err
		}
		for _, da := range resp.DeviceActions {
			if w, found := want[da.DeviceID]; found && da.Progress == w {
				ok++
			}
		}
		if len(resp.DeviceActions) < 1000 {
			break
		}
	}
	return ok, len(want), nil
}

func errorNote(res result) string {
	if res.errors == 0 {
		return ""
	}
	return fmt.Sprintf("%d failed requests; the first: %s", res.errors, res.firstErr)
}

func joinNotes(notes ...string) string {
	var out []string
	for _, n := range notes {
		if n != "" {
			out = append(out, n)
		}
	}
	return strings.Join(out, "; ")
}

// gatewayHeaders returns the headers of conns gateways, each with a device
// key of its own: fleetd limits each key's device data (20,000 requests/s
// by default). Scenarios share them.
func (r *runner) gatewayHeaders(ctx context.Context, conns int) ([]http.Header, error) {
	if len(r.gateways) == conns {
		return r.gateways, nil
	}
	headers := make([]http.Header, conns)
	for w := range headers {
		key, err := r.admin.createKey(ctx, fmt.Sprintf("fleetbench-gw%d-%s", w, r.runID), "device", "")
		if err != nil {
			return nil, err
		}
		headers[w] = http.Header{"Content-Type": {"application/json"}, "X-Service-Tenant": {r.t.tenant}, "X-Service-Api-Key": {key}}
	}
	r.gateways = headers
	return headers, nil
}

// hello measures the hello-world baseline once, under the load S10's
// connections make with body.
func (r *runner) hello(ctx context.Context, headers []http.Header, body func(w, i int) []byte) error {
	if r.rep.baselines["hello"] != nil {
		return nil
	}
	conns := len(headers)
	h, err := startHello(ctx)
	if err != nil {
		return err
	}
	r.p.say("hello-world baseline, %d connections, %s", conns, r.o.duration)
	helloCPU := startCPU(h.pid)
	res := (&httpLoad{url: h.url, headers: headers, conns: conns, want: http.StatusNoContent,
		body: body, warmup: r.sz.warmup, duration: r.o.duration}).run(ctx)
	note := strings.Replace(helloCPU.String(), "fleetd", "hello", 1)
	h.stop()
	if res.errors > 0 {
		return fmt.Errorf("hello-world baseline: %s", errorNote(res))
	}
	r.rep.addBaseline("hello", "hello", &figure{Name: fmt.Sprintf("hello-world Go handler, %d connections", conns), Value: res.rate, Unit: perSecond, Note: note})
	r.rep.addBaseline("hello-p50", "hello p50", &figure{Name: "its p50", Value: ms(res.p50), Unit: millis})
	r.rep.addBaseline("hello-p99", "hello p99", &figure{Name: "its p99", Value: ms(res.p99), Unit: millis,
		Note: fmt.Sprintf("max %.2f ms", ms(res.max))})
	return nil
}

// s10Fleet is S10's load on devices of its own: an action dispatched to
// them, each device action owned by one connection (worker w owns device
// actions w, w+conns, w+2·conns, …), its reports' sequences rising.
type s10Fleet struct {
	devIDs  []string
	act     dispatched
	headers []http.Header
	conns   int
}

// newS10Fleet provisions n devices named from prefix and dispatches an
// action to them.
func (r *runner) newS10Fleet(ctx context.Context, prefix, what string, n int) (*s10Fleet, error) {
	conns := r.o.conns
	if conns > n {
		return nil, fmt.Errorf("--connections %d is more than the %d device actions", conns, n)
	}
	devIDs := ids(prefix+r.runID, n)
	if _, err := r.admin.provision(ctx, devIDs, nil, r.p, what); err != nil {
		return nil, err
	}
	headers, err := r.gatewayHeaders(ctx, conns)
	if err != nil {
		return nil, err
	}
	act, err := r.admin.dispatch(ctx, map[string]any{"action": "s10-bench", "params": map[string]any{}, "search_type": "default",
		"device_ids": devIDs, "timeout": longTimeout})
	if err != nil {
		return nil, err
	}
	return &s10Fleet{devIDs: devIDs, act: act, headers: headers, conns: conns}, nil
}

// body returns worker w's i-th report, its sequence from seq.
func (f *s10Fleet) body(seq *reportSeq) func(w, i int) []byte {
	n := len(f.devIDs)
	owned := func(w int) int { return (n - w + f.conns - 1) / f.conns }
	return func(w, i int) []byte {
		item := w + (i%owned(w))*f.conns
		s := seq.next(item)
		return fmt.Appendf(nil, `{"device_id":%q,"action_id":%d,"state":"Downloading","progress":%d,"timestamp":%d,"sequence":%d}`,
			f.devIDs[item], f.act.ID, progressOf(s), seq.base+s, s)
	}
}

// load is S10's load on the fleet for a window.
func (r *runner) s10Load(ctx context.Context, f *s10Fleet, seq *reportSeq, warmup, duration time.Duration) result {
	return (&httpLoad{url: r.t.url + "/api/v1/devices/action/status", headers: f.headers, conns: f.conns, want: http.StatusNoContent,
		body: f.body(seq), warmup: warmup, duration: duration}).run(ctx)
}

// s10 measures S10 over HTTP and, in the same way, the hello-world handler.
func (r *runner) s10(ctx context.Context) error {
	n, conns := r.sz.s10Devices, r.o.conns
	f, err := r.newS10Fleet(ctx, "s10-", "s10: provisioned devices", n)
	if err != nil {
		return err
	}
	devIDs, act := f.devIDs, f.act
	seq := newReportSeq(n)
	if err := r.hello(ctx, f.headers, f.body(newReportSeq(n))); err != nil {
		return err
	}
	if err := r.updateBaseline(ctx); err != nil {
		return err
	}

	r.p.say("s10: %d connections, %s, on %d device actions", conns, r.o.duration, n)
	wait := r.profile("s10", r.sz.warmup+r.o.duration)
	cpu, commits := startCPU(r.t.pid), startCommits(ctx, r.t.url)
	res := r.s10Load(ctx, f, seq, r.sz.warmup, r.o.duration)
	wait()
	ok, sent, err := r.verifyLast(ctx, act.ID, devIDs, seq)
	if err != nil {
		return err
	}
	applied := fmt.Sprintf("%d of %d device actions show the last report sent", ok, sent)
	judge(r.rep.compare(r.rep.add(&figure{Scenario: "s10", Name: fmt.Sprintf("S10 throughput ÷ hello-world, %d connections", conns), Value: res.rate, Unit: perSecond,
		Note: joinNotes(applied, cpu.String(), commits.Note(ctx), errorNote(res))}), "hello"), r.t.dialect, goalS10Rate, "")
	r.rep.compare(r.rep.add(&figure{Scenario: "s10", Name: "S10 p50", Value: ms(res.p50), Unit: millis}), "hello-p50")
	judge(r.rep.compare(r.rep.add(&figure{Scenario: "s10", Name: "S10 p99 ÷ hello-world p99, fleetbench's load", Value: ms(res.p99), Unit: millis,
		Note: fmt.Sprintf("max %.2f ms", ms(res.max))}), "hello-p99"), r.t.dialect, goalS10P99, "")
	if res.errors > 0 || ok != sent {
		return fmt.Errorf("S10: %s", joinNotes(applied, errorNote(res)))
	}
	return nil
}

// s10Random measures S10's tail as wrk finds it: the 64 connections report
// for devices drawn at random from an action dispatched to 100,000, so
// each commit touches pages all over device_actions and its indexes, and
// the WAL holds many distinct pages when it is checkpointed.
func (r *runner) s10Random(ctx context.Context) error {
	n, conns := r.sz.randomDevices, r.o.conns
	devIDs := ids("rnd-"+r.runID, n)
	if _, err := r.admin.provision(ctx, devIDs, nil, r.p, "s10-random: provisioned devices"); err != nil {
		return err
	}
	headers, err := r.gatewayHeaders(ctx, conns)
	if err != nil {
		return err
	}
	act, err := r.admin.dispatch(ctx, map[string]any{"action": "s10-random", "params": map[string]any{}, "search_type": "default",
		"device_ids": devIDs, "timeout": longTimeout})
	if err != nil {
		return err
	}
	// One rising sequence for all: two reports for one device may cross
	// on two connections, and the older is then acknowledged and ignored,
	// as the API says; nearly all are applied.
	base, next := time.Now().UnixMilli(), atomic.Int64{}
	body := func(w, i int) []byte {
		s := next.Add(1)
		d := devIDs[rand.IntN(n)]
		return fmt.Appendf(nil, `{"device_id":%q,"action_id":%d,"state":"Downloading","progress":%d,"timestamp":%d,"sequence":%d}`,
			d, act.ID, progressOf(s), base+s, s)
	}
	if err := r.hello(ctx, headers, body); err != nil {
		return err
	}
	r.p.say("s10-random: %d connections, %s, on random devices of %d", conns, r.o.duration, n)
	wait := r.profile("s10-random", r.sz.warmup+r.o.duration)
	cpu, commits := startCPU(r.t.pid), startCommits(ctx, r.t.url)
	res := (&httpLoad{url: r.t.url + "/api/v1/devices/action/status", headers: headers, conns: conns, want: http.StatusNoContent,
		body: body, warmup: r.sz.warmup, duration: r.o.duration}).run(ctx)
	wait()
	of := fmt.Sprintf("random devices of a %s-device action", thousands(float64(n)))
	r.rep.compare(r.rep.add(&figure{Scenario: "s10-random", Name: fmt.Sprintf("S10 throughput, %s, %d connections", of, conns), Value: res.rate, Unit: perSecond,
		Note: joinNotes(cpu.String(), commits.Note(ctx), errorNote(res))}), "hello")
	judge(r.rep.compare(r.rep.add(&figure{Scenario: "s10-random", Name: "S10 p99 ÷ hello-world p99, " + of, Value: ms(res.p99), Unit: millis,
		Note: fmt.Sprintf("p50 %.2f ms, max %.2f ms, %d of %d requests over 50 ms", ms(res.p50), ms(res.max), res.over50, res.ops)}), "hello-p99"),
		r.t.dialect, goalRandomP99, "")
	if res.errors > 0 {
		return fmt.Errorf("S10 random: %s", errorNote(res))
	}
	return nil
}

// updateBaseline measures the raw update rate once.
func (r *runner) updateBaseline(ctx context.Context) error {
	if r.store == nil || r.rep.baselines["update"] != nil {
		return nil
	}
	d := min(r.o.duration, 5*time.Second)
	r.p.say("baseline: %s UPDATE by primary key, batches of %d, %s", dialectName(r.store.dialect), baselineBatch, d)
	rate, err := r.store.updateRate(ctx, d)
	if err != nil {
		return err
	}
	r.rep.addBaseline("update", "UPDATE", &figure{Name: fmt.Sprintf("%s UPDATE by primary key, %d per commit, %d writer(s)", dialectName(r.store.dialect), baselineBatch, r.store.writers),
		Value: rate, Unit: perSecond})
	return nil
}

// publishLoad has every device publish, one message at a time, each
// waiting for its PUBACK, until the window ends.
func (r *runner) publishLoad(ctx context.Context, fc *fleetConn, topic func(d *simDevice) string, payload func(i int) []byte) result {
	return r.publishFor(ctx, fc, topic, payload, r.sz.warmup, r.o.duration)
}

// publishFor is publishLoad over a window of its own.
func (r *runner) publishFor(ctx context.Context, fc *fleetConn, topic func(d *simDevice) string, payload func(i int) []byte, warmup, duration time.Duration) result {
	w := newWindow(warmup, duration)
	var wg sync.WaitGroup
	for i, d := range fc.devices {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec := w.recorder()
			defer rec.flush()
			t := topic(d)
			for !w.over() && ctx.Err() == nil {
				p := payload(i)
				t0 := time.Now()
				if err := d.publish(ctx, t, p); err != nil {
					rec.fail(err)
					return
				}
				rec.done(t0)
			}
		}()
	}
	wg.Wait()
	return w.result()
}

// statusReports returns the payload of each device's next status report on
// action actionID, its sequence rising per device (seq).
func statusReports(actionID int64, seq *reportSeq) func(i int) []byte {
	return func(i int) []byte {
		s := seq.next(i)
		return fmt.Appendf(nil, `{"id":"%d","state":"Downloading","progress":%d,"timestamp":%d,"sequence":%d}`, actionID, progressOf(s), seq.base+s, s)
	}
}

func statusTopic(d *simDevice) string { return mqtt.ActionStatusTopic(d.tenant, d.id) }

// mqttStatus measures status reports over MQTT, after its baseline: the
// same clients under the same load publishing to Mosquitto.
func (r *runner) mqttStatus(ctx context.Context) error {
	n := r.sz.mqttDevices
	devIDs, toks, act, err := r.mqttFleet(ctx, "ms-", "mqtt-status: provisioned devices")
	if err != nil {
		return err
	}
	unmeasured, err := r.mosquittoBaseline(ctx, toks, act.ID)
	if err != nil {
		return err
	}
	fc, err := connectDevices(ctx, r.t.mqttAddr, r.t.tenant, toks, nil, r.p, "mqtt-status: connected devices")
	if err != nil {
		return err
	}
	defer fc.close()
	seq := newReportSeq(n)
	r.p.say("mqtt-status: %d devices publishing, %s", n, r.o.duration)
	wait := r.profile("mqtt-status", r.sz.warmup+r.o.duration)
	cpu, commits := startCPU(r.t.pid), startCommits(ctx, r.t.url)
	res := r.publishLoad(ctx, fc, statusTopic, statusReports(act.ID, seq))
	wait()
	ok, sent, err := r.verifyLast(ctx, act.ID, devIDs, seq)
	if err != nil {
		return err
	}
	applied := fmt.Sprintf("%d of %d device actions show the last report sent", ok, sent)
	f := r.rep.add(&figure{Scenario: "mqtt-status", Name: fmt.Sprintf("MQTT status reports ÷ Mosquitto 2, %d devices, QoS 1, one per publish", n),
		Value: res.rate, Unit: perSecond,
		Note: joinNotes("fleetd commits each report before its PUBACK; Mosquitto (no persistence) acknowledges on receipt",
			applied, fmt.Sprintf("PUBACK p50 %.2f ms, p99 %.2f ms", ms(res.p50), ms(res.p99)), cpu.String(), commits.Note(ctx), errorNote(res))})
	judge(r.rep.compare(f, "mosquitto"), r.t.dialect, goalMQTT, unmeasured)
	if res.errors > 0 || ok != sent {
		return fmt.Errorf("MQTT status: %s", f.Note)
	}
	return nil
}

// mqttFleet provisions the MQTT scenarios' devices, named from prefix,
// and dispatches an action to them for their status reports.
func (r *runner) mqttFleet(ctx context.Context, prefix, what string) ([]string, []deviceToken, dispatched, error) {
	devIDs := ids(prefix+r.runID, r.sz.mqttDevices)
	toks, err := r.admin.provision(ctx, devIDs, nil, r.p, what)
	if err != nil {
		return nil, nil, dispatched{}, err
	}
	act, err := r.admin.dispatch(ctx, map[string]any{"action": "mqtt-bench", "params": map[string]any{}, "search_type": "default",
		"device_ids": devIDs, "timeout": longTimeout})
	return devIDs, toks, act, err
}

// mosquittoBaseline measures, once, the devices of toks publishing status
// reports to Mosquitto as mqttStatus has them publish to fleetd: the same
// paho clients, topics, payloads and window. Without mosquitto installed
// it says why it measured nothing (outside CI, which installs it).
func (r *runner) mosquittoBaseline(ctx context.Context, toks []deviceToken, actionID int64) (unmeasured string, err error) {
	if r.rep.baselines["mosquitto"] != nil {
		return "", nil
	}
	return r.withMosquitto(ctx, func(m *mosquitto) error {
		fc, err := connectDevices(ctx, m.addr, r.t.tenant, toks, nil, r.p, "baseline: devices connected to Mosquitto")
		if err != nil {
			return err
		}
		defer fc.close() // before mosquitto stops
		r.p.say("baseline: %d devices publishing to Mosquitto %s, %s", len(toks), m.version, r.o.duration)
		cpu := startCPU(m.pid)
		res := r.publishLoad(ctx, fc, statusTopic, statusReports(actionID, newReportSeq(len(toks))))
		note := strings.Replace(cpu.String(), "fleetd", "mosquitto", 1)
		if res.errors > 0 {
			return fmt.Errorf("the Mosquitto baseline: %s; its log:\n%s", errorNote(res), tail(m.log, 10))
		}
		r.rep.addBaseline("mosquitto", "Mosquitto", &figure{Name: fmt.Sprintf("Mosquitto %s, the same %d clients, QoS 1, no persistence", m.version, len(toks)),
			Value: res.rate, Unit: perSecond, Note: joinNotes(fmt.Sprintf("PUBACK p50 %.2f ms, p99 %.2f ms", ms(res.p50), ms(res.p99)), note)})
		return nil
	})
}

// withMosquitto runs a Mosquitto for f and stops it after. Without
// mosquitto installed it says why f did not run (outside CI, which
// installs it).
func (r *runner) withMosquitto(ctx context.Context, f func(m *mosquitto) error) (unmeasured string, err error) {
	m, err := startMosquitto(ctx, r.dir)
	if errors.Is(err, errNoMosquitto) && os.Getenv("CI") != "true" {
		r.p.say("baseline: %v", err)
		return err.Error(), nil
	}
	if err != nil {
		return "", err
	}
	defer m.stop()
	return "", f(m)
}

// streamRules are the alert rules the stream scenario evaluates: a
// threshold, a compound condition with an activation threshold, and a
// no-data watch.
var streamRules = []map[string]any{
	{"condition": map[string]any{"field": "temp", "operator": ">", "value": 80}},
	{"condition": map[string]any{"all": []any{
		map[string]any{"field": "humidity", "operator": ">=", "value": 90},
		map[string]any{"not": map[string]any{"field": "temp", "operator": "<", "value": 30}},
	}}, "activation_threshold_seconds": 60, "deactivation_threshold_seconds": 30},
	{"condition": map[string]any{"no_data_seconds": 300}},
}

// pointBatch is n points from the k-th on, as a device writes them; the
// temperature crosses the threshold once in 500 points, so alerts open
// and close now and then.
func pointBatch(base int64, k, n int) []byte {
	b := make([]byte, 0, n*90)
	b = append(b, '[')
	for i := k; i < k+n; i++ {
		if i > k {
			b = append(b, ',')
		}
		b = fmt.Appendf(b, `{"timestamp":%d,"sequence":%d,"temp":%d,"humidity":%d,"status":"ok"}`,
			base+int64(i), i, 70+i%500/40, 85+i%1000/100)
	}
	return append(b, ']')
}

// streams measures stream points over MQTT through alert evaluation, kept
// in history, beside the same ingest latest-only: points older than the
// retention, which fleetd evaluates and keeps as the stream's latest but
// not in history (docs/telemetry.md), on a stream of their own with the
// same rules, by the same devices, just before.
func (r *runner) streams(ctx context.Context) error {
	n, per := r.sz.streamDevices, r.sz.pointsPerBatch
	devIDs := ids("st-"+r.runID, n)
	toks, err := r.admin.provision(ctx, devIDs, nil, r.p, "streams: provisioned devices")
	if err != nil {
		return err
	}
	stream, old := "env"+r.runID, "old"+r.runID
	for _, st := range []string{old, stream} {
		for i, rule := range streamRules {
			body := map[string]any{"name": fmt.Sprintf("fleetbench-%s-%s-%d", st, r.runID, i), "stream": st}
			for k, v := range rule {
				body[k] = v
			}
			if err := r.admin.call(ctx, "POST", "/api/v1/alert-rules", body, http.StatusCreated, nil); err != nil {
				return err
			}
		}
	}
	fc, err := connectDevices(ctx, r.t.mqttAddr, r.t.tenant, toks, nil, r.p, "streams: connected devices")
	if err != nil {
		return err
	}
	defer fc.close()
	name := fmt.Sprintf("MQTT stream points, %d alert rules, %d devices, %d per publish", len(streamRules), n, per)

	r.p.say("streams, latest-only: %d devices publishing batches of %d points 40 days old, %d rules, %s", n, per, len(streamRules), r.o.duration)
	base := time.Now().Add(-40 * 24 * time.Hour).UnixMilli()
	sent := make([]int, n)
	cpu, commits := startCPU(r.t.pid), startCommits(ctx, r.t.url)
	res := r.publishLoad(ctx, fc, func(d *simDevice) string { return mqtt.StreamTopic(d.tenant, d.id, old) }, func(i int) []byte {
		sent[i]++
		return pointBatch(base, (sent[i]-1)*per, per)
	})
	r.rep.addBaseline("latest-only", "latest-only", &figure{Name: name + ", latest-only (older than the retention: not kept in history)",
		Value: res.rate * float64(per), Unit: perSecond,
		Note: joinNotes(fmt.Sprintf("PUBACK p50 %.2f ms, p99 %.2f ms", ms(res.p50), ms(res.p99)), cpu.String(), commits.Note(ctx), errorNote(res))})

	base = time.Now().UnixMilli()
	sent = make([]int, n) // batches each device published
	r.p.say("streams: %d devices publishing batches of %d points, %d rules, %s", n, per, len(streamRules), r.o.duration)
	wait := r.profile("streams", r.sz.warmup+r.o.duration)
	cpu, commits = startCPU(r.t.pid), startCommits(ctx, r.t.url)
	res = r.publishLoad(ctx, fc, func(d *simDevice) string { return mqtt.StreamTopic(d.tenant, d.id, stream) }, func(i int) []byte {
		sent[i]++
		return pointBatch(base, (sent[i]-1)*per, per)
	})
	wait()
	// The latest point of each device is its last batch's last point.
	latest := 0
	for i, id := range devIDs {
		if i >= 20 {
			break
		}
		var p struct {
			Sequence int `json:"sequence"`
		}
		if err := r.admin.call(ctx, "GET", "/api/v1/devices/"+id+"/streams/"+stream+"/latest", nil, http.StatusOK, &p); err != nil {
			return err
		}
		if p.Sequence == sent[i]*per-1 {
			latest++
		}
	}
	f := r.rep.compare(r.rep.add(&figure{Scenario: "streams", Name: name + ", kept in history",
		Value: res.rate * float64(per), Unit: perSecond,
		Note: joinNotes(fmt.Sprintf("%s publishes/s, PUBACK p50 %.2f ms, p99 %.2f ms; %d of %d devices checked show their last point as latest",
			thousands(res.rate), ms(res.p50), ms(res.p99), latest, min(n, 20)), cpu.String(), commits.Note(ctx), errorNote(res))}), "latest-only")
	judge(f, r.t.dialect, goalHistoryIngest, "")
	if res.errors > 0 || latest != min(n, 20) {
		return fmt.Errorf("streams: %s", f.Note)
	}
	return nil
}

// dispatch measures dispatches to each size of fleet.
func (r *runner) dispatch(ctx context.Context) error {
	for i := range r.sz.dispatch {
		if err := r.dispatchOne(ctx, i); err != nil {
			return err
		}
	}
	return nil
}

// dispatchOne provisions the i-th dispatch fleet and dispatches to all of
// it. fleetbench's own fleetd has an empty tenant for each size, so the
// dispatch is search_type all; a running fleetd's tenant has other devices,
// so there the fleet is chosen by metadata, which reads every device of
// the tenant and is slower.
func (r *runner) dispatchOne(ctx context.Context, i int) error {
	if r.dispatched[i] {
		return nil
	}
	n := r.sz.dispatch[i]
	a, body, meta := r.dispatchFleet(i)
	prefix := fmt.Sprintf("dp%d-%s", i, r.runID)
	if _, err := a.provision(ctx, ids(prefix, n), meta, r.p, fmt.Sprintf("dispatch: provisioned devices of the %s fleet", thousands(float64(n)))); err != nil {
		return err
	}
	baseline := ""
	if r.store != nil {
		r.p.say("baseline: %s INSERT … SELECT of %s rows", dialectName(r.store.dialect), thousands(float64(n)))
		metadata := []byte("{}")
		if meta != nil {
			metadata, _ = json.Marshal(meta)
		}
		d, cpu, err := r.store.insertTime(ctx, n, a.tenant, prefix, string(metadata))
		if err != nil {
			return err
		}
		baseline = fmt.Sprintf("insert-%d", n)
		note := ""
		if r.store.dialect != "postgres" {
			note = cpu.seconds() // PostgreSQL's work is the server's
		}
		r.rep.addBaseline(baseline, "INSERT "+short(n), &figure{Name: fmt.Sprintf("%s INSERT … SELECT of the fleet's %s device actions, primary key only", dialectName(r.store.dialect), thousands(float64(n))),
			Value: d.Seconds(), Unit: seconds, Note: note})
	}
	r.p.say("dispatch: to %s devices", thousands(float64(n)))
	wait := r.profile(fmt.Sprintf("dispatch-%d", n), 2*time.Second+time.Duration(n/50_000)*time.Second)
	cpu := startCPU(r.t.pid)
	t0 := time.Now()
	d, err := a.dispatch(ctx, body)
	elapsed := time.Since(t0)
	cpu.stop()
	wait()
	if err != nil {
		return err
	}
	if d.Targeted != n {
		return fmt.Errorf("dispatch targeted %d devices, want %d", d.Targeted, n)
	}
	r.dispatched[i] = true
	f := r.rep.add(&figure{Scenario: "dispatch", Name: fmt.Sprintf("dispatch to %s devices ÷ raw INSERT … SELECT, time to 201", thousands(float64(n))),
		Value: elapsed.Seconds(), Unit: seconds, Note: joinNotes(fmt.Sprintf("%s device actions/s", thousands(float64(n)/elapsed.Seconds())), cpu.seconds())})
	judge(r.rep.compare(f, baseline), r.t.dialect, goalDispatch[i], "no database to insert into (--url without --database)")
	return nil
}

// dispatchFleet is the API of the i-th dispatch fleet's tenant, the body
// of a dispatch to all of that fleet, and the metadata its devices are
// provisioned with.
func (r *runner) dispatchFleet(i int) (*api, map[string]any, map[string]string) {
	body := map[string]any{"action": "reboot", "params": map[string]any{"reason": "fleetbench"}, "search_type": "all"}
	if r.t.dispatchTenants != nil {
		name := dispatchTenantNames[i]
		return newAPI(r.t.url, name, r.t.dispatchTenants[name]), body, nil
	}
	group := fmt.Sprintf("%s-%d", r.runID, i)
	body["search_type"], body["search_key"], body["search_query"] = "metadata", "fleetbench", group
	return r.admin, body, map[string]string{"fleetbench": group}
}

// delivery measures how long connected devices wait for an action after
// its 201.
func (r *runner) delivery(ctx context.Context) error {
	n := r.sz.delivery
	devIDs := ids("dl-"+r.runID, n)
	toks, err := r.admin.provision(ctx, devIDs, nil, r.p, "delivery: provisioned devices")
	if err != nil {
		return err
	}
	fc, err := connectDevices(ctx, r.t.mqttAddr, r.t.tenant, toks, subscribeActions, r.p, "delivery: connected and subscribed devices")
	if err != nil {
		return err
	}
	keep := false
	defer func() {
		if !keep {
			fc.close()
		}
	}()
	// fleetd looks for queued actions of each device that subscribes; let
	// that finish so the measurement is of the dispatch alone.
	time.Sleep(2 * time.Second)
	r.p.say("delivery: dispatch to %d connected devices", n)
	wait := r.profile("delivery", 5*time.Second)
	d, err := r.admin.dispatch(ctx, map[string]any{"action": "configure", "params": map[string]any{"interval": 60},
		"search_type": "default", "device_ids": devIDs, "timeout": longTimeout})
	t201 := time.Now()
	if err != nil {
		wait()
		return err
	}
	deadline := t201.Add(60 * time.Second)
	got := 0
	for time.Now().Before(deadline) {
		got = 0
		for _, dev := range fc.devices {
			if dev.actions.Load() > 0 {
				got++
			}
		}
		if got == n {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	wait()
	var after []time.Duration
	for _, dev := range fc.devices {
		if at := dev.received.Load(); at != 0 {
			after = append(after, max(0, time.Unix(0, at).Sub(t201)))
		}
	}
	slices.Sort(after)
	last := 60 * time.Second
	if got == n {
		last = after[len(after)-1]
	}
	f := r.rep.add(&figure{Scenario: "delivery", Name: fmt.Sprintf("delivery to %s connected devices, after the 201", thousands(float64(n))),
		Value: last.Seconds(), Unit: seconds,
		Note: fmt.Sprintf("action %d; %d of %d received within 60 s; half had it %.0f ms after the 201", d.ID, got, n, ms(latencies(after).percentile(50)))})
	judge(f, r.t.dialect, goalDelivery, "")
	if got != n {
		return fmt.Errorf("delivery: only %d of %d devices received the action", got, n)
	}
	if slices.Contains(r.o.scenarios, "memory") && n == r.sz.memConns {
		r.connected, keep = fc, true
	}
	return nil
}

// short writes 100000 as 100k and 1000000 as 1M.
func short(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n >= 1_000 && n%1_000 == 0:
		return fmt.Sprintf("%dk", n/1_000)
	}
	return strconv.Itoa(n)
}

// s7Types are the action names of the S7 device's actions.
var s7Types = []string{"reboot", "configure", "restart_app", "collect_logs", "set_time", "ping", "rotate_keys", "factory_reset"}

// s7Sorts are S7's sort_by values (docs/actions.md#s7-a-devices-actions).
var s7Sorts = []string{"action_id", "type", "status", "user_email", "user_name", "updated_at", "errors"}

// s7 measures S7 latency for every sort on a device with many actions of
// varied types, dispatchers, states and errors.
func (r *runner) s7(ctx context.Context) error {
	n := r.sz.s7Actions
	dev := "s7-" + r.runID
	if _, err := r.admin.provision(ctx, []string{dev}, map[string]string{"site": "bench"}, r.p, "s7: provisioned the device"); err != nil {
		return err
	}
	var ops []*api
	for i := range 4 {
		k, err := r.admin.createKey(ctx, fmt.Sprintf("fleetbench-op%d-%s", i, r.runID), "operator", fmt.Sprintf("operator%d@example.com", i))
		if err != nil {
			return err
		}
		ops = append(ops, r.admin.as(k))
	}
	devKey, err := r.deviceKeyOnce(ctx)
	if err != nil {
		return err
	}
	reporter := r.admin.as(devKey)
	actionIDs := make([]int64, n)
	var done atomic.Int64
	err = parallel(ctx, n, 16, func(ctx context.Context, i int) error {
		d, err := ops[i%len(ops)].dispatch(ctx, map[string]any{"action": s7Types[i%len(s7Types)], "params": map[string]any{"i": i},
			"search_type": "default", "device_ids": []string{dev}, "timeout": longTimeout})
		actionIDs[i] = d.ID
		r.p.count("s7: dispatched actions to the device", int(done.Add(1)), n)
		return err
	})
	if err != nil {
		return err
	}
	// The device's history, as a device that has run n actions has it:
	// all final but the last 30 (20 in progress, 10 queued), with errors
	// on some. fleetd reads and sorts a device's actions that are not
	// final; the final ones are indexed (migration 0009).
	done.Store(0)
	err = parallel(ctx, n, 16, func(ctx context.Context, i int) error {
		r.p.count("s7: status reports and cancellations", int(done.Add(1)), n)
		report := func(state string, progress int, errs ...string) error {
			rep := map[string]any{"device_id": dev, "action_id": actionIDs[i], "state": state, "progress": progress}
			if len(errs) > 0 {
				rep["errors"] = errs
			}
			return reporter.call(ctx, "POST", "/api/v1/devices/action/status", rep, http.StatusNoContent, nil)
		}
		switch {
		case i >= n-10:
			return nil // stays Queued
		case i >= n-30:
			return report("Downloading", i%100)
		case i%20 == 19:
			return ops[0].call(ctx, "POST", fmt.Sprintf("/api/v1/actions/%d/cancel", actionIDs[i]), nil, http.StatusNoContent, nil)
		case i%4 == 2:
			return report("Failed", 100, []string{"checksum mismatch", "retry limit"}[:1+i%3/2]...)
		case i%4 == 3:
			if err := report("Installing", 60, "low battery"); err != nil {
				return err
			}
		}
		return report("Completed", 100)
	})
	if err != nil {
		return err
	}
	note := ""
	if r.t.dialect == "postgres" && r.t.dsn != "" {
		// Until autovacuum visits the table (within its next round, a
		// minute by default) PostgreSQL plans as if device_actions were
		// empty, and index-only scans read the heap: a benchmark right
		// after a bulk setup would measure that moment, not the service.
		r.p.say("s7: VACUUM (ANALYZE) device_actions, as autovacuum would")
		if err := vacuumAnalyze(ctx, r.t.dsn, "device_actions", "actions"); err != nil {
			return err
		}
		note = "; after VACUUM (ANALYZE), as autovacuum would have run"
	}
	client := newClient(1)
	get := func(path string) error {
		req, _ := http.NewRequestWithContext(ctx, "GET", r.t.url+path, nil)
		req.Header.Set("X-Service-Tenant", r.t.tenant)
		req.Header.Set("X-Service-Api-Key", r.t.adminKey)
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: status %d: %s", path, resp.StatusCode, b)
		}
		if !strings.Contains(string(b), `"count":`+strconv.Itoa(n)) {
			return fmt.Errorf("GET %s: count is not %d", path, n)
		}
		return nil
	}
	path := func(sort string, i int) string {
		order := "desc"
		if i%2 != 0 {
			order = "asc"
		}
		return fmt.Sprintf("/api/v1/devices/%s/actions?sort_by=%s&sort_order=%s&limit=50", url.PathEscape(dev), sort, order)
	}
	if r.profiling() {
		// fleetd's CPU profile is of unmeasured requests of every sort:
		// starting a profile and encoding it cost fleetd milliseconds of
		// CPU, which would land in the measured requests' tail.
		wait := r.profile("s7", 5*time.Second)
		for i, end := 0, time.Now().Add(5*time.Second); time.Now().Before(end); i++ {
			if err := get(path(s7Sorts[i%len(s7Sorts)], i/len(s7Sorts))); err != nil {
				wait()
				return err
			}
		}
		wait()
		note += "; fleetd's CPU profile taken over 5 s of unmeasured requests before"
	}
	note += r.settle(ctx, "s7")
	// The client's own collections land in its latencies too (at Go's
	// default, one every ~45 requests): S7 measures fleetd, so fleetbench
	// collects a quarter as often meanwhile.
	defer debug.SetGCPercent(debug.SetGCPercent(400))
	for _, sort := range s7Sorts {
		var lat latencies
		// S7's tail is requests that overlap a garbage collection (in
		// fleetd or here): the note counts both (BENCHMARKS.md).
		var gcs *gcMeter
		for i := -20; i < r.sz.s7Requests; i++ { // 20 unmeasured first
			if i == 0 {
				gcs = startGCs(ctx, r.t.url)
			}
			t0 := time.Now()
			if err := get(path(sort, i)); err != nil {
				return err
			}
			if i >= 0 {
				lat = append(lat, time.Since(t0))
			}
		}
		slices.Sort(lat)
		p50, p99 := lat.percentile(50), lat.percentile(99)
		judge(r.rep.add(&figure{Scenario: "s7", Name: fmt.Sprintf("S7 p99 ÷ its p50, %s actions, sort_by=%s", thousands(float64(n)), sort),
			Value: ms(p99), Unit: millis, Baseline: "its p50", Ratio: float64(p99) / float64(p50),
			Note: fmt.Sprintf("p50 %.2f ms over %d requests, desc and asc; %s%s", ms(p50), len(lat), gcs.Note(ctx), note)}), r.t.dialect, goalS7, "")
	}
	return nil
}

// vacuumAnalyze runs VACUUM (ANALYZE) on tables of the PostgreSQL
// database of dsn.
func vacuumAnalyze(ctx context.Context, dsn string, tables ...string) error {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.ExecContext(ctx, "VACUUM (ANALYZE) "+strings.Join(tables, ", "))
	return err
}

// memory reads fleetd's resident memory with many MQTT connections open
// and the large dispatch's device actions stored.
func (r *runner) memory(ctx context.Context) error {
	large := len(r.sz.dispatch) - 1
	if err := r.dispatchOne(ctx, large); err != nil {
		return err
	}
	fc := r.connected
	if fc == nil {
		n := r.sz.memConns
		devIDs := ids("mem-"+r.runID, n)
		toks, err := r.admin.provision(ctx, devIDs, nil, r.p, "memory: provisioned devices")
		if err != nil {
			return err
		}
		if fc, err = connectDevices(ctx, r.t.mqttAddr, r.t.tenant, toks, subscribeActions, r.p, "memory: connected and subscribed devices"); err != nil {
			return err
		}
		defer fc.close()
	}
	time.Sleep(3 * time.Second) // let the connections' first work settle
	conns, actions := thousands(float64(len(fc.devices))), thousands(float64(r.sz.dispatch[large]))
	if err := r.readMemory(ctx, fmt.Sprintf("fleetd VmRSS, %s MQTT connections, %s+ device actions", conns, actions), "3 s after connecting"); err != nil {
		return err
	}
	r.snapshot("memory")
	if r.o.quick {
		return nil
	}
	// Goroutine stacks shrink only at garbage collections, and an idle
	// server collects when the runtime forces it, every two minutes: the
	// steady state of idle connections comes after one.
	const idle = 150 * time.Second
	r.p.say("memory: %s idle, for the runtime's periodic collection", idle)
	select {
	case <-time.After(idle):
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := r.readMemory(ctx, fmt.Sprintf("fleetd VmRSS, same, after %s idle", idle), "after the runtime's periodic garbage collection"); err != nil {
		return err
	}
	r.snapshot("memory-idle")
	return nil
}

// readMemory adds a figure of fleetd's resident memory now.
func (r *runner) readMemory(ctx context.Context, name, when string) error {
	rss, peak, how, err := r.residentMemory(ctx)
	if err != nil {
		return err
	}
	note := how + ", " + when
	if peak > 0 {
		note += fmt.Sprintf("; peak (VmHWM) over the whole run %.0f MB", peak)
	}
	judge(r.rep.add(&figure{Scenario: "memory", Name: name, Value: rss, Unit: megabytes, Note: note}), r.t.dialect, goalMemory, "")
	return nil
}

// residentMemory returns fleetd's resident memory in MB: VmRSS (and VmHWM)
// from /proc when its pid is known, else /metrics'
// process_resident_memory_bytes.
func (r *runner) residentMemory(ctx context.Context) (rss, peak float64, how string, err error) {
	if r.t.pid != 0 {
		rss, peak, err := vmRSS(r.t.pid)
		return rss, peak, fmt.Sprintf("VmRSS of pid %d", r.t.pid), err
	}
	const name = "process_resident_memory_bytes"
	m, err := scrape(ctx, r.t.url, []string{name})
	if err != nil {
		return 0, 0, "", fmt.Errorf("%w; or pass --pid", err)
	}
	return m[name] / (1 << 20), 0, name + " of /metrics", nil
}

// vmRSS reads process pid's resident memory (VmRSS) and its peak (VmHWM)
// from /proc, in MB: what ps shows.
func vmRSS(pid int) (rss, peak float64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
		switch name {
		case "VmRSS":
			rss = kb / 1024
		case "VmHWM":
			peak = kb / 1024
		}
	}
	return rss, peak, sc.Err()
}
