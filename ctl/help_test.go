package ctl_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/fleetd/fleet/ctl"
	"github.com/spf13/cobra"
)

// TestHelpOnStdout: help asked for, of any command, is the command's output
// (fleetctl devices --help | less) and exits 0; a wrong flag is an error on
// stderr with exit 2, and nothing on stdout, which a script may be reading;
// so is a group run without one of its commands. fleetd's own commands do
// the same (TestCommandLine).
func TestHelpOnStdout(t *testing.T) {
	run := func(args ...string) (code int, stdout, stderr string) {
		var out, errOut bytes.Buffer
		code = ctl.Run(context.Background(), args, ctl.Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errOut})
		return code, out.String(), errOut.String()
	}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		path := strings.Fields(c.CommandPath())[1:] // without "fleetctl"
		for _, h := range []string{"--help", "-h"} {
			code, out, errOut := run(append(path, h)...)
			if code != ctl.ExitOK || !strings.Contains(out, "Usage:") || errOut != "" {
				t.Errorf("fleetctl %s %s: exit %d, stdout %q, stderr %q; want the usage on stdout alone, exit 0", strings.Join(path, " "), h, code, out, errOut)
			}
		}
		code, out, errOut := run(append(path, "--no-such-flag")...)
		if code != ctl.ExitUsage || out != "" || !strings.Contains(errOut, "no-such-flag") {
			t.Errorf("fleetctl %s --no-such-flag: exit %d, stdout %q, stderr %q; want the error on stderr alone, exit 2", strings.Join(path, " "), code, out, errOut)
		}
		if c.HasAvailableSubCommands() {
			code, out, errOut := run(path...)
			if code != ctl.ExitUsage || out != "" || !strings.Contains(errOut, "say which command") {
				t.Errorf("fleetctl %s: exit %d, stdout %q, stderr %q; want the usage and \"say which command\" on stderr alone, exit 2", strings.Join(path, " "), code, out, errOut)
			}
		}
		for _, sub := range c.Commands() {
			if !sub.Hidden && sub.Name() != "help" {
				walk(sub)
			}
		}
	}
	walk(ctl.Root())
}
