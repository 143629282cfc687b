package relay

import (
	"testing"

	"github.com/fleetd/fleet"
)

// TestRevokes checks which changes end which sessions: each revocation
// reaches the sessions that stood on what it revoked, in its tenant, and
// no others.
func TestRevokes(t *testing.T) {
	keyed := &Session{RemoteSession: fleet.RemoteSession{ID: "s1", Tenant: "a", DeviceID: "d1"},
		opener: fleet.Actor{Tenant: "a", KeyName: "ops", KeyHash: "h1", ConsoleSession: "c1"}}
	user := &Session{RemoteSession: fleet.RemoteSession{Tenant: "a", DeviceID: "d2"},
		opener: fleet.Actor{Tenant: "a", UserName: "ann", UserEmail: "ann@example.com", ConsoleSession: "c2"}}
	for _, c := range []struct {
		change      fleet.Change
		keyed, user string
	}{
		{fleet.Change{Kind: fleet.ChangeDeviceDelete, Tenant: "a", Key: "d1"}, "the device was deleted", ""},
		{fleet.Change{Kind: fleet.ChangeDeviceCredentials, Tenant: "a", Key: "d2"}, "", "the device's credentials were replaced"},
		{fleet.Change{Kind: fleet.ChangeAPIKey, Tenant: "a", Key: "h1"}, `API key "ops", which opened it, was deleted`, ""},
		{fleet.Change{Kind: fleet.ChangeAPIKey, Tenant: "a", Key: "h2"}, "", ""},
		{fleet.Change{Kind: fleet.ChangeConsoleSession, Tenant: "a", Key: "c2"}, "", "the console session that opened it ended"},
		{fleet.Change{Kind: fleet.ChangeConsoleSession, Tenant: "a", Key: ""}, "", ""},
		{fleet.Change{Kind: fleet.ChangeTenantAuth, Tenant: "a"}, "", "the tenant's sign-in settings changed"},
		{fleet.Change{Kind: fleet.ChangeDevice, Tenant: "a", Key: "d1"}, "", ""},
		{fleet.Change{Kind: fleet.ChangeRemoteSessionStop, Tenant: "a", Key: "s1 olivia smith"}, "ended by olivia smith", ""},
		{fleet.Change{Kind: fleet.ChangeRemoteSessionStop, Tenant: "a", Key: "s2 olivia"}, "", ""},
		{fleet.Change{Kind: fleet.ChangeAll}, "", ""},
	} {
		if got := revokes(c.change, keyed); got != c.keyed {
			t.Errorf("%+v on the key's session: %q, want %q", c.change, got, c.keyed)
		}
		if got := revokes(c.change, user); got != c.user {
			t.Errorf("%+v on the user's session: %q, want %q", c.change, got, c.user)
		}
	}
}
