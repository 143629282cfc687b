package console_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pahov3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/mqtt"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// chromiumPath is Debian's Chromium, which .ci/run installs; Playwright's
// own browser download is not used.
const chromiumPath = "/usr/bin/chromium"

// consoleHarness returns the directory of the browser tests' Node
// harness, or skips the test (fails it under CI=true) when Chromium, Node
// or the harness's packages are missing.
func consoleHarness(t *testing.T) string {
	t.Helper()
	dir, _ := filepath.Abs("testdata/browser")
	missing := ""
	if _, err := os.Stat(chromiumPath); err != nil {
		missing = "chromium (apt-get install chromium)"
	} else if _, err := exec.LookPath("node"); err != nil {
		missing = "node"
	} else if _, err := os.Stat(filepath.Join(dir, "node_modules", "playwright-core")); err != nil {
		missing = "playwright-core (npm ci --prefix console/testdata/browser)"
	}
	if missing != "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("the console's browser tests need %s; .ci/run installs it", missing)
		}
		t.Skipf("the console's browser tests need %s", missing)
	}
	return dir
}

// TestConsoleInBrowser signs in to the console in a real Chromium and does
// what an operator does: finds devices (one with markup in its metadata),
// dispatches a phased rollout from the form after counting its devices,
// watches devices' reports move the page without a reload, sees the gate
// pause the rollout, resumes it, watches the overview follow an action
// that `fleetd sim` devices run, rotates a device's token and reloads
// (which rotates nothing again), checks the layout at 1280x800 and at phone
// width, and sees a viewer get no write controls;
// then a person signs in through the tenant's OpenID provider.
// FLEETD_CONSOLE_SCREENSHOTS=docs/console (a relative path is taken from
// the repository root) refreshes the screenshots of docs/console.md.
func TestConsoleInBrowser(t *testing.T) {
	t.Parallel()
	dir := consoleHarness(t)
	s := fleetdtest.Start(t, sqlstoretest.Backends()[0], "--rollout-interval", "50ms", "--outbound-allow", "127.0.0.1")
	admin := s.Admin()
	operator := s.NewKey(t, admin, "olivia", "operator")
	viewer := s.NewKey(t, admin, "victor", "viewer")
	var ids []string
	for i := 1; i <= 4; i++ {
		id := fmt.Sprintf("pump-%02d", i)
		ids = append(ids, id)
		s.Do(t, admin, "POST", "/api/v1/devices", map[string]any{"id": id, "metadata": map[string]any{"site": "harbour", "model": "p" + fmt.Sprint(i)}}).Want(t, 201)
	}
	s.Do(t, admin, "POST", "/api/v1/devices", map[string]any{"id": "odd-one",
		"metadata": map[string]any{"note": "<script>alert(1)</script>", "site": `"><img src=x onerror=alert(2)>`}}).Want(t, 201)
	// Simulated devices on MQTT, half of which fail what they run, for the
	// overview to follow; each takes a few steps of 300 ms over an action.
	const simDevices = 6
	sim := s.StartSim(t, "--devices", fmt.Sprint(simDevices), "--provision", "--url", s.URL, "--api-key", admin.Key,
		"--prefix", "sim-", "--fail-rate", "0.5", "--step", "300ms", "--telemetry-interval", "0")
	sim.Connected(t, simDevices)

	op := fleetdtest.StartOIDCProvider(t, "fleetd-console", "console-secret", s.URL+"/console/oidc/callback")
	s.Do(t, admin, "PUT", "/api/v1/tenants/default/auth", op.TenantOIDC("fleetd-console", "console-secret", "viewer")).Want(t, 204)

	// A bundle to upload, and an alert rule whose alert a reading opens.
	bundle := filepath.Join(t.TempDir(), "pump-fw-2.0.0.tar.gz")
	if err := os.WriteFile(bundle, fleetdtest.MakeBundle(t, "2.0.0", fleetdtest.Part{Name: "pump-fw", Version: "2.0.0", Body: strings.Repeat("firmware ", 50_000)}), 0o644); err != nil {
		t.Fatal(err)
	}
	s.MustAlertRule(t, admin, map[string]any{"name": "pump overheating", "stream": "env", "condition": map[string]any{"field": "temp", "operator": ">", "value": 80}})

	shots := screenshotDir(t)
	runConsoleScript(t, dir, "console.mjs", 3*time.Minute,
		"FLEETD_URL="+s.URL, "FLEETD_TENANT="+admin.Tenant,
		"OPERATOR_KEY="+operator.Key, "VIEWER_KEY="+viewer.Key,
		"DEVICES="+strings.Join(ids, ","), "XSS_DEVICE=odd-one", "SCREENSHOTS="+shots,
		"SIM_PREFIX=sim-", fmt.Sprintf("SIM_DEVICES=%d", simDevices),
		"BUNDLE_FILE="+bundle,
		"OIDC_USER="+op.Username, "OIDC_PASSWORD="+op.Password, "OIDC_EMAIL="+op.Email)
}

