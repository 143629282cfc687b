package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/creack/pty"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/remote"
)

// remoteSession answers fleetd's remote_session action (on with --remote
// only): it dials back to fleetd, a stream leg unless --remote-websocket
// (docs/agent.md, The session's messages), and serves the session on it,
// apart from the action, which completes once the device is connected.
func (a *Agent) remoteSession(ctx context.Context, id, payload string) error {
	var p struct {
		SessionID string `json:"session_id"`
		Kind      string `json:"kind"`
		Target    string `json:"target"`
	}
	if err := json.Unmarshal([]byte(payload), &p); err != nil || p.SessionID == "" {
		return errors.New("remote_session without a session_id")
	}
	u := strings.TrimRight(a.cfg.Server, "/") + "/api/v1/remote-sessions/" + url.PathEscape(p.SessionID) + "/device"
	h := http.Header{"X-Service-Tenant": {a.cfg.Tenant}, "Authorization": {"TargetToken " + a.cfg.Token}}
	tc, err := a.tlsConfig()
	if err != nil {
		return err
	}
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	dial := remote.DialStream
	if a.cfg.RemoteWebSocket {
		dial = remote.Dial
	}
	c, err := dial(dctx, u, h, tc)
	if err != nil {
		return fmt.Errorf("cannot connect back to fleetd for remote session %s: %v", p.SessionID, err)
	}
	a.log.Info("remote session", "session", p.SessionID, "kind", p.Kind, "target", p.Target)
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		defer c.Close()
		err := a.serveRemote(a.base, c, p.Kind, p.Target)
		if err != nil {
			c.Send(remote.Control{Type: remote.TypeError, Message: err.Error()})
		}
		a.log.Info("remote session ended", "session", p.SessionID, "err", err)
	}()
	return nil
}

func (a *Agent) serveRemote(ctx context.Context, c *remote.Conn, kind, target string) error {
	switch kind {
	case fleet.RemoteShell:
		if target == "" {
			return a.remoteTerminal(ctx, c)
		}
		return a.remoteCommand(ctx, c, target)
	case fleet.RemoteForward:
		return a.remoteForward(ctx, c, target)
	case fleet.RemoteGet:
		return a.remoteGet(c, target)
	case fleet.RemotePut:
		return a.remotePut(c, target)
	}
	return fmt.Errorf("this agent does not know remote sessions of kind %q", kind)
}

// closeOnEnd closes c when ctx ends (the agent stops), so that a read of
// it returns.
func closeOnEnd(ctx context.Context, c *remote.Conn) func() {
	stop := context.AfterFunc(ctx, func() { c.Close() })
	return func() { stop() }
}

// remoteTerminal runs --remote-shell on a pty: the operator's bytes are
// its keyboard, its output theirs, resize messages its size.
func (a *Agent) remoteTerminal(ctx context.Context, c *remote.Conn) error {
	defer closeOnEnd(ctx, c)()
	cmd := exec.Command(a.cfg.RemoteShell)
	cmd.Env = append(os.Environ(), "TERM=xterm-256color")
	cmd.Dir = a.cfg.RemoteRoot
	defaultHangUps()
	f, err := startPty(cmd) // a session of its own, whose leader is the shell
	if err != nil {
		return fmt.Errorf("cannot start %s on a pty: %v", a.cfg.RemoteShell, err)
	}
	defer f.Close()
	// The shell is a session leader (pty.Start makes it one): its jobs
	// stay in its session whatever process group they are put in, and
	// any of them holds the pty open, so the session ends only once all of
	// them have let go of it, or the agent closes its end (hangUp).
	// Whichever ends first, the operator's leg or the shell, hangs up the
	// rest of the session.
	done := make(chan struct{}) // the pty is let go of and the shell reaped
	var hang sync.Once
	hangUpAll := func() { hang.Do(func() { go hangUp(cmd.Process, f, done) }) }
	waited := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		waited <- err
		hangUpAll() // its background jobs, if any
	}()
	go func() {
		for {
			b, ctl, err := c.Read()
			if err != nil {
				hangUpAll()
				return
			}
			switch {
			case b != nil:
				f.Write(b) // a pty closed by hangUp refuses it
			case ctl.Type == remote.TypeResize && ctl.Cols > 0 && ctl.Rows > 0:
				setSize(f, ctl.Cols, ctl.Rows)
			}
		}
	}()
	buf := make([]byte, c.MaxSend())
	for {
		n, err := f.Read(buf)
		if n > 0 && c.Write(buf[:n]) != nil {
			break
		}
		// EIO once every process of the session let go of the pty;
		// os.ErrClosed once hangUp closed it.
		if err != nil {
			break
		}
	}
	hangUpAll() // the operator is gone: what holds the pty goes too
	err = <-waited
	close(done)
	return c.Send(remote.Control{Type: remote.TypeExit, Code: exitCode(err)})
}

