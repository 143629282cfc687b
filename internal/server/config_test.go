package server

import (
	"io"
	"strings"
	"testing"

	"github.com/fleetd/fleet/internal/cli"
)

// TestRemoteRecordingRetention refuses a retention under a second: the
// sweep looks at half of it, and a ticker of no time panics when fleetd
// starts.
func TestRemoteRecordingRetention(t *testing.T) {
	for _, tc := range []struct {
		value string
		ok    bool
	}{{"1ns", false}, {"0s", false}, {"-1h", false}, {"999ms", false}, {"1s", true}, {"2160h", true}} {
		getenv := func(string) string { return "" }
		var c Config
		fs := cli.NewFlagSet("serve", "", "", cli.Env{Getenv: getenv, Stdout: io.Discard, Stderr: io.Discard})
		c.serveFlags(fs)
		if err := fs.Parse([]string{"--remote-recording-retention", tc.value}, getenv); err != nil {
			t.Fatal(err)
		}
		err := c.checkAlerts()
		if tc.ok && err != nil || !tc.ok && (err == nil || !strings.Contains(err.Error(), "--remote-recording-retention")) {
			t.Errorf("--remote-recording-retention %s: %v", tc.value, err)
		}
	}
}
