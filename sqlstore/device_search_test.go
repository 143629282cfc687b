package sqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// searchDevices are the devices of TestDeviceSearch's tenant acme: ids and
// metadata values with cases, quotes, LIKE's and FTS5's special
// characters and letters beyond ASCII.
var searchDevices = map[string]map[string]string{
	"Pump-Alpha": {"site": "Zürich Nord", "note": `50% off_\ "quoted" it's`},
	"pump-beta":  {"site": "ZÜRICH", "model": "X1"},
	"valve.7":    {"site": "berlin", "tag": "Ünïcödé ǅ ß"},
	"gw:0000":    {"site": "Paris", "serial": "A0000b"},
	"gw:0001":    nil,
	"x":          {"k": "ab"},
}

// searchTerms cover every length around the trigram index's three
// characters, each special character alone and inside longer terms, case,
// and a term that spans the id and a value (which must not match).
var searchTerms = []string{
	"p", "P", "pu", "PUMP", "ump-a", "alpha", "Pump-Alpha", "pump-alpha\nzür",
	"zür", "ZÜR", "zÜr", "ürich", "ZÜRICH", "ich n", "nord", "nör",
	"%", "_", `\`, `"`, "'", "50%", "0%", "% o", "off_", `_\`, `\ "`, `"quoted"`, `it's`, "%%%", "___",
	"0000", "000", "00", "0", "a0000b", "gw:", ":00", "valve.", ".7",
	"ünï", "ÜNÏ", "ǅ", "ß", "ǆ", "ü", "ab", "abc", "model", "site", "x1", "X",
	"nowhere", "paris ", " ",
}

// TestDeviceSearch checks that search through migration 0019's indexes
// finds what the condition alone finds: the devices whose id or metadata
// value contains the term, with the database's own case folding, in the
// tenant and no other, after creation, metadata updates and deletion.
func TestDeviceSearch(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, raw := openWithRaw(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustTenant(t, db, "beta")
		mustDevices(t, db, "acme", searchDevices)
		// beta has acme's ids with other values, and values of its own.
		mustDevices(t, db, "beta", map[string]map[string]string{
			"Pump-Alpha": {"site": "Lisbon"},
			"beta-only":  {"site": "Zürich Süd", "note": "quoted"},
		})

		check := func(t *testing.T) {
			t.Helper()
			for _, tenant := range []string{"acme", "beta"} {
				for _, term := range searchTerms {
					want := referenceSearch(t, raw, b.Name, tenant, term)
					devs, n, err := db.FindDevices(ctx, tenant, fleet.DeviceFilter{Search: term, Page: fleet.Page{Page: 1, Limit: 1000}})
					if err != nil {
						t.Fatalf("%s: search %q: %v", tenant, term, err)
					}
					var got []string
					for _, d := range devs {
						got = append(got, d.ID)
					}
					if !slices.Equal(got, want) || n != len(want) {
						t.Errorf("%s: search %q = %d %q, want %q", tenant, term, n, got, want)
					}
					// A dispatch's search chooses the same devices; with
					// search_key, the id or that key's value.
					for _, key := range []string{"", "site"} {
						nt, err := db.CountTargets(ctx, tenant, &fleet.Dispatch{SearchType: fleet.SearchSearch, SearchKey: key, SearchQuery: term})
						if wantN := len(referenceKeySearch(t, raw, b.Name, tenant, key, term)); err != nil || nt != wantN {
							t.Errorf("%s: dispatch search %q under %q targets %d, %v; want %d", tenant, term, key, nt, err, wantN)
						}
					}
				}
			}
		}
		t.Run("Created", check)

		// The reference itself is what search means: some fixed answers.
		for term, want := range map[string][]string{
			"PUMP":            {"Pump-Alpha", "pump-beta"},
			"50%":             {"Pump-Alpha"},
			"%":               {"Pump-Alpha"},
			`"quoted"`:        {"Pump-Alpha"},
			"0000":            {"gw:0000"},
			"000":             {"gw:0000", "gw:0001"},
			"pump-alpha\nzür": nil,
			"site":            nil,
		} {
			if got := referenceSearch(t, raw, b.Name, "acme", term); !slices.Equal(got, want) {
				t.Fatalf("reference search %q = %q, want %q", term, got, want)
			}
		}

		if _, err := db.UpdateDeviceMetadata(ctx, "acme", "Pump-Alpha", map[string]*string{"site": ptr("Genève"), "note": nil}); err != nil {
			t.Fatal(err)
		}
		if _, err := db.UpdateDeviceMetadata(ctx, "acme", "gw:0001", map[string]*string{"serial": ptr("a0000B"), "site": ptr("Paris")}); err != nil {
			t.Fatal(err)
		}
		if err := db.DeleteDevice(ctx, "acme", "valve.7"); err != nil {
			t.Fatal(err)
		}
		if err := db.DeleteDevice(ctx, "acme", "pump-beta"); err != nil {
			t.Fatal(err)
		}
		// A deleted id comes back with other metadata.
		mustDevices(t, db, "acme", map[string]map[string]string{"pump-beta": {"site": "Nordhausen"}})
		t.Run("Changed", check)
		for term, want := range map[string][]string{
			"genè":   {"Pump-Alpha"},
			"zürich": nil,
			"quoted": nil,
			"a0000b": {"gw:0000", "gw:0001"},
			"nord":   {"pump-beta"},
			"valve":  nil,
			"ünïc":   nil,
		} {
			devs, _, err := db.FindDevices(ctx, "acme", fleet.DeviceFilter{Search: term, Page: fleet.Page{Page: 1, Limit: 50}})
			var got []string
			for _, d := range devs {
				got = append(got, d.ID)
			}
			if err != nil || !slices.Equal(got, want) {
				t.Errorf("after the changes, search %q = %q, %v; want %q", term, got, err, want)
			}
		}
		if b.Name == "sqlite" {
			checkSearchTables(t, raw)
		}
	})
}

// TestDeviceSearchRows follows a device's metadata through creation in
// batches of several statements, updates that add, change and remove keys,
// deletion and creation again, with concurrent writers sharing the
// transaction and one of them failing: search and the metadata filter
// find what the devices hold, and on SQLite the search rows the store
// writes (migration 0021) are exactly those of the devices.
func TestDeviceSearchRows(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, raw := openWithRaw(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustTenant(t, db, "beta")
		// More devices and metadata rows than one statement carries, and
		// bytes that are not UTF-8, which the stored JSON holds as U+FFFD.
		devs := make([]fleet.NewDevice, 450)
		for i := range devs {
			devs[i] = fleet.NewDevice{ID: fmt.Sprintf("d%03d", i), Metadata: map[string]string{
				"site": fmt.Sprint("site-", i%7), "rack": fmt.Sprint("r", i), "raw": "caf\xe9-\xff\xfe",
			}}
		}
		devs[3].Metadata = nil
		var wg sync.WaitGroup
		errs := make([]error, 4)
		wg.Go(func() { _, errs[0] = db.CreateDevices(ctx, "acme", devs) })
		wg.Go(func() { _, errs[1] = db.CreateDevices(ctx, "beta", devs[:300]) })
		wg.Wait()
		// A batch that fails (d010 exists) beside writers that succeed.
		wg.Go(func() {
			_, errs[0] = db.CreateDevices(ctx, "acme", []fleet.NewDevice{{ID: "n1", Metadata: map[string]string{"site": "lost"}}, {ID: "d010"}})
		})
		wg.Go(func() {
			_, errs[1] = db.CreateDevices(ctx, "acme", []fleet.NewDevice{{ID: "n2", Metadata: map[string]string{"site": "kept"}}})
		})
		wg.Go(func() {
			_, errs[2] = db.UpdateDeviceMetadata(ctx, "acme", "d001", map[string]*string{"site": ptr("moved"), "raw": nil, "new": ptr("Ünï")})
		})
		wg.Go(func() { errs[3] = db.DeleteDevice(ctx, "acme", "d002") })
		wg.Wait()
		wantCode(t, errs[0], fleet.ECONFLICT)
		for _, err := range errs[1:] {
			if err != nil {
				t.Fatal(err)
			}
		}
		if _, err := db.UpdateDeviceMetadata(ctx, "acme", "d003", map[string]*string{"site": ptr("was-empty")}); err != nil {
			t.Fatal(err)
		}
		if err := db.DeleteDevice(ctx, "acme", "d004"); err != nil {
			t.Fatal(err)
		}
		mustDevices(t, db, "acme", map[string]map[string]string{"d004": {"site": "back"}})
		for _, tc := range []struct {
			term string
			meta map[string]string
			want string
		}{
			{"moved", nil, "[d001]"},
			{"", map[string]string{"site": "moved"}, "[d001]"},
			{"Ünï", map[string]string{"new": "Ünï"}, "[d001]"},
			{"site-1", nil, "[d008 d015 d022]"}, // d001 moved
			{"r1", map[string]string{"site": "site-1"}, "[d015 d106 d113]"},
			{"lost", nil, "[]"},
			{"", map[string]string{"site": "lost"}, "[]"},
			{"kept", map[string]string{"site": "kept"}, "[n2]"},
			{"r2", map[string]string{"rack": "r2"}, "[]"},
			{"was-empty", nil, "[d003]"},
			{"back", nil, "[d004]"},
			{"", map[string]string{"rack": "r4"}, "[]"},
			{"caf\uFFFD-", nil, "[d000 d005 d006]"},
		} {
			devs, _, err := db.FindDevices(ctx, "acme", fleet.DeviceFilter{Search: tc.term, Metadata: tc.meta, Page: fleet.Page{Page: 1, Limit: 3}})
			var got []string
			for _, d := range devs {
				got = append(got, d.ID)
			}
			if err != nil || fmt.Sprint(got) != tc.want {
				t.Errorf("search %q, metadata %v = %v, %v; want %s", tc.term, tc.meta, got, err, tc.want)
			}
		}
		for _, term := range []string{"site-3", "r44", "caf", "d00", "moved", "kept", "back", "\uFFFD\uFFFD"} {
			for _, tenant := range []string{"acme", "beta"} {
				want := referenceSearch(t, raw, b.Name, tenant, term)
				devs, n, err := db.FindDevices(ctx, tenant, fleet.DeviceFilter{Search: term, Page: fleet.Page{Page: 1, Limit: 1000}})
				var got []string
				for _, d := range devs {
					got = append(got, d.ID)
				}
				if err != nil || n != len(want) || !slices.Equal(got, want) {
					t.Errorf("%s: search %q = %d %q, %v; want %q", tenant, term, n, got, err, want)
				}
			}
		}
		if b.Name == "sqlite" {
			checkSearchTables(t, raw)
		}
	})
}

// TestDeviceMetadataFilter checks the metadata filter through migration
// 0019's index: exact values, in the tenant alone, after updates and
// deletion.
func TestDeviceMetadataFilter(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, _ := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustTenant(t, db, "beta")
		mustDevices(t, db, "acme", searchDevices)
		mustDevices(t, db, "beta", map[string]map[string]string{"b1": {"site": "Paris", "model": "X1"}})
		find := func(meta map[string]string) []string {
			t.Helper()
			devs, n, err := db.FindDevices(ctx, "acme", fleet.DeviceFilter{Metadata: meta, Page: fleet.Page{Page: 1, Limit: 50}})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, d := range devs {
				got = append(got, d.ID)
			}
			if n != len(got) {
				t.Fatalf("metadata %v: count %d, listed %q", meta, n, got)
			}
			return got
		}
		for _, tc := range []struct {
			meta map[string]string
			want []string
		}{
			{map[string]string{"site": "Paris"}, []string{"gw:0000"}},
			{map[string]string{"site": "paris"}, nil},
			{map[string]string{"site": "Par"}, nil},
			{map[string]string{"note": `50% off_\ "quoted" it's`}, []string{"Pump-Alpha"}},
			{map[string]string{"tag": "Ünïcödé ǅ ß"}, []string{"valve.7"}},
			{map[string]string{"site": "ZÜRICH", "model": "X1"}, []string{"pump-beta"}},
			{map[string]string{"site": "Paris", "model": "X1"}, nil},
			{map[string]string{"k": "ab"}, []string{"x"}},
			{map[string]string{"K": "ab"}, nil},
			{map[string]string{"nowhere": ""}, nil},
		} {
			if got := find(tc.meta); !slices.Equal(got, tc.want) {
				t.Errorf("metadata %v = %q, want %q", tc.meta, got, tc.want)
			}
		}
		if _, err := db.UpdateDeviceMetadata(ctx, "acme", "gw:0000", map[string]*string{"site": ptr("Rome")}); err != nil {
			t.Fatal(err)
		}
		if _, err := db.UpdateDeviceMetadata(ctx, "acme", "gw:0001", map[string]*string{"site": ptr("Paris")}); err != nil {
			t.Fatal(err)
		}
		if err := db.DeleteDevice(ctx, "acme", "x"); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			meta map[string]string
			want []string
		}{
			{map[string]string{"site": "Paris"}, []string{"gw:0001"}},
			{map[string]string{"site": "Rome"}, []string{"gw:0000"}},
			{map[string]string{"serial": "A0000b"}, []string{"gw:0000"}},
			{map[string]string{"k": "ab"}, nil},
		} {
			if got := find(tc.meta); !slices.Equal(got, tc.want) {
				t.Errorf("after the changes, metadata %v = %q, want %q", tc.meta, got, tc.want)
			}
		}
		n, err := db.CountTargets(ctx, "acme", &fleet.Dispatch{SearchType: fleet.SearchMetadata, SearchKey: "site", SearchQuery: "Paris"})
		if err != nil || n != 1 {
			t.Fatalf("dispatch to site=Paris targets %d, %v; want 1", n, err)
		}
	})
}

