package main

import (
	"testing"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// testServer is fleetd in process (internal/fleetdtest) with the helpers
// of this package's end-to-end tests.
type testServer struct{ *fleetdtest.Server }

// startServer is fleetdtest.Start.
func startServer(t *testing.T, b sqlstoretest.Backend, extra ...string) *testServer {
	t.Helper()
	return &testServer{fleetdtest.Start(t, b, extra...)}
}

// newServer is fleetdtest.New, not started, on b's database.
func newServer(t *testing.T, b sqlstoretest.Backend) *testServer {
	return &testServer{fleetdtest.New(b.DSN(t), t.TempDir())}
}
