// Package mosquittotest runs a private Mosquitto broker for tests of fleetd
// as a client of an external broker: each test gets its own, on a free
// loopback port, so tests neither see each other's messages nor depend on
// a broker already running, and a test can restart the broker.
package mosquittotest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
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
	bin, err := exec.LookPath("mosquitto")
	if err != nil {
		for _, p := range []string{"/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto"} {
			if _, e := os.Stat(p); e == nil {
				bin, err = p, nil
				break
			}
		}
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("mosquitto not installed: %v", err)
		}
		t.Skipf("mosquitto not installed (apt-get install mosquitto): %v", err)
	}
	dir := t.TempDir()
	port := freePort(t)
	b := &Broker{
		Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		conf: filepath.Join(dir, "mosquitto.conf"),
		log:  filepath.Join(dir, "mosquitto.log"),
	}
	b.URL = "mqtt://" + b.Addr
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
`, port, dir, b.log)
	for _, o := range opts {
		tlsPort := freePort(t)
		conf += fmt.Sprintf("listener %d 127.0.0.1\n", tlsPort) + o(dir)
		b.TLSURL = fmt.Sprintf("mqtts://127.0.0.1:%d", tlsPort)
	}
	if os.Geteuid() == 0 {
		// Started as root, mosquitto drops to its own user, which cannot
		// reach the test's temporary directory.
		conf += "user root\n"
	}
	if err := os.WriteFile(b.conf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	b.start(t, bin)
	t.Cleanup(func() { b.stop() })
	return b
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func (b *Broker) start(t testing.TB, bin string) {
	t.Helper()
	cmd := exec.Command(bin, "-c", b.conf)
	// Its own warnings (such as running as root) go to its log, not the
	// test's output.
	out, err := os.OpenFile(b.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start mosquitto: %v", err)
	}
	exit := make(chan error, 1)
	go func() { exit <- cmd.Wait() }()
	b.mu.Lock()
	b.cmd, b.exit = cmd, exit
	b.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", b.Addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		select {
		case err := <-exit:
			log, _ := os.ReadFile(b.log)
			t.Fatalf("mosquitto exited: %v\n%s", err, log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("mosquitto did not listen on %s in 10s: %v", b.Addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
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
	b.start(t, bin)
}

// Pid returns the process id of the running mosquitto, for measuring it.
func (b *Broker) Pid() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cmd.Process.Pid
}
