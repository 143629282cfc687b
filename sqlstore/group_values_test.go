package sqlstore_test

import (
	"context"
	"testing"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestGroupReportedValues: a reported value is compared as JSON writes it,
// and a path goes through objects only, the same on both databases
// (docs/twin.md, Groups).
func TestGroupReportedValues(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, _ := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		if _, err := db.CreateDevices(ctx, "acme", []fleet.NewDevice{{ID: "a"}}); err != nil {
			t.Fatal(err)
		}
		if _, err := db.UpdateReported(ctx, "acme", "a", map[string]any{
			"list": []any{"x", map[string]any{"k": "y"}}, "third": 0.30000000000000004, "whole": 20.0, "n": int64(7),
		}); err != nil {
			t.Fatal(err)
		}
		for sel, want := range map[string]string{
			"reported.list.0=x":                  "",
			"reported.list.1.k=y":                "",
			"reported.list.0":                    "",
			"reported.third=0.30000000000000004": "a",
			"reported.third=0.3":                 "",
			"reported.whole=20.0":                "a",
			"reported.n=7":                       "a",
			"reported.n.x":                       "",
		} {
			t.Run(sel, func(t *testing.T) {
				g := &fleet.Group{Name: "g", Selector: sel}
				if _, err := db.CreateGroup(ctx, "acme", g); err != nil {
					t.Fatal(err)
				}
				defer db.DeleteGroup(ctx, "acme", "g")
				if got := groupIDs(t, db, "acme", "g"); got != want {
					t.Errorf("devices %q, want %q", got, want)
				}
			})
		}
	})
}
