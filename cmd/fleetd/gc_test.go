package main

import (
	"io"
	"runtime/debug"
	"strings"
	"testing"
)

// TestGCPercent checks which collector target fleetd serve sets: none of
// its own unless told, so that GOGC or Go's default stands; --gc-percent or
// FLEETD_GC_PERCENT over GOGC; and no collector without GOMEMLIMIT refused.
func TestGCPercent(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		want    int // the target afterwards; 50 is the test's own
		wantErr string
	}{
		{name: "untold", want: 50},
		{name: "GOGC stands", env: map[string]string{"GOGC": "50"}, want: 50},
		{name: "flag over GOGC", args: []string{"--gc-percent", "200"}, env: map[string]string{"GOGC": "50"}, want: 200},
		{name: "environment", env: map[string]string{"FLEETD_GC_PERCENT": "150"}, want: 150},
		{name: "off without a limit", args: []string{"--gc-percent", "-1"}, want: 50, wantErr: "GOMEMLIMIT"},
		{name: "off with a limit", args: []string{"--gc-percent", "-1"}, env: map[string]string{"GOMEMLIMIT": "1GiB"}, want: -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			debug.SetGCPercent(50)
			getenv := func(k string) string { return tc.env[k] }
			var c config
			fs := newFlagSet("serve", "", "", env{getenv: getenv, stdout: io.Discard, stderr: io.Discard})
			c.gcFlags(fs)
			if err := fs.parse(tc.args, getenv); err != nil {
				t.Fatal(err)
			}
			err := c.applyGC(fs, getenv)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("error %v, want one naming %q", err, tc.wantErr)
			}
			if got := debug.SetGCPercent(100); got != tc.want {
				t.Errorf("GC percent %d, want %d", got, tc.want)
			}
		})
	}
}
