package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// flagSet is a subcommand's flags, each with a FLEETD_* environment
// equivalent.
type flagSet struct {
	*flag.FlagSet
	cmd, args, about string
	positional       []string        // the arguments that are not flags, in order
	hidden           map[string]bool // flags left out of the usage
	stdout, stderr   io.Writer       // where help asked for goes, and a wrong command line's usage
}

// hide leaves a flag out of the usage; it still works, and so does its
// environment variable.
func (fs *flagSet) hide(name string) {
	if fs.hidden == nil {
		fs.hidden = map[string]bool{}
	}
	fs.hidden[name] = true
}

func newFlagSet(cmd, args, about string, e env) *flagSet {
	fs := &flagSet{FlagSet: flag.NewFlagSet(cmd, flag.ContinueOnError), cmd: cmd, args: args, about: about, stdout: e.stdout, stderr: e.stderr}
	fs.SetOutput(e.stderr) // the flag package's word on a wrong flag
	fs.Usage = func() {}   // parse prints it, where it belongs
	return fs
}

// envName is the environment variable of a flag: --http-addr is
// FLEETD_HTTP_ADDR.
func envName(flagName string) string {
	return "FLEETD_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// parse reads the command line, flags and arguments in any order
// ("tenant create acme --database x.db"), then the environment for every
// flag the command line left alone.
func (fs *flagSet) parse(args []string, getenv func(string) string) error {
	for {
		if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
			fs.usage(fs.stdout) // help asked for is the command's output
			return err
		} else if err != nil { // the flag package printed it; the usage goes with it
			fs.usage(fs.stderr)
			return &usageError{fmt.Sprintf("%s: %v", fs.cmd, err)}
		}
		if fs.NArg() == 0 {
			break
		}
		fs.positional = append(fs.positional, fs.Arg(0))
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

// isSet reports whether the flag name was given, on the command line or
// in the environment.
func (fs *flagSet) isSet(name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// require is a usage error naming each of the flags that is empty, and
// how many positional arguments there must be, at least (min) and at most
// (max, -1: any).
func (fs *flagSet) require(min, max int, flags ...string) error {
	var missing []string
	for _, name := range flags {
		if fs.Lookup(name).Value.String() == "" {
			missing = append(missing, "--"+name)
		}
	}
	n := len(fs.positional)
	switch {
	case n < min:
		missing = append(missing, fs.args)
	case max >= 0 && n > max:
		return &usageError{fmt.Sprintf("%s: unexpected arguments %q (fleetd %s --help)", fs.cmd, fs.positional[max:], fs.cmd)}
	case len(missing) == 0:
		return nil
	}
	return &usageError{fmt.Sprintf("%s: missing %s (fleetd %s --help)", fs.cmd, strings.Join(missing, " and "), fs.cmd)}
}

func (fs *flagSet) usage(w io.Writer) {
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
