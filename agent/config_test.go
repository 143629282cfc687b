package agent

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestConfigPrecedence(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "agent.yaml")
	os.WriteFile(file, []byte("mqtt-addr: file:1883\ntenant: acme\ndevice: from-file\naction-timeout: 5m\ntoken-file: "+filepath.Join(dir, "token")+"\n"), 0o600)
	os.WriteFile(filepath.Join(dir, "token"), []byte("fdt_fromfile\n"), 0o600)

	c, _, err := parseConfig([]string{"--config", file, "--device", "from-flag"},
		env(map[string]string{"FLEETD_AGENT_DEVICE": "from-env", "FLEETD_AGENT_ACTION_TIMEOUT": "7s"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Device != "from-flag" || c.ActionTimeout != 7*time.Second || c.MQTTAddr != "file:1883" || c.Tenant != "acme" || c.Token != "fdt_fromfile" {
		t.Errorf("config = %+v", c)
	}
	// The variable holding the token wins over the token file.
	c, _, err = parseConfig([]string{"--config", file}, env(map[string]string{"FLEETD_AGENT_TOKEN": "fdt_env"}))
	if err != nil || c.Token != "fdt_env" || c.Device != "from-file" {
		t.Errorf("config = %+v, %v", c, err)
	}
}

func TestConfigRefusals(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("mqtt-adr: x:1\n"), 0o600)
	tok := env(map[string]string{"FLEETD_AGENT_TOKEN": "fdt_x"})
	for _, tc := range []struct {
		args   []string
		getenv func(string) string
		want   string
	}{
		{[]string{"--tenant", "acme", "--device", "d"}, tok, "no --mqtt-addr"},
		{[]string{"--mqtt-addr", "h:1", "--tenant", "acme", "--device", "d"}, env(nil), "no credentials"},
		{[]string{"--mqtt-addr", "h:1", "--tenant", "acme", "--device", "a/b"}, tok, `--device "a/b" is not a device id`},
		{[]string{"--mqtt-addr", "h:1", "--tenant", "acme", "--device", "d", "--cert-file", "c", "--key-file", "k"}, tok, "needs TLS"},
		{[]string{"--mqtt-addr", "h:1", "--tenant", "acme", "--device", "d", "--server", "ftp://x"}, tok, "not an http or https URL"},
		{[]string{"--config", bad}, tok, `"mqtt-adr" is not a flag`},
		{[]string{"--mqtt-addr", "h:1", "--tenant", "acme", "--device", "d"}, env(map[string]string{"FLEETD_AGENT_TOKEN": "x", "FLEETD_AGENT_ACTION_TIMEOUT": "soon"}), "FLEETD_AGENT_ACTION_TIMEOUT"},
	} {
		if _, _, err := parseConfig(tc.args, tc.getenv); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want %q", tc.args, err, tc.want)
		}
	}
}

func TestHelp(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := Run(t.Context(), []string{"--help"}, env(nil), &out, &errOut); code != ExitOK {
		t.Fatalf("--help exited %d: %s", code, errOut.String())
	}
	for _, want := range []string{"FLEETD_AGENT_TOKEN", "FLEETD_AGENT_MQTT_ADDR", "--actions-dir", "progress N", "--install-hook", "docs/agent.md"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--help lacks %q:\n%s", want, out.String())
		}
	}
	if code := Run(t.Context(), []string{"--tenant", "acme"}, env(nil), &out, &errOut); code != ExitUsage || !strings.Contains(errOut.String(), "no --mqtt-addr") {
		t.Errorf("a bad command line exited %d: %s", code, errOut.String())
	}
}
