package main

import (
	"context"
	"fmt"
	"runtime/debug"

	"github.com/fleetd/fleet/internal/cli"
)

func runVersion(ctx context.Context, args []string, e env) error {
	fs := cli.NewFlagSet("version", "", "Prints fleetd's version and the commit it was built from.", e.cli())
	if err := fs.Parse(args, e.getenv); err != nil {
		return err
	}
	if err := fs.Require(0, 0); err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, "fleetd", version())
	return nil
}

// version is the module version, or the VCS revision of a development build.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = "+dirty"
			}
		}
	}
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		return fmt.Sprintf("%s (%s%s, %s)", v, rev, modified, bi.GoVersion)
	}
	return fmt.Sprintf("%s (%s)", v, bi.GoVersion)
}
