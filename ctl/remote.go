package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/remote"
)

// remoteExit is a remote command's exit status, which fleetctl exits with.
type remoteExit struct{ code int }

func (e *remoteExit) Error() string {
	return fmt.Sprintf("the remote command exited with status %d", e.code)
}

// openRemote makes a remote session with device and joins it: a refusal
// (no permission, a cap, no such device) is the server's message.
func (a *app) openRemote(ctx context.Context, device, kind, target string) (*session, error) {
	c, err := a.connect(ctx)
	if err != nil {
		return nil, err
	}
	b, err := c.call(ctx, request{method: "POST", path: "/api/v1/devices/" + esc(device) + "/remote-sessions",
		body: map[string]string{"kind": kind, "target": target}})
	if err != nil {
		return nil, err
	}
	var s fleet.RemoteSession
	if err := json.Unmarshal(b, &s); err != nil || s.ID == "" {
		return nil, fmt.Errorf("the server's answer is not a remote session: %s", b)
	}
	if s.Recorded {
		fmt.Fprintln(a.env.Stderr, "fleetctl: this session's output is recorded (docs/agent.md#recording)")
	}
	h := http.Header{"X-Service-Tenant": {c.tenant}, "X-Service-Api-Key": {c.key}}
	tc := c.http.Transport.(*http.Transport).TLSClientConfig
	// A stream leg (docs/agent.md, The session's messages), unless
	// FLEETCTL_REMOTE_WEBSOCKET asks for a WebSocket, for a proxy before
	// fleetd that passes no other upgrade.
	dial := remote.DialStream
	if v := a.env.Getenv("FLEETCTL_REMOTE_WEBSOCKET"); v != "" && v != "0" && v != "false" {
		dial = remote.Dial
	}
	conn, err := dial(ctx, c.base+"/api/v1/remote-sessions/"+esc(s.ID)+"/operator", h, tc)
	if err != nil {
		return nil, err
	}
	// Interrupted, fleetctl ends the session as when it is done with it
	// (finish), with less patience: it returns once fleetd has, or after
	// interruptPatience.
	stop := context.AfterFunc(ctx, func() { conn.CloseWrite(interruptPatience) })
	return &session{Conn: conn, stop: stop}, nil
}

// session is a remote session's leg as fleetctl holds it: stop stops
// the watch on the command's context (openRemote), once it is done with.
type session struct {
	*remote.Conn
	stop func() bool
}

// remotePatience is how long fleetctl waits for fleetd to close a
// session's leg once it is done with it; interruptPatience, once
// interrupted (a second interrupt ends fleetctl at once: cmd/fleetctl).
const (
	remotePatience    = time.Minute
	interruptPatience = 3 * time.Second
)

// finish ends a session fleetctl is done with, and returns once fleetd
// has closed its leg, which fleetd does once it has recorded the
// session's end: when fleetctl returns, the session no longer counts
// under the caps (docs/agent.md, Caps), and a script's next session is
// not refused for it. It waits remotePatience at most (interruptPatience
// once interrupted), then says so.
func (a *app) finish(conn *session) {
	patience := remotePatience
	if !conn.stop() {
		patience = interruptPatience
	}
	if conn.Finish(patience) != nil {
		fmt.Fprintf(a.env.Stderr, "fleetctl: fleetd did not close the session within %s; it counts under the caps until fleetd records its end\n", patience)
	}
}

func (a *app) sshCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "ssh DEVICE [-- COMMAND [ARG]...]",
		Short: "A shell on a device that runs fleetd-agent --remote: a terminal, or one command and its exit status",
		Long: `Opens a remote session with the device through fleetd-agent (docs/agent.md).
Without a command, an interactive terminal on a pty (standard input must be
a terminal). With one, the command runs with the device's shell -c; its
output comes back on standard output, standard input goes to it, and
fleetctl exits with its exit status. A session the server refuses (no
remote permission, too many open, an unknown device) exits 1 with its
message. When fleetctl returns, the session has ended and no longer counts
under the server's caps (docs/agent.md, Caps). Interrupted, fleetctl ends the session and waits 3 seconds at most for the
server to record its end (a minute when done); a second interrupt exits at
once.`,
		Example: "  fleetctl ssh pump-1\n  fleetctl ssh pump-1 -- systemctl status app",
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("say which device: fleetctl ssh DEVICE [-- COMMAND]")
			}
			return nil
		},
		ValidArgsFunction: a.completeDevices,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				return a.terminal(cmd.Context(), args[0])
			}
			return a.remoteCommand(cmd.Context(), args[0], strings.Join(args[1:], " "))
		},
	}
}

