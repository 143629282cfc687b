// Package sim is fleetd sim: a fleet of simulated devices on MQTT that
// execute the actions they receive (firmware updates included, downloaded
// for real), report their progress and send telemetry.
package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pahov3 "github.com/eclipse/paho.mqtt.golang"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/action"
	"github.com/fleetd/fleet/internal/cli"
	"github.com/fleetd/fleet/mqtt"
)

const simAbout = `Simulates a fleet: connects N devices to fleetd's MQTT broker, each
subscribed to its actions. A device executes what it receives by reporting
Received, then Downloading with rising progress, then Completed, or Failed
on the devices --fail-rate chooses (the same devices every run: the share is
taken by a hash of the device id), and publishes telemetry points on a
stream. With --unhealthy-after-update, a device whose update_firmware
completed publishes a point at once and from then on runs hot
(temperature 95, where healthy devices send 20 to 30): an alert rule on it
opens, as a rollout's alert gate wants to see.
An update_firmware is real: the device downloads the bundle from the
signed URL it is sent, checks its checksum and length, and reports
Completed or Failed with the reason.
A progress line is printed every --report-interval until interrupted.

sim says which broker its first device connected to, and warns when that
broker is not fleetd's (another broker on port 1883, say): with --api-key,
when fleetd does not see the device connect; without, when the broker
grants a QoS 2 subscription, which fleetd never does.

Devices come from --provision (created through the API with --url and
--api-key; with --tokens their tokens are also written to that file) or
from --tokens FILE alone (lines "id,token", as written by --provision).
Provisioned devices carry the metadata simulated=true, the --metadata
pairs, and their row of --metadata-file: a CSV whose header is id and the
keys, a row per device (an empty cell sets nothing), such as
  id,ring
  sim-00001,lab
  sim-00002,lab
so that a rollout's metadata phase has a ring to release.

--step paces everything a device does: the reports of an ordinary action
are a --step apart, and a firmware download reads a tenth of the archive
per --step (about ten steps however large it is).`

// simConfig is what the simulator is told.
type simConfig struct {
	devices        int
	mqttAddr       string
	mqttURL        string
	tenant         string
	prefix         string
	provision      bool
	apiURL         string
	apiKey         string
	tokens         string
	metadata       simMetadata // sim_rollout.go
	failRate       float64
	unhealthy      bool
	step           time.Duration
	telemetry      time.Duration
	stream         string
	reportInterval time.Duration
	connectors     int
	checkTimeout   time.Duration // how long fleetd may take to see the first device connect
}

// Run is fleetd sim with its command line args.
func Run(ctx context.Context, args []string, e cli.Env) error {
	var c simConfig
	fs := cli.NewFlagSet("sim", "", simAbout, e)
	fs.IntVar(&c.devices, "devices", 0, "`N` devices to simulate (default: with --provision 10, with --tokens alone every device in the file)")
	fs.StringVar(&c.mqttAddr, "mqtt-addr", "localhost:1883", "`HOST:PORT` of fleetd's MQTT broker")
	fs.StringVar(&c.mqttURL, "mqtt-url", "", "`URL` of the broker, mqtt://host:port (tcp:// works too); wins over --mqtt-addr")
	fs.StringVar(&c.tenant, "tenant", "default", "`TENANT` the devices belong to")
	fs.StringVar(&c.prefix, "prefix", "sim-", "`PREFIX` of the device ids: prefix00001, prefix00002, …")
	fs.BoolVar(&c.provision, "provision", false, "create the devices through the API first (needs --url and --api-key)")
	fs.StringVar(&c.apiURL, "url", "http://localhost:8080", "`URL` of fleetd's HTTP API, for --provision")
	fs.StringVar(&c.apiKey, "api-key", "", "`KEY` of an operator or admin, for --provision")
	fs.StringVar(&c.tokens, "tokens", "", "`FILE` of id,token lines: read it, or with --provision write it")
	fs.Func("metadata", "`KEY=VALUE` of metadata every provisioned device carries; repeatable", c.metadata.add)
	fs.StringVar(&c.metadata.file, "metadata-file", "", "CSV `FILE` of each provisioned device's metadata: a header id,KEY,..., a row per device")
	fs.Float64Var(&c.failRate, "fail-rate", 0, "`FRACTION` (0 to 1) of the devices, chosen stably by id, that fail every action they run")
	fs.BoolVar(&c.unhealthy, "unhealthy-after-update", false, "devices whose update_firmware completed run hot from then on: their telemetry trips a temperature alert")
	fs.DurationVar(&c.step, "step", 500*time.Millisecond, "`DURATION` between a device's status reports on an action")
	fs.DurationVar(&c.telemetry, "telemetry-interval", 5*time.Second, "`DURATION` between a device's telemetry points; 0 sends none")
	fs.StringVar(&c.stream, "stream", "telemetry", "`STREAM` the telemetry goes to")
	fs.DurationVar(&c.reportInterval, "report-interval", 5*time.Second, "`DURATION` between progress lines")
	fs.IntVar(&c.connectors, "connect-parallel", 100, "`N` connections opened at once")
	fs.DurationVar(&c.checkTimeout, "broker-check-timeout", 10*time.Second, "`DURATION` fleetd may take to see the first device connect before sim warns that the broker is not fleetd's")
	fs.Hide("broker-check-timeout")
	if err := fs.Parse(args, e.Getenv); err != nil {
		return err
	}
	if err := fs.Require(0, 0); err != nil {
		return err
	}
	if err := c.check(); err != nil {
		return cli.UsageError("sim: " + err.Error())
	}
	creds, err := c.credentials(ctx)
	if err != nil {
		return err
	}
	s := &sim{cfg: c, out: e.Stdout, broker: c.brokerURL(), handlers: simHandlers()}
	return s.run(ctx, creds)
}