// startPty starts cmd on a new pty and returns the pty's master, which
// the runtime polls: a read or write of it blocked on a job that holds
// the terminal and says nothing, or reads nothing, returns once it is
// closed, and so does the close. pty.Start's own file is in blocking mode
// (its set-up ioctls take the descriptor), where a close waits for the
// read in the system call and neither ends while the job lives: the
// goroutine and the descriptor would leak. The copy is made under
// syscall.ForkLock, so no program another session starts meanwhile
// inherits it.
func startPty(cmd *exec.Cmd) (*os.File, error) {
	f, err := pty.Start(cmd)
	if err != nil {
		return nil, err
	}
	syscall.ForkLock.RLock()
	fd, err := syscall.Dup(int(f.Fd()))
	if err == nil {
		syscall.CloseOnExec(fd)
	}
	syscall.ForkLock.RUnlock()
	f.Close()
	if err == nil {
		if err = syscall.SetNonblock(fd, true); err != nil {
			syscall.Close(fd)
		}
	}
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, err
	}
	return os.NewFile(uintptr(fd), "/dev/ptmx"), nil
}

// setSize sets the terminal's size on its master, through the runtime's
// descriptor (pty.Setsize would put it back in blocking mode).
func setSize(f *os.File, cols, rows int) {
	ws := pty.Winsize{Cols: uint16(cols), Rows: uint16(rows)}
	if rc, err := f.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) {
			syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCSWINSZ, uintptr(unsafe.Pointer(&ws)))
		})
	}
}

// defaultHangUps makes a terminal's shell start with SIGHUP at its
// default action, as a login's does. An agent started with SIGHUP ignored
// (under nohup, or a supervisor that ignores it) would hand that down:
// such a shell outlives the hang-up, holds its pty, and is killed with
// whatever else of its session still holds it, a nohup job among them.
// A signal the agent handles is reset to its default in the programs it
// starts; one it ignores is not: so the agent handles SIGHUP, and goes on
// taking no notice of it.
func defaultHangUps() {
	hangUpsOnce.Do(func() {
		if signal.Ignored(syscall.SIGHUP) {
			signal.Notify(make(chan os.Signal, 1), syscall.SIGHUP)
		}
	})
}

var hangUpsOnce sync.Once

// hangUpGrace is how long a terminal's processes have to let go of it
// after SIGHUP before the agent closes its end.
var hangUpGrace = 2 * time.Second

