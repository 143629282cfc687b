// Package ctl is fleetctl, the command-line client of fleetd's HTTP API.
// It talks only HTTP: nothing of the server's database or broker is linked
// in (a test holds it to that). cmd/fleetctl's main calls Run; tests call
// Run too, against a real fleetd.
package ctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// Env is the process environment as fleetctl sees it.
type Env struct {
	Getenv func(string) string
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// IsTerminal says whether the writer is a terminal, where progress
	// redraws in place; nil means never.
	IsTerminal func(io.Writer) bool
	// ReadSecret shows prompt and reads a line from the terminal without
	// echoing it; nil when standard input is not a terminal.
	ReadSecret func(prompt string) (string, error)
}

// The exit codes a script can rely on (rootLong tells them to users).
const (
	ExitOK      = 0 // done; for a watch, every device finished and no more failed than --max-failed allows
	ExitRefused = 1 // a request failed: the server refused (its message is on stderr) or could not be reached
	ExitUsage   = 2 // the command line cannot be run
	ExitPaused  = 3 // a watched rollout paused: a gate did not hold, or an operator paused it
	ExitFailed  = 4 // more devices of a watched action failed than --max-failed allows
	ExitTimeout = 5 // the watch's time limit ran out first
	ExitAborted = 6 // a watched rollout was aborted, or device actions of a watched action were cancelled
)

// usageError is a command line that cannot be run: exit 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{fmt.Sprintf(format, args...)}
}

// runError is a command that ran and failed: exit 1. Errors that come out
// of cobra without it are its own, about the command line.
type runError struct{ err error }

func (e *runError) Error() string { return e.err.Error() }
func (e *runError) Unwrap() error { return e.err }

// Run runs fleetctl with args (without the program name) and returns its
// exit code. Errors are written to e.Stderr.
func Run(ctx context.Context, args []string, e Env) int {
	if e.Getenv == nil {
		e.Getenv = func(string) string { return "" }
	}
	a := &app{env: e, now: time.Now}
	root := a.root()
	root.SetArgs(args)
	root.SetIn(e.Stdin)
	root.SetOut(e.Stdout)
	root.SetErr(e.Stderr)
	addCompletion(root)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	var ue *usageError
	var re *runError
	var we *watchEnd
	var rx *remoteExit
	switch {
	case errors.As(err, &rx):
		return rx.code // the remote command's own status; it said why
	case errors.As(err, &we):
		fmt.Fprintf(e.Stderr, "fleetctl: %v\n", err)
		return we.code
	case errors.As(err, &ue) || !errors.As(err, &re):
		fmt.Fprintf(e.Stderr, "fleetctl: %v\nRun 'fleetctl --help' for usage.\n", err)
		return ExitUsage
	default:
		fmt.Fprintf(e.Stderr, "fleetctl: %v\n", err)
		return ExitRefused
	}
}

// Root returns fleetctl's command tree, for the generated documentation.
func Root() *cobra.Command {
	root := (&app{env: Env{Getenv: func(string) string { return "" }}, now: time.Now}).root()
	addCompletion(root)
	return root
}

// addCompletion adds cobra's completion group to root, once root's output
// is set (the group's commands write where it was when they were made),
// as a group that says which of its commands to run.
func addCompletion(root *cobra.Command) {
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() == "completion" {
			c.RunE = groupRun
		}
	}
}

// app holds what every command shares: the environment, the global flags
// and, once resolved, the client.
type app struct {
	env Env
	now func() time.Time

	// global flags
	contextName string
	url         string
	tenant      string
	apiKey      string
	caFile      string
	output      string

	client *client
}

const rootLong = `fleetctl talks to a fleetd server over its HTTP API: devices, actions and
rollouts, firmware bundles, alert rules and alerts, API keys, the tenant's
end-user authentication and the audit log.

Start with 'fleetctl login --url URL --tenant TENANT', which asks for the
key (or takes it from FLEETCTL_API_KEY) and stores a named context in
$XDG_CONFIG_HOME/fleetctl/config (mode 0600). The
flags --context, --url, --tenant, --api-key and --ca-file and the variables
FLEETCTL_URL, FLEETCTL_TENANT, FLEETCTL_API_KEY and FLEETCTL_CA_FILE override
the context (flags first).

Output is a table unless -o json, -o yaml or -o edn (the server's own EDN)
asks for a form for scripts, or -o csv for a spreadsheet: the list a command
shows as a header row and a row an item, a column per field; a nested
object's fields are columns named by their dotted path (data.temperature,
data.gps.lat), an array is one column holding its JSON, null and a missing
field are empty, and a fleet-wide aggregate by device has a row per bucket,
its device_id first.

Exit codes (the 3 to 6 come from 'actions watch' and 'actions dispatch
--watch', so that a CI job can gate on a rollout):
  0  done; for a watch, every device finished and no more failed than
     --max-failed allows (default 0)
  1  a request failed: the server refused (its message on stderr), or could
     not be reached
  2  the command line cannot be run
  3  the watched rollout paused: a gate did not hold, or an operator paused it
  4  more devices failed than --max-failed allows
  5  the watch's time limit (--watch-timeout, or watch's --timeout) ran out
  6  the rollout was aborted, or device actions were cancelled (an operator's
     cancel, or the schedule's end before their phase)`

