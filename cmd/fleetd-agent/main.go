// Command fleetd-agent is the program a Linux device runs to be managed by
// fleetd; see docs/agent.md. Everything but the process's environment is in
// package agent.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/fleetd/fleet/agent"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := agent.Run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
