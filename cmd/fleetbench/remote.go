package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/creack/pty"

	"github.com/fleetd/fleet/agent"
	"github.com/fleetd/fleet/ctl"
	"github.com/fleetd/fleet/remote"
)

// Remote access (docs/agent.md, Remote access): each goal of the ratio
// against a baseline in the same run, or of the value.
var (
	goalRemoteIdle      = goal{sqlite: 1000, postgres: 1000, atLeast: true} // sessions open at once on one replica
	goalRemoteMemory    = goal{sqlite: 64, postgres: 64}                    // KiB per idle session
	goalRemoteForward   = goal{sqlite: 0.5, postgres: 0.5, atLeast: true, ofRatio: true}
	goalRemoteKeystroke = goal{sqlite: 2, postgres: 2} // ms added at p99
	goalRemoteSetup     = goal{sqlite: 1000, postgres: 1000}
)

// remote measures remote sessions through fleetd-agents run in this
// process (package agent, what cmd/fleetd-agent runs), connected to fleetd
// as devices are: idle sessions open at once and fleetd's memory for
// each, a session's set-up, a port forward's throughput through fleetctl
// forward (package ctl) against a direct loopback copy, and a keystroke's
// round trip through a terminal against the same keystroke on a pty of
// this process.
func (r *runner) remote(ctx context.Context) error {
	if !r.t.managed {
		r.p.say("remote: the fleetd measured must run with --remote-max-per-user and --remote-max-per-device of at least %d", r.sz.remoteSessions+2)
	}
	dev := r.sz.remoteDevices
	toks, err := r.admin.provision(ctx, ids("ra-"+r.runID, dev+1), nil, r.p, "remote: provisioned devices")
	if err != nil {
		return err
	}
	actx, stop := context.WithCancel(ctx)
	agents := &agentGroup{}
	defer agents.wait()
	defer stop()
	// The last agent's terminal runs cat: a keystroke is echoed by its
	// pty, with no prompt in between.
	if err := agents.start(actx, r, toks[:dev]); err != nil {
		return err
	}
	if err := agents.start(actx, r, toks[dev:], "--remote-shell", "/bin/cat"); err != nil {
		return err
	}
	svc, err := startDeviceServices()
	if err != nil {
		return err
	}
	defer svc.close()
	if err := r.remoteIdle(ctx, toks[:dev], svc); err != nil {
		return err
	}
	if err := r.remoteForward(ctx, toks[0].ID, svc); err != nil {
		return err
	}
	return r.remoteKeystroke(ctx, toks[dev].ID)
}

// agentGroup is fleetd-agents running in this process.
type agentGroup struct {
	wg sync.WaitGroup
}

