package sqlstore_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

func groupIDs(t *testing.T, db *sqlstore.DB, tenant, name string) string {
	t.Helper()
	devs, n, err := db.FindGroupDevices(context.Background(), tenant, name, fleet.Page{Page: 1, Limit: 1000})
	if err != nil {
		t.Fatalf("FindGroupDevices(%s): %v", name, err)
	}
	ids := make([]string, len(devs))
	for i, d := range devs {
		ids[i] = d.ID
	}
	if n != len(ids) {
		t.Fatalf("group %s counts %d, lists %v", name, n, ids)
	}
	return strings.Join(ids, " ")
}

func TestGroups(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, _ := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustTenant(t, db, "beta")
		if _, err := db.CreateDevices(ctx, "acme", []fleet.NewDevice{
			{ID: "a", Metadata: map[string]string{"site": "berlin", "ring": "canary"}},
			{ID: "b", Metadata: map[string]string{"site": "paris", "ring": "stable"}},
			{ID: "c", Metadata: map[string]string{"site": "berlin"}},
			{ID: "d"},
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := db.CreateDevices(ctx, "beta", []fleet.NewDevice{{ID: "a", Metadata: map[string]string{"site": "berlin"}}}); err != nil {
			t.Fatal(err)
		}
		for id, rep := range map[string]map[string]any{
			"a": {"fw": map[string]any{"version": "2.0", "build": int64(7)}, "wifi": true, "temp": 21.5},
			"b": {"fw": map[string]any{"version": "1.9"}, "wifi": false},
			"c": {"fw": "none"},
		} {
			if _, err := db.UpdateReported(ctx, "acme", id, rep); err != nil {
				t.Fatal(err)
			}
		}
		selectors := map[string]string{
			"eq":            "site=berlin",
			"ne":            "site!=berlin",
			"in":            "site in (paris, rome)",
			"notin":         "ring notin (canary)",
			"exists":        "ring",
			"absent":        "!ring",
			"and":           "site=berlin,ring",
			"rep-eq":        "reported.fw.version=2.0",
			"rep-ne":        "reported.fw.version!=2.0",
			"rep-int":       "reported.fw.build=7",
			"rep-bool":      "reported.wifi=true",
			"rep-float":     "reported.temp in (21.5)",
			"rep-exists":    "reported.fw",
			"rep-object":    "reported.fw in (none)",
			"rep-absent":    "!reported.fw.version",
			"mixed":         "site=berlin,reported.fw.version notin (1.9)",
			"empty-results": "site=rome",
		}
		for name, sel := range selectors {
			if _, err := db.CreateGroup(ctx, "acme", &fleet.Group{Name: name, Selector: sel}); err != nil {
				t.Fatalf("CreateGroup(%s, %q): %v", name, sel, err)
			}
		}
		for name, want := range map[string]string{
			"eq": "a c", "ne": "b d", "in": "b", "notin": "b c d", "exists": "a b", "absent": "c d", "and": "a",
			"rep-eq": "a", "rep-ne": "b c d", "rep-int": "a", "rep-bool": "a", "rep-float": "a", "rep-exists": "a b c",
			"rep-object": "c", "rep-absent": "c d", "mixed": "a c", "empty-results": "",
		} {
			if got := groupIDs(t, db, "acme", name); got != want {
				t.Errorf("group %s (%s) = [%s], want [%s]", name, selectors[name], got, want)
			}
		}

		t.Run("Live", func(t *testing.T) {
			if _, err := db.UpdateDeviceMetadata(ctx, "acme", "d", map[string]*string{"site": ptr("berlin")}); err != nil {
				t.Fatal(err)
			}
			if _, err := db.UpdateReported(ctx, "acme", "a", map[string]any{"fw": map[string]any{"version": "2.1"}}); err != nil {
				t.Fatal(err)
			}
			if got := groupIDs(t, db, "acme", "eq"); got != "a c d" {
				t.Errorf("after d moved to berlin: [%s]", got)
			}
			if got := groupIDs(t, db, "acme", "rep-eq"); got != "" {
				t.Errorf("after a reported 2.1: [%s]", got)
			}
			g, err := db.FindGroup(ctx, "acme", "eq")
			if err != nil || g.Count != 3 || g.Selector != "site=berlin" {
				t.Fatalf("FindGroup = %+v, %v", g, err)
			}
		})
		t.Run("CRUD", func(t *testing.T) {
			_, err := db.CreateGroup(ctx, "acme", &fleet.Group{Name: "eq", Selector: "x"})
			wantCode(t, err, fleet.ECONFLICT)
			_, err = db.CreateGroup(ctx, "acme", &fleet.Group{Name: "bad", Selector: "a in ("})
			wantCode(t, err, fleet.EINVALID)
			g, err := db.UpdateGroup(ctx, "acme", "in", &fleet.Group{Selector: " site  in (berlin)", Description: "now berlin"})
			if err != nil || g.Selector != "site in (berlin)" || g.Description != "now berlin" || g.Count != 3 {
				t.Fatalf("UpdateGroup = %+v, %v", g, err)
			}
			gs, n, err := db.FindGroups(ctx, "acme", fleet.Page{Page: 1, Limit: 3})
			if err != nil || n != len(selectors) || len(gs) != 3 || gs[0].Name != "absent" || gs[0].Count != 2 {
				t.Fatalf("FindGroups = %d, %+v, %v", n, gs, err)
			}
			if err := db.DeleteGroup(ctx, "acme", "empty-results"); err != nil {
				t.Fatal(err)
			}
			wantCode(t, db.DeleteGroup(ctx, "acme", "empty-results"), fleet.ENOTFOUND)
			_, _, err = db.FindGroupDevices(ctx, "acme", "empty-results", fleet.Page{Page: 1, Limit: 10})
			wantCode(t, err, fleet.ENOTFOUND)
		})
		t.Run("Tenants", func(t *testing.T) {
			_, err := db.FindGroup(ctx, "beta", "eq")
			wantCode(t, err, fleet.ENOTFOUND)
			_, _, err = db.FindGroupDevices(ctx, "beta", "eq", fleet.Page{Page: 1, Limit: 10})
			wantCode(t, err, fleet.ENOTFOUND)
			wantCode(t, db.DeleteGroup(ctx, "beta", "eq"), fleet.ENOTFOUND)
			if _, err := db.CreateGroup(ctx, "beta", &fleet.Group{Name: "eq", Selector: "site=berlin"}); err != nil {
				t.Fatal(err)
			}
			if got := groupIDs(t, db, "beta", "eq"); got != "a" {
				t.Fatalf("beta's group = [%s]", got)
			}
		})
		t.Run("ShadowFilter", func(t *testing.T) {
			if _, err := db.UpdateDesired(ctx, "acme", "b", map[string]any{"wifi": true}, nil); err != nil {
				t.Fatal(err)
			}
			list := func(state string) []string {
				devs, n, err := db.FindDevices(ctx, "acme", fleet.DeviceFilter{Shadow: state, Page: fleet.Page{Page: 1, Limit: 50}})
				if err != nil || n != len(devs) {
					t.Fatalf("FindDevices(%s): %d, %v", state, n, err)
				}
				var ids []string
				for _, d := range devs {
					ids = append(ids, d.ID)
				}
				return ids
			}
			if got := list(fleet.ShadowOutOfSync); !slices.Equal(got, []string{"b"}) {
				t.Errorf("out of sync = %v", got)
			}
			if got := list(fleet.ShadowInSync); !slices.Equal(got, []string{"a", "c", "d"}) {
				t.Errorf("in sync = %v", got)
			}
		})
	})
}
