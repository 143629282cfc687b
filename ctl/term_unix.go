//go:build unix

package ctl

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/term"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/remote"
)

// terminal joins this terminal, in raw mode, to a shell on the device's
// pty, and keeps the pty's size the terminal's.
func (a *app) terminal(ctx context.Context, device string) error {
	in, ok := a.env.Stdin.(*os.File)
	if !ok || !term.IsTerminal(int(in.Fd())) {
		return usagef("an interactive shell needs a terminal: give a command instead (fleetctl ssh DEVICE -- COMMAND)")
	}
	fd := int(in.Fd())
	conn, err := a.openRemote(ctx, device, fleet.RemoteShell, "")
	if err != nil {
		return err
	}
	defer a.finish(conn)
	old, err := term.MakeRaw(fd)
	if err != nil {
		return err
	}
	defer term.Restore(fd, old)
	resize := func() {
		if cols, rows, err := term.GetSize(fd); err == nil {
			conn.Send(remote.Control{Type: remote.TypeResize, Cols: cols, Rows: rows})
		}
	}
	resize()
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	defer signal.Stop(winch)
	go func() {
		for range winch {
			resize()
		}
	}()
	go conn.Pump(in)
	return a.receive(conn.Conn, a.env.Stdout)
}
