package fleetdtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// BuildAgent builds cmd/fleetd-agent as a static binary, as a device
// would get it, and returns its path.
func BuildAgent(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "fleetd-agent")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/fleetd/fleet/cmd/fleetd-agent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build fleetd-agent: %v\n%s", err, out)
	}
	return bin
}

// AgentProcess is fleetd-agent running as a process of its own.
type AgentProcess struct {
	Cmd    *exec.Cmd
	Output *LockedBuffer
}

// StartAgent runs the agent for a device of tenant "default" against s,
// with extra flags. It is stopped with SIGTERM, and must exit 0, when the
// test ends.
func (s *Server) StartAgent(t *testing.T, bin, device, token string, extra ...string) *AgentProcess {
	t.Helper()
	args := append([]string{"--server", s.URL, "--mqtt-addr", s.MQTTAddr, "--tenant", "default", "--device", device,
		"--log-level", "debug"}, extra...)
	p := &AgentProcess{Cmd: exec.Command(bin, args...), Output: &LockedBuffer{}}
	p.Cmd.Env = append(os.Environ(), "FLEETD_AGENT_TOKEN="+token)
	p.Cmd.Stdout, p.Cmd.Stderr = p.Output, p.Output
	if err := p.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- p.Cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("fleetd-agent exited with %v; output:\n%s", err, p.Output)
			}
		case <-time.After(Bound):
			p.Cmd.Process.Kill()
			t.Errorf("fleetd-agent did not stop on SIGTERM; output:\n%s", p.Output)
		}
		if t.Failed() {
			t.Logf("fleetd-agent %s output:\n%s", device, p.Output)
		}
	})
	return p
}

// AgentSays reports whether the agent's output has s.
func AgentSays(p *AgentProcess, s string) bool {
	return strings.Contains(p.Output.String(), s)
}
