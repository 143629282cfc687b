// Command fleetd is the fleet management server and its tools: main wires
// signals and the real environment into run, which picks the command. The
// server is internal/server, the simulator internal/sim.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/fleetd/fleet/internal/cli"
	"github.com/fleetd/fleet/internal/server"
	"github.com/fleetd/fleet/internal/sim"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "fleetd:", err)
		}
		os.Exit(exitCode(err))
	}
}

// exitCode is 0 for help that was asked for, 2 for a command line that
// cannot be run, 1 for a command that failed.
func exitCode(err error) int {
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, cli.ErrUsage):
		return 2
	}
	return 1
}

// env is the process environment as run sees it.
type env struct {
	getenv func(string) string
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	// now, when set, is the clock of the rollouts (tests move it across a
	// daylight saving time change); time.Now otherwise.
	now func() time.Time
}

func (e env) cli() cli.Env {
	return cli.Env{Getenv: e.getenv, Stdin: e.stdin, Stdout: e.stdout, Stderr: e.stderr}
}

// command is one subcommand.
type command struct {
	name    string // "tenant create"
	summary string
	run     func(ctx context.Context, args []string, e env) error
}

func commands() []command {
	return []command{
		{"serve", "run the server: HTTP API, MQTT broker, background work", runServe},
		{"migrate", "apply database migrations and exit", cliCommand(server.Migrate)},
		{"tenant create", "create a tenant and print its admin API key", cliCommand(server.TenantCreate)},
		{"tenant list", "list tenants", cliCommand(server.TenantList)},
		{"apikey create", "create an API key in a tenant and print it", cliCommand(server.APIKeyCreate)},
		{"bundle create", "build a firmware bundle archive with its manifest", runBundleCreate},
		{"sim", "simulate a fleet of devices over MQTT: execute actions, send telemetry", cliCommand(sim.Run)},
		{"version", "print the version", runVersion},
	}
}

// cliCommand is a command that needs no more of the environment than
// cli.Env.
func cliCommand(run func(context.Context, []string, cli.Env) error) func(context.Context, []string, env) error {
	return func(ctx context.Context, args []string, e env) error { return run(ctx, args, e.cli()) }
}

// runServe is fleetd serve.
func runServe(ctx context.Context, args []string, e env) error {
	return server.Serve(ctx, args, server.Env{Env: e.cli(), Now: e.now})
}

// run is fleetd with its environment passed in.
func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	return runEnv(ctx, args, env{getenv: getenv, stdin: stdin, stdout: stdout, stderr: stderr})
}

// runEnv is run with the environment gathered.
// Help asked for goes to stdout (fleetd --help | less); the usage that
// comes with a command line that cannot run goes to stderr with the error.
func runEnv(ctx context.Context, args []string, e env) error {
	if len(args) == 0 {
		usage(e.stderr)
		return cli.UsageError("say which command to run")
	}
	if isHelp(args[0]) {
		if len(args) > 1 { // "fleetd help tenant create" is "fleetd tenant create --help"
			return runEnv(ctx, append(args[1:], "--help"), e)
		}
		usage(e.stdout)
		return flag.ErrHelp
	}
	// Longest match first: "tenant create" before a group "tenant".
	cmds := commands()
	sort.Slice(cmds, func(i, j int) bool { return len(cmds[i].name) > len(cmds[j].name) })
	for _, c := range cmds {
		words := strings.Fields(c.name)
		if len(args) >= len(words) && strings.Join(args[:len(words)], " ") == c.name {
			return c.run(ctx, args[len(words):], e)
		}
	}
	if group := groupCommands(args[0]); group != nil {
		if len(args) > 1 && isHelp(args[1]) {
			groupUsage(e.stdout, args[0], group)
			return flag.ErrHelp
		}
		groupUsage(e.stderr, args[0], group)
		if len(args) == 1 {
			return cli.UsageError(fmt.Sprintf("%s: say which: %s", args[0], subcommandNames(group)))
		}
	} else {
		usage(e.stderr)
	}
	return cli.UsageError(fmt.Sprintf("unknown command %q", strings.Join(args, " ")))
}

// isHelp is an argument that asks for help.
func isHelp(arg string) bool {
	return arg == "-h" || arg == "-help" || arg == "--help" || arg == "help"
}

// groupCommands is the commands whose name begins with the word group
// ("tenant": tenant create, tenant list), nil when there are none.
func groupCommands(group string) []command {
	var cs []command
	for _, c := range commands() {
		if first, _, ok := strings.Cut(c.name, " "); ok && first == group {
			cs = append(cs, c)
		}
	}
	return cs
}

// subcommandNames is "create or list".
func subcommandNames(cs []command) string {
	var names []string
	for _, c := range cs {
		_, sub, _ := strings.Cut(c.name, " ")
		names = append(names, sub)
	}
	if len(names) == 1 {
		return names[0]
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

func groupUsage(w io.Writer, group string, cs []command) {
	fmt.Fprintf(w, "Usage: fleetd %s <command> [flags]\n\nCommands:\n", group)
	for _, c := range cs {
		fmt.Fprintf(w, "  %-15s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nRun \"fleetd %s <command> --help\" for a command's flags.\n", group)
}

func usage(w io.Writer) {
	fmt.Fprint(w, `fleetd manages fleets of connected devices: it dispatches actions and follows
each device's progress, stores and serves firmware bundles, and watches device
data for alert conditions. Operators use its HTTP API; devices speak MQTT.

Usage: fleetd <command> [flags]

Commands:
`)
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-15s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, `
Every flag may also be set by an environment variable: --http-addr is
FLEETD_HTTP_ADDR. Flags win over the environment.
Run "fleetd <command> --help" for a command's flags.
`)
}
