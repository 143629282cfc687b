// Command fleetctl is the command-line client of fleetd's HTTP API; see
// docs/cli.md. Everything but the process's environment is in package ctl.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/fleetd/fleet/ctl"
	"golang.org/x/term"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	env := ctl.Env{
		Getenv: os.Getenv, Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
		IsTerminal: isTerminal,
	}
	if term.IsTerminal(int(os.Stdin.Fd())) {
		env.ReadSecret = readSecret
	}
	code := ctl.Run(ctx, os.Args[1:], env)
	stop()
	os.Exit(code)
}

// readSecret prompts on standard error and reads a line from the terminal
// without echoing it, as passwd does.
func readSecret(prompt string) (string, error) {
	fmt.Fprint(os.Stderr, prompt)
	b, err := term.ReadPassword(int(os.Stdin.Fd()))
	fmt.Fprintln(os.Stderr)
	return string(b), err
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