// TestConsoleRolloutsInBrowser has an operator roll out a bundle from its
// page with the rollout builder (a phase added, a fixed list, an alert
// gate and a failure-rate gate, each phase counted before it is sent),
// abort it after confirming what the abort cancels, see that it does not
// look finished, and find it in the actions list by its version; then
// build a metadata canary with a finished share, see the page say which
// devices the next phase waits for and which are online, retry the device
// that failed with the page's button, and cancel the retry after
// confirming what the cancel does.
func TestConsoleRolloutsInBrowser(t *testing.T) {
	t.Parallel()
	dir := consoleHarness(t)
	s := fleetdtest.Start(t, sqlstoretest.Backends()[0], "--rollout-interval", "50ms")
	admin := s.Admin()
	operator := s.NewKey(t, admin, "olivia", "operator")
	var ids []string
	for i := 1; i <= 6; i++ {
		id := fmt.Sprintf("valve-%02d", i)
		ids = append(ids, id)
		var meta map[string]string
		if i >= 5 {
			meta = map[string]string{"ring": "lab"}
		}
		d := s.MustDevice(t, admin, id, meta)
		if i == 5 {
			connectQuietDevice(t, s, admin.Tenant, id, d.Token) // online; valve-06 never is
		}
	}
	s.MustUpload(t, admin, fleetdtest.MakeBundle(t, "3.1.0", fleetdtest.Part{Name: "valve-fw", Version: "3.1.0", Body: "valve firmware"}))
	s.MustAlertRule(t, admin, map[string]any{"name": "valve stuck", "stream": "env", "condition": map[string]any{"field": "flow", "operator": "==", "value": 0}})
	runConsoleScript(t, dir, "rollouts.mjs", 3*time.Minute,
		"FLEETD_URL="+s.URL, "FLEETD_TENANT="+admin.Tenant, "OPERATOR_KEY="+operator.Key, "SCREENSHOTS="+screenshotDir(t),
		"DEVICES="+strings.Join(ids, ","), "VERSION=3.1.0", "RULE=valve stuck", "LAB=valve-05,valve-06")
}

// connectQuietDevice connects a device over MQTT and subscribes to its
// actions, which it never answers; it stays connected until the test ends.
func connectQuietDevice(t *testing.T, s *fleetdtest.Server, tenant, id, token string) {
	t.Helper()
	c := pahov3.NewClient(pahov3.NewClientOptions().AddBroker("tcp://" + s.MQTTAddr).SetClientID(id).
		SetUsername(tenant + "/" + id).SetPassword(token).SetProtocolVersion(4).SetAutoReconnect(false).SetConnectTimeout(fleetdtest.Bound))
	if tok := c.Connect(); !tok.WaitTimeout(fleetdtest.Bound) || tok.Error() != nil {
		t.Fatalf("connect %s: %v", id, tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(100) })
	if tok := c.Subscribe(mqtt.ActionsTopic(tenant, id), 1, nil); !tok.WaitTimeout(fleetdtest.Bound) || tok.Error() != nil {
		t.Fatalf("subscribe %s: %v", id, tok.Error())
	}
}

