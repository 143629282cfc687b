package main

import (
	"bufio"
	"bytes"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// commits reads fleetd_db_commits_total from /metrics.
func (s *testServer) commits(t *testing.T) float64 {
	t.Helper()
	r := s.Do(t, fleetdtest.Creds{}, "GET", "/metrics", nil).Want(t, 200)
	sc := bufio.NewScanner(bytes.NewReader(r.Body))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "fleetd_db_commits_total "); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no fleetd_db_commits_total in /metrics")
	return 0
}

// TestIdleAfterCrashMidDelivery: fleetd killed while a notification is being
// delivered, and started again, is idle while the dead process's lease runs:
// it does not claim the notification over and over (at 10129e9 it did: 112%
// CPU and ~7,000 SQLite commits a second for two minutes;
// docs/reliability.md#notification-templates). Idle is measured by the
// commits of two seconds.
func TestIdleAfterCrashMidDelivery(t *testing.T) {
	b := sqlstoretest.Backends()[0] // the single writer made the spin visible
	s := newServer(t, b)
	p := startProcess(t, s, "--notify-lease", "1m")
	admin := s.Admin()
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case arrived <- struct{}{}:
		default:
		}
		<-release
	}))
	defer hook.Close()
	defer close(release)
	s.MustDevice(t, admin, "pump-1", nil)
	rule := s.MustAlertRule(t, admin, map[string]any{"name": "hot", "stream": "env",
		"condition": map[string]any{"field": "temp", "operator": ">", "value": 80}})
	s.Do(t, admin, "POST", "/api/v1/alert-rules/"+rule.ID+"/alert-notification-rules",
		map[string]any{"channel_parameters": map[string]any{"type": "webhook", "url": hook.URL}}).Want(t, 201)
	s.Do(t, admin, "POST", "/api/v1/devices/pump-1/streams/env", fleetdtest.Points(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC), 90)).Want(t, 200)
	select {
	case <-arrived:
	case <-time.After(15 * time.Second):
		t.Fatal("the notification was not sent")
	}
	p.kill() // mid-delivery: the notification stays leased for a minute
	startProcess(t, s, "--notify-lease", "1m")
	before := s.commits(t)
	time.Sleep(2 * time.Second) // the window idleness is measured over
	n := s.commits(t) - before
	t.Logf("%v commits in 2 s after the restart", n)
	if n > 40 {
		t.Fatalf("%v commits in 2 s of an idle fleetd, want at most 40 (the timers' own)", n)
	}
}
