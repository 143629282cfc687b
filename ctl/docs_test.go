package ctl_test

import (
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetd/fleet/ctl"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

var update = flag.Bool("update", false, "rewrite docs/cli.md from the command tree")

// TestCLIReference holds docs/cli.md to the command tree: a command, flag
// or help text changed without regenerating it fails here.
func TestCLIReference(t *testing.T) {
	path := filepath.Join("..", "docs", "cli.md")
	got := ctl.Markdown(ctl.Root())
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(want) != got {
		t.Fatalf("docs/cli.md is not what the command tree says; run: go test ./ctl -run TestCLIReference -update")
	}
}

// TestHelpExplainsItself: every command says what it does, and every flag
// what it means.
func TestHelpExplainsItself(t *testing.T) {
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Short == "" {
			t.Errorf("%s has no short help", c.CommandPath())
		}
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if f.Usage == "" {
				t.Errorf("%s --%s has no help", c.CommandPath(), f.Name)
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(ctl.Root())
}

// TestNoServerCodeLinked: fleetctl talks only HTTP, so none of the
// server's store, broker, blob stores or their drivers is linked into it
// (it builds bundles with firmware/bundle, which knows no storage).
func TestNoServerCodeLinked(t *testing.T) {
	// go test puts its own go first on the test's PATH.
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list fleetctl's dependencies")
	}
	out, err := exec.Command(goTool, "list", "-deps", "github.com/fleetd/fleet/cmd/fleetctl").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	// database/sql/driver is linked by google/uuid's Scan and Value: an
	// interface, no driver.
	banned := []string{"github.com/fleetd/fleet/sqlstore", "github.com/fleetd/fleet/mqtt", "github.com/fleetd/fleet/http",
		"github.com/fleetd/fleet/action", "github.com/fleetd/fleet/blob", "github.com/minio/", "github.com/jackc/", "modernc.org/sqlite", "github.com/mochi-mqtt/", "github.com/eclipse/paho"}
	for _, dep := range strings.Fields(string(out)) {
		if dep == "database/sql" {
			t.Errorf("fleetctl links database/sql")
		}
		for _, b := range banned {
			if dep == b || strings.HasPrefix(dep, b+"/") || (strings.HasSuffix(b, "/") && strings.HasPrefix(dep, b)) {
				t.Errorf("fleetctl links %s", dep)
			}
		}
	}
}