// start runs an agent per device of toks with extra flags, and returns
// once each has subscribed to its actions.
func (g *agentGroup) start(ctx context.Context, r *runner, toks []deviceToken, extra ...string) error {
	failed := make(chan error, len(toks))
	connected := make([]*logWatch, len(toks))
	for i, tok := range toks {
		args := append([]string{"--server", r.t.url, "--mqtt-addr", r.t.mqttAddr, "--tenant", r.t.tenant, "--device", tok.ID,
			"--remote", "--remote-root", r.dir, "--log-level", "info"}, extra...)
		getenv := func(k string) string {
			if k == "FLEETD_AGENT_TOKEN" {
				return tok.Token
			}
			return ""
		}
		w := &logWatch{want: []byte("msg=connected"), seen: make(chan struct{})}
		connected[i] = w
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			if code := agent.Run(ctx, args, getenv, io.Discard, w); code != agent.ExitOK {
				failed <- fmt.Errorf("fleetd-agent of %s exited %d: %s", tok.ID, code, w.last())
			}
		}()
	}
	deadline := time.After(time.Minute)
	for i, w := range connected {
		select {
		case <-w.seen:
		case err := <-failed:
			return err
		case <-deadline:
			return fmt.Errorf("fleetd-agent of %s did not connect within a minute: %s", toks[i].ID, w.last())
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	r.p.say("remote: %d fleetd-agents connected", len(toks))
	return nil
}

func (g *agentGroup) wait() { g.wg.Wait() }

// logWatch is an agent's log: it says when a line holds want, and keeps
// the last line for an error.
type logWatch struct {
	want []byte
	seen chan struct{}
	once sync.Once
	mu   sync.Mutex
	tail []byte
}

func (w *logWatch) Write(p []byte) (int, error) {
	// The line is kept before it is said to have come: fleetctl
	// forward's address is read with last() once seen is closed.
	w.mu.Lock()
	w.tail = append(w.tail[:0], p...)
	w.mu.Unlock()
	if len(w.want) > 0 && bytes.Contains(p, w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

func (w *logWatch) last() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.TrimSpace(string(w.tail))
}

// deviceServices are the TCP services a device's forwards reach, on this
// machine's loopback as the agent dials them: echo answers what it gets;
// sink swallows everything and answers, at the end, how many bytes.
type deviceServices struct {
	echo, sink net.Listener
}

func startDeviceServices() (*deviceServices, error) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	sink, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		echo.Close()
		return nil, err
	}
	serve := func(ln net.Listener, h func(c net.Conn)) {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); h(c) }()
		}
	}
	go serve(echo, func(c net.Conn) { io.Copy(c, c) })
	go serve(sink, func(c net.Conn) {
		// The round's label (profiles: -tagfocus round=direct or
		// forwarded), set before the round's connection is made.
		pprof.Do(context.Background(), pprof.Labels("round", sinkRound.Load().(string)), func(context.Context) {
			n, _ := io.Copy(io.Discard, c)
			fmt.Fprintf(c, "%d\n", n)
		})
	})
	return &deviceServices{echo: echo, sink: sink}, nil
}

func (s *deviceServices) close() { s.echo.Close(); s.sink.Close() }

// sinkRound is the forward's round being sent, direct or forwarded: the
// sink service's and the sender's CPU profile label.
var sinkRound atomic.Value

func init() { sinkRound.Store("") }

func port(ln net.Listener) string {
	_, p, _ := net.SplitHostPort(ln.Addr().String())
	return p
}

// openSession opens a remote session with device and joins it as its
// operator, as fleetctl does (docs/api.md, Remote sessions).
func (r *runner) openSession(ctx context.Context, device, kind, target string) (*remote.Conn, error) {
	var s struct {
		ID string `json:"id"`
	}
	if err := r.admin.call(ctx, "POST", "/api/v1/devices/"+url.PathEscape(device)+"/remote-sessions",
		map[string]string{"kind": kind, "target": target}, http.StatusCreated, &s); err != nil {
		return nil, err
	}
	h := http.Header{"X-Service-Tenant": {r.admin.tenant}, "X-Service-Api-Key": {r.admin.key}}
	return remote.Dial(ctx, r.admin.base+"/api/v1/remote-sessions/"+url.PathEscape(s.ID)+"/operator", h, nil)
}

// echoed sends b on c and reads until as many bytes came back, which must
// be want.
func echoed(c *remote.Conn, b, want []byte) error {
	if err := c.Write(b); err != nil {
		return err
	}
	var got []byte
	for len(got) < len(want) {
		data, m, err := c.Read()
		if err != nil {
			return err
		}
		if m != nil && m.Type == remote.TypeError {
			return errors.New(m.Message)
		}
		got = append(got, data...)
	}
	if !bytes.Equal(got, want) {
		return fmt.Errorf("sent %q, %q came back", b, got)
	}
	return nil
}

// fleetdMemory is fleetd's memory at one moment, after a garbage
// collection when its pprof listener is known.
type fleetdMemory struct {
	rss, heap, stacks, goroutines, sessions float64
}

