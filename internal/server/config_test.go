package server

import (
	"io"
	"strings"
	"testing"

	"github.com/fleetd/fleet/internal/cli"
)

// TestRemoteRecordingFlags refuses a retention under a second (the sweep
// looks at half of it, and a ticker of no time panics when fleetd starts)
// and a cap under 4096 bytes; 0 and negatives would otherwise mean the
// defaults without a word.
func TestRemoteRecordingFlags(t *testing.T) {
	for _, tc := range []struct {
		flag, value string
		ok          bool
	}{
		{"--remote-recording-retention", "1ns", false}, {"--remote-recording-retention", "0s", false},
		{"--remote-recording-retention", "-1h", false}, {"--remote-recording-retention", "999ms", false},
		{"--remote-recording-retention", "1s", true}, {"--remote-recording-retention", "2160h", true},
		{"--remote-recording-max", "0", false}, {"--remote-recording-max", "-1", false},
		{"--remote-recording-max", "4095", false}, {"--remote-recording-max", "4096", true},
		{"--remote-recording-max", "67108864", true},
	} {
		getenv := func(string) string { return "" }
		var c Config
		fs := cli.NewFlagSet("serve", "", "", cli.Env{Getenv: getenv, Stdout: io.Discard, Stderr: io.Discard})
		c.serveFlags(fs)
		if err := fs.Parse([]string{tc.flag, tc.value}, getenv); err != nil {
			t.Fatal(err)
		}
		err := c.checkAlerts()
		if tc.ok && err != nil || !tc.ok && (err == nil || !strings.Contains(err.Error(), tc.flag)) {
			t.Errorf("%s %s: %v", tc.flag, tc.value, err)
		}
	}
}

// TestSQLiteWALLimitFlag refuses a WAL limit under a megabyte (0 and
// negatives included, which the store would read as its default or as
// never) and over 64 GiB.
func TestSQLiteWALLimitFlag(t *testing.T) {
	for _, tc := range []struct {
		value string
		ok    bool
	}{
		{"0", false}, {"-1", false}, {"1048575", false}, {"1048576", true},
		{"134217728", true}, {"68719476736", true}, {"68719476737", false},
	} {
		getenv := func(string) string { return "" }
		var c Config
		fs := cli.NewFlagSet("serve", "", "", cli.Env{Getenv: getenv, Stdout: io.Discard, Stderr: io.Discard})
		c.serveFlags(fs)
		if err := fs.Parse([]string{"--sqlite-wal-limit", tc.value}, getenv); err != nil {
			t.Fatal(err)
		}
		err := c.checkDatabase()
		if tc.ok && err != nil || !tc.ok && (err == nil || !strings.Contains(err.Error(), "--sqlite-wal-limit")) {
			t.Errorf("--sqlite-wal-limit %s: %v", tc.value, err)
		}
	}
}