// hangUp ends a terminal's session, as closing a terminal does: SIGHUP to
// every process of the session whose leader is shell, then, if the pty
// is still held hangUpGrace later, the agent closes its end of it (the
// master, pty) and kills the shell if it is still there. A job that
// ignored the hang-up (nohup, or a trap that ignores HUP) keeps running, its terminal
// hung up (its writes to it fail with EIO, its reads get end of file), as
// after an SSH session; a shell that ignores SIGHUP (one started by an
// agent that was itself started with SIGHUP ignored inherits that, unless
// defaultHangUps) is the terminal's and goes with it, so the session's end
// waits on nothing of the session's. done is closed once the pty is let
// go of and the shell reaped. Processes that left the session (setsid, a
// daemon) are no longer the terminal's.
func hangUp(shell *os.Process, pty *os.File, done <-chan struct{}) {
	signalSession(shell.Pid, syscall.SIGHUP)
	grace := time.NewTimer(hangUpGrace)
	defer grace.Stop()
	select {
	case <-done:
		return
	case <-grace.C:
	}
	pty.Close()
	shell.Signal(syscall.SIGKILL) // nothing once it is reaped
}

// signalSession sends sig to session sid's process group and to every
// other process of the session: on Linux, those whose /proc/PID/stat
// names sid as their session (elsewhere, the group only). A session's
// id is not given to another while a process of it is left.
func signalSession(sid int, sig syscall.Signal) {
	syscall.Kill(-sid, sig)
	for _, p := range sessionProcesses(sid) {
		syscall.Kill(p, sig)
	}
}

