package agent_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/remote"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestAgentTerminalNohup: a job started with nohup and its output sent
// elsewhere (nohup cmd >log &) ignores the terminal's hang-up and holds
// no end of it, so it outlives the session, as after an SSH session,
// whether the shell exits or the operator leaves: an operator starts a
// long job that way and logs out.
func TestAgentTerminalNohup(t *testing.T) {
	t.Parallel()
	bin := fleetdtest.BuildAgent(t)
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		outer := t
		s := fleetdtest.Start(t, b)
		admin := s.Admin()
		dev := s.MustDevice(t, admin, "nohup", nil)
		p := s.StartAgent(t, bin, "nohup", dev.Token, "--remote")
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
