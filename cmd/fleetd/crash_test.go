package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
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

// process is fleetd run as a binary on one database, to be killed.
type process struct {
	*testServer
	cmd    *exec.Cmd
	stderr *fleetdtest.LockedBuffer
	exited chan struct{}
}

// startProcess runs the built fleetd on s's database and data directory
// and waits until it listens; s takes its addresses (and, on the first
// start, its admin key).
func startProcess(t *testing.T, s *testServer, extra ...string) *process {
	t.Helper()
	args := append([]string{"serve", "--database", s.DSN, "--data-dir", s.DataDir,
		"--http-addr", "127.0.0.1:0", "--mqtt-addr", "127.0.0.1:0", "--log-level", "warn", "--outbound-allow", "127.0.0.0/8"}, extra...)
	return runFleetd(t, s, args, nil)
}

// runFleetd runs the built fleetd with args, and env added to the
// environment, and waits until it listens; s takes its addresses and, when
// it prints one, its admin key. The process is killed when the test ends
// if it is still running.
func runFleetd(t *testing.T, s *testServer, args, env []string) *process {
	t.Helper()
	cmd := exec.Command(fleetdBinary(t), args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &process{testServer: s, cmd: cmd, stderr: &fleetdtest.LockedBuffer{}, exited: make(chan struct{})}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { cmd.Wait(); close(p.exited) }()
	t.Cleanup(p.kill)
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "fk_") {
				s.Key = line
			}
			if strings.HasPrefix(line, "fleetd: listening") {
				for _, f := range strings.Fields(line) {
					if v, ok := strings.CutPrefix(f, "http="); ok {
						s.URL = "http://" + v
					} else if v, ok := strings.CutPrefix(f, "mqtt="); ok {
						s.MQTTAddr = v
					}
				}
				close(ready)
			}
		}
		io.Copy(io.Discard, stdout)
	}()
	select {
	case <-ready:
	case <-p.exited:
		t.Fatalf("fleetd %s exited:\n%s", strings.Join(args, " "), p.stderr)
	case <-time.After(60 * time.Second):
		t.Fatalf("fleetd %s did not start:\n%s", strings.Join(args, " "), p.stderr)
	}
	return p
}

// kill ends the process with SIGKILL: no shutdown, no flush.
func (p *process) kill() {
	select {
	case <-p.exited:
		return
	default:
	}
	p.cmd.Process.Kill()
	<-p.exited
}

// acked is what fleetd acknowledged before it was killed: each a promise.
type acked struct {
	mu       sync.Mutex
	devices  []string
	actions  []int64
	reports  map[string]int // "device/action" -> highest acknowledged sequence (HTTP and MQTT)
	points   map[string]int64
	bundles  map[string]string // id -> checksum
	failures atomic.Int64      // requests that failed once the process died
}

