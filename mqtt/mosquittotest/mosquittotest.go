// Package mosquittotest runs a private Mosquitto broker for tests of fleetd
// as a client of an external broker: each test gets its own, on a free
// loopback port (internal/loopback), so tests neither see each other's
// messages nor depend on a broker already running, and a test can restart
// the broker.
package mosquittotest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/loopback"
)

// Broker is a running mosquitto.
type Broker struct {
	Addr string // host:port
	URL  string // mqtt://host:port
	// TLSURL is mqtts://host:port of a TLS listener, when Start was given
	// WithTLS.
	TLSURL string

	conf string
	log  string
	mu   sync.Mutex
	cmd  *exec.Cmd
	exit chan error
}

// Option adjusts the broker's configuration.
type Option func(dir string) (conf string)

// WithTLS adds a TLS listener with the PEM certificate and key given.
func WithTLS(certPEM, keyPEM []byte) Option {
	return func(dir string) string {
		cert, key := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
		os.WriteFile(cert, certPEM, 0o644)
		os.WriteFile(key, keyPEM, 0o600)
		return "certfile " + cert + "\nkeyfile " + key + "\n"
	}
}

// Start runs mosquitto with persistence in a temporary directory, so that a
// Restart keeps sessions as a production broker would, and stops it when
// the test ends. Without mosquitto installed the test is skipped, except
// under CI (CI=true), where .ci/run installs it.
func Start(t testing.TB, opts ...Option) *Broker {
	t.Helper()
	bin := binary(t)
	dir := t.TempDir()
	b := &Broker{conf: filepath.Join(dir, "mosquitto.conf"), log: filepath.Join(dir, "mosquitto.log")}
	loopback.Start(t, 1+len(opts), func(ports []int) error {
		if err := b.configure(dir, ports, opts); err != nil {
			return err
		}
		return b.start(bin)
	})
	t.Cleanup(func() { b.stop() })
	return b
}

// configure writes the configuration of a broker in dir listening on
// ports: the first plain, one for each option after it.
func (b *Broker) configure(dir string, ports []int, opts []Option) error {
	b.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
	b.URL = "mqtt://" + b.Addr
	// Information is where Mosquitto says it runs: every listener bound.
	conf := fmt.Sprintf(`listener %d 127.0.0.1
allow_anonymous true
persistence true
persistence_location %s/
autosave_interval 1
max_queued_messages 100000
max_inflight_messages 0
log_dest file %s
log_type error
log_type warning
log_type information
`, ports[0], dir, b.log)
	for i, o := range opts {
		conf += fmt.Sprintf("listener %d 127.0.0.1\n", ports[1+i]) + o(dir)
		b.TLSURL = fmt.Sprintf("mqtts://127.0.0.1:%d", ports[1+i])
	}
	if os.Geteuid() == 0 {
		// Started as root, mosquitto drops to its own user, which cannot
		// reach the test's temporary directory.
		conf += "user root\n"
	}
	return os.WriteFile(b.conf, []byte(conf), 0o644)
}

// binary finds mosquitto, or skips the test without it, except under CI
// (CI=true), where .ci/run installs it.
func binary(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("mosquitto")
	if err != nil {
		for _, p := range []string{"/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto"} {
			if _, e := os.Stat(p); e == nil {
				return p
			}
		}
		if os.Getenv("CI") == "true" {
			t.Fatalf("mosquitto not installed: %v", err)
		}
		t.Skipf("mosquitto not installed (apt-get install mosquitto): %v", err)
	}
	return bin
}

// running is the line Mosquitto logs once every listener is bound; it
// exits instead when one cannot be.
var running = regexp.MustCompile(`(?m)mosquitto version \S+ running$`)

// start runs mosquitto and waits until it says it runs: a port that
// answers may be another process's, which took it after it was chosen.
// A port taken is loopback.ErrPortTaken.
func (b *Broker) start(bin string) error {
	var from int64 // where this run's lines begin: a restart appends
	if fi, err := os.Stat(b.log); err == nil {
		from = fi.Size()
	}
	logged := func() string {
		data, _ := os.ReadFile(b.log)
		return string(data[min(from, int64(len(data))):])
	}
	cmd := exec.Command(bin, "-c", b.conf)
	// Its own warnings (such as running as root) go to its log, not the
	// test's output.
	out, err := os.OpenFile(b.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start mosquitto: %w", err)
	}
	exit := make(chan error, 1)
	go func() { exit <- cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for !running.MatchString(logged()) {
		select {
		case err := <-exit:
			if log := logged(); strings.Contains(log, "Address already in use") {
				return fmt.Errorf("mosquitto on %s: %w:\n%s", b.Addr, loopback.ErrPortTaken, log)
			}
			return fmt.Errorf("mosquitto exited: %v\n%s", err, logged())
		default:
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-exit
			return fmt.Errorf("mosquitto did not start on %s in 10s:\n%s", b.Addr, logged())
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.mu.Lock()
	b.cmd, b.exit = cmd, exit
	b.mu.Unlock()
	return nil
}

// stop ends mosquitto with SIGTERM, which saves its sessions.
func (b *Broker) stop() {
	b.mu.Lock()
	cmd, exit := b.cmd, b.exit
	b.cmd = nil
	b.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exit:
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		<-exit
	}
}

// Restart stops the broker gracefully and starts it again on the same port
// and persistence, as an operator's restart or a failover would.
func (b *Broker) Restart(t testing.TB) {
	t.Helper()
	b.mu.Lock()
	bin := b.cmd.Path
	b.mu.Unlock()
	b.stop()
	if err := b.start(bin); err != nil {
		t.Fatal(err)
	}
}

// Pid returns the process id of the running mosquitto, for measuring it.
func (b *Broker) Pid() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cmd.Process.Pid
}
