// Command fleetctl is the command-line client of fleetd's HTTP API; see
// docs/cli.md. Everything but the process's environment is in package ctl.
package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/fleetd/fleet/ctl"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := ctl.Run(ctx, os.Args[1:], ctl.Env{
		Getenv: os.Getenv, Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
		IsTerminal: isTerminal,
	})
	stop()
	os.Exit(code)
}

// isTerminal reports whether w is a character device, as a terminal is.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
