package console_test

import (
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestConsoleSettingsInBrowser runs testdata/browser/settings.mjs in a real
// Chromium: an admin creates an API key and sees it once (a reload shows
// it no more), its holder signs in, the admin deletes it and the holder's
// session is signed out, the audit log shows and filters those changes,
// the tenant's sign-in settings are saved without their secret ever
// showing, a viewer finds no settings and is refused their forms, and the
// admin ends the viewer's session from Settings → Sessions.
// FLEETD_CONSOLE_SCREENSHOTS=docs/console refreshes docs/console.md's
// settings screenshots.
func TestConsoleSettingsInBrowser(t *testing.T) {
	t.Parallel()
	dir := consoleHarness(t)
	s := fleetdtest.Start(t, sqlstoretest.Backends()[0])
	admin := s.Admin()
	viewer := s.NewKey(t, admin, "victor", "viewer")
	const secret = "console-secret-never-shown"
	op := fleetdtest.StartOIDCProvider(t, "fleetd-console", secret, s.URL+"/console/oidc/callback")
	s.Do(t, admin, "PUT", "/api/v1/tenants/default/auth", op.TenantOIDC("fleetd-console", secret, "viewer")).Want(t, 204)

	runConsoleScript(t, dir, "settings.mjs", 2*time.Minute,
		"FLEETD_URL="+s.URL, "FLEETD_TENANT="+admin.Tenant,
		"ADMIN_KEY="+admin.Key, "VIEWER_KEY="+viewer.Key, "OIDC_CLIENT_SECRET="+secret,
		"SCREENSHOTS="+screenshotDir(t))
}
