//go:build !unix

package ctl

import "context"

// terminal needs a Unix terminal: elsewhere, give a command.
func (a *app) terminal(ctx context.Context, device string) error {
	return usagef("an interactive shell is supported on Unix only: give a command instead (fleetctl ssh DEVICE -- COMMAND)")
}
