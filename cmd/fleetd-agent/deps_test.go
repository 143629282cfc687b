package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestNoServerCodeLinked: the agent is a small program for devices, so
// none of fleetd's store, HTTP server, console, broker, blob stores or
// their drivers is linked into it. Package mqtt (the topics), the root
// package (names' rules) and firmware/bundle (a bundle's archive and its
// resumable download) are the protocol, and welcome.
func TestNoServerCodeLinked(t *testing.T) {
	// go test puts its own go first on the test's PATH.
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list fleetd-agent's dependencies")
	}
	out, err := exec.Command(goTool, "list", "-deps", "github.com/fleetd/fleet/cmd/fleetd-agent").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "github.com/fleetd/fleet/agent") {
		t.Fatalf("go list -deps does not list the agent package; it listed:\n%s", out)
	}
	banned := []string{"github.com/fleetd/fleet/sqlstore", "github.com/fleetd/fleet/http", "github.com/fleetd/fleet/console",
		"github.com/fleetd/fleet/mqtt/broker", "github.com/fleetd/fleet/mqtt/bridge", "github.com/fleetd/fleet/action",
		"github.com/fleetd/fleet/blob", "github.com/fleetd/fleet/firmware", "github.com/fleetd/fleet/ctl",
		"github.com/minio/", "github.com/jackc/", "modernc.org/sqlite", "github.com/prometheus/", "github.com/spf13/cobra"}
	for _, dep := range deps {
		if dep == "github.com/fleetd/fleet/firmware/bundle" {
			continue
		}
		if dep == "database/sql" {
			t.Errorf("fleetd-agent links database/sql")
		}
		for _, b := range banned {
			if dep == b || strings.HasPrefix(dep, b+"/") || (strings.HasSuffix(b, "/") && strings.HasPrefix(dep, b)) {
				t.Errorf("fleetd-agent links %s", dep)
			}
		}
	}
}
