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
			"big": 1.5e20, "tiny": 1e-7, "huge": 3.551759552515556e17, "text": "1.0", "on": true,
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
			// A number by value, whichever way it is written.
			"reported.whole=20":                  "a",
			"reported.n=7.0":                     "a",
			"reported.n=7e0":                     "a",
			"reported.n in (6,7.0)":              "a",
			"reported.n!=7.0":                    "",
			"reported.big=1.5e20":                "a",
			"reported.big=1.5e+20":               "a",
			"reported.big=150000000000000000000": "a",
			"reported.tiny=1e-7":                 "a",
			"reported.tiny=0.0000001":            "a",
			"reported.huge=355175955251555600":   "a",
			"reported.huge=3.551759552515556e17": "a",
			"reported.huge=3.551759552515557e17": "",
			// A string as text, a boolean as true or false.
			"reported.text=1.0": "a",
			"reported.text=1":   "",
			"reported.on=true":  "a",
			"reported.on=1":     "",
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
