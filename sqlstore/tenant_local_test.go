package sqlstore

import (
	"context"
	"math"
	"testing"

	"github.com/fleetd/fleet"
)

// TestDeleteWhileAuthenticating is the race of a request that read its key
// just before DeleteAPIKey committed: it caches the key after the delete
// has forgotten it. The key must still be refused afterwards, not accepted
// for authCacheTTL.
func TestDeleteWhileAuthenticating(t *testing.T) {
	ctx := context.Background()
	db := openLocal(t, math.MaxInt)
	if _, _, err := db.CreateTenant(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	k := &fleet.APIKey{Name: "ci", Role: fleet.RoleOperator}
	if err := db.CreateAPIKey(ctx, "acme", k); err != nil {
		t.Fatal(err)
	}
	hash := fleet.HashSecret(k.Key)

	// AuthenticateAPIKey's steps, with the delete between its read and
	// its put.
	_, gen, cached := db.authCache.get(hash, db.now())
	if cached {
		t.Fatal("a new key is cached before its first use")
	}
	read := &fleet.Actor{Tenant: "acme", KeyName: "ci", Role: fleet.RoleOperator}
	if err := db.DeleteAPIKey(ctx, "acme", "ci"); err != nil {
		t.Fatal(err)
	}
	db.authCache.put(hash, read, db.now(), gen)

	if _, err := db.AuthenticateAPIKey(ctx, "acme", k.Key); fleet.ErrorCode(err) != fleet.EUNAUTHENTICATED {
		t.Fatalf("the deleted key authenticates after a racing lookup cached it (%v)", err)
	}
	// A lookup that began after the delete caches as before.
	_, gen, _ = db.authCache.get(hash, db.now())
	db.authCache.put(hash, read, db.now(), gen)
	if _, _, cached := db.authCache.get(hash, db.now()); !cached {
		t.Fatal("a lookup begun after the last forget was not cached")
	}
}
