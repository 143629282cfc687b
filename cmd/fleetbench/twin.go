package main

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/fleetd/fleet/mqtt"
)

// The device twin and groups (docs/twin.md), each of the ratio to what
// fleetd does already, measured in the same run.
var (
	goalShadowWrites   = goal{sqlite: 0.5, postgres: 0.5, atLeast: true, ofRatio: true} // ÷ S10
	goalShadowReported = goal{sqlite: 0.5, postgres: 0.5, atLeast: true, ofRatio: true} // ÷ MQTT status reports
	goalDeltaDelivery  = goal{sqlite: 2, postgres: 2, ofRatio: true}                    // ÷ an action's delivery
	goalGroupCount     = goal{sqlite: 2, postgres: 2, ofRatio: true}                    // ÷ the metadata search
)

// turns runs a and b in turn, rounds times, over windows of half the
// run's duration each, and returns each one's rate (operations over the
// windows' time) and the median of the rounds' ratios of b's rate to a's:
// the machine's speed moves between rounds more than within one.
func (r *runner) turns(a, b func(warmup, d time.Duration) result) (ra, rb result, ratio float64, ratios []float64, err error) {
	d := max(r.o.duration/2, time.Second)
	warmup := r.sz.warmup / 2
	var opsA, opsB float64
	for range r.sz.twinRounds {
		x := a(warmup, d)
		y := b(warmup, d)
		if x.errors > 0 || y.errors > 0 {
			return x, y, 0, nil, fmt.Errorf("%s", joinNotes(errorNote(x), errorNote(y)))
		}
		opsA, opsB = opsA+x.rate*d.Seconds(), opsB+y.rate*d.Seconds()
		ratios = append(ratios, y.rate/x.rate)
		ra, rb = x, y
	}
	total := d.Seconds() * float64(r.sz.twinRounds)
	ra.rate, rb.rate = opsA/total, opsB/total
	slices.Sort(ratios)
	return ra, rb, ratios[len(ratios)/2], ratios, nil
}

// turned is a throughput measured in turns with its baseline.
type turned struct {
	key, label, name string // the baseline's
	base             result
	baseNote         string
	f                *figure
	notes            []string
	ratio            float64 // the median round's
	ratios           []float64
	goal             goal
	load0            float64
}

// addTurns adds t's baseline and figure, judged on the median round.
func (r *runner) addTurns(t turned) {
	load := loadNote(t.load0)
	r.rep.addBaseline(t.key, t.label, &figure{Name: t.name, Value: t.base.rate, Unit: perSecond, Note: joinNotes(t.baseNote, load)})
	t.f.Note = joinNotes(append(append([]string{ratiosNote(t.ratios)}, t.notes...), load)...)
	r.rep.compare(r.rep.add(t.f), t.key)
	t.f.Ratio = t.ratio
	judge(t.f, r.t.dialect, t.goal, "")
}

// ratiosNote says how the rounds' ratios spread.
func ratiosNote(ratios []float64) string {
	return fmt.Sprintf("%d rounds in turns, each round's ratio from %.0f%% to %.0f%%, the verdict on the median", len(ratios), 100*ratios[0], 100*ratios[len(ratios)-1])
}

// twin measures the device twin against what fleetd did before it, in
// the same run: operators' desired writes against S10, devices' reported
// state over MQTT against MQTT status reports, and a desired change's
// delta reaching connected devices against an action reaching them.
func (r *runner) twin(ctx context.Context) error {
	if err := r.twinDesired(ctx); err != nil {
		return err
	}
	if err := r.twinReported(ctx); err != nil {
		return err
	}
	return r.twinDelta(ctx)
}

// shadowOf reads a device's shadow.
func (r *runner) shadowOf(ctx context.Context, device string) (desired, reported map[string]any, err error) {
	var s struct {
		Desired  map[string]any `json:"desired"`
		Reported map[string]any `json:"reported"`
	}
	err = r.admin.call(ctx, "GET", "/api/v1/devices/"+url.PathEscape(device)+"/shadow", nil, http.StatusOK, &s)
	return s.Desired, s.Reported, err
}

