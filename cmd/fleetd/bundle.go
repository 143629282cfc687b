package main

import (
	"context"

	fwbundle "github.com/fleetd/fleet/firmware/bundle"
	"github.com/fleetd/fleet/internal/cli"
)

// runBundleCreate builds a bundle archive; fleetctl firmware bundle create
// is the same command, through the same bundle.BuildFile.
func runBundleCreate(ctx context.Context, args []string, e env) error {
	var version, out string
	deps := fwbundle.Depends{}
	fs := cli.NewFlagSet("bundle create", "NAME=VERSION:PATH ...", fwbundle.BuildHelp("fleetd bundle create"), e.cli())
	fs.StringVar(&version, "version", "", "the bundle's `VERSION` (numbers separated by dots; required)")
	fs.StringVar(&out, "out", "", "`FILE` to write the archive to (.tar.gz, or .tar for no gzip; required)")
	fs.Var(deps, "depends", "`COMPONENT:NEEDS>=VERSION`: a dependency of a component; repeatable")
	if err := fs.Parse(args, e.getenv); err != nil {
		return err
	}
	if err := fs.Require(1, -1, "version", "out"); err != nil {
		return err
	}
	parsed, err := fwbundle.BuildFile(out, version, fs.Positional, deps)
	if err != nil {
		return err
	}
	fwbundle.WriteBuildReport(e.stdout, out, parsed)
	return nil
}