// remoteCommand runs command on device: stdin to it, its output to
// stdout, its exit status as fleetctl's.
func (a *app) remoteCommand(ctx context.Context, device, command string) error {
	conn, err := a.openRemote(ctx, device, fleet.RemoteShell, command)
	if err != nil {
		return err
	}
	defer a.finish(conn)
	if a.env.Stdin != nil {
		go conn.Pump(a.env.Stdin)
	}
	return a.receive(conn.Conn, a.env.Stdout)
}

// receive writes the session's bytes to w until it ends: an exit status
// (a remoteExit unless 0), an error message, or the connection's end.
func (a *app) receive(conn *remote.Conn, w io.Writer) error {
	for {
		b, ctl, err := conn.Read()
		if err != nil {
			if remote.Closed(err) {
				return errors.New("the session ended without an exit status")
			}
			return fmt.Errorf("the session ended: %v", err)
		}
		if b != nil {
			if _, err := w.Write(b); err != nil {
				return err
			}
			continue
		}
		switch ctl.Type {
		case remote.TypeExit:
			if ctl.Code != 0 {
				return &remoteExit{ctl.Code}
			}
			return nil
		case remote.TypeError:
			return errors.New(ctl.Message)
		}
	}
}

func (a *app) forwardCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "forward DEVICE LOCAL:REMOTE",
		Short: "Forward a local TCP port to a port on a device that runs fleetd-agent --remote",
		Long: `Listens on 127.0.0.1:LOCAL (0 chooses a free port; the address is printed
on standard output) and joins each connection to port REMOTE of the
device's loopback interface, through a remote session of its own, until
interrupted. A session ends once both ways have half-closed; its local
connection is closed once the server has recorded its end, and when
fleetctl returns every session it opened has ended (docs/agent.md, Caps).
Interrupted, fleetctl waits 3 seconds at most for the server to record
their ends (a minute for a session once done); a second interrupt exits at
once. Sessions go
as streams (docs/agent.md, The session's messages), or as WebSockets with
FLEETCTL_REMOTE_WEBSOCKET=1, for a proxy before fleetd that passes no other
upgrade.`,
		Example:           "  fleetctl forward pump-1 8080:80",
		Args:              exactArgs(2),
		ValidArgsFunction: a.completeDevices,
		RunE: func(cmd *cobra.Command, args []string) error {
			local, port, ok := strings.Cut(args[1], ":")
			if !ok || local == "" || port == "" {
				return usagef("say the ports as LOCAL:REMOTE, such as 8080:80")
			}
			ctx := cmd.Context()
			ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", local))
			if err != nil {
				return err
			}
			context.AfterFunc(ctx, func() { ln.Close() })
			fmt.Fprintln(a.env.Stdout, ln.Addr().String())
			var wg sync.WaitGroup
			defer wg.Wait()
			for {
				c, err := ln.Accept()
				if err != nil {
					if ctx.Err() != nil {
						return nil
					}
					return err
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer c.Close()
					if err := a.forwardOne(ctx, args[0], port, c.(*net.TCPConn)); err != nil {
						fmt.Fprintf(a.env.Stderr, "fleetctl: forward: %v\n", err)
					}
				}()
			}
		},
	}
}

// forwardOne joins one local connection to the device's port.
func (a *app) forwardOne(ctx context.Context, device, port string, c *net.TCPConn) error {
	conn, err := a.openRemote(ctx, device, fleet.RemoteForward, port)
	if err != nil {
		return err
	}
	defer a.finish(conn)
	return conn.Join(c)
}

