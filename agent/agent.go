// Package agent is fleetd-agent, the program a Linux device runs to be
// managed by fleetd: it speaks the device protocol of
// docs/device-protocol.md over MQTT, runs actions, and sends streams.
// Nothing of the server is linked in (cmd/fleetd-agent's test holds it to
// that); the topics come from package mqtt, which is what the protocol is.
package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/fleetd/fleet/mqtt"
)

// Exit codes of Run.
const (
	ExitOK    = 0
	ExitError = 1 // the agent could not start, or stopped on an error
	ExitUsage = 2 // the command line or configuration cannot be run
)

// Run runs the agent with args (without the program name) until ctx ends,
// and returns its exit code.
func Run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	cfg, fs, err := parseConfig(args, getenv)
	if errors.Is(err, errHelp) {
		fmt.Fprint(stdout, usage(fs))
		return ExitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "fleetd-agent: %v\n", err)
		return ExitUsage
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.LogLevel)); err != nil {
		fmt.Fprintf(stderr, "fleetd-agent: --log-level: %v\n", err)
		return ExitUsage
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	a := &Agent{cfg: cfg, log: log, running: map[string]*run{}, seen: newRecent(1024), now: time.Now}
	if err := a.run(ctx); err != nil {
		log.Error("fleetd-agent stopped", "err", err)
		return ExitError
	}
	return ExitOK
}

// Agent is one device's connection to fleetd and what runs through it.
type Agent struct {
	cfg    *Config
	base   context.Context // the agent's own, for what outlives an action (remote sessions)
	log    *slog.Logger
	client paho.Client
	now    func() time.Time

	mu      sync.Mutex
	running map[string]*run // by action id
	seen    *recent
	seq     int64 // the last report's sequence

	// configMu runs one update_config at a time; configApplied is the
	// newest action id it applied, so an older state arriving late does
	// not replace a newer one.
	configMu      sync.Mutex
	configApplied int64

	reports chan outgoing
	stopped <-chan struct{} // closed when the agent stops
	wg      sync.WaitGroup
}

// message is an action as fleetd sends it: payload is the params as JSON
// text, to be parsed again (docs/device-protocol.md, Messages).
type message struct {
	ID      string `json:"id"`
	Kind    string `json:"kind"`
	Name    string `json:"name"`
	Payload string `json:"payload"`
}

// report is a status report on an action.
type report struct {
	ActionID  string   `json:"action_id"`
	State     string   `json:"state"`
	Progress  int      `json:"progress"`
	Errors    []string `json:"errors"`
	Timestamp int64    `json:"timestamp"`
	Sequence  int64    `json:"sequence"`
}

// outgoing is one publish waiting for its acknowledgement.
type outgoing struct {
	topic   string
	payload []byte
}

func (a *Agent) run(ctx context.Context) error {
	opts, err := a.clientOptions()
	if err != nil {
		return err
	}
	a.reports = make(chan outgoing, 256)
	actions := make(chan message, 64)
	opts.SetOnConnectHandler(func(c paho.Client) {
		// Sessions end with their connection: subscribe after every
		// CONNACK, and fleetd sends what waits.
		tok := c.Subscribe(mqtt.ActionsTopic(a.cfg.Tenant, a.cfg.Device), 1, func(_ paho.Client, m paho.Message) {
			var msg message
			if err := json.Unmarshal(m.Payload(), &msg); err != nil || msg.ID == "" || msg.Name == "" {
				a.log.Warn("an action fleetd sent is not understood", "payload", string(m.Payload()), "err", err)
				return
			}
			select {
			case actions <- msg:
			case <-ctx.Done():
			}
		})
		go func() {
			if tok.WaitTimeout(30*time.Second) && tok.Error() == nil {
				a.log.Info("connected", "mqtt", a.cfg.MQTTAddr, "tenant", a.cfg.Tenant, "device", a.cfg.Device)
				return
			}
			a.log.Error("subscribing to actions failed; reconnecting", "err", tok.Error())
			c.Disconnect(0) // auto-reconnect subscribes again
		}()
	})
	opts.SetConnectionLostHandler(func(_ paho.Client, err error) {
		a.log.Warn("connection to fleetd lost; reconnecting", "err", err)
	})
	a.client = paho.NewClient(opts)
	a.client.Connect() // with ConnectRetry, it keeps trying in the background

	ctx, stop := context.WithCancel(ctx)
	defer stop()
	a.stopped = ctx.Done()
	a.base = ctx
	a.wg.Add(1)
	go func() { defer a.wg.Done(); a.publishLoop(ctx, a.reports) }()
	a.startStreams(ctx)

	for {
		select {
		case m := <-actions:
			a.receive(ctx, m)
		case <-ctx.Done():
			a.mu.Lock()
			for _, r := range a.running {
				r.cancel(errStopping)
			}
			a.mu.Unlock()
			a.wg.Wait()
			a.client.Disconnect(500)
			return nil
		}
	}
}

