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
	// The first interrupt ends the command's context, and fleetctl ends
	// what it is doing (a remote session is given a few seconds to end,
	// docs/cli.md); the signals are caught no more, so that a second one
	// ends fleetctl at once.
	context.AfterFunc(ctx, stop)
	code := ctl.Run(ctx, os.Args[1:], environment(os.Stdin, os.Stdout, os.Stderr))
	stop()
	os.Exit(code)
}

// environment is the process's environment as ctl sees it: a secret is
// asked for only when standard input is a terminal.
func environment(stdin, stdout, stderr *os.File) ctl.Env {
	env := ctl.Env{
		Getenv: os.Getenv, Stdin: stdin, Stdout: stdout, Stderr: stderr,
		IsTerminal: isTerminal,
	}
	if term.IsTerminal(int(stdin.Fd())) {
		env.ReadSecret = func(prompt string) (string, error) { return readSecret(stdin, stderr, prompt) }
	}
	return env
}

// readSecret prompts on stderr and reads a line from the terminal stdin
// without echoing it, as passwd does.
func readSecret(stdin, stderr *os.File, prompt string) (string, error) {
	fmt.Fprint(stderr, prompt)
	b, err := term.ReadPassword(int(stdin.Fd()))
	fmt.Fprintln(stderr)
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