// TestDeviceCount checks the kept count of a tenant's devices through
// creation, failed creation, deletion and failed deletion.
func TestDeviceCount(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, _ := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustTenant(t, db, "beta")
		count := func(tenant string, want int) {
			t.Helper()
			_, n, err := db.FindDevices(ctx, tenant, fleet.DeviceFilter{Page: fleet.Page{Page: 1, Limit: 1}})
			if err != nil || n != want {
				t.Fatalf("%s has %d devices, %v; want %d", tenant, n, err, want)
			}
			nt, err := db.CountTargets(ctx, tenant, &fleet.Dispatch{SearchType: fleet.SearchAll})
			if err != nil || nt != want {
				t.Fatalf("a dispatch to all of %s targets %d, %v; want %d", tenant, nt, err, want)
			}
		}
		count("acme", 0)
		numberedDevices(t, db, "acme", "d%03d", 450) // more than one INSERT
		count("acme", 450)
		count("beta", 0)
		_, err := db.CreateDevices(ctx, "acme", []fleet.NewDevice{{ID: "new"}, {ID: "d001"}})
		wantCode(t, err, fleet.ECONFLICT)
		count("acme", 450)
		if err := db.DeleteDevice(ctx, "acme", "d001"); err != nil {
			t.Fatal(err)
		}
		wantCode(t, db.DeleteDevice(ctx, "acme", "d001"), fleet.ENOTFOUND)
		wantCode(t, db.DeleteDevice(ctx, "beta", "d002"), fleet.ENOTFOUND)
		count("acme", 449)
		numberedDevices(t, db, "beta", "d%03d", 3)
		count("beta", 3)
		count("acme", 449)
	})
}

