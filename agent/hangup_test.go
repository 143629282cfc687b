package agent_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/remote"
)

// TestAgentTerminalNohup: a job started with nohup and its output sent
// elsewhere (nohup cmd >log &) ignores the terminal's hang-up and holds
// no end of it, so it outlives the session, as after an SSH session,
// whether the shell exits or the operator leaves: an operator starts a
// long job that way and logs out.
func TestAgentTerminalNohup(t *testing.T) {
	t.Parallel()
	withFleetd(t, nil, func(t *testing.T, s *agents) {
		outer := t
		admin := s.Admin()
		p := s.StartDevice(t, "nohup", "--remote")
		// start opens a terminal and starts a nohup job, whose pid it
		// writes to the file it returns, and waits until the job ignores
		// SIGHUP (nohup has run sleep); the jobs are killed when the test
		// ends.
		dir := t.TempDir()
		start := func(t *testing.T, name string) (string, *remote.Conn, string) {
			sess, conn := s.OpenTerminal(t, admin, "nohup")
			pidFile := filepath.Join(dir, name+".pid")
			conn.Write([]byte("nohup sleep 1000 >/dev/null 2>&1 </dev/null & echo $! > " + pidFile + "; echo star''ted\n"))
			fleetdtest.ReadUntil(t, conn, "started")
			b, err := os.ReadFile(pidFile)
			if err != nil {
				t.Fatal(err)
			}
			pid := strings.TrimSpace(string(b))
			fleetdtest.Eventually(t, "nohup to run the job", func() bool {
				comm, err := os.ReadFile("/proc/" + pid + "/comm")
				if err != nil {
					t.Fatalf("the job is not running: %v", err)
				}
				return strings.TrimSpace(string(comm)) == "sleep"
			})
			outer.Cleanup(func() {
				if pid, err := strconv.Atoi(pid); err == nil {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			})
			return sess.ID, conn, pidFile
		}
		ended := func(t *testing.T, id string) {
			fleetdtest.Eventually(t, "the agent to end the session", func() bool {
				return fleetdtest.AgentSays(p, `"remote session ended" session=`+id)
			})
		}
		// Each subtest leaves its job's pid file; the jobs are checked
		// again at the end, from another session, once the agent has had
		// all the time it takes to finish with the first two.
		var pidFiles []string
		t.Run("ShellExits", func(t *testing.T) {
			id, conn, pidFile := start(t, "exits")
			pidFiles = append(pidFiles, pidFile)
			conn.Write([]byte("exit\n"))
			if got := fleetdtest.SessionEnd(t, conn); got != "exit" {
				t.Fatalf("the session ended with %q", got)
			}
			ended(t, id)
			if processGone(t, pidFile) {
				t.Fatal("the nohup job was killed when the shell exited")
			}
		})
		t.Run("OperatorLeaves", func(t *testing.T) {
			id, conn, pidFile := start(t, "leaves")
			pidFiles = append(pidFiles, pidFile)
			conn.Close()
			ended(t, id)
			if processGone(t, pidFile) {
				t.Fatal("the nohup job was killed when the operator left")
			}
		})
		// A round trip through a third session, then the jobs again: a
		// job killed is a zombie until something reaps it, which kill -0
		// would take for alive, so /proc says.
		_, conn := s.OpenTerminal(t, admin, "nohup")
		conn.Write([]byte("echo chec''ked\n"))
		fleetdtest.ReadUntil(t, conn, "checked")
		for _, f := range pidFiles {
			if processGone(t, f) {
				t.Fatalf("the job of %s was killed once its session ended", f)
			}
		}
	})
}

// TestAgentTerminalHungUpJob: a job that ignores SIGHUP and keeps writing
// to the terminal (a trap that ignores HUP, output not sent elsewhere)
// does not keep the session open: two seconds after the hang-up the
// agent closes its end of the pty, the job's writes to it fail from then
// on, and the job keeps running, whether the shell exits or the operator
// leaves; the agent holds no pty once the sessions have ended.
func TestAgentTerminalHungUpJob(t *testing.T) {
	t.Parallel()
	withFleetd(t, nil, func(t *testing.T, s *agents) {
		outer := t
		admin := s.Admin()
		p := s.StartDevice(t, "hungup", "--remote")
		dir := t.TempDir()
		// start opens a terminal and starts the job, which ticks until a
		// write fails, then says so in its file and sleeps on.
		start := func(t *testing.T, name string) (string, *remote.Conn, string, string) {
			sess, conn := s.OpenTerminal(t, admin, "hungup")
			pidFile, failed := filepath.Join(dir, name+".pid"), filepath.Join(dir, name+".failed")
			conn.Write([]byte("sh -c \"trap '' HUP; while echo tick; do sleep 0.1; done 2>/dev/null; echo \\$? > " + failed +
				"; exec sleep 1000\" & echo $! > " + pidFile + "; echo star''ted\n"))
			fleetdtest.ReadUntil(t, conn, "started")
			fleetdtest.ReadUntil(t, conn, "tick")
			outer.Cleanup(func() {
				if b, err := os.ReadFile(pidFile); err == nil {
					if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
						syscall.Kill(pid, syscall.SIGKILL)
					}
				}
			})
			return sess.ID, conn, pidFile, failed
		}
		ended := func(t *testing.T, id, pidFile, failed string) {
			fleetdtest.Eventually(t, "the agent to end the session", func() bool {
				return fleetdtest.AgentSays(p, `"remote session ended" session=`+id)
			})
			fleetdtest.Eventually(t, "the job's write to fail", func() bool {
				_, err := os.Stat(failed)
				return err == nil
			})
			if processGone(t, pidFile) {
				t.Fatal("the job that ignored the hang-up was killed")
			}
		}
		t.Run("ShellExits", func(t *testing.T) {
			id, conn, pidFile, failed := start(t, "exits")
			conn.Write([]byte("exit\n"))
			if got := fleetdtest.SessionEnd(t, conn); got != "exit" {
				t.Fatalf("the session ended with %q", got)
			}
			ended(t, id, pidFile, failed)
		})
		t.Run("OperatorLeaves", func(t *testing.T) {
			id, conn, pidFile, failed := start(t, "leaves")
			conn.Close()
			ended(t, id, pidFile, failed)
		})
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.Cmd.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		for _, fd := range fds {
			if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", p.Cmd.Process.Pid, fd.Name())); l == "/dev/ptmx" {
				t.Fatalf("the agent holds a pty (descriptor %s) once its sessions have ended", fd.Name())
			}
		}
	})
}
