package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/firmware"
)

const bundleAbout = `Builds a firmware bundle archive, with its manifest.json, from component
files, so that no one writes a manifest by hand. Each argument is one
component: NAME=VERSION:PATH (the file is stored in the archive under its
base name). --depends says that a component needs another at a minimum
version: --depends 'app:bootloader>=1.1.0' (quoted: > is special to
the shell; repeat the flag for more).

The archive is gzipped unless --out ends in .tar. The same inputs always
make the same archive. The last line printed is the S5 declaration of the
archive, as JSON, for scripts that upload it in two steps:
  fleetd bundle create --version 2.3.0 --out fw-2.3.0.tar.gz \
    bootloader=1.2.0:build/boot.bin app=2.3.0:build/app.bin.gz \
    --depends 'app:bootloader>=1.1.0'`

// dependsFlag collects --depends COMPONENT:NEEDS>=VERSION.
type dependsFlag map[string][]fleet.Dependency

func (d dependsFlag) String() string { return "" }

func (d dependsFlag) Set(s string) error {
	component, rest, ok := strings.Cut(s, ":")
	needs, min, ok2 := strings.Cut(rest, ">=")
	if !ok || !ok2 || !fleet.ValidComponentName(component) || !fleet.ValidComponentName(needs) || !fleet.ValidVersion(min) {
		return fmt.Errorf("want COMPONENT:NEEDS>=VERSION, such as app:bootloader>=1.1.0")
	}
	d[component] = append(d[component], fleet.Dependency{ComponentName: needs, MinVersion: min})
	return nil
}

func runBundleCreate(ctx context.Context, args []string, e env) error {
	var version, out string
	deps := dependsFlag{}
	fs := newFlagSet("bundle create", "NAME=VERSION:PATH ...", bundleAbout, e.stderr)
	fs.StringVar(&version, "version", "", "the bundle's `VERSION` (numbers separated by dots; required)")
	fs.StringVar(&out, "out", "", "`FILE` to write the archive to (.tar.gz, or .tar for no gzip; required)")
	fs.Var(deps, "depends", "`COMPONENT:NEEDS>=VERSION`: a dependency of a component; repeatable")
	if err := fs.parse(args, e.getenv); err != nil {
		return err
	}
	if err := fs.require(1, -1, "version", "out"); err != nil {
		return err
	}
	var srcs []firmware.Source
	seen := map[string]bool{}
	for _, arg := range fs.positional {
		name, rest, ok := strings.Cut(arg, "=")
		ver, path, ok2 := strings.Cut(rest, ":")
		if !ok || !ok2 || path == "" {
			return fmt.Errorf("component %q: want NAME=VERSION:PATH, such as app=2.3.0:build/app.bin", arg)
		}
		f, err := os.Open(path)
		if err != nil {
			return fmt.Errorf("component %s: %w", name, err)
		}
		defer f.Close()
		info, err := f.Stat()
		if err != nil {
			return fmt.Errorf("component %s: %w", name, err)
		}
		if !info.Mode().IsRegular() {
			return fmt.Errorf("component %s: %s is not a regular file", name, path)
		}
		seen[name] = true
		srcs = append(srcs, firmware.Source{ComponentName: name, VersionNumber: ver, FileName: filepath.Base(path),
			Dependencies: deps[name], Size: info.Size(), Body: f})
	}
	for c := range deps {
		if !seen[c] {
			return fmt.Errorf("--depends names component %s, which is not in the bundle", c)
		}
	}

	// Write next to the target and rename at the end: a failed build leaves
	// no half archive behind.
	tmp, err := os.CreateTemp(filepath.Dir(out), ".bundle-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := firmware.Build(tmp, version, srcs, !strings.HasSuffix(out, ".tar")); err != nil {
		tmp.Close()
		return cliError(err)
	}
	// CreateTemp makes the file private; an archive is for sharing.
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Seek(0, 0); err != nil {
		tmp.Close()
		return err
	}
	// Measure the archive as the server will, so the declaration printed
	// is exactly what S5 must say.
	parsed, err := firmware.Parse(tmp, firmware.ParseOptions{})
	tmp.Close()
	if err != nil {
		return cliError(err)
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "wrote %s: bundle %s with %d components\n", out, version, len(srcs))
	for _, c := range parsed.Manifest.Components {
		fmt.Fprintf(e.stdout, "  %s %s (%s, %d bytes, sha256 %s)\n", c.ComponentName, c.VersionNumber, c.FileName, c.ContentLength, c.Checksum)
	}
	decl, _ := json.Marshal(fleet.Declaration{UncompressedSize: parsed.UncompressedSize, Checksum: parsed.Checksum, ContentLength: parsed.ContentLength})
	fmt.Fprintf(e.stdout, "%s\n", decl)
	return nil
}