func (a *app) root() *cobra.Command {
	root := &cobra.Command{
		Use:           "fleetctl",
		Short:         "The command-line client of fleetd's HTTP API",
		Long:          rootLong,
		SilenceErrors: true,
		SilenceUsage:  true,
		Args:          noArgs,
		RunE:          groupRun,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err.Error()} })
	pf := root.PersistentFlags()
	pf.StringVar(&a.contextName, "context", "", "the `NAME`d context of the config file to use, instead of its current one")
	pf.StringVar(&a.url, "url", "", "fleetd's base `URL` (env FLEETCTL_URL)")
	pf.StringVar(&a.tenant, "tenant", "", "the `TENANT` to act in (env FLEETCTL_TENANT)")
	pf.StringVar(&a.apiKey, "api-key", "", "the API `KEY` (env FLEETCTL_API_KEY); prefer the variable or a context, as arguments show in ps")
	pf.StringVar(&a.caFile, "ca-file", "", "PEM `FILE` of the certificate authorities to trust for https (env FLEETCTL_CA_FILE)")
	pf.StringVarP(&a.output, "output", "o", "table", "output `FORMAT`: table, json, yaml, edn or csv (a list: a header row, a column per field, nested fields as dotted names)")
	root.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"table", "json", "yaml", "edn", "csv"}, cobra.ShellCompDirectiveNoFileComp))
	root.RegisterFlagCompletionFunc("context", a.completeContexts)

	root.PersistentPreRunE = func(*cobra.Command, []string) error { return a.checkOutput() }
	root.AddCommand(a.loginCmd(), a.configCmd(), a.devicesCmd(), a.actionsCmd(), a.firmwareCmd(),
		a.alertRulesCmd(), a.alertsCmd(), a.rolloutRulesCmd(), a.streamsCmd(), a.logsCmd(), a.shadowCmd(), a.groupsCmd(), a.apikeysCmd(), a.tenantCmd(), a.auditCmd(),
		a.sshCmd(), a.forwardCmd(), a.cpCmd(), a.sessionsCmd())
	markRunErrors(root)
	return root
}

// markRunErrors makes every error a command's RunE returns a runError, so
// that Run tells them from cobra's errors about the command line.
func markRunErrors(c *cobra.Command) {
	if run := c.RunE; run != nil {
		c.RunE = func(cmd *cobra.Command, args []string) error {
			err := run(cmd, args)
			var ue *usageError
			if err == nil || errors.As(err, &ue) {
				return err
			}
			return &runError{err}
		}
	}
	for _, sub := range c.Commands() {
		markRunErrors(sub)
	}
}

// groupRun is the RunE of a command that only groups others: alone it
// shows its help; with an argument, that is no subcommand of it.
func groupRun(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("unknown command %q for %q", args[0], cmd.CommandPath())
	}
	// A group alone cannot be run: as fleetd does, say so on stderr with
	// the usage and exit 2, so that a script that forgot the command
	// fails rather than reading help as output.
	var names []string
	for _, sub := range cmd.Commands() {
		if sub.IsAvailableCommand() && sub.Name() != "help" {
			names = append(names, sub.Name())
		}
	}
	fmt.Fprint(cmd.ErrOrStderr(), cmd.UsageString())
	msg := "say which command: " + strings.Join(names, ", ")
	if cmd.HasParent() {
		msg = strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" ") + ": " + msg
	}
	return usagef("%s", msg)
}

// group makes a command that only groups others.
func group(use, short string, subs ...*cobra.Command) *cobra.Command {
	c := &cobra.Command{Use: use, Short: short, RunE: groupRun}
	c.AddCommand(subs...)
	return c
}

// exactArgs and the others are cobra's argument checks, as usage errors.
func exactArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usagef("%s takes %d argument(s), got %d: %s", cmd.CommandPath(), n, len(args), cmd.UseLine())
		}
		return nil
	}
}

func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 && cmd.HasSubCommands() {
		return nil // groupRun names the unknown command
	}
	return exactArgs(0)(cmd, args)
}

func rangeArgs(min, max int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < min || len(args) > max {
			return usagef("%s takes %d to %d arguments, got %d: %s", cmd.CommandPath(), min, max, len(args), cmd.UseLine())
		}
		return nil
	}
}
