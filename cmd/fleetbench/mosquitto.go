package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// mosquitto is the MQTT baseline: Debian's Mosquitto 2 on a free loopback
// port, configured as a bare broker (anonymous, no persistence) so that it
// acknowledges each QoS 1 PUBLISH as soon as it has read it. fleetd
// acknowledges only once the report is committed.
type mosquitto struct {
	addr    string
	version string // "2.0.11"
	pid     int
	log     string
	stop    func()
}

// errNoMosquitto is returned when mosquitto is not installed.
var errNoMosquitto = errors.New("mosquitto is not installed (apt-get install mosquitto)")

// findMosquitto returns the path of the mosquitto binary, which Debian
// installs in /usr/sbin (often not on a user's PATH).
func findMosquitto() (string, error) {
	if bin, err := exec.LookPath("mosquitto"); err == nil {
		return bin, nil
	}
	for _, p := range []string{"/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errNoMosquitto
}

// startMosquitto runs mosquitto with a configuration generated in dir and
// returns once it accepts connections.
func startMosquitto(ctx context.Context, dir string) (*mosquitto, error) {
	bin, err := findMosquitto()
	if err != nil {
		return nil, err
	}
	// "mosquitto -h" prints "mosquitto version 2.0.11" first (and exits 3).
	help, _ := exec.CommandContext(ctx, bin, "-h").CombinedOutput()
	first, _, _ := strings.Cut(string(help), "\n")
	version, ok := strings.CutPrefix(strings.TrimSpace(first), "mosquitto version ")
	if !ok {
		return nil, fmt.Errorf("%s -h does not say its version: %q", bin, first)
	}
	dir = filepath.Join(dir, "mosquitto")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	// The port was free a moment before mosquitto binds it; on a busy
	// machine another process may take it in between, and mosquitto exits.
	for range 4 {
		m, err := launchMosquitto(ctx, bin, dir, version)
		if !errors.Is(err, errExitedAtStart) {
			return m, err
		}
	}
	return launchMosquitto(ctx, bin, dir, version)
}

// errExitedAtStart: mosquitto exited before it listened.
var errExitedAtStart = errors.New("mosquitto exited at start")

// launchMosquitto starts mosquitto on a port free a moment ago.
func launchMosquitto(ctx context.Context, bin, dir, version string) (*mosquitto, error) {
	m := &mosquitto{addr: freeAddr(), version: version, log: filepath.Join(dir, "mosquitto.log")}
	_, port, _ := net.SplitHostPort(m.addr)
	// set_tcp_nodelay: its PUBACKs leave at once, as fleetd's do (Go sets
	// TCP_NODELAY); mosquitto leaves Nagle's algorithm on by default.
	conf := fmt.Sprintf(`listener %s 127.0.0.1
allow_anonymous true
persistence false
set_tcp_nodelay true
max_connections -1
log_dest file %s
log_type error
log_type warning
`, port, m.log)
	if os.Geteuid() == 0 {
		// Started as root, mosquitto drops to its own user, which cannot
		// write its log in fleetbench's temporary directory.
		conf += "user root\n"
	}
	confPath := filepath.Join(dir, "mosquitto.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "-c", confPath)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start mosquitto: %w", err)
	}
	m.pid = cmd.Process.Pid
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	m.stop = func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", m.addr, time.Second)
		if err == nil {
			c.Close()
			return m, nil
		}
		select {
		case err := <-exited:
			return nil, fmt.Errorf("%w: %v; its log:\n%s", errExitedAtStart, err, tail(m.log, 10))
		case <-ctx.Done():
			m.stop()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			m.stop()
			return nil, fmt.Errorf("mosquitto did not listen on %s within 10 s: %v", m.addr, err)
		}
	}
}
