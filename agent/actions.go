package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fleetd/fleet"
)

var (
	errCancelled = errors.New("cancelled by fleetd")
	errStopping  = errors.New("the agent is stopping")
)

// run is an action in progress.
type run struct {
	name   string
	cancel context.CancelCauseFunc
	done   chan struct{}
}

// builtin actions; an executable in --actions-dir of the same name wins,
// so a device may replace one.
var builtin = map[string]func(a *Agent, ctx context.Context, id, payload string) error{
	"update_firmware": (*Agent).updateFirmware,
	"reboot":          (*Agent).reboot,
	"update_config":   (*Agent).updateConfig,
}

// receive starts an action, or stops one for a cancel_action.
func (a *Agent) receive(ctx context.Context, m message) {
	a.mu.Lock()
	fresh := a.seen.add(m.ID)
	a.mu.Unlock()
	if !fresh {
		a.log.Debug("action received again; ignored", "action", m.ID)
		return
	}
	a.log.Info("action received", "action", m.ID, "name", m.Name)
	if m.Name == "cancel_action" {
		a.wg.Add(1)
		go func() { defer a.wg.Done(); a.cancelAction(m) }()
		return
	}
	handler, err := a.handler(m.Name)
	if err != nil {
		a.report(m.ID, "Failed", 0, err.Error())
		return
	}
	cctx, cancel := context.WithCancelCause(ctx)
	rctx, stopTimer := context.WithTimeoutCause(cctx, a.cfg.ActionTimeout,
		fmt.Errorf("timed out after %s (--action-timeout)", a.cfg.ActionTimeout))
	r := &run{name: m.Name, cancel: cancel, done: make(chan struct{})}
	a.mu.Lock()
	a.running[m.ID] = r
	a.mu.Unlock()
	a.report(m.ID, "Received", 0)
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		defer close(r.done)
		defer cancel(nil)
		defer stopTimer()
		err := handler(a, rctx, m.ID, m.Payload)
		a.mu.Lock()
		delete(a.running, m.ID)
		a.mu.Unlock()
		switch {
		case errors.Is(context.Cause(rctx), errStopping):
			// Not finished, not failed: fleetd sends it again when the
			// agent next connects, or times it out.
			a.log.Info("action interrupted by shutdown", "action", m.ID)
		case err != nil:
			a.log.Info("action failed", "action", m.ID, "name", m.Name, "err", err)
			a.report(m.ID, "Failed", 0, err.Error())
		default:
			a.log.Info("action completed", "action", m.ID, "name", m.Name)
			a.report(m.ID, "Completed", 100)
		}
	}()
}

// handler finds what runs action name: an executable in --actions-dir,
// else a built-in.
func (a *Agent) handler(name string) (func(*Agent, context.Context, string, string) error, error) {
	if a.cfg.ActionsDir != "" && validActionName(name) {
		path := filepath.Join(a.cfg.ActionsDir, name)
		if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return func(a *Agent, ctx context.Context, id, payload string) error {
				return a.runProgram(ctx, id, []string{path}, payload, "Running")
			}, nil
		}
	}
	if h, ok := builtin[name]; ok {
		return h, nil
	}
	if name == fleet.ActionRemoteSession && a.cfg.Remote {
		return (*Agent).remoteSession, nil
	}
	return nil, fmt.Errorf("this device has no program for action %q (no executable %s in its actions directory, and no built-in)", name, name)
}

// validActionName keeps an action's name one plain file name in
// --actions-dir: no separator, no hidden file, no "..".
func validActionName(name string) bool {
	return name != "" && len(name) <= 255 && !strings.ContainsAny(name, "/\\\x00") && !strings.HasPrefix(name, ".")
}

// cancelAction stops the action a cancel_action names and reports on the
// cancel_action's own id: Completed once the action's program is gone,
// Failed if there was nothing of that id running.
func (a *Agent) cancelAction(m message) {
	var p struct {
		ActionID string `json:"action_id"`
	}
	if err := json.Unmarshal([]byte(m.Payload), &p); err != nil || p.ActionID == "" {
		a.report(m.ID, "Failed", 0, "cancel_action without an action_id")
		return
	}
	a.report(m.ID, "Received", 0)
	a.mu.Lock()
	r := a.running[p.ActionID]
	a.mu.Unlock()
	if r == nil {
		a.report(m.ID, "Failed", 0, fmt.Sprintf("action %s is not running on this device", p.ActionID))
		return
	}
	r.cancel(errCancelled)
	<-r.done
	a.report(m.ID, "Completed", 100)
}

