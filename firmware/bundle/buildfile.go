package bundle

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/fleetd/fleet"
)

// The command lines that build bundles (fleetd bundle create and fleetctl
// firmware bundle create) share what follows, so that both take the same
// arguments and make the same archive.

// BuildHelp explains the arguments of a command that builds bundles; cmd
// is how the command is typed.
func BuildHelp(cmd string) string {
	return `Builds a firmware bundle archive, with its manifest.json, from component
files, so that no one writes a manifest by hand. Each argument is one
component: NAME=VERSION:PATH (the file is stored in the archive under its
base name). --depends says that a component needs another at a minimum
version: --depends 'app:bootloader>=1.1.0' (quoted: > is special to
the shell; repeat the flag for more).

The archive is gzipped unless --out ends in .tar. The same inputs always
make the same archive. The last line printed is the S5 declaration of the
archive, as JSON, for scripts that upload it in two steps:
  ` + cmd + ` --version 2.3.0 --out fw-2.3.0.tar.gz \
    bootloader=1.2.0:build/boot.bin app=2.3.0:build/app.bin.gz \
    --depends 'app:bootloader>=1.1.0'`
}

// Depends collects --depends COMPONENT:NEEDS>=VERSION flags: a flag.Value
// and a pflag.Value.
type Depends map[string][]fleet.Dependency

func (d Depends) String() string { return "" }

// Type names the flag's value in pflag's help.
func (d Depends) Type() string { return "COMPONENT:NEEDS>=VERSION" }

// Set adds one dependency.
func (d Depends) Set(s string) error {
	component, rest, ok := strings.Cut(s, ":")
	needs, min, ok2 := strings.Cut(rest, ">=")
	if !ok || !ok2 || !fleet.ValidComponentName(component) || !fleet.ValidComponentName(needs) || !fleet.ValidVersion(min) {
		return fmt.Errorf("want COMPONENT:NEEDS>=VERSION, such as app:bootloader>=1.1.0")
	}
	d[component] = append(d[component], fleet.Dependency{ComponentName: needs, MinVersion: min})
	return nil
}

// BuildFile builds the bundle of the components args name (NAME=VERSION:PATH
// each) into the file out, gzipped unless out ends in .tar, and returns the
// archive as the server will measure it. It writes next to out and renames
// at the end: a failed build leaves no half archive behind. Its errors are
// sentences for a person.
func BuildFile(out, version string, args []string, deps Depends) (*fleet.BundleFile, error) {
	var srcs []Source
	seen := map[string]bool{}
	for _, arg := range args {
		name, rest, ok := strings.Cut(arg, "=")
		ver, path, ok2 := strings.Cut(rest, ":")
		if !ok || !ok2 || path == "" {
			return nil, fmt.Errorf("component %q: want NAME=VERSION:PATH, such as app=2.3.0:build/app.bin", arg)
		}
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("component %s: %w", name, err)
		}
		defer f.Close()
		info, err := f.Stat()
		if err != nil {
			return nil, fmt.Errorf("component %s: %w", name, err)
		}
		if !info.Mode().IsRegular() {
			return nil, fmt.Errorf("component %s: %s is not a regular file", name, path)
		}
		seen[name] = true
		srcs = append(srcs, Source{ComponentName: name, VersionNumber: ver, FileName: filepath.Base(path),
			Dependencies: deps[name], Size: info.Size(), Body: f})
	}
	if len(srcs) == 0 {
		return nil, fmt.Errorf("a bundle needs at least one component NAME=VERSION:PATH")
	}
	for c := range deps {
		if !seen[c] {
			return nil, fmt.Errorf("--depends names component %s, which is not in the bundle", c)
		}
	}
	tmp, err := os.CreateTemp(filepath.Dir(out), ".bundle-*")
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	if err := Build(tmp, version, srcs, !strings.HasSuffix(out, ".tar")); err != nil {
		return nil, sentence(err)
	}
	// CreateTemp makes the file private; an archive is for sharing.
	if err := tmp.Chmod(0o644); err != nil {
		return nil, err
	}
	if err := tmp.Sync(); err != nil {
		return nil, err
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	// Measure the archive as the server will, so the declaration printed
	// is exactly what S5 must say.
	parsed, err := Parse(tmp, ParseOptions{})
	if err != nil {
		return nil, sentence(err)
	}
	if err := tmp.Close(); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return nil, err
	}
	return parsed, nil
}

// sentence is a refusal's message alone; an internal error stays whole.
func sentence(err error) error {
	if fleet.ErrorCode(err) == fleet.EINTERNAL {
		return err
	}
	return fmt.Errorf("%s", fleet.ErrorMessage(err))
}

// WriteBuildReport prints what BuildFile made: the archive, each component,
// and last, alone on its line, the S5 declaration as JSON.
func WriteBuildReport(w io.Writer, out string, f *fleet.BundleFile) {
	fmt.Fprintf(w, "wrote %s: bundle %s with %d components\n", out, f.Manifest.Version, len(f.Manifest.Components))
	for _, c := range f.Manifest.Components {
		fmt.Fprintf(w, "  %s %s (%s, %d bytes, sha256 %s)\n", c.ComponentName, c.VersionNumber, c.FileName, c.ContentLength, c.Checksum)
	}
	decl, _ := json.Marshal(fleet.Declaration{UncompressedSize: f.UncompressedSize, Checksum: f.Checksum, ContentLength: f.ContentLength})
	fmt.Fprintf(w, "%s\n", decl)
}