func (r *runner) readFleetdMemory(ctx context.Context) (fleetdMemory, error) {
	if r.t.pprof != "" {
		// The heap profile's gc=1 collects first; twice, so that the
		// stacks of goroutines idle since the first shrink too.
		for range 2 {
			resp, err := http.Get(r.t.pprof + "/debug/pprof/heap?gc=1")
			if err != nil {
				return fleetdMemory{}, err
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	rss, _, _, err := r.residentMemory(ctx)
	if err != nil {
		return fleetdMemory{}, err
	}
	m, err := scrape(ctx, r.t.url, []string{"go_memstats_heap_inuse_bytes", "go_memstats_stack_inuse_bytes", "go_goroutines", "fleetd_remote_sessions_open"})
	if err != nil {
		return fleetdMemory{}, err
	}
	return fleetdMemory{rss: rss * (1 << 20), heap: m["go_memstats_heap_inuse_bytes"], stacks: m["go_memstats_stack_inuse_bytes"],
		goroutines: m["go_goroutines"], sessions: m["fleetd_remote_sessions_open"]}, nil
}

// remoteIdle opens the idle sessions (forwards to the echo service, each
// proven by a byte echoed), the first ones one at a time for their
// set-up time, and reads fleetd's memory before and after.
func (r *runner) remoteIdle(ctx context.Context, toks []deviceToken, svc *deviceServices) error {
	n, target := r.sz.remoteSessions, port(svc.echo)
	device := func(i int) string { return toks[i%len(toks)].ID }
	// A first session warms what every session uses once (pools, the
	// handlers' first allocations) out of the memory measured.
	warm, err := r.openSession(ctx, device(0), "forward", target)
	if err != nil {
		return err
	}
	if err := echoed(warm, []byte("w"), []byte("w")); err != nil {
		return fmt.Errorf("the first remote session: %w", err)
	}
	warm.Close()
	if err := r.awaitNoSessions(ctx); err != nil {
		return err
	}
	load0 := loadAverage()
	before, err := r.readFleetdMemory(ctx)
	if err != nil {
		return err
	}
	r.snapshot("remote-before")
	conns := make([]*remote.Conn, n)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	open := func(ctx context.Context, i int) error {
		c, err := r.openSession(ctx, device(i), "forward", target)
		if err != nil {
			return fmt.Errorf("remote session %d: %w", i, err)
		}
		conns[i] = c
		if err := echoed(c, []byte("s"), []byte("s")); err != nil {
			return fmt.Errorf("remote session %d: %w", i, err)
		}
		return nil
	}
	seq := min(n, r.sz.remoteSetups)
	setups := make(latencies, 0, seq)
	for i := range seq {
		t0 := time.Now()
		if err := open(ctx, i); err != nil {
			return err
		}
		setups = append(setups, time.Since(t0))
	}
	slices.Sort(setups)
	r.p.say("remote: %d sessions set up one at a time, p50 %.1f ms; opening %d more, 16 at a time", seq, ms(setups.percentile(50)), n-seq)
	t0 := time.Now()
	if err := parallel(ctx, n-seq, 16, func(ctx context.Context, i int) error { return open(ctx, seq+i) }); err != nil {
		return err
	}
	rest := time.Since(t0)
	after, err := r.readFleetdMemory(ctx)
	if err != nil {
		return err
	}
	r.snapshot("remote-idle") // go tool pprof -sample_index inuse_space -base remote-before-heap.pprof remote-idle-heap.pprof
	// Every session still answers: they were open, not merely counted.
	if err := parallel(ctx, n, 16, func(_ context.Context, i int) error {
		if err := echoed(conns[i], []byte("i"), []byte("i")); err != nil {
			return fmt.Errorf("idle remote session %d: %w", i, err)
		}
		return nil
	}); err != nil {
		return err
	}
	load := loadNote(load0)
	judge(r.rep.add(&figure{Scenario: "remote", Name: "remote sessions open at once on one replica, idle (port forwards, each answering)",
		Value: float64(n), Unit: sessionsUnit, Note: joinNotes(fmt.Sprintf("fleetd counted %.0f open", after.sessions), load)}), r.t.dialect, goalRemoteIdle, "")
	rss, heap := (after.rss-before.rss)/float64(n), (after.heap+after.stacks-before.heap-before.stacks)/float64(n)
	how := "VmRSS"
	if r.t.pid == 0 {
		how = "process_resident_memory_bytes"
	}
	gc := "after two garbage collections (pprof heap?gc=1)"
	if r.t.pprof == "" {
		gc = "without a forced collection (fleetd's pprof listener unknown)"
	}
	judge(r.rep.add(&figure{Scenario: "remote", Name: "fleetd's memory per idle remote session (both legs)", Value: max(rss, heap) / 1024, Unit: kibibytes,
		Note: joinNotes(fmt.Sprintf("the larger of the %s growth (%.1f KiB a session) and the Go heap in use plus goroutine stacks (%.1f KiB: heap %.1f, stacks %.1f), %s, over %d sessions, both read %s",
			how, rss/1024, heap/1024, (after.heap-before.heap)/float64(n)/1024, (after.stacks-before.stacks)/float64(n)/1024, gc, n, "before the first and after the last session opened"),
			fmt.Sprintf("%.1f goroutines a session", (after.goroutines-before.goroutines)/float64(n)),
			"socket buffers are the kernel's, in neither figure", load)}), r.t.dialect, goalRemoteMemory, "")
	judge(r.rep.add(&figure{Scenario: "remote", Name: "remote session set-up for a connected device, p99 (POST to a byte echoed through a forward)",
		Value: ms(setups.percentile(99)), Unit: millis,
		Note: joinNotes(fmt.Sprintf("%d sessions one at a time: p50 %.1f ms, max %.1f ms; the other %d, 16 at a time, took %.1f ms each on average",
			seq, ms(setups.percentile(50)), ms(setups[len(setups)-1]), n-seq, ms(rest)/float64(max(1, n-seq))), load)}), r.t.dialect, goalRemoteSetup, "")
	return nil
}

// awaitNoSessions returns once fleetd counts no remote session open: the
// ones closed before have ended, their store's work done.
func (r *runner) awaitNoSessions(ctx context.Context) error {
	return waitFor(ctx, time.Minute, func() (bool, error) {
		m, err := scrape(ctx, r.t.url, []string{"fleetd_remote_sessions_open"})
		return err == nil && m["fleetd_remote_sessions_open"] == 0, err
	})
}

// remoteForward sends the same bytes to the sink service directly and
// through fleetctl forward (run in this process), fleetd and the agent,
// in alternating rounds, and compares the rates.
func (r *runner) remoteForward(ctx context.Context, device string, svc *deviceServices) error {
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	out, errOut := &logWatch{want: []byte("127.0.0.1:"), seen: make(chan struct{})}, &logWatch{}
	cfg, err := os.MkdirTemp(r.dir, "fleetctl-")
	if err != nil {
		return err
	}
	env := map[string]string{"FLEETCTL_URL": r.admin.base, "FLEETCTL_TENANT": r.admin.tenant, "FLEETCTL_API_KEY": r.admin.key, "XDG_CONFIG_HOME": cfg}
	done := make(chan int, 1)
	go func() {
		done <- ctl.Run(fctx, []string{"forward", device, "0:" + port(svc.sink)},
			ctl.Env{Getenv: func(k string) string { return env[k] }, Stdin: strings.NewReader(""), Stdout: out, Stderr: errOut})
	}()
	defer func() { cancel(); <-done }()
	select {
	case <-out.seen:
	case code := <-done:
		done <- code
		return fmt.Errorf("fleetctl forward exited %d: %s", code, errOut.last())
	case <-time.After(30 * time.Second):
		return errors.New("fleetctl forward did not listen within 30 s")
	}
	local := out.last()
	// The idle sessions, closed as the forward starts, end first: their
	// ends (fleetd's store) were in the first rounds' time and CPU.
	if err := r.awaitNoSessions(ctx); err != nil {
		return err
	}
	size := r.sz.forwardBytes
	load0 := loadAverage()
	// Rounds alternate, and the verdict is on the median of each pair's
	// ratio: the machine's speed moves between rounds more than within
	// a pair.
	var direct, forwarded time.Duration
	var ratios []float64
	stopProfile := r.selfProfile("remote-forward")
	// The CPU each way takes, in this process (sender, service, and for
	// the forward fleetctl and the agent) and fleetd.
	cpu := func() float64 { return procCPU(os.Getpid()) + procCPU(r.t.pid) }
	var cpuDirect, cpuForward, cpuFleetd float64
	for range r.sz.forwardRounds {
		c0 := cpu()
		d, err := sendRound("direct", svc.sink.Addr().String(), size)
		if err != nil {
			return err
		}
		c1, d1 := cpu(), procCPU(r.t.pid)
		f, err := sendRound("forwarded", local, size)
		if err != nil {
			return fmt.Errorf("%w (fleetctl: %s)", err, errOut.last())
		}
		cpuDirect, cpuForward, cpuFleetd = cpuDirect+c1-c0, cpuForward+cpu()-c1, cpuFleetd+procCPU(r.t.pid)-d1
		direct, forwarded = direct+d, forwarded+f
		ratios = append(ratios, d.Seconds()/f.Seconds())
	}
	stopProfile()
	slices.Sort(ratios)
	total := float64(size*r.sz.forwardRounds) / (1 << 20)
	load := loadNote(load0)
	r.rep.addBaseline("loopback-copy", "loopback copy", &figure{Name: fmt.Sprintf("a direct loopback TCP copy to the same service, %d rounds of %d MiB", r.sz.forwardRounds, size>>20),
		Value: total / direct.Seconds(), Unit: mibPerSecond, Note: load})
	f := r.rep.add(&figure{Scenario: "remote", Name: "port forward through fleetctl, fleetd and fleetd-agent ÷ a direct loopback copy (median of rounds)",
		Value: total / forwarded.Seconds(), Unit: mibPerSecond,
		Note: joinNotes(fmt.Sprintf("%d rounds of %d MiB each way round, alternating; each round's ratio from %.0f%% to %.0f%%; fleetctl and the agent run in fleetbench's process",
			r.sz.forwardRounds, size>>20, 100*ratios[0], 100*ratios[len(ratios)-1]),
			fmt.Sprintf("CPU a MiB (fleetbench and fleetd): direct %.2f ms, forwarded %.2f ms, of which fleetd %.2f ms", 1000*cpuDirect/total, 1000*cpuForward/total, 1000*cpuFleetd/total), load)})
	r.rep.compare(f, "loopback-copy")
	f.Ratio = ratios[len(ratios)/2]
	judge(f, r.t.dialect, goalRemoteForward, "")
	return nil
}

// selfProfile takes fleetbench's own CPU profile (where the agents and
// fleetctl run) and fleetd's, under --profile, until the returned
// function is called.
func (r *runner) selfProfile(name string) func() {
	if !r.profiling() {
		return func() {}
	}
	f, err := os.Create(filepath.Join(r.o.profile, name+"-fleetbench-cpu.pprof"))
	if err != nil {
		r.p.say("profile: %v", err)
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		r.p.say("profile: %v", err)
		return func() {}
	}
	// fleetd's profile has its own length; the forward's rounds take
	// about this long.
	wait := r.profile(name, 5*time.Second)
	return func() {
		pprof.StopCPUProfile()
		f.Close()
		wait()
	}
}

// sendRound is sendTo under the round's label, the sender's and the sink
// service's (fleetbench --profile: go tool pprof -tagfocus round=direct).
func sendRound(round, addr string, n int) (d time.Duration, err error) {
	sinkRound.Store(round)
	pprof.Do(context.Background(), pprof.Labels("round", round), func(context.Context) { d, err = sendTo(addr, n) })
	return d, err
}

// sendTo sends n bytes to the sink service at addr and returns how long
// it took until the service said it had them all.
func sendTo(addr string, n int) (time.Duration, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	buf := make([]byte, 64<<10)
	t0 := time.Now()
	for sent := 0; sent < n; sent += len(buf) {
		if _, err := c.Write(buf[:min(len(buf), n-sent)]); err != nil {
			return 0, err
		}
	}
	c.(*net.TCPConn).CloseWrite()
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != fmt.Sprintf("%d\n", n) {
		return 0, fmt.Errorf("sending %d bytes to %s: the service answered %q, %v", n, addr, line, err)
	}
	return time.Since(t0), nil
}

// keystrokes alternate: a letter, echoed as it is, and the erase key,
// echoed as backspace, space, backspace (the pty's ECHOE); the line stays
// empty.
var keystrokes = [][2][]byte{{[]byte("x"), []byte("x")}, {[]byte{0x7f}, []byte("\b \b")}}

// remoteKeystroke types into a terminal session (the agent's pty, running
// cat) and into a pty of this process running the same program, one
// keystroke each in turn, and compares the round trips' p99.
func (r *runner) remoteKeystroke(ctx context.Context, device string) error {
	c, err := r.openSession(ctx, device, "shell", "")
	if err != nil {
		return err
	}
	defer c.Close()
	cmd := exec.Command("/bin/cat")
	f, err := pty.Start(cmd)
	if err != nil {
		return fmt.Errorf("a local pty: %w", err)
	}
	defer func() { f.Close(); cmd.Process.Kill(); cmd.Wait() }()
	local := func(b, want []byte) error {
		if _, err := f.Write(b); err != nil {
			return err
		}
		got := make([]byte, 0, len(want))
		buf := make([]byte, 64)
		for len(got) < len(want) {
			n, err := f.Read(buf)
			if err != nil {
				return err
			}
			got = append(got, buf[:n]...)
		}
		if !bytes.Equal(got, want) {
			return fmt.Errorf("local pty: sent %q, %q came back", b, got)
		}
		return nil
	}
	n := r.sz.keystrokes
	through, direct := make(latencies, 0, n), make(latencies, 0, n)
	load0 := loadAverage()
	for i := -20; i < n; i++ { // 20 unmeasured
		k := keystrokes[(i+20)%2]
		t0 := time.Now()
		if err := echoed(c, k[0], k[1]); err != nil {
			return fmt.Errorf("keystroke through the terminal session: %w", err)
		}
		t1 := time.Now()
		if err := local(k[0], k[1]); err != nil {
			return err
		}
		if i >= 0 {
			through, direct = append(through, t1.Sub(t0)), append(direct, time.Since(t1))
		}
	}
	slices.Sort(through)
	slices.Sort(direct)
	load := loadNote(load0)
	r.rep.addBaseline("pty-echo", "local pty", &figure{Name: fmt.Sprintf("a keystroke echoed by a pty of this process running cat, p99 of %d", n),
		Value: ms(direct.percentile(99)), Unit: millis, Note: joinNotes(fmt.Sprintf("p50 %.3f ms", ms(direct.percentile(50))), load)})
	// What fleetd and the agent add: the round trip's p99 less what the
	// pty itself takes, typically. (Less the pty's own p99 would take
	// the machine's pauses away twice, and can come out below zero.)
	added := ms(through.percentile(99) - direct.percentile(50))
	// The target is of the difference, not of a ratio: the baseline
	// column names what was taken away.
	judge(r.rep.add(&figure{Scenario: "remote", Name: "keystroke round trip added by fleetd and the agent: a terminal session's p99 less a local pty's p50",
		Value: added, Unit: millis, Baseline: "local pty",
		Note: joinNotes(fmt.Sprintf("through the operator's WebSocket, fleetd, the agent's and its pty: p50 %.3f ms, p99 %.3f ms; direct: p50 %.3f ms, p99 %.3f ms; %d keystrokes each, alternating",
			ms(through.percentile(50)), ms(through.percentile(99)), ms(direct.percentile(50)), ms(direct.percentile(99)), n), load)}), r.t.dialect, goalRemoteKeystroke, "")
	return nil
}

// loadAverage is the machine's one-minute load average, or -1.
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	var l float64
	fmt.Sscan(string(b), &l)
	return l
}

// loadNote says how loaded the machine was from load0 (at the start of a
// measurement) to now.
func loadNote(load0 float64) string {
	return fmt.Sprintf("load average %.1f at the start, %.1f at the end", load0, loadAverage())
}
