package main

import (
	"testing"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestRevocationEndsConnections: a device connected with credentials that
// are then revoked (token rotated, device deleted) is disconnected at once,
// not at its next reconnect; other devices stay connected.
func TestRevocationEndsConnections(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := startServer(t, b)
		admin := s.Admin()
		rotated := s.MustDevice(t, admin, "rotated", nil)
		deleted := s.MustDevice(t, admin, "deleted", nil)
		bystander := s.MustDevice(t, admin, "bystander", nil)
		r := s.ConnectDevice(t, "default", rotated.ID, rotated.Token)
		d := s.ConnectDevice(t, "default", deleted.ID, deleted.Token)
		by := s.ConnectDevice(t, "default", bystander.ID, bystander.Token)

		s.Do(t, admin, "POST", "/api/v1/devices/rotated/token", nil).Want(t, 201)
		fleetdtest.Eventually(t, "the device with the rotated token is disconnected", func() bool { return !r.Client.IsConnectionOpen() })

		s.Do(t, admin, "DELETE", "/api/v1/devices/deleted", nil).Want(t, 204)
		fleetdtest.Eventually(t, "the deleted device is disconnected", func() bool { return !d.Client.IsConnectionOpen() })

		if !by.Client.IsConnectionOpen() {
			t.Fatal("a device whose credentials did not change was disconnected")
		}
		// The bystander still gets its actions.
		id := s.Dispatch(t, admin, map[string]any{"action": "ping", "params": map[string]any{}, "search_type": "default", "device_ids": []string{"bystander"}})
		if got := by.Next(t); got.ID != itoa(int(id)) {
			t.Fatalf("bystander got action %s, want %d", got.ID, id)
		}
	})
}