func (c *simConfig) check() error {
	if c.devices == 0 && c.provision {
		c.devices = 10
	}
	switch {
	case c.devices < 0:
		return fmt.Errorf("--devices must be at least 1")
	case c.failRate < 0 || c.failRate > 1:
		return fmt.Errorf("--fail-rate must be between 0 and 1")
	case !fleet.ValidTenantName(c.tenant):
		return fmt.Errorf("--tenant %q is not a tenant name", c.tenant)
	case c.provision && c.apiKey == "":
		return fmt.Errorf("--provision needs --api-key (and --url)")
	case !c.provision && c.tokens == "":
		return fmt.Errorf("say where the devices come from: --provision, or --tokens FILE")
	case !c.provision && (len(c.metadata.all) > 0 || c.metadata.file != ""):
		return fmt.Errorf("--metadata and --metadata-file are given to devices as they are made: with --provision")
	case c.step <= 0 || c.reportInterval <= 0 || c.checkTimeout <= 0 || c.connectors < 1:
		return fmt.Errorf("--step, --report-interval and --broker-check-timeout must be positive, --connect-parallel at least 1")
	case c.telemetry > 0 && !mqtt.ValidStreamName(c.stream):
		return fmt.Errorf("--stream %q is not a stream name", c.stream)
	}
	return nil
}

// brokerURL is the broker as paho wants it.
func (c *simConfig) brokerURL() string {
	if c.mqttURL == "" {
		return "tcp://" + c.mqttAddr
	}
	u := c.mqttURL
	if rest, ok := strings.CutPrefix(u, "mqtt://"); ok {
		u = "tcp://" + rest
	}
	return u
}

// credentials provisions the devices or reads their tokens.
func (c *simConfig) credentials(ctx context.Context) ([]fleet.DeviceToken, error) {
	if !c.provision {
		return readTokens(c.tokens, c.devices)
	}
	ids := make([]string, c.devices)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s%05d", c.prefix, i+1)
	}
	metadata, err := c.metadata.of(ids)
	if err != nil {
		return nil, err
	}
	var toks []fleet.DeviceToken
	for start := 0; start < c.devices; start += 10_000 {
		var devs []map[string]any
		for _, id := range ids[start:min(start+10_000, c.devices)] {
			devs = append(devs, map[string]any{"id": id, "metadata": metadata[id]})
		}
		status, b, err := c.apiDo(ctx, "POST", "/api/v1/devices/bulk", map[string]any{"devices": devs})
		if err != nil {
			return nil, fmt.Errorf("provision devices: %w", err)
		}
		if status != http.StatusCreated {
			hint := ""
			if status == http.StatusConflict {
				hint = " (they exist: use the --tokens file of the run that made them, or another --prefix)"
			}
			return nil, fmt.Errorf("provision devices: %d %s: %s%s", status, http.StatusText(status), bytes.TrimSpace(b), hint)
		}
		var out struct{ Devices []fleet.DeviceToken }
		if err := json.Unmarshal(b, &out); err != nil {
			return nil, fmt.Errorf("provision devices: %w", err)
		}
		toks = append(toks, out.Devices...)
	}
	if c.tokens != "" {
		var b strings.Builder
		for _, t := range toks {
			fmt.Fprintf(&b, "%s,%s\n", t.ID, t.Token)
		}
		if err := os.WriteFile(c.tokens, []byte(b.String()), 0o600); err != nil {
			return nil, fmt.Errorf("write --tokens: %w", err)
		}
	}
	return toks, nil
}