func (a *app) cpCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "cp DEVICE:PATH LOCAL | cp LOCAL DEVICE:PATH",
		Short: "Copy a file from or to a device that runs fleetd-agent --remote",
		Long: `Copies one file through a remote session. The device's side is written
DEVICE:PATH (a colon before any slash, as scp does); PATH is within the
directory the device shares (its --remote-root), and the device's size and
rate limits apply. A file received is written beside its destination and
renamed into place once complete, on either side. When fleetctl returns,
the session has ended and no longer counts under the server's caps
(docs/agent.md, Caps). Interrupted, fleetctl ends the session and waits 3 seconds at most for the
server to record its end (a minute when done); a second interrupt exits at
once.`,
		Example: "  fleetctl cp pump-1:/var/log/app.log app.log\n  fleetctl cp app.conf pump-1:/etc/app/app.conf",
		Args:    exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			srcDev, srcPath, srcRemote := remoteSpec(args[0])
			dstDev, dstPath, dstRemote := remoteSpec(args[1])
			switch {
			case srcRemote == dstRemote:
				return usagef("say exactly one side as DEVICE:PATH")
			case srcRemote:
				return a.cpGet(cmd.Context(), srcDev, srcPath, args[1])
			default:
				return a.cpPut(cmd.Context(), args[0], dstDev, dstPath)
			}
		},
	}
}

// remoteSpec splits DEVICE:PATH; a colon after a slash is part of a local
// path.
func remoteSpec(s string) (device, path string, ok bool) {
	device, path, ok = strings.Cut(s, ":")
	if !ok || strings.Contains(device, "/") || !fleet.ValidDeviceID(device) {
		return "", s, false
	}
	return device, path, true
}

func (a *app) cpGet(ctx context.Context, device, path, local string) error {
	if fi, err := os.Stat(local); err == nil && fi.IsDir() {
		local = filepath.Join(local, filepath.Base(path))
	}
	conn, err := a.openRemote(ctx, device, fleet.RemoteGet, path)
	if err != nil {
		return err
	}
	defer a.finish(conn)
	_, ctl, err := conn.Read()
	if err != nil {
		return fmt.Errorf("the session ended: %v", err)
	}
	if ctl == nil || ctl.Type != remote.TypeFile {
		if ctl != nil && ctl.Type == remote.TypeError {
			return errors.New(ctl.Message)
		}
		return errors.New("the device did not send a file")
	}
	tmp, err := os.CreateTemp(filepath.Dir(local), "."+filepath.Base(local)+".fleetctl-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	var got int64
	for {
		b, ctl2, err := conn.Read()
		if err != nil {
			return fmt.Errorf("the session ended after %d of %d bytes: %v", got, ctl.Size, err)
		}
		if ctl2 != nil {
			if ctl2.Type == remote.TypeError {
				return errors.New(ctl2.Message)
			}
			if ctl2.Type == remote.TypeEOF {
				break
			}
			continue
		}
		// A device sends what it announced, no more: fleetctl's disk
		// is not a device's to fill.
		if got += int64(len(b)); got > ctl.Size {
			return fmt.Errorf("the device sent more than the %d bytes it announced", ctl.Size)
		}
		if _, err := tmp.Write(b); err != nil {
			return err
		}
	}
	if got != ctl.Size {
		return fmt.Errorf("%d bytes came of the %d announced", got, ctl.Size)
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), local)
}

func (a *app) cpPut(ctx context.Context, local, device, path string) error {
	f, err := os.Open(local)
	if err != nil {
		return usagef("%v", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return usagef("%s is not a regular file", local)
	}
	conn, err := a.openRemote(ctx, device, fleet.RemotePut, path)
	if err != nil {
		return err
	}
	defer a.finish(conn)
	done := make(chan error, 1)
	go func() { done <- a.receive(conn.Conn, io.Discard) }()
	if err := conn.Send(remote.Control{Type: remote.TypeFile, Size: fi.Size()}); err != nil {
		return err
	}
	buf := make([]byte, conn.MaxSend())
	for {
		n, err := f.Read(buf)
		if n > 0 {
			if werr := conn.Write(buf[:n]); werr != nil {
				return <-done
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	conn.Send(remote.Control{Type: remote.TypeEOF})
	return <-done
}