// TestDeviceSearchBadInput: a term no device can hold finds none, and one
// no database can compare, not UTF-8 or holding NUL, is invalid.
func TestDeviceSearchBadInput(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, _ := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustDevices(t, db, "acme", searchDevices)
		page := fleet.Page{Page: 1, Limit: 50}
		for _, term := range []string{strings.Repeat("é", 2000), `"*" OR NEAR(a b) ^x`, "a*", "~"} {
			_, n, err := db.FindDevices(ctx, "acme", fleet.DeviceFilter{Search: term, Page: page})
			if err != nil || n != 0 {
				t.Errorf("search %q: %d, %v; want none", term, n, err)
			}
			_, n, err = db.FindDevices(ctx, "acme", fleet.DeviceFilter{Metadata: map[string]string{term: term}, Page: page})
			if err != nil || n != 0 {
				t.Errorf("metadata %q: %d, %v; want none", term, n, err)
			}
		}
		for _, term := range []string{"\x00", "ab\x00cd", "\xff\xfe", "caf\xe9"} {
			_, _, err := db.FindDevices(ctx, "acme", fleet.DeviceFilter{Search: term, Page: page})
			wantCode(t, err, fleet.EINVALID)
			_, _, err = db.FindDevices(ctx, "acme", fleet.DeviceFilter{Metadata: map[string]string{"site": term}, Page: page})
			wantCode(t, err, fleet.EINVALID)
			_, _, err = db.FindDevices(ctx, "acme", fleet.DeviceFilter{Metadata: map[string]string{term: "x"}, Page: page})
			wantCode(t, err, fleet.EINVALID)
			for _, st := range []string{fleet.SearchSearch, fleet.SearchMetadata} {
				_, err = db.CountTargets(ctx, "acme", &fleet.Dispatch{SearchType: st, SearchKey: "site", SearchQuery: term})
				wantCode(t, err, fleet.EINVALID)
			}
		}
	})
}