// stderrTail is how much of the end of a program's stderr an error keeps.
const stderrTail = 1024

// runProgram runs argv with payload on stdin, in a process group of its
// own so that a timeout or a cancellation kills everything it started.
// Each "progress N" line on its stdout is reported as state with N
// percent; other lines are logged. A non-zero exit is an error holding the
// end of its stderr.
func (a *Agent) runProgram(ctx context.Context, id string, argv []string, payload, state string) error {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second // a grandchild that kept our pipes open
	cmd.Stdin = strings.NewReader(payload)
	cmd.Env = append(os.Environ(),
		"FLEETD_ACTION_ID="+id, "FLEETD_TENANT="+a.cfg.Tenant, "FLEETD_DEVICE="+a.cfg.Device)
	tail := &tailBuffer{max: stderrTail}
	cmd.Stderr = tail
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("cannot run %s: %v", argv[0], err)
	}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "progress "); ok {
			if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n >= 0 && n <= 100 {
				a.report(id, state, n)
				continue
			}
		}
		a.log.Debug("action output", "action", id, "line", line)
	}
	io.Copy(io.Discard, out)
	err = cmd.Wait()
	if cause := context.Cause(ctx); cause != nil {
		return cause
	}
	if err != nil {
		if msg := strings.TrimSpace(tail.String()); msg != "" {
			return fmt.Errorf("%s: %s", err, msg)
		}
		return err
	}
	return nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// updateConfig takes the twin's desired state (docs/twin.md: the whole
// state, a JSON object): it writes it to --update-config-file, replacing
// the file only once it is whole on disk, then runs --update-config-hook
// with the state on its stdin. Either may be configured alone.
func (a *Agent) updateConfig(ctx context.Context, id, payload string) error {
	file, hook := a.cfg.UpdateConfigFile, strings.Fields(a.cfg.UpdateConfigHook)
	if file == "" && len(hook) == 0 {
		return errors.New("update_config is not configured on this device (--update-config-file, --update-config-hook)")
	}
	var state map[string]any
	if err := json.Unmarshal([]byte(payload), &state); err != nil || state == nil {
		return errors.New("update_config's params must be the desired state, a JSON object")
	}
	// Each action carries the whole state and fleetd numbers actions in
	// order: applied one at a time, an older one that comes late is
	// superseded by the newer one already applied.
	a.configMu.Lock()
	defer a.configMu.Unlock()
	n, _ := strconv.ParseInt(id, 10, 64)
	if n > 0 && n < a.configApplied {
		a.log.Info("update_config superseded by a newer one already applied", "action", id)
		return nil
	}
	a.configApplied = max(a.configApplied, n)
	if file != "" {
		if err := writeFileAtomic(file, []byte(payload)); err != nil {
			return fmt.Errorf("writing %s: %w", file, err)
		}
	}
	if len(hook) == 0 {
		return nil
	}
	for i, w := range hook {
		hook[i] = strings.ReplaceAll(w, "{file}", file)
	}
	a.report(id, "Running", 50)
	return a.runProgram(ctx, id, hook, payload, "Running")
}

// writeFileAtomic replaces path with b: a temporary file beside it,
// synced, then renamed over it, so a reader sees the old file or the new
// one whole, even across a power cut.
func writeFileAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // gone once renamed
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// reboot runs --reboot-hook. It reports Rebooting first: a hook that
// reboots at once leaves no time to report after it.
func (a *Agent) reboot(ctx context.Context, id, payload string) error {
	argv := strings.Fields(a.cfg.RebootHook)
	if len(argv) == 0 {
		return errors.New("reboot is not configured on this device (--reboot-hook)")
	}
	a.report(id, "Rebooting", 0)
	return a.runProgram(ctx, id, argv, payload, "Rebooting")
}