// sessionProcesses lists the processes of session sid that /proc shows.
func sessionProcesses(sid int) []int {
	dir, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range dir {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid pgrp session ...: comm may hold spaces
		// and parentheses, so the fields are counted after its last ')'.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) > 3 && f[3] == strconv.Itoa(sid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// remoteCommand runs one command with --remote-shell -c, without a pty:
// the operator's bytes are its stdin (eof closes it), its stdout and
// stderr come back, then its exit status.
func (a *Agent) remoteCommand(ctx context.Context, c *remote.Conn, command string) error {
	defer closeOnEnd(ctx, c)()
	cmd := exec.Command(a.cfg.RemoteShell, "-c", command)
	cmd.Dir = a.cfg.RemoteRoot
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	out := &connWriter{c: c}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("cannot run the command: %v", err)
	}
	go func() {
		for {
			b, ctl, err := c.Read()
			if err != nil {
				syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				return
			}
			switch {
			case b != nil:
				stdin.Write(b)
			case ctl.Type == remote.TypeEOF:
				stdin.Close()
			}
		}
	}()
	err = cmd.Wait()
	return c.Send(remote.Control{Type: remote.TypeExit, Code: exitCode(err)})
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	if err != nil {
		return 255
	}
	return 0
}

// connWriter writes a program's output to the session, serialised: stdout
// and stderr write from two goroutines.
type connWriter struct {
	mu sync.Mutex
	c  *remote.Conn
}

func (w *connWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.c.Write(p); err != nil { // in pieces the operator's side reads
		return 0, err
	}
	return len(p), nil
}

// remoteForward connects the session to a TCP port of the device's
// loopback interface.
func (a *Agent) remoteForward(ctx context.Context, c *remote.Conn, port string) error {
	defer closeOnEnd(ctx, c)()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", port))
	if err != nil {
		return fmt.Errorf("cannot connect to port %s on the device: %v", port, err)
	}
	defer conn.Close()
	if err := c.Join(conn.(*net.TCPConn)); err != nil {
		a.log.Info("remote forward", "err", err)
	}
	return nil
}

// remotePath resolves path under --remote-root, following symbolic links,
// and refuses what resolves outside it.
func (a *Agent) remotePath(path string, mustExist bool) (string, error) {
	root, err := filepath.EvalSymlinks(a.cfg.RemoteRoot)
	if err != nil {
		return "", fmt.Errorf("the agent's --remote-root: %v", err)
	}
	p := filepath.Join(root, filepath.Clean("/"+path))
	resolved := p
	if mustExist {
		resolved, err = filepath.EvalSymlinks(p)
	} else {
		var dir string
		dir, err = filepath.EvalSymlinks(filepath.Dir(p))
		resolved = filepath.Join(dir, filepath.Base(p))
	}
	if err != nil {
		return "", fmt.Errorf("%s: %v", path, errors.Unwrap(err))
	}
	if !strings.HasPrefix(resolved, root+string(filepath.Separator)) && !(resolved == root && mustExist) {
		// The root itself is no file to put: a put beside it would write
		// its temporary file in the root's parent.
		return "", fmt.Errorf("%s is outside the directory this device shares (--remote-root)", path)
	}
	return resolved, nil
}

// remoteGet sends a file: its size, its bytes at no more than
// --remote-rate, then eof.
func (a *Agent) remoteGet(c *remote.Conn, path string) error {
	p, err := a.remotePath(path, true)
	if err != nil {
		return err
	}
	f, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("%s: %v", path, errors.Unwrap(err))
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", path)
	}
	if fi.Size() > a.cfg.RemoteMaxFile {
		return fmt.Errorf("%s is %d bytes, more than the %d this device sends (--remote-max-file-bytes)", path, fi.Size(), a.cfg.RemoteMaxFile)
	}
	if err := c.Send(remote.Control{Type: remote.TypeFile, Size: fi.Size()}); err != nil {
		return err
	}
	pace := newPacer(a.cfg.RemoteRate)
	buf := make([]byte, c.MaxSend())
	for {
		n, err := f.Read(buf)
		if n > 0 {
			pace.wait(n)
			if err := c.Write(buf[:n]); err != nil {
				return err
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	if err := c.Send(remote.Control{Type: remote.TypeEOF}); err != nil {
		return err
	}
	c.Read() // the operator closes when it has all
	return nil
}

// remotePut receives a file into a temporary file beside its path, and
// renames it into place once all its bytes came: a cut transfer leaves
// the old file as it was.
func (a *Agent) remotePut(c *remote.Conn, path string) error {
	p, err := a.remotePath(path, false)
	if err != nil {
		return err
	}
	_, ctl, err := c.Read()
	if err != nil {
		return err
	}
	if ctl == nil || ctl.Type != remote.TypeFile {
		return errors.New("a put starts with the file's size")
	}
	size := ctl.Size
	if size > a.cfg.RemoteMaxFile {
		return fmt.Errorf("the file is %d bytes, more than the %d this device takes (--remote-max-file-bytes)", size, a.cfg.RemoteMaxFile)
	}
	tmp, err := os.CreateTemp(filepath.Dir(p), "."+filepath.Base(p)+".fleetd-*")
	if err != nil {
		return fmt.Errorf("%s: %v", path, errors.Unwrap(err))
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	pace := newPacer(a.cfg.RemoteRate)
	var got int64
	for {
		b, ctl, err := c.Read()
		if err != nil {
			return err
		}
		if ctl != nil {
			if ctl.Type == remote.TypeEOF {
				break
			}
			continue
		}
		if got += int64(len(b)); got > size {
			return fmt.Errorf("more than the %d bytes announced", size)
		}
		pace.wait(len(b))
		if _, err := tmp.Write(b); err != nil {
			return fmt.Errorf("%s: %v", path, err)
		}
	}
	if got != size {
		return fmt.Errorf("%d bytes came of the %d announced", got, size)
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		return fmt.Errorf("%s: %v", path, errors.Unwrap(err))
	}
	return c.Send(remote.Control{Type: remote.TypeExit, Code: 0})
}

// pacer keeps a transfer at or below rate bytes a second (0: no limit).
type pacer struct {
	rate  int64
	start time.Time
	sent  int64
}

func newPacer(rate int64) *pacer { return &pacer{rate: rate, start: time.Now()} }

func (p *pacer) wait(n int) {
	if p.rate <= 0 {
		return
	}
	p.sent += int64(n)
	due := p.start.Add(time.Duration(float64(p.sent) / float64(p.rate) * float64(time.Second)))
	if d := time.Until(due); d > 0 {
		time.Sleep(d)
	}
}
