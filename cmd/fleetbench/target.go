package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"
)

// target is the fleetd being measured.
type target struct {
	url      string // http://host:port
	mqttAddr string
	tenant   string // the tenant most scenarios provision into
	adminKey string
	// dispatchTenants are empty tenants of their own for the dispatch
	// scenarios, name -> admin key; nil when fleetd was not started here,
	// and dispatches then select their devices by metadata.
	dispatchTenants map[string]string
	pid             int    // 0: unknown; memory comes from /metrics
	pprof           string // base URL of fleetd's pprof endpoints, or ""
	dialect         string // "sqlite" or "postgres"
	dsn             string // the database fleetd runs on, if known
	managed         bool
	logPath         string
	stop            func() error
}

// dispatchTenantNames are the tenants the dispatch scenarios fill, smaller
// first.
var dispatchTenantNames = []string{"dispatch-small", "dispatch-large"}

// raiseFileLimit lifts the soft RLIMIT_NOFILE to the hard limit. Setting it
// explicitly, rather than relying on the Go runtime's own raise, makes
// child processes (fleetd, the hello server) inherit it too.
func raiseFileLimit(need uint64) (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	if lim.Cur < need {
		return lim.Cur, fmt.Errorf("RLIMIT_NOFILE is %d, below the %d this run needs: raise the hard limit (ulimit -Hn) or run with --quick", lim.Cur, need)
	}
	return lim.Cur, nil
}

// startFleetd builds fleetd (unless o.fleetd names a binary), makes its
// tenants and runs "fleetd serve" on free loopback ports.
func startFleetd(ctx context.Context, o *options, dir string, p *progress) (*target, error) {
	bin := o.fleetd
	if bin == "" {
		bin = filepath.Join(dir, "fleetd")
		p.say("building fleetd")
		cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/fleetd/fleet/cmd/fleetd")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("go build fleetd: %v\n%s", err, out.String())
		}
	}
	t := &target{managed: true, tenant: "bench", dispatchTenants: map[string]string{}, dialect: "sqlite"}
	var dropSchema func() error
	switch {
	case isPostgres(o.database):
		dsn, drop, err := freshSchema(ctx, o.database, "fleetbench_")
		if err != nil {
			return nil, err
		}
		t.dsn, t.dialect = dsn, "postgres"
		if !o.keep {
			dropSchema = drop
		}
	case o.database != "":
		t.dsn = o.database
	default:
		t.dsn = filepath.Join(dir, "fleetd.db")
	}
	cleanup := func() error {
		if dropSchema != nil {
			return dropSchema()
		}
		return nil
	}
	for _, name := range append([]string{t.tenant}, dispatchTenantNames...) {
		out, err := exec.CommandContext(ctx, bin, "tenant", "create", name, "--database", t.dsn, "--log-level", "warn").CombinedOutput()
		if err != nil {
			cleanup()
			return nil, fmt.Errorf("fleetd tenant create %s: %v\n%s", name, err, out)
		}
		// The key is the last line of the output that looks like one;
		// log lines may follow it.
		var key string
		for _, line := range strings.Split(string(out), "\n") {
			if line = strings.TrimSpace(line); strings.HasPrefix(line, "fk_") {
				key = line
			}
		}
		if name == t.tenant {
			t.adminKey = key
		} else {
			t.dispatchTenants[name] = key
		}
	}
	t.logPath = filepath.Join(dir, "fleetd.log")
	logFile, err := os.Create(t.logPath)
	if err != nil {
		cleanup()
		return nil, err
	}
	// fleetd binds port 0 itself and says which ports it got: a port
	// found free here and handed over could be taken in between.
	args := []string{"serve", "--database", t.dsn, "--http-addr", "127.0.0.1:0", "--mqtt-addr", "127.0.0.1:0",
		"--data-dir", filepath.Join(dir, "data"), "--log-level", "warn", "--log-format", "text", "--pprof-addr", "127.0.0.1:0"}
	// The setup dispatches thousands of actions and S7 is measured with
	// few keys: lift the per-key limit of the API (not of device data).
	help, _ := exec.CommandContext(ctx, bin, "serve", "--help").CombinedOutput()
	if bytes.Contains(help, []byte("--rate-limit ")) {
		args = append(args, "--rate-limit", "-1")
	}
	// The remote scenario opens a thousand sessions with one key, many
	// with each device, and both legs of each come from 127.0.0.1, where
	// operators and devices would have addresses of their own.
	if bytes.Contains(help, []byte("--remote-max-per-user")) {
		args = append(args, "--remote-max-per-user", "100000", "--remote-max-per-device", "100000", "--http-max-connections-per-ip", "10000")
	}
	cmd := exec.Command(bin, args...)
	addrs := newAddrWatcher()
	cmd.Stdout, cmd.Stderr = io.MultiWriter(logFile, addrs.stream()), io.MultiWriter(logFile, addrs.stream())
	if err := cmd.Start(); err != nil {
		logFile.Close()
		cleanup()
		return nil, fmt.Errorf("start fleetd: %w", err)
	}
	t.pid = cmd.Process.Pid
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); logFile.Close() }()
	t.stop = func() error {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(60 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		return cleanup()
	}
	select {
	case <-addrs.found:
		t.url, t.mqttAddr, t.pprof = "http://"+addrs.http, addrs.mqtt, "http://"+addrs.pprof
	case err := <-exited:
		cleanup()
		return nil, fmt.Errorf("fleetd exited at start: %v; its log:\n%s", err, tail(t.logPath, 20))
	case <-ctx.Done():
		t.stop()
		return nil, ctx.Err()
	case <-time.After(time.Minute):
		t.stop()
		return nil, fmt.Errorf("fleetd did not say where it listens within a minute; its log:\n%s", tail(t.logPath, 20))
	}
	if err := awaitReady(ctx, t.url+"/readyz", exited); err != nil {
		t.stop()
		return nil, fmt.Errorf("%v; fleetd's log:\n%s", err, tail(t.logPath, 20))
	}
	return t, nil
}

