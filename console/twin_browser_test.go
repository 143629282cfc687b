package console_test

import (
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestConsoleTwinInBrowser has an operator set a device's desired state
// on its page and see it converge as the device reports it, save from a
// page read before someone else's change (refused, the text kept), type
// bad JSON (the API's message), make a group after a malformed selector
// (its position shown), find its devices on its page, in the devices
// filter by group and twin state, on the overview's counts and in the
// dispatch form, see a device leave the group as its reported state
// changes, and delete the group after confirming; a viewer sees the twin
// and the groups without their forms; the pages fit 1280x800 and 390x844
// with no CSP violation. It takes the twin's and groups' screenshots:
// FLEETD_CONSOLE_SCREENSHOTS=docs/console go test ./console -run TestConsoleTwinInBrowser.
func TestConsoleTwinInBrowser(t *testing.T) {
	dir := consoleHarness(t)
	s := fleetdtest.Start(t, sqlstoretest.Backends()[0])
	admin := s.Admin()
	operator := s.NewKey(t, admin, "olivia", "operator")
	viewer := s.NewKey(t, admin, "victor", "viewer")
	s.MustDevice(t, admin, "pump-1", map[string]string{"site": "berlin"})
	s.MustDevice(t, admin, "pump-2", map[string]string{"site": "paris"})
	runConsoleScript(t, dir, "twin.mjs", 3*time.Minute,
		"FLEETD_URL="+s.URL, "FLEETD_TENANT="+admin.Tenant, "SCREENSHOTS="+screenshotDir(t),
		"OPERATOR_KEY="+operator.Key, "VIEWER_KEY="+viewer.Key, "ADMIN_KEY="+admin.Key,
		"DEVICE=pump-1", "OTHER=pump-2")
}
