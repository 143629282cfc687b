package console_test

import (
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestConsoleTerminalInBrowser has an operator open a terminal on a device
// run by a real fleetd-agent from its console page, type commands into
// xterm.js and read their output, see the shell's exit, end a session from
// the sessions list and see the terminal say who ended it, download a
// recorded session's asciicast from the list, and sign out,
// which ends the terminal that console session opened; a viewer gets no
// terminal.
func TestConsoleTerminalInBrowser(t *testing.T) {
	t.Parallel()
	dir := consoleHarness(t)
	bin := fleetdtest.BuildAgent(t)
	s := fleetdtest.Start(t, sqlstoretest.Backends()[0])
	admin := s.Admin()
	operator := s.NewKey(t, admin, "olivia", "operator")
	viewer := s.NewKey(t, admin, "victor", "viewer")
	s.Do(t, admin, "PUT", "/api/v1/tenants/"+admin.Tenant+"/remote-settings", map[string]any{"recording": true}).Want(t, 204)
	dev := s.MustDevice(t, admin, "kiosk-1", nil)
	s.StartAgent(t, bin, "kiosk-1", dev.Token, "--remote", "--remote-shell", "/bin/sh")
	runConsoleScript(t, dir, "terminal.mjs", 3*time.Minute,
		"FLEETD_URL="+s.URL, "FLEETD_TENANT="+admin.Tenant, "OPERATOR_KEY="+operator.Key, "OPERATOR_NAME=olivia",
		"VIEWER_KEY="+viewer.Key, "DEVICE=kiosk-1", "SCREENSHOTS="+screenshotDir(t))
}