// checkLast reads up to 100 of the devices' shadows (spread over them)
// and counts those whose section holds the last interval sent.
func (r *runner) checkLast(ctx context.Context, devIDs []string, seq *reportSeq, reported bool) (ok, read int, err error) {
	step := max(1, len(devIDs)/100)
	for i := 0; i < len(devIDs); i += step {
		if seq.last[i] == 0 {
			continue
		}
		desired, rep, err := r.shadowOf(ctx, devIDs[i])
		if err != nil {
			return 0, 0, err
		}
		m := desired
		if reported {
			m = rep
		}
		read++
		if v, _ := m["interval"].(float64); int64(v) == seq.last[i] {
			ok++
		}
	}
	return ok, read, nil
}

// twinDesired measures PATCH /api/v1/devices/{id}/shadow under S10's
// load, in turns with S10 itself on a fleet of its own: the same 64
// connections, each owning its devices, every write a change.
func (r *runner) twinDesired(ctx context.Context) error {
	n, conns := r.sz.s10Devices, r.o.conns
	s10, err := r.newS10Fleet(ctx, "tws-", "twin: provisioned S10's devices", n)
	if err != nil {
		return err
	}
	devIDs := ids("tw-"+r.runID, n)
	if _, err := r.admin.provision(ctx, devIDs, nil, r.p, "twin: provisioned devices"); err != nil {
		return err
	}
	headers := []http.Header{{"Content-Type": {"application/json"}, "X-Service-Tenant": {r.t.tenant}, "X-Service-Api-Key": {r.admin.key}}}
	owned := func(w int) int { return (n - w + conns - 1) / conns }
	item := func(w, i int) int { return w + (i%owned(w))*conns }
	seq, s10seq := newReportSeq(n), newReportSeq(n)
	r.p.say("twin: desired writes in turns with S10, %d connections, on %d devices each", conns, n)
	wait := r.profile("twin-desired", time.Duration(r.sz.twinRounds)*(r.sz.warmup+r.o.duration))
	cpu, commits := startCPU(r.t.pid), startCommits(ctx, r.t.url)
	load0 := loadAverage()
	base, res, ratio, ratios, err := r.turns(func(warmup, d time.Duration) result {
		return r.s10Load(ctx, s10, s10seq, warmup, d)
	}, func(warmup, d time.Duration) result {
		return (&httpLoad{method: http.MethodPatch, headers: headers, conns: conns, want: http.StatusOK,
			urlOf: func(w, i int) string { return r.t.url + "/api/v1/devices/" + devIDs[item(w, i)] + "/shadow" },
			body: func(w, i int) []byte {
				return fmt.Appendf(nil, `{"desired":{"interval":%d,"mode":"eco"}}`, seq.next(item(w, i)))
			}, warmup: warmup, duration: d}).run(ctx)
	})
	wait()
	if err != nil {
		return fmt.Errorf("twin desired writes: %w", err)
	}
	ok, read, err := r.checkLast(ctx, devIDs, seq, false)
	if err != nil {
		return err
	}
	s10ok, s10sent, err := r.verifyLast(ctx, s10.act.ID, s10.devIDs, s10seq)
	if err != nil {
		return err
	}
	r.addTurns(turned{key: "s10-turns", label: "S10, in turns", name: fmt.Sprintf("S10 on %d devices of its own, in turns with the desired writes", n),
		base: base, baseNote: fmt.Sprintf("%d of %d device actions show the last report sent; the last round's p50 %.2f ms, p99 %.2f ms", s10ok, s10sent, ms(base.p50), ms(base.p99)),
		f: &figure{Scenario: "twin", Name: fmt.Sprintf("shadow desired writes (PATCH …/shadow) ÷ S10, %d connections", conns), Value: res.rate, Unit: perSecond},
		notes: []string{fmt.Sprintf("one operator key on every connection; %d of %d shadows read back hold the last write", ok, read),
			fmt.Sprintf("the last round's p50 %.2f ms, p99 %.2f ms", ms(res.p50), ms(res.p99)), "over both: " + cpu.String(), commits.Note(ctx)},
		ratio: ratio, ratios: ratios, goal: goalShadowWrites, load0: load0})
	if ok != read || s10ok != s10sent {
		return fmt.Errorf("twin desired writes: %d of %d shadows, %d of %d device actions hold the last write", ok, read, s10ok, s10sent)
	}
	return nil
}