func (a *Agent) clientOptions() (*paho.ClientOptions, error) {
	opts := paho.NewClientOptions().
		SetClientID(a.cfg.Device).
		SetProtocolVersion(4).
		SetCleanSession(true).
		SetKeepAlive(30 * time.Second).
		SetAutoReconnect(true).
		SetConnectRetry(true).
		SetConnectRetryInterval(time.Second).
		SetMaxReconnectInterval(30 * time.Second).
		SetOrderMatters(false)
	if a.cfg.Token != "" {
		opts.SetUsername(a.cfg.Tenant + "/" + a.cfg.Device).SetPassword(a.cfg.Token)
	}
	if addr, ok := strings.CutPrefix(a.cfg.MQTTAddr, "mqtts://"); ok {
		tc, err := a.tlsConfig()
		if err != nil {
			return nil, err
		}
		opts.AddBroker("ssl://" + addr).SetTLSConfig(tc)
	} else {
		opts.AddBroker("tcp://" + strings.TrimPrefix(a.cfg.MQTTAddr, "mqtt://"))
	}
	return opts, nil
}

// tlsConfig verifies fleetd with --ca-file (or the system's roots) and
// presents the device's certificate when one is configured.
func (a *Agent) tlsConfig() (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if a.cfg.CAFile != "" {
		pem, err := os.ReadFile(a.cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("--ca-file: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--ca-file %s holds no PEM certificate", a.cfg.CAFile)
		}
	}
	if a.cfg.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(a.cfg.CertFile, a.cfg.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("client certificate: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// report queues a status report on action id. Reports carry the time and
// a sequence, so fleetd applies them in order even when one is sent again.
func (a *Agent) report(id, state string, progress int, errs ...string) {
	a.mu.Lock()
	a.seq++
	r := report{ActionID: id, State: state, Progress: progress, Errors: errs, Timestamp: a.now().UnixMilli(), Sequence: a.seq}
	a.mu.Unlock()
	if r.Errors == nil {
		r.Errors = []string{}
	}
	b, _ := json.Marshal(r)
	a.log.Debug("report", "action", id, "state", state, "progress", progress)
	select {
	case a.reports <- outgoing{mqtt.ActionStatusTopic(a.cfg.Tenant, a.cfg.Device), b}:
	case <-a.stopped:
	}
}

// ackTimeout is how long a publish waits for its PUBACK before it is sent
// again; fleetd disconnects a device it cannot write to within 10 s.
const ackTimeout = 15 * time.Second

// publishLoop publishes what is queued on q, in order, each at QoS 1 until
// fleetd acknowledges it (that is, has committed it), across reconnections.
func (a *Agent) publishLoop(ctx context.Context, q <-chan outgoing) {
	for {
		var o outgoing
		select {
		case o = <-q:
		case <-ctx.Done():
			// Whatever is queued gets a last chance, briefly.
			for {
				select {
				case o := <-q:
					a.client.Publish(o.topic, 1, false, o.payload).WaitTimeout(time.Second)
				default:
					return
				}
			}
		}
		for wait := 100 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
			// Published only on an open connection: the client keeps what
			// is published while it connects, and a clean session's
			// CONNACK drops it without completing its token.
			for !a.client.IsConnectionOpen() {
				select {
				case <-time.After(50 * time.Millisecond):
				case <-ctx.Done():
					return
				}
			}
			tok := a.client.Publish(o.topic, 1, false, o.payload)
			acked := false
			select {
			case <-tok.Done():
				// Not tok.WaitTimeout(0): it races a zero timer against
				// the done channel and says "not done" half the time.
				acked = tok.Error() == nil
			case <-time.After(ackTimeout):
			case <-ctx.Done():
				return
			}
			if acked {
				break
			}
			a.log.Debug("publish not acknowledged; retrying", "topic", o.topic, "err", tok.Error())
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return
			}
		}
	}
}

// recent remembers the last n action ids, for deduplication: fleetd
// delivers at least once.
type recent struct {
	ids  map[string]bool
	ring []string
	next int
}

func newRecent(n int) *recent { return &recent{ids: map[string]bool{}, ring: make([]string, n)} }

// add reports whether id is new, and remembers it.
func (r *recent) add(id string) bool {
	if r.ids[id] {
		return false
	}
	delete(r.ids, r.ring[r.next])
	r.ring[r.next] = id
	r.next = (r.next + 1) % len(r.ring)
	r.ids[id] = true
	return true
}