// TestCrash kills fleetd with SIGKILL in the middle of mixed load —
// dispatches, S10 reports, MQTT status reports, stream ingest over HTTP
// and MQTT, firmware uploads, provisioning — restarts it, and checks that
// every acknowledged write is there and that the work in flight carries
// on: an action times out, a queued action reaches its device, an alert
// whose threshold was running opens and notifies, a notification owed is
// delivered.
func TestCrash(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := newServer(t, b)
		flags := append([]string{"--notify-lease", "1s", "--action-sweep-interval", "100ms", "--rate-limit", "-1"}, fleetdtest.AlertFlags...)
		p := startProcess(t, s, flags...)
		admin := s.Admin()

		var hooks atomic.Int32
		hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			if strings.Contains(r.URL.Path, "late") {
				hooks.Add(1)
			}
		}))
		defer hook.Close()

		const n = 8
		var toks []fleetdtest.Device
		var ids []string
		for i := range n {
			toks = append(toks, s.MustDevice(t, admin, fmt.Sprintf("dev-%d", i), nil))
			ids = append(ids, toks[i].ID)
		}
		sleeper := s.MustDevice(t, admin, "sleeper", nil)
		late := s.MustAlertRule(t, admin, map[string]any{"name": "late", "stream": "heat", "activation_threshold_seconds": 2,
			"condition": map[string]any{"field": "temp", "operator": ">", "value": 50}})
		s.Do(t, admin, "POST", "/api/v1/alert-rules/"+late.ID+"/alert-notification-rules", map[string]any{
			"channel_parameters": map[string]any{"type": "webhook", "url": hook.URL + "/late"}}).Want(t, 201)
		taker := s.ConnectDevice(t, "default", "dev-1", toks[1].Token)

		// The load.
		ack := &acked{reports: map[string]int{}, points: map[string]int64{}, bundles: map[string]string{}}
		target := s.Dispatch(t, admin, map[string]any{"action": "load", "params": map[string]any{}, "search_type": "default", "device_ids": ids, "timeout": 3600})
		taker.Next(t)
		var mqttDevs []pahov3.Client
		for i := 2; i < n; i++ {
			mqttDevs = append(mqttDevs, plainDevice(t, s.MQTTAddr, "default", toks[i].ID, toks[i].Token))
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		client := &http.Client{Timeout: 5 * time.Second}
		post := func(path, body string, ct string) (int, []byte) {
			hr, _ := http.NewRequest("POST", s.URL+path, strings.NewReader(body))
			hr.Header.Set("Content-Type", ct)
			hr.Header.Set("X-Service-Tenant", "default")
			hr.Header.Set("X-Service-Api-Key", s.Key)
			resp, err := client.Do(hr)
			if err != nil {
				ack.failures.Add(1)
				return 0, nil
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, b
		}
		worker := func(f func(i int) bool) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					if !f(i) {
						return
					}
				}
			}()
		}
		base := time.Now().UnixMilli()
		worker(func(i int) bool { // dispatch
			if i == 200 {
				return false // S7 below reads a page of 1000
			}
			code, body := post("/api/v1/actions", `{"action": "d", "params": {}, "search_type": "default", "device_ids": ["dev-2", "dev-3"]}`, "application/json")
			var out struct{ ID int64 }
			if code == 201 && json.Unmarshal(body, &out) == nil {
				ack.mu.Lock()
				ack.actions = append(ack.actions, out.ID)
				ack.mu.Unlock()
			}
			return code != 0
		})
		worker(func(i int) bool { // provisioning
			id := fmt.Sprintf("new-%d", i)
			code, _ := post("/api/v1/devices", `{"id": "`+id+`"}`, "application/json")
			if code == 201 {
				ack.mu.Lock()
				ack.devices = append(ack.devices, id)
				ack.mu.Unlock()
			}
			return code != 0
		})
		for w := range 2 { // S10, dev-0 and dev-1
			dev := fmt.Sprintf("dev-%d", w)
			worker(func(i int) bool {
				code, _ := post("/api/v1/devices/action/status", fmt.Sprintf(`{"device_id": %q, "action_id": %d, "state": "step-%d", "progress": %d, "timestamp": %d, "sequence": %d}`,
					dev, target, i, i%100, base+int64(i), i), "application/json")
				if code == 204 {
					ack.mu.Lock()
					ack.reports[dev] = max(ack.reports[dev], i)
					ack.mu.Unlock()
				}
				return code != 0
			})
		}
		worker(func(i int) bool { // stream ingest over HTTP
			ts := base + int64(i)
			code, _ := post("/api/v1/devices/dev-0/streams/env", fmt.Sprintf(`[{"timestamp": %d, "t": %d}]`, ts, i), "application/json")
			if code == 200 {
				ack.mu.Lock()
				ack.points["dev-0/env"] = max(ack.points["dev-0/env"], ts)
				ack.mu.Unlock()
			}
			return code != 0
		})
		worker(func(i int) bool { // uploads
			archive := fleetdtest.MakeBundle(t, fmt.Sprintf("1.0.%d", i), fleetdtest.Part{Name: "app", Version: fmt.Sprintf("1.0.%d", i), Body: strings.Repeat("x", 1000+i)})
			body, ct := fleetdtest.MultipartBody(t, "b.tar.gz", archive)
			code, out := post("/api/v1/firmware-bundles", string(body), ct)
			var bd struct{ ID, Checksum string }
			if code == 201 && json.Unmarshal(out, &bd) == nil {
				ack.mu.Lock()
				ack.bundles[bd.ID] = fleetdtest.SHA256Hex(archive)
				ack.mu.Unlock()
			}
			return code != 0
		})
		for k, c := range mqttDevs { // MQTT status reports and stream points
			dev := toks[k+2].ID
			worker(func(i int) bool {
				var topic string
				var payload []byte
				if i%2 == 0 {
					topic = mqtt.ActionStatusTopic("default", dev)
					payload = fmt.Appendf(nil, `{"id": "%d", "state": "step-%d", "timestamp": %d, "sequence": %d}`, target, i, base+int64(i), i)
				} else {
					topic = mqtt.StreamTopic("default", dev, "env")
					payload = fmt.Appendf(nil, `[{"timestamp": %d, "t": %d}]`, base+int64(i), i)
				}
				tok := c.Publish(topic, 1, false, payload)
				if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
					return false
				}
				ack.mu.Lock()
				if i%2 == 0 {
					ack.reports[dev] = max(ack.reports[dev], i)
				} else {
					ack.points[dev+"/env"] = max(ack.points[dev+"/env"], base+int64(i))
				}
				ack.mu.Unlock()
				return true
			})
		}

		// Kill it once every kind of write has been acknowledged a few
		// times, in the middle of the stream of them. The writers run until
		// then, so the counts are certain to come; the bound only ends a
		// hang, and a loaded machine took over 15 s to reach them.
		fleetdtest.EventuallyWithin(t, time.Minute, "load of every kind", func() bool {
			ack.mu.Lock()
			defer ack.mu.Unlock()
			return len(ack.actions) >= 20 && len(ack.devices) >= 40 && len(ack.bundles) >= 5 &&
				ack.reports["dev-0"] >= 100 && ack.reports["dev-2"] >= 60 && ack.points["dev-0/env"] >= base+100 && ack.points["dev-3/env"] > 0
		})
		// Work in flight at the crash: an alert needing 2 s of heat, which
		// starts now; an action with a 2 s timeout, taken by its device; an
		// action queued for a device that is offline.
		s.Do(t, admin, "POST", "/api/v1/devices/dev-0/streams/heat", fleetdtest.Points(time.Now(), 90)).Want(t, 200)
		timing := s.Dispatch(t, admin, map[string]any{"action": "slow", "params": map[string]any{}, "search_type": "default", "device_ids": []string{"dev-1"}, "timeout": 2})
		taker.Next(t)
		s.AwaitActionStatus(t, admin, "dev-1", timing, "Initiated")
		queued := s.Dispatch(t, admin, map[string]any{"action": "wake", "params": map[string]any{}, "search_type": "default", "device_ids": []string{"sleeper"}})
		p.kill()
		close(stop)
		wg.Wait()
		for _, c := range mqttDevs {
			c.Disconnect(0)
		}
		ack.mu.Lock()
		defer ack.mu.Unlock()
		t.Logf("acknowledged before the kill: %d dispatches, %d devices, %d bundles, reports %v, points %d",
			len(ack.actions), len(ack.devices), len(ack.bundles), ack.reports, len(ack.points))

		startProcess(t, s, flags...)

		// Every acknowledged write is there.
		for _, id := range ack.devices {
			s.Do(t, admin, "GET", "/api/v1/devices/"+id, nil).Want(t, 200)
		}
		for _, id := range ack.actions {
			var a fleetdtest.ActionBody
			s.Do(t, admin, "GET", fmt.Sprintf("/api/v1/actions/%d", id), nil).Want(t, 200).Decode(t, &a)
			if a.Targeted != 2 {
				t.Errorf("action %d targets %d devices after the crash, want 2 (dispatch is atomic)", id, a.Targeted)
			}
		}
		for dev, seq := range ack.reports {
			da := s.DeviceAction(t, admin, dev, target)
			var got int
			if _, err := fmt.Sscanf(da.Status, "step-%d", &got); err != nil || got < seq {
				t.Errorf("%s's report: status %q after the crash, want step-%d or later", dev, da.Status, seq)
			}
		}
		for key, ts := range ack.points {
			dev, stream, _ := strings.Cut(key, "/")
			var latest struct{ Timestamp string }
			s.Do(t, admin, "GET", "/api/v1/devices/"+dev+"/streams/"+stream+"/latest", nil).Want(t, 200).Decode(t, &latest)
			if got, err := time.Parse(time.RFC3339Nano, latest.Timestamp); err != nil || got.UnixMilli() < ts {
				t.Errorf("%s's latest point %s after the crash, want %s or later", key, latest.Timestamp, time.UnixMilli(ts).UTC())
			}
		}
		for id, sum := range ack.bundles {
			resp, body := s.Get(t, admin, "/api/v1/firmware-bundles/id/"+id+"/artifact")
			if resp.StatusCode != 200 || fleetdtest.SHA256Hex(body) != sum {
				t.Errorf("bundle %s after the crash: %d, %d bytes of another checksum", id, resp.StatusCode, len(body))
			}
		}

		// Work in flight carries on.
		s.AwaitActionStatus(t, admin, "dev-1", timing, "Failed")
		if got := s.ConnectDevice(t, "default", "sleeper", sleeper.Token).Next(t); got.ID != fmt.Sprint(queued) {
			t.Fatalf("the sleeper got action %s, want %d", got.ID, queued)
		}
		fleetdtest.Eventually(t, "the alert whose threshold ran across the crash", func() bool {
			return len(s.Alerts(t, admin, "?state=active&rule_id="+late.ID)) == 1
		})
		fleetdtest.Eventually(t, "its notification", func() bool { return hooks.Load() >= 1 })
		if bytes.Contains([]byte(p.stderr.String()), []byte("panic")) {
			t.Errorf("the killed process panicked first:\n%s", p.stderr)
		}
	})
}

// plainDevice connects a device over MQTT 3.1.1 that only publishes.
func plainDevice(t *testing.T, addr, tenant, id, token string) pahov3.Client {
	t.Helper()
	c := pahov3.NewClient(pahov3.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).
		SetUsername(tenant + "/" + id).SetPassword(token).SetProtocolVersion(4).SetCleanSession(true).
		SetAutoReconnect(false).SetConnectTimeout(fleetdtest.Bound))
	if tok := c.Connect(); !tok.WaitTimeout(fleetdtest.Bound) || tok.Error() != nil {
		t.Fatalf("connect %s: %v", id, tok.Error())
	}
	return c
}