// openWithRaw opens a migrated store and a connection of the test's own
// to its database.
func openWithRaw(t testing.TB, b sqlstoretest.Backend) (*sqlstore.DB, *sql.DB) {
	t.Helper()
	db, raw, _ := openAtMigration(t, b, math.MaxInt)
	return db, raw
}

// referenceSearch is what search meant before migration 0019: every
// device of the tenant read, its id and metadata values compared.
func referenceSearch(t *testing.T, raw *sql.DB, backend, tenant, term string) []string {
	return referenceKeySearch(t, raw, backend, tenant, "", term)
}

// referenceKeySearch is referenceSearch of the value under key alone, when
// key is not "".
func referenceKeySearch(t *testing.T, raw *sql.DB, backend, tenant, key, term string) []string {
	t.Helper()
	q := `SELECT id FROM devices WHERE tenant = ? AND (instr(lower(id), lower(?)) > 0
		OR EXISTS (SELECT 1 FROM json_each(metadata) e WHERE (? = '' OR e.key = ?) AND instr(lower(e.value), lower(?)) > 0)) ORDER BY id`
	if backend == "postgres" {
		q = `SELECT id FROM devices WHERE tenant = $1 AND (strpos(lower(id), lower($2)) > 0
			OR EXISTS (SELECT 1 FROM jsonb_each_text(metadata) e WHERE ($3 = '' OR e.key = $4) AND strpos(lower(e.value), lower($5)) > 0)) ORDER BY id`
	}
	rows, err := raw.Query(q, tenant, term, key, key, term)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// checkSearchTables checks SQLite's search tables against the devices
// table: one text per device, of its id and metadata values, the FTS5
// index of those texts, and one metadata row per key and value.
func checkSearchTables(t *testing.T, raw *sql.DB) {
	t.Helper()
	const texts = `SELECT tenant, id, id || char(10) || coalesce((SELECT group_concat(value, char(10)) FROM json_each(metadata)), '') FROM devices`
	for _, q := range []string{
		texts + ` EXCEPT SELECT tenant, id, text FROM device_texts`,
		`SELECT tenant, id, text FROM device_texts EXCEPT ` + texts,
		`SELECT d.tenant, d.id, e.key, e.value FROM devices d, json_each(d.metadata) e EXCEPT SELECT tenant, id, key, value FROM device_metadata`,
		`SELECT tenant, id, key, value FROM device_metadata EXCEPT SELECT d.tenant, d.id, e.key, e.value FROM devices d, json_each(d.metadata) e`,
	} {
		var n int
		if err := raw.QueryRow("SELECT count(*) FROM (" + q + ")").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("%d rows of %s", n, q)
		}
	}
	// With content rowid 1, FTS5 compares its index with device_texts.
	if _, err := raw.Exec(`INSERT INTO device_search (device_search, rank) VALUES ('integrity-check', 1)`); err != nil {
		t.Errorf("the FTS5 index is not that of device_texts: %v", err)
	}
}