// twinReported has the same connected devices publish their reported
// state and status reports on an action, in turns, as mqtt-status's
// devices do: the same clients and load, QoS 1, each waiting for its
// PUBACK.
func (r *runner) twinReported(ctx context.Context) error {
	n := r.sz.mqttDevices
	devIDs, toks, act, err := r.mqttFleet(ctx, "tr-", "twin: provisioned reporting devices")
	if err != nil {
		return err
	}
	fc, err := connectDevices(ctx, r.t.mqttAddr, r.t.tenant, toks, nil, r.p, "twin: connected reporting devices")
	if err != nil {
		return err
	}
	defer fc.close()
	seq, statusSeq := newReportSeq(n), newReportSeq(n)
	r.p.say("twin: %d devices reporting their state in turns with status reports", n)
	wait := r.profile("twin-reported", time.Duration(r.sz.twinRounds)*(r.sz.warmup+r.o.duration))
	cpu, commits := startCPU(r.t.pid), startCommits(ctx, r.t.url)
	load0 := loadAverage()
	base, res, ratio, ratios, err := r.turns(func(warmup, d time.Duration) result {
		return r.publishFor(ctx, fc, statusTopic, statusReports(act.ID, statusSeq), warmup, d)
	}, func(warmup, d time.Duration) result {
		return r.publishFor(ctx, fc, func(d *simDevice) string { return mqtt.ShadowReportedTopic(d.tenant, d.id) }, func(i int) []byte {
			s := seq.next(i)
			return fmt.Appendf(nil, `{"interval":%d,"uptime":%d}`, s, seq.base+s)
		}, warmup, d)
	})
	wait()
	if err != nil {
		return fmt.Errorf("twin reported state: %w", err)
	}
	ok, read, err := r.checkLast(ctx, devIDs, seq, true)
	if err != nil {
		return err
	}
	sok, ssent, err := r.verifyLast(ctx, act.ID, devIDs, statusSeq)
	if err != nil {
		return err
	}
	r.addTurns(turned{key: "mqtt-status-turns", label: "MQTT status, in turns", name: fmt.Sprintf("MQTT status reports from the same %d devices, in turns with their reported state", n),
		base: base, baseNote: fmt.Sprintf("%d of %d device actions show the last report sent; the last round's PUBACK p50 %.2f ms, p99 %.2f ms", sok, ssent, ms(base.p50), ms(base.p99)),
		f: &figure{Scenario: "twin", Name: fmt.Sprintf("reported state over MQTT ÷ MQTT status reports, %d devices, QoS 1", n), Value: res.rate, Unit: perSecond},
		notes: []string{fmt.Sprintf("a merge patch a publish; %d of %d shadows read back hold the last report", ok, read),
			fmt.Sprintf("the last round's PUBACK p50 %.2f ms, p99 %.2f ms", ms(res.p50), ms(res.p99)), "over both: " + cpu.String(), commits.Note(ctx)},
		ratio: ratio, ratios: ratios, goal: goalShadowReported, load0: load0})
	if ok != read || sok != ssent {
		return fmt.Errorf("twin reported state: %d of %d shadows, %d of %d device actions hold the last report", ok, read, sok, ssent)
	}
	return nil
}

