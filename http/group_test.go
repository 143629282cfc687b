package fleethttp_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

type groupBody struct {
	Name, Selector, Description string
	Count                       int
}

// TestGroupsAPI: groups over HTTP: saved, read with their counts, their
// devices listed live as metadata and reported state change, targeted by
// a dispatch; errors, roles and tenants.
func TestGroupsAPI(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		admin := s.Admin()
		for i := range 5 {
			site := "berlin"
			if i%2 == 1 {
				site = "paris"
			}
			s.MustDevice(t, admin, fmt.Sprint("gd-", i), map[string]string{"site": site})
		}
		r := s.Do(t, admin, "POST", "/api/v1/groups", map[string]any{"name": "berlin-new", "selector": "site = berlin, reported.fw!=2", "description": "to update"}).Want(t, 201)
		if loc := r.Header.Get("Location"); !strings.HasSuffix(loc, "/api/v1/groups/berlin-new") {
			t.Fatalf("Location = %q", loc)
		}
		var g groupBody
		r.Decode(t, &g)
		if g.Selector != "site=berlin,reported.fw!=2" || g.Count != 3 || g.Description != "to update" {
			t.Fatalf("created = %+v", g)
		}
		members := func() string {
			var list struct {
				Devices []fleetdtest.Device
				Count   int
			}
			s.Do(t, admin, "GET", "/api/v1/groups/berlin-new/devices?limit=2", nil).Want(t, 200).Decode(t, &list)
			var ids []string
			for _, d := range list.Devices {
				ids = append(ids, d.ID)
			}
			return fmt.Sprintf("%d %s", list.Count, strings.Join(ids, " "))
		}
		if got := members(); got != "3 gd-0 gd-2" {
			t.Fatalf("members = %s", got)
		}
		// Live: gd-0 reports the new firmware and leaves, gd-1 moves to Berlin.
		s.Do(t, admin, "PATCH", "/api/v1/devices/gd-1", map[string]any{"metadata": map[string]any{"site": "berlin"}}).Want(t, 204)
		var dev struct{ Token string }
		s.Do(t, admin, "POST", "/api/v1/devices/gd-0/token", nil).Want(t, 201).Decode(t, &dev)
		s.Send(t, fleetdtest.Req{Method: "POST", Path: "/api/v1/devices/gd-0/streams/device_shadow", Creds: admin,
			Body: []any{map[string]any{"timestamp": 1763719200000, "sequence": 1, "fw": 2}}}).Want(t, 200)
		if got := members(); got != "3 gd-1 gd-2" {
			t.Fatalf("members after the changes = %s", got)
		}

		// A dispatch to the group targets its devices of the moment.
		var out struct {
			ID       int64
			Targeted int
		}
		s.Do(t, admin, "POST", "/api/v1/actions", map[string]any{"action": "configure", "params": map[string]any{}, "search_type": "group", "group": "berlin-new"}).Want(t, 201).Decode(t, &out)
		if out.Targeted != 3 {
			t.Fatalf("targeted %d, want 3", out.Targeted)
		}
		var act struct {
			SearchType  string `json:"search_type"`
			SearchQuery string `json:"search_query"`
		}
		s.Do(t, admin, "GET", fmt.Sprint("/api/v1/actions/", out.ID), nil).Want(t, 200).Decode(t, &act)
		if act.SearchType != "group" || act.SearchQuery != "berlin-new" {
			t.Fatalf("action = %+v", act)
		}

		s.Do(t, admin, "PUT", "/api/v1/groups/berlin-new", map[string]any{"selector": "site in (paris)"}).Want(t, 204)
		s.Do(t, admin, "GET", "/api/v1/groups/berlin-new", nil).Want(t, 200).Decode(t, &g)
		if g.Selector != "site in (paris)" || g.Count != 1 || g.Description != "" {
			t.Fatalf("after PUT = %+v", g)
		}
		var list struct {
			Groups []groupBody
			Count  int
		}
		s.Do(t, admin, "GET", "/api/v1/groups", nil).Want(t, 200).Decode(t, &list)
		if list.Count != 1 || list.Groups[0].Count != 1 {
			t.Fatalf("list = %+v", list)
		}

		for _, tc := range []struct {
			name, method, path string
			body               any
			status             int
			field, says        string
		}{
			{"Malformed", "POST", "/api/v1/groups", map[string]any{"name": "x", "selector": "a in (b"}, 400, "selector", "position 8"},
			{"BadName", "POST", "/api/v1/groups", map[string]any{"name": "a b", "selector": "a"}, 400, "name", ""},
			{"NoSelector", "POST", "/api/v1/groups", map[string]any{"name": "x"}, 400, "selector", ""},
			// PostgreSQL's text holds no NUL: refused on both databases.
			{"NULInDescription", "POST", "/api/v1/groups", map[string]any{"name": "x", "selector": "a", "description": "a\x00b"}, 400, "description", "NUL"},
			{"Taken", "POST", "/api/v1/groups", map[string]any{"name": "berlin-new", "selector": "a"}, 409, "", ""},
			{"PutMalformed", "PUT", "/api/v1/groups/berlin-new", map[string]any{"selector": "a=b=c"}, 400, "selector", "position 4"},
			{"Unknown", "GET", "/api/v1/groups/nope", nil, 404, "", ""},
			{"UnknownDevices", "GET", "/api/v1/groups/nope/devices", nil, 404, "", ""},
			{"DispatchUnknownGroup", "POST", "/api/v1/actions", map[string]any{"action": "a", "params": map[string]any{}, "search_type": "group", "group": "nope"}, 400, "group", ""},
			{"DispatchNoGroup", "POST", "/api/v1/actions", map[string]any{"action": "a", "params": map[string]any{}, "search_type": "group"}, 400, "group", ""},
			{"DispatchGroupElsewhere", "POST", "/api/v1/actions", map[string]any{"action": "a", "params": map[string]any{}, "search_type": "all", "group": "berlin-new"}, 400, "group", ""},
			{"ShadowFilter", "GET", "/api/v1/devices?shadow=maybe", nil, 400, "shadow", ""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				var e struct {
					Error, Message string
					Fields         map[string]string
				}
				s.Do(t, admin, tc.method, tc.path, tc.body).Want(t, tc.status).Decode(t, &e)
				if tc.field != "" && !strings.Contains(e.Fields[tc.field], tc.says) {
					t.Fatalf("error = %+v, want %s to say %q", e, tc.field, tc.says)
				}
			})
		}

		viewer := s.NewKey(t, admin, "g-viewer", "viewer")
		s.Do(t, viewer, "GET", "/api/v1/groups/berlin-new", nil).Want(t, 200)
		s.Do(t, viewer, "POST", "/api/v1/groups", map[string]any{"name": "v", "selector": "a"}).Want(t, 403)
		beta := s.NewTenant(t, "beta")
		s.Do(t, beta, "GET", "/api/v1/groups/berlin-new", nil).Want(t, 404)
		s.Do(t, beta, "GET", "/api/v1/groups/berlin-new/devices", nil).Want(t, 404)
		s.Do(t, beta, "POST", "/api/v1/actions", map[string]any{"action": "a", "params": map[string]any{}, "search_type": "group", "group": "berlin-new"}).Want(t, 400)
		s.Do(t, beta, "DELETE", "/api/v1/groups/berlin-new", nil).Want(t, 404)
		s.Do(t, admin, "DELETE", "/api/v1/groups/berlin-new", nil).Want(t, 204)
		s.Do(t, admin, "GET", "/api/v1/groups/berlin-new", nil).Want(t, 404)

		// The fleet view: devices out of sync with their shadow.
		s.Do(t, admin, "PATCH", "/api/v1/devices/gd-3/shadow", map[string]any{"desired": map[string]any{"fw": 3}}).Want(t, 200)
		var sync struct {
			Devices []fleetdtest.Device
			Count   int
		}
		s.Do(t, admin, "GET", "/api/v1/devices?shadow=out_of_sync", nil).Want(t, 200).Decode(t, &sync)
		if sync.Count != 1 || sync.Devices[0].ID != "gd-3" {
			t.Fatalf("out of sync = %+v", sync)
		}
		s.Do(t, admin, "GET", "/api/v1/devices?shadow=in_sync&metadata.site=berlin", nil).Want(t, 200).Decode(t, &sync)
		if sync.Count != 4 {
			t.Fatalf("in sync in berlin = %d, want 4", sync.Count)
		}
	})
}