// TestDeviceSearchCommon: a term or value more than 2,000 devices match is
// counted and listed by reading the tenant's devices rather than an index;
// both ways give the same count and pages.
func TestDeviceSearchCommon(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, _ := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustTenant(t, db, "beta")
		devs := make([]fleet.NewDevice, 2100)
		for i := range devs {
			half := "left"
			if i >= 2000 {
				half = "right"
			}
			devs[i] = fleet.NewDevice{ID: fmt.Sprintf("dev-%04d", i), Metadata: map[string]string{"m": fmt.Sprint("v", i/1000), "all": "yes", "h": half}}
		}
		for _, tenant := range []string{"acme", "beta"} {
			if _, err := db.CreateDevices(ctx, tenant, devs); err != nil {
				t.Fatal(err)
			}
		}
		for _, tc := range []struct {
			filter     fleet.DeviceFilter
			count      int
			first, end string // of page 3 of 100
		}{
			{fleet.DeviceFilter{Search: "DEV"}, 2100, "dev-0200", "dev-0299"},  // read in id order
			{fleet.DeviceFilter{Search: "ev-1"}, 1000, "dev-1200", "dev-1299"}, // through the index
			{fleet.DeviceFilter{Search: "dev", Metadata: map[string]string{"m": "v1"}}, 1000, "dev-1200", "dev-1299"},
			{fleet.DeviceFilter{Metadata: map[string]string{"m": "v1"}}, 1000, "dev-1200", "dev-1299"},
			{fleet.DeviceFilter{Metadata: map[string]string{"all": "yes"}}, 2100, "dev-0200", "dev-0299"},
			{fleet.DeviceFilter{Search: "YES", Metadata: map[string]string{"all": "yes"}}, 2100, "dev-0200", "dev-0299"},
			{fleet.DeviceFilter{Search: "v"}, 2100, "dev-0200", "dev-0299"}, // no index
			// indexedMost exactly, through the index, and one more.
			{fleet.DeviceFilter{Metadata: map[string]string{"h": "left"}}, 2000, "dev-0200", "dev-0299"},
			{fleet.DeviceFilter{Search: "lef"}, 2000, "dev-0200", "dev-0299"},
			{fleet.DeviceFilter{Search: "-1", Metadata: map[string]string{"h": "left"}}, 1000, "dev-1200", "dev-1299"},
		} {
			tc.filter.Page = fleet.Page{Page: 3, Limit: 100}
			page, n, err := db.FindDevices(ctx, "acme", tc.filter)
			if err != nil || n != tc.count || len(page) != 100 || page[0].ID != tc.first || page[99].ID != tc.end {
				t.Errorf("%+v: %d devices, page of %d, %v", tc.filter, n, len(page), err)
			}
			// The last page holds what is left; the page after it
			// none, with the same count.
			last := (tc.count + 99) / 100
			for pg, want := range map[int]int{last: tc.count - (last-1)*100, last + 1: 0} {
				tc.filter.Page = fleet.Page{Page: pg, Limit: 100}
				page, n, err := db.FindDevices(ctx, "acme", tc.filter)
				if err != nil || n != tc.count || len(page) != want {
					t.Errorf("%+v: %d devices, page of %d, %v; want %d of %d", tc.filter, n, len(page), err, want, tc.count)
				}
			}
		}
		// Another tenant's devices are not counted or listed: beta has
		// 50 more of the value, and acme's count stays.
		more := make([]fleet.NewDevice, 50)
		for i := range more {
			more[i] = fleet.NewDevice{ID: fmt.Sprintf("more-%02d", i), Metadata: map[string]string{"h": "left"}}
		}
		if _, err := db.CreateDevices(ctx, "beta", more); err != nil {
			t.Fatal(err)
		}
		for _, tenant := range []string{"acme", "beta"} {
			page, n, err := db.FindDevices(ctx, tenant, fleet.DeviceFilter{Search: "left", Page: fleet.Page{Page: 1, Limit: 50}})
			want := map[string]int{"acme": 2000, "beta": 2050}[tenant]
			if err != nil || n != want || len(page) != 50 || page[0].ID != "dev-0000" {
				t.Errorf("%s: search left: %d devices, page of %d, %v; want %d", tenant, n, len(page), err, want)
			}
		}
		for _, tc := range []struct {
			d    fleet.Dispatch
			want int
		}{
			{fleet.Dispatch{SearchType: fleet.SearchSearch, SearchQuery: "dev"}, 2100},
			{fleet.Dispatch{SearchType: fleet.SearchSearch, SearchKey: "all", SearchQuery: "ye"}, 2100},
			{fleet.Dispatch{SearchType: fleet.SearchSearch, SearchKey: "m", SearchQuery: "ev-1"}, 1000},
			{fleet.Dispatch{SearchType: fleet.SearchMetadata, SearchKey: "m", SearchQuery: "v0"}, 1000},
			{fleet.Dispatch{SearchType: fleet.SearchMetadata, SearchKey: "all", SearchQuery: "yes"}, 2100},
		} {
			if n, err := db.CountTargets(ctx, "acme", &tc.d); err != nil || n != tc.want {
				t.Errorf("%+v targets %d, %v; want %d", tc.d, n, err, tc.want)
			}
		}
	})
}