// twinDelta connects devices subscribed to their actions and their
// delta, and times, in alternating rounds, an action dispatched to all of
// them and a desired change made for all of them (PATCH
// /api/v1/shadows), each from its request until the last device
// received it.
func (r *runner) twinDelta(ctx context.Context) error {
	n := r.sz.delivery
	devIDs := ids("td-"+r.runID, n)
	toks, err := r.admin.provision(ctx, devIDs, nil, r.p, "twin: provisioned devices for the delta")
	if err != nil {
		return err
	}
	fc, err := connectDevices(ctx, r.t.mqttAddr, r.t.tenant, toks, []topicFunc{mqtt.ActionsTopic, mqtt.ShadowDeltaTopic}, r.p, "twin: connected and subscribed devices")
	if err != nil {
		return err
	}
	defer fc.close()
	// As in delivery: fleetd looks for what waits for each device that
	// subscribes; that is over before the first round.
	time.Sleep(2 * time.Second)
	// reach times one request until every device's count grew, and
	// returns how long the last device waited from the request's start.
	reach := func(what string, count, at func(*simDevice) int64, send func() error) (time.Duration, error) {
		before := make([]int64, n)
		for i, d := range fc.devices {
			before[i] = count(d)
		}
		t0 := time.Now()
		if err := send(); err != nil {
			return 0, err
		}
		deadline := t0.Add(60 * time.Second)
		for {
			got := 0
			for i, d := range fc.devices {
				if count(d) > before[i] {
					got++
				}
			}
			if got == n {
				break
			}
			if time.Now().After(deadline) {
				return 0, fmt.Errorf("twin: %s reached %d of %d devices in 60 s", what, got, n)
			}
			time.Sleep(5 * time.Millisecond)
		}
		var last int64
		for _, d := range fc.devices {
			last = max(last, at(d))
		}
		return time.Unix(0, last).Sub(t0), nil
	}
	load0 := loadAverage()
	var actions, deltas []time.Duration
	wait := r.profile("twin-delta", 15*time.Second)
	defer func() { wait() }()
	for round := range r.sz.deltaRounds {
		a, err := reach("the action", func(d *simDevice) int64 { return d.actions.Load() }, func(d *simDevice) int64 { return d.received.Load() }, func() error {
			_, err := r.admin.dispatch(ctx, map[string]any{"action": "configure", "params": map[string]any{"interval": 60 + round},
				"search_type": "default", "device_ids": devIDs, "timeout": longTimeout})
			return err
		})
		if err != nil {
			return err
		}
		d, err := reach("the desired change", func(d *simDevice) int64 { return d.deltas.Load() }, func(d *simDevice) int64 { return d.deltaAt.Load() }, func() error {
			var fd struct {
				Changed int `json:"changed"`
			}
			err := r.admin.call(ctx, "PATCH", "/api/v1/shadows", map[string]any{"search_type": "default", "device_ids": devIDs,
				"desired": map[string]any{"interval": 60 + round}}, http.StatusOK, &fd)
			if err == nil && fd.Changed != n {
				err = fmt.Errorf("PATCH /api/v1/shadows changed %d of %d shadows", fd.Changed, n)
			}
			return err
		})
		if err != nil {
			return err
		}
		r.p.say("twin: round %d: action to all %d devices %.2f s, desired change %.2f s", round+1, n, a.Seconds(), d.Seconds())
		actions, deltas = append(actions, a), append(deltas, d)
	}
	slices.Sort(actions)
	slices.Sort(deltas)
	am, dm := actions[len(actions)/2], deltas[len(deltas)/2]
	load := loadNote(load0)
	r.rep.addBaseline("action-delivery", "action", &figure{Name: fmt.Sprintf("an action dispatched to the same %s connected devices, from the request to the last received (median of %d)", thousands(float64(n)), len(actions)),
		Value: am.Seconds(), Unit: seconds, Note: joinNotes(fmt.Sprintf("rounds from %.2f to %.2f s", actions[0].Seconds(), actions[len(actions)-1].Seconds()), load)})
	f := r.rep.add(&figure{Scenario: "twin", Name: fmt.Sprintf("a desired change to %s connected devices (one PATCH /api/v1/shadows), to the last delta received ÷ an action's", thousands(float64(n))),
		Value: dm.Seconds(), Unit: seconds,
		Note: joinNotes(fmt.Sprintf("median of %d rounds alternating with the action's, from %.2f to %.2f s; the tenant's update_config setting off (its default)", len(deltas), deltas[0].Seconds(), deltas[len(deltas)-1].Seconds()), load)})
	judge(r.rep.compare(f, "action-delivery"), r.t.dialect, goalDeltaDelivery, "")
	return nil
}