// runConsoleScript runs one of the harness's scripts with env added to
// the environment, and fails t, with the script's output, when it fails.
func runConsoleScript(t *testing.T, dir, script string, timeout time.Duration, env ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	t.Logf("node %s:\n%s", script, out)
	if err != nil {
		t.Fatalf("the browser test failed: %v", err)
	}
}

// screenshotDir is where a browser test saves its screenshots:
// FLEETD_CONSOLE_SCREENSHOTS (a relative path is taken from the repository
// root), else a directory that is thrown away.
func screenshotDir(t *testing.T) string {
	d := os.Getenv("FLEETD_CONSOLE_SCREENSHOTS")
	if d == "" {
		return t.TempDir()
	}
	if !filepath.IsAbs(d) {
		d = filepath.Join("..", d)
	}
	d, _ = filepath.Abs(d)
	return d
}

// TestConsoleAlertsInBrowser has an operator make an alert rule in the
// console's editor (after it refuses a bad condition typed as JSON, then
// one made with the threshold builder, with the API's messages), sees a
// device's reading open an alert on the console's pages, edits the rule
// so that the next reading ends it, checks the alerts pages' layout, and
// sees a viewer get no write controls.
func TestConsoleAlertsInBrowser(t *testing.T) {
	t.Parallel()
	dir := consoleHarness(t)
	// The webhook receiver is on this machine: the egress policy must
	// allow it.
	s := fleetdtest.Start(t, sqlstoretest.Backends()[0], append(fleetdtest.AlertFlags, "--outbound-allow", "127.0.0.1")...)
	admin := s.Admin()
	operator := s.NewKey(t, admin, "olivia", "operator")
	viewer := s.NewKey(t, admin, "victor", "viewer")
	gateway := s.NewKey(t, admin, "gateway", "device")
	s.MustDevice(t, admin, "pump-07", map[string]string{"site": "harbour"})
	hook := fleetdtest.NewReceiver(t, 0)
	runConsoleScript(t, dir, "alerts.mjs", 3*time.Minute,
		"FLEETD_URL="+s.URL, "FLEETD_TENANT="+admin.Tenant, "SCREENSHOTS="+screenshotDir(t),
		"OPERATOR_KEY="+operator.Key, "VIEWER_KEY="+viewer.Key, "DEVICE_KEY="+gateway.Key, "DEVICE=pump-07",
		"WEBHOOK_URL="+hook.URL+"/hooks/pumps")
	// The notification made in the console reached the receiver, signed,
	// with its header and its template.
	got := hook.Got()
	if len(got) == 0 {
		t.Fatal("the receiver got no notification")
	}
	if h := got[0].Header; h.Get("X-Fleet-Signature") == "" || h.Get("X-Team") != "ops" || !strings.Contains(string(got[0].Body), "pump-07 95") {
		t.Errorf("the receiver got %v %s", got[0].Header, got[0].Body)
	}
}

// TestConsoleChartsInBrowser has a viewer watch a device's chart appear
// and move as its points arrive, without a reload, and its Logs tab show
// and follow lines (markup in a line stays text, a level filter holds),
// and checks both pages' layout.
func TestConsoleChartsInBrowser(t *testing.T) {
	t.Parallel()
	dir := consoleHarness(t)
	s := fleetdtest.Start(t, sqlstoretest.Backends()[0])
	admin := s.Admin()
	viewer := s.NewKey(t, admin, "victor", "viewer")
	s.MustDevice(t, admin, "pump-03", nil)
	runConsoleScript(t, dir, "charts.mjs", 3*time.Minute,
		"FLEETD_URL="+s.URL, "FLEETD_TENANT="+admin.Tenant, "SCREENSHOTS="+screenshotDir(t),
		"VIEWER_KEY="+viewer.Key, "ADMIN_KEY="+admin.Key, "DEVICE=pump-03")
}
