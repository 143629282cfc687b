package agent

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetd/fleet/remote"
)

// TestTerminalLetsGo: a job that ignores the hang-up and holds the
// terminal without a word (a trap that ignores HUP, then sleep) keeps
// running when the session ends, and the agent lets go of the session
// all the same: remoteTerminal returns once hangUp closed the pty's
// master, whose read no longer waits in a system call, and nothing of
// the session is left in the agent's process, no pty descriptor and no
// goroutine. The operator's WebSocket is served here, the agent's dials
// it, as fleetd's relay and the agent would.
func TestTerminalLetsGo(t *testing.T) {
	if _, err := os.Stat("/proc/self/fd"); err != nil {
		t.Skip("no /proc to count descriptors in")
	}
	before := ptys(t)
	ops := make(chan *remote.Conn, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := remote.Upgrade(w, r)
		if err != nil {
			t.Error(err)
			return
		}
		ops <- c
	}))
	defer srv.Close()
	dev, err := remote.Dial(context.Background(), srv.URL, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	op := <-ops
	a := testAgent(t)
	a.cfg.RemoteShell, a.cfg.RemoteRoot = "/bin/sh", t.TempDir()
	served := make(chan error, 1)
	go func() {
		defer dev.Close()
		served <- a.remoteTerminal(context.Background(), dev)
	}()

	pidFile := filepath.Join(t.TempDir(), "job.pid")
	op.Write([]byte("sh -c \"trap '' HUP; exec sleep 1000\" & echo $! > " + pidFile + "; echo star''ted\n"))
	for out := ""; !strings.Contains(out, "started"); {
		b, _, err := op.Read()
		if err != nil {
			t.Fatalf("the terminal ended: %v; output %q", err, out)
		}
		out += string(b)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	job, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(job, syscall.SIGKILL) })
	// The trap is set once the job's comm is sleep (exec).
	deadline := time.Now().Add(30 * time.Second)
	for comm(job) != "sleep" {
		if time.Now().After(deadline) {
			t.Fatalf("the job is %q, not sleep", comm(job))
		}
		time.Sleep(10 * time.Millisecond)
	}

	op.Close() // the operator leaves
	select {
	case <-served:
	case <-time.After(hangUpGrace + 30*time.Second):
		t.Fatal("the agent still serves the terminal after the hang-up")
	}
	if c := comm(job); c != "sleep" {
		t.Fatalf("the job that ignored the hang-up is gone (%q)", c)
	}
	if n := ptys(t); n != before {
		t.Fatalf("%d pty masters open in the agent's process, %d before the session", n, before)
	}
	// The operator's leg reader returns once the agent's WebSocket is
	// closed, as its caller does.
	deadline = time.Now().Add(30 * time.Second)
	for {
		left := sessionGoroutines()
		if left == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("goroutines of the session are left:\n%s", left)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ptys counts the pty masters this process holds open.
func ptys(t *testing.T) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, fd := range fds {
		if l, err := os.Readlink("/proc/self/fd/" + fd.Name()); err == nil && l == "/dev/ptmx" {
			n++
		}
	}
	return n
}

// comm is the command name of process pid, or "" once it is gone (a
// zombie too).
func comm(pid int) string {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	open, end := strings.IndexByte(string(stat), '('), strings.LastIndexByte(string(stat), ')')
	if open < 0 || end < open {
		return ""
	}
	if f := strings.Fields(string(stat[end+1:])); len(f) > 0 && (f[0] == "Z" || f[0] == "X") {
		return ""
	}
	return string(stat[open+1 : end])
}

// sessionGoroutines returns the stacks of the goroutines in a terminal's
// code, or "".
func sessionGoroutines() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var left []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "agent.(*Agent).remoteTerminal") || strings.Contains(g, "agent.hangUp") {
			left = append(left, g)
		}
	}
	return strings.Join(left, "\n\n")
}