// groups counts a group's devices (GET /api/v1/groups/{name}) against the
// devices API counting the same devices by their metadata, one request at
// a time, in turns.
func (r *runner) groups(ctx context.Context) error {
	n := r.sz.groupDevices
	site := "north-" + r.runID
	if _, err := r.admin.provision(ctx, ids("gm-"+r.runID, n), map[string]string{"site": site, "tier": "gold"}, r.p, "groups: provisioned members"); err != nil {
		return err
	}
	if _, err := r.admin.provision(ctx, ids("go-"+r.runID, n/10), map[string]string{"site": "south-" + r.runID, "tier": "gold"}, r.p, "groups: provisioned others"); err != nil {
		return err
	}
	name := "bench-" + r.runID
	if err := r.admin.call(ctx, "POST", "/api/v1/groups", map[string]string{"name": name, "selector": "site=" + site}, http.StatusCreated, nil); err != nil {
		return err
	}
	var g struct {
		Count int `json:"count"`
	}
	group := func() (int, error) {
		err := r.admin.call(ctx, "GET", "/api/v1/groups/"+name, nil, http.StatusOK, &g)
		return g.Count, err
	}
	var l struct {
		Count int `json:"count"`
	}
	search := func() (int, error) {
		err := r.admin.call(ctx, "GET", "/api/v1/devices?limit=1&metadata.site="+url.QueryEscape(site), nil, http.StatusOK, &l)
		return l.Count, err
	}
	load0 := loadAverage()
	var tg, ts latencies
	for i := -3; i < r.sz.groupCounts; i++ { // 3 unmeasured
		for _, q := range []struct {
			count func() (int, error)
			into  *latencies
		}{{group, &tg}, {search, &ts}} {
			t0 := time.Now()
			c, err := q.count()
			if err != nil {
				return err
			}
			if c != n {
				return fmt.Errorf("groups: counted %d devices, want %d", c, n)
			}
			if i >= 0 {
				*q.into = append(*q.into, time.Since(t0))
			}
		}
	}
	slices.Sort(tg)
	slices.Sort(ts)
	load := loadNote(load0)
	r.rep.addBaseline("metadata-count", "metadata search", &figure{Name: fmt.Sprintf("GET /api/v1/devices?metadata.site=…&limit=1, the same %s devices counted, median of %d", thousands(float64(n)), len(ts)),
		Value: ms(ts.percentile(50)), Unit: millis, Note: joinNotes(fmt.Sprintf("p99 %.1f ms", ms(ts.percentile(99))), load)})
	f := r.rep.add(&figure{Scenario: "groups", Name: fmt.Sprintf("a group of %s devices counted (GET /api/v1/groups/{name}, selector site=…) ÷ the metadata search", thousands(float64(n))),
		Value: ms(tg.percentile(50)), Unit: millis,
		Note: joinNotes(fmt.Sprintf("median of %d, in turns with the search; p99 %.1f ms; %s other devices in another site, and the run's other scenarios' devices, in the tenant",
			len(tg), ms(tg.percentile(99)), thousands(float64(n/10))), load)})
	judge(r.rep.compare(f, "metadata-count"), r.t.dialect, goalGroupCount, "")
	return nil
}