// apiDo makes one request of fleetd's API as --api-key and returns the
// answer's status and body; body, when not nil, is sent as JSON.
func (c *simConfig) apiDo(ctx context.Context, method, path string, body any) (int, []byte, error) {
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(c.apiURL, "/")+path, r)
	if err != nil {
		return 0, nil, fmt.Errorf("--url: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("x-service-tenant", c.tenant)
	req.Header.Set("x-service-api-key", c.apiKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	return resp.StatusCode, b, err
}

// readTokens reads up to n "id,token" lines, every line when n is 0.
func readTokens(path string, n int) ([]fleet.DeviceToken, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--tokens: %w", err)
	}
	defer f.Close()
	var toks []fleet.DeviceToken
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan() && (n == 0 || len(toks) < n); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		id, tok, ok := strings.Cut(text, ",")
		if !ok || !fleet.ValidDeviceID(id) || tok == "" {
			return nil, fmt.Errorf("--tokens %s:%d: want id,token", path, line)
		}
		toks = append(toks, fleet.DeviceToken{ID: id, Token: tok})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("--tokens: %w", err)
	}
	if len(toks) < n || len(toks) == 0 {
		return nil, fmt.Errorf("--tokens %s has %d devices, --devices asks for %d", path, len(toks), max(n, 1))
	}
	return toks, nil
}

// simHandler executes one action on a simulated device; special actions
// (cancel_action, update_firmware) have their own.
type simHandler func(d *simDevice, ctx context.Context, m action.Message)

func simHandlers() map[string]simHandler {
	return map[string]simHandler{
		fleet.ActionCancel:         (*simDevice).cancel,
		fleet.ActionUpdateFirmware: (*simDevice).updateFirmware, // sim_firmware.go
	}
}

// sim is a running simulation.
type sim struct {
	cfg      simConfig
	out      io.Writer
	broker   string
	handlers map[string]simHandler

	connected, received, completed, failed, points, errs atomic.Int64
}

func (s *sim) run(ctx context.Context, creds []fleet.DeviceToken) error {
	devs := make([]*simDevice, len(creds))
	for i, t := range creds {
		devs[i] = &simDevice{sim: s, id: t.ID, token: t.Token, running: map[string]context.CancelFunc{}, seen: map[string]bool{}}
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	// Connect at a bounded pace, then keep going until interrupted.
	probe := s.newBrokerProbe(ctx, devs[0].id)
	devs[0].probe = probe
	sem := make(chan struct{}, s.cfg.connectors)
	for _, d := range devs {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := d.connect(ctx)
			<-sem
			if err != nil {
				s.errs.Add(1)
				fmt.Fprintf(s.out, "sim: %s: %v\n", d.id, err)
				return
			}
			if d.probe != nil {
				wg.Add(1)
				go func() { defer wg.Done(); s.brokerConnected(ctx, d.probe) }()
			}
			d.live(ctx)
		}()
	}
	tick := time.NewTicker(s.cfg.reportInterval)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			s.progress(len(devs))
		case <-ctx.Done():
			s.progress(len(devs))
			return nil
		}
	}
}

func (s *sim) progress(n int) {
	fmt.Fprintf(s.out, "sim: connected=%d/%d actions=%d completed=%d failed=%d points=%d errors=%d\n",
		s.connected.Load(), n, s.received.Load(), s.completed.Load(), s.failed.Load(), s.points.Load(), s.errs.Load())
}

// simDevice is one simulated device.
type simDevice struct {
	sim       *sim
	id, token string
	client    pahov3.Client

	mu        sync.Mutex
	running   map[string]context.CancelFunc // action id -> stop it
	seen      map[string]bool               // action ids received: delivery is at least once
	seq       int64                         // of telemetry points
	unhealthy bool                          // runs hot since an update (--unhealthy-after-update)

	probe    *brokerProbe // the first device checks its broker (sim_broker.go)
	subacked atomic.Bool  // its SUBACK was looked at
}

func (d *simDevice) connect(ctx context.Context) error {
	s := d.sim
	opts := pahov3.NewClientOptions().
		AddBroker(s.broker).
		SetClientID(d.id).
		SetUsername(s.cfg.tenant + "/" + d.id).
		SetPassword(d.token).
		SetProtocolVersion(4).
		SetCleanSession(true).
		SetKeepAlive(60 * time.Second).
		SetAutoReconnect(true).
		SetMaxReconnectInterval(10 * time.Second).
		SetConnectTimeout(30 * time.Second).
		SetOrderMatters(false).
		// Subscribe after every CONNACK: fleetd sends what waits for the
		// device once it has.
		SetOnConnectHandler(func(cl pahov3.Client) {
			s.connected.Add(1)
			d.subscribeDelta(cl)
			if d.probe != nil && !d.probe.byAPI && !d.subacked.Swap(true) {
				s.subscribeProbe(cl, d)
				return
			}
			cl.Subscribe(mqtt.ActionsTopic(s.cfg.tenant, d.id), 1, d.onAction)
		}).
		SetConnectionLostHandler(func(pahov3.Client, error) { s.connected.Add(-1) })
	d.client = pahov3.NewClient(opts)
	tok := d.client.Connect()
	select {
	case <-tok.Done():
	case <-ctx.Done():
		return ctx.Err()
	}
	return tok.Error()
}