// awaitReady polls url until it answers 200, fleetd exits or a minute passes.
func awaitReady(ctx context.Context, url string, exited <-chan error) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return fmt.Errorf("fleetd exited at start: %v", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
	}
	return errors.New("fleetd was not ready within a minute")
}

// addrWatcher reads fleetd's output as it is written, for the addresses
// it listens on: "fleetd: listening http=… mqtt=…" on its standard output
// and the pprof server's pprof_addr=… in its log.
type addrWatcher struct {
	mu                sync.Mutex
	http, mqtt, pprof string
	found             chan struct{} // closed once all three are known
}

func newAddrWatcher() *addrWatcher { return &addrWatcher{found: make(chan struct{})} }

// stream returns a writer for one of fleetd's outputs.
func (a *addrWatcher) stream() io.Writer { return &addrStream{a: a} }

type addrStream struct {
	a    *addrWatcher
	line []byte // what was written of the line not yet ended
}

func (s *addrStream) Write(p []byte) (int, error) {
	s.line = append(s.line, p...)
	for {
		i := bytes.IndexByte(s.line, '\n')
		if i < 0 {
			break
		}
		s.a.read(string(s.line[:i]))
		s.line = s.line[i+1:]
	}
	return len(p), nil
}

func (a *addrWatcher) read(line string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.http != "" && a.pprof != "" {
		return
	}
	listening := strings.HasPrefix(line, "fleetd: listening ")
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, "http="); ok && listening {
			a.http = v
		} else if v, ok := strings.CutPrefix(f, "mqtt="); ok && listening {
			a.mqtt = v
		} else if v, ok := strings.CutPrefix(f, "pprof_addr="); ok {
			a.pprof = v
		}
	}
	if a.http != "" && a.pprof != "" {
		close(a.found)
	}
}

// freeAddr returns a loopback address whose port was free a moment ago.
func freeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err) // no loopback: nothing here can work
	}
	defer ln.Close()
	return ln.Addr().String()
}

func isPostgres(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

// freshSchema makes a schema named prefix+random in the database of base
// and returns a DSN whose search_path is that schema, and a function that
// drops it.
func freshSchema(ctx context.Context, base, prefix string) (string, func() error, error) {
	b := make([]byte, 5)
	rand.Read(b)
	schema := prefix + hex.EncodeToString(b)
	admin, err := sql.Open("pgx", base)
	if err != nil {
		return "", nil, fmt.Errorf("--database: %w", err)
	}
	// Outside the schema, which is dropped at the end: as
	// sqlstore.CreateExtensions does for tests.
	if _, err := admin.ExecContext(ctx, "CREATE EXTENSION IF NOT EXISTS pg_trgm"); err != nil {
		admin.Close()
		return "", nil, fmt.Errorf("create extensions in %s: %w", redact(base), err)
	}
	if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
		admin.Close()
		return "", nil, fmt.Errorf("create schema in %s: %w", redact(base), err)
	}
	u, err := url.Parse(base)
	if err != nil {
		admin.Close()
		return "", nil, fmt.Errorf("--database is not a URL: %w", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	drop := func() error {
		defer admin.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		_, err := admin.ExecContext(ctx, "DROP SCHEMA "+schema+" CASCADE")
		return err
	}
	return u.String(), drop, nil
}

func redact(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return "the database"
	}
	return u.Redacted()
}

// tail returns the last n lines of a file, for error messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// hello is the hello-world baseline: this command re-run as "fleetbench
// hello", so the handler has a process of its own, as fleetd has.
type hello struct {
	url  string
	pid  int
	stop func()
}

func startHello(ctx context.Context) (*hello, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "hello", "--addr", "127.0.0.1:0")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the hello server: %w", err)
	}
	stop := func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		stop()
		return nil, fmt.Errorf("the hello server did not start: %v", err)
	}
	addr := strings.TrimPrefix(strings.TrimSpace(line), "listening ")
	go io.Copy(io.Discard, out)
	return &hello{url: "http://" + addr + "/", pid: cmd.Process.Pid, stop: stop}, nil
}

// runHello serves the hello-world handler: it reads the body and answers
// 204, as S10 does, and nothing else.
func runHello(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newHelloFlags(stderr)
	addr := fs.String("addr", "127.0.0.1:0", "`ADDR` to listen on")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	})}
	fmt.Fprintf(stdout, "listening %s\n", ln.Addr())
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
