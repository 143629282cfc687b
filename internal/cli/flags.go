// Package cli is what fleetd's commands share: flags with FLEETD_*
// environment equivalents, the usage errors that exit 2, and the
// environment a command runs in, passed in so that tests run commands in
// process.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Env is the process environment as a command sees it.
type Env struct {
	Getenv func(string) string
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
}

// ErrUsage is a command line that cannot be run; fleetd exits 2.
var ErrUsage = errors.New("usage error")

// usageError is a command line that cannot be run, saying why: the missing
// flag or argument, the unknown one. It is ErrUsage.
type usageError struct{ msg string }

func (e *usageError) Error() string        { return e.msg }
func (e *usageError) Is(target error) bool { return target == ErrUsage }

// UsageError is a command line that cannot be run, saying why in msg; it
// is ErrUsage.
func UsageError(msg string) error { return &usageError{msg} }

// FlagSet is a subcommand's flags, each with a FLEETD_* environment
// equivalent.
type FlagSet struct {
	*flag.FlagSet
	cmd, args, about string
	// Positional is the arguments that are not flags, in order.
	Positional     []string
	hidden         map[string]bool // flags left out of the usage
	stdout, stderr io.Writer       // where help asked for goes, and a wrong command line's usage
}

// Hide leaves a flag out of the usage; it still works, and so does its
// environment variable.
func (fs *FlagSet) Hide(name string) {
	if fs.hidden == nil {
		fs.hidden = map[string]bool{}
	}
	fs.hidden[name] = true
}

// NewFlagSet is the flags of command cmd ("tenant create"), whose
// positional arguments args and description about its usage shows.
func NewFlagSet(cmd, args, about string, e Env) *FlagSet {
	fs := &FlagSet{FlagSet: flag.NewFlagSet(cmd, flag.ContinueOnError), cmd: cmd, args: args, about: about, stdout: e.Stdout, stderr: e.Stderr}
	fs.SetOutput(e.Stderr) // the flag package's word on a wrong flag
	fs.Usage = func() {}   // parse prints it, where it belongs
	return fs
}

// envName is the environment variable of a flag: --http-addr is
// FLEETD_HTTP_ADDR.
func envName(flagName string) string {
	return "FLEETD_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Parse reads the command line, flags and arguments in any order
// ("tenant create acme --database x.db"), then the environment for every
// flag the command line left alone.
func (fs *FlagSet) Parse(args []string, getenv func(string) string) error {
	for {
		if err := fs.FlagSet.Parse(args); errors.Is(err, flag.ErrHelp) {
			fs.usage(fs.stdout) // help asked for is the command's output
			return err
		} else if err != nil { // the flag package printed it; the usage goes with it
			fs.usage(fs.stderr)
			return UsageError(fmt.Sprintf("%s: %v", fs.cmd, err))
		}
		if fs.NArg() == 0 {
			break
		}
		fs.Positional = append(fs.Positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		if v := getenv(envName(f.Name)); v != "" {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %v", envName(f.Name), v, e)
			}
		}
	})
	return err
}

// IsSet reports whether the flag name was given, on the command line or
// in the environment.
func (fs *FlagSet) IsSet(name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// Require is a usage error naming each of the flags that is empty, and
// how many positional arguments there must be, at least (min) and at most
// (max, -1: any).
func (fs *FlagSet) Require(min, max int, flags ...string) error {
	var missing []string
	for _, name := range flags {
		if fs.Lookup(name).Value.String() == "" {
			missing = append(missing, "--"+name)
		}
	}
	n := len(fs.Positional)
	switch {
	case n < min:
		missing = append(missing, fs.args)
	case max >= 0 && n > max:
		return UsageError(fmt.Sprintf("%s: unexpected arguments %q (fleetd %s --help)", fs.cmd, fs.Positional[max:], fs.cmd))
	case len(missing) == 0:
		return nil
	}
	return UsageError(fmt.Sprintf("%s: missing %s (fleetd %s --help)", fs.cmd, strings.Join(missing, " and "), fs.cmd))
}

func (fs *FlagSet) usage(w io.Writer) {
	fmt.Fprintf(w, "Usage: fleetd %s [flags] %s\n\n%s\n", fs.cmd, fs.args, fs.about)
	n := 0
	fs.VisitAll(func(f *flag.Flag) {
		if !fs.hidden[f.Name] {
			n++
		}
	})
	if n == 0 {
		return
	}
	fmt.Fprintln(w, "\nFlags (each also read from the environment variable shown):")
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fs.VisitAll(func(f *flag.Flag) {
		if fs.hidden[f.Name] {
			return
		}
		name, _ := flag.UnquoteUsage(f)
		arg := "--" + f.Name
		if name != "" {
			arg += " " + name
		}
		def := ""
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" {
			def = " (default " + f.DefValue + ")"
		}
		_, usage := flag.UnquoteUsage(f)
		fmt.Fprintf(tw, "  %s\t%s\t%s%s\n", arg, envName(f.Name), usage, def)
	})
	tw.Flush()
}
