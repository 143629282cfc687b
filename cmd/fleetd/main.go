// Command fleetd is the fleet management server and its tools. main only
// wires signals and the real environment into run, so tests call run.
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

func exitCode(err error) int {
	if errors.Is(err, flag.ErrHelp) || errors.Is(err, errUsage) {
		return 2
	}
	return 1
}

// errUsage is a command line that cannot be run; the usage was printed.
var errUsage = errors.New("usage error")

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

// command is one subcommand.
type command struct {
	name    string // "tenant create"
	summary string
	run     func(ctx context.Context, args []string, e env) error
}

func commands() []command {
	return []command{
		{"serve", "run the server: HTTP API, MQTT broker, background work", runServe},
		{"migrate", "apply database migrations and exit", runMigrate},
		{"tenant create", "create a tenant and print its admin API key", runTenantCreate},
		{"tenant list", "list tenants", runTenantList},
		{"apikey create", "create an API key in a tenant and print it", runAPIKeyCreate},
		{"bundle create", "build a firmware bundle archive with its manifest", runBundleCreate},
		{"sim", "simulate a fleet of devices over MQTT: execute actions, send telemetry", runSim},
		{"version", "print the version", runVersion},
	}
}

// run is fleetd with its environment passed in.
func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	return runEnv(ctx, args, env{getenv: getenv, stdin: stdin, stdout: stdout, stderr: stderr})
}

// runEnv is run with the environment gathered.
func runEnv(ctx context.Context, args []string, e env) error {
	stderr := e.stderr
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return errUsage
		}
		return flag.ErrHelp
	}
	// Longest match first: "tenant create" before a hypothetical "tenant".
	cmds := commands()
	sort.Slice(cmds, func(i, j int) bool { return len(cmds[i].name) > len(cmds[j].name) })
	for _, c := range cmds {
		words := strings.Fields(c.name)
		if len(args) >= len(words) && strings.Join(args[:len(words)], " ") == c.name {
			return c.run(ctx, args[len(words):], e)
		}
	}
	fmt.Fprintf(stderr, "fleetd: unknown command %q\n\n", strings.Join(args, " "))
	usage(stderr)
	return errUsage
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