// live publishes telemetry until ctx ends, then disconnects.
func (d *simDevice) live(ctx context.Context) {
	defer d.client.Disconnect(250)
	if d.sim.cfg.telemetry <= 0 {
		<-ctx.Done()
		return
	}
	// Spread the fleet's points over the interval.
	first := time.Duration(rand.Int64N(int64(d.sim.cfg.telemetry)))
	t := time.NewTimer(first)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		d.publishPoint()
		t.Reset(d.sim.cfg.telemetry)
	}
}

func (d *simDevice) publishPoint() {
	d.mu.Lock()
	d.seq++
	seq := d.seq
	d.mu.Unlock()
	pt := []map[string]any{{
		"timestamp":   time.Now().UnixMilli(),
		"sequence":    seq,
		"temperature": d.temperature(),
		"humidity":    40 + 20*rand.Float64(),
	}}
	b, _ := json.Marshal(pt)
	tok := d.client.Publish(mqtt.StreamTopic(d.sim.cfg.tenant, d.id, d.sim.cfg.stream), 1, false, b)
	go func() {
		if tok.WaitTimeout(30*time.Second) && tok.Error() == nil {
			d.sim.points.Add(1)
		} else {
			d.sim.errs.Add(1)
		}
	}()
}

// onAction runs on paho's goroutine: it must not block.
func (d *simDevice) onAction(_ pahov3.Client, msg pahov3.Message) {
	var m action.Message
	if err := json.Unmarshal(msg.Payload(), &m); err != nil || m.ID == "" {
		d.sim.errs.Add(1)
		return
	}
	d.mu.Lock()
	if d.seen[m.ID] {
		d.mu.Unlock()
		return
	}
	d.seen[m.ID] = true
	ctx, cancel := context.WithCancel(context.Background())
	d.running[m.ID] = cancel
	d.mu.Unlock()
	d.sim.received.Add(1)
	h := d.sim.handlers[m.Name]
	if h == nil {
		h = (*simDevice).execute
	}
	go func() {
		defer func() {
			d.mu.Lock()
			delete(d.running, m.ID)
			d.mu.Unlock()
			cancel()
		}()
		h(d, ctx, m)
	}()
}

// execute is what a device does with an ordinary action.
func (d *simDevice) execute(ctx context.Context, m action.Message) {
	var seq int64
	report := func(state string, progress int, errs ...string) bool {
		seq++
		return d.report(m.ID, state, progress, seq, errs...)
	}
	if !report("Received", 0) {
		return
	}
	for p := 20; p <= 80; p += 20 {
		select {
		case <-time.After(d.sim.cfg.step):
		case <-ctx.Done():
			return // cancelled: the cancellation reports
		}
		if !report("Downloading", p) {
			return
		}
	}
	select {
	case <-time.After(d.sim.cfg.step):
	case <-ctx.Done():
		return
	}
	if d.fails() {
		if report("Failed", 80, "simulated failure") {
			d.sim.failed.Add(1)
		}
		return
	}
	if report("Completed", 100) {
		d.sim.completed.Add(1)
	}
}

// cancel stops the action a cancel_action names and reports the
// cancellation done, as the uplink agent does.
func (d *simDevice) cancel(_ context.Context, m action.Message) {
	var p struct {
		ActionID string `json:"action_id"`
	}
	json.Unmarshal([]byte(m.Payload), &p)
	d.mu.Lock()
	stop, ok := d.running[p.ActionID]
	d.mu.Unlock()
	if ok {
		stop()
	}
	d.report(m.ID, "Received", 0, 1)
	if d.report(m.ID, "Completed", 100, 2) {
		d.sim.completed.Add(1)
	}
}

// report publishes one status report and waits for its acknowledgement.
func (d *simDevice) report(id, state string, progress int, seq int64, errs ...string) bool {
	if errs == nil {
		errs = []string{}
	}
	b, _ := json.Marshal([]map[string]any{{
		"id": id, "state": state, "progress": progress, "errors": errs,
		"timestamp": time.Now().UnixMilli(), "sequence": seq,
	}})
	tok := d.client.Publish(mqtt.ActionStatusTopic(d.sim.cfg.tenant, d.id), 1, false, b)
	if !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		d.sim.errs.Add(1)
		return false
	}
	return true
}
