package sqlstore

import (
	"context"
	"fmt"
	"reflect"
	"testing"

	"github.com/fleetd/fleet"
)

// TestRebuildWithoutForeignKey upgrades a SQLite database holding device
// actions through migration 0017, which rebuilds device_actions without
// its foreign key: every row keeps every column, every index is there
// again, and the key is gone. Migration 0018 then counts them.
func TestRebuildWithoutForeignKey(t *testing.T) {
	ctx := context.Background()
	db := openLocal(t, 16)
	if _, _, err := db.CreateTenant(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	// As migration 16 found them: CreateDevices counts devices in a table
	// of migration 19.
	for i := range 30 {
		if _, err := db.write.ExecContext(ctx, "INSERT INTO devices (tenant, id, token_hash, metadata, components, created_at) VALUES ('acme', ?, '', ?, '{}', 0)",
			fmt.Sprintf("d%02d", i), fmt.Sprintf(`{"n":"%d"}`, i)); err != nil {
			t.Fatal(err)
		}
	}
	// The device actions of a dispatch to all 30, written as the store of
	// migration 16 wrote them, in every state the columns can hold:
	// queued, started, ended with errors.
	if _, err := db.write.ExecContext(ctx, `INSERT INTO actions (tenant, id, action, params, search_type, search_key, search_query,
		metadata, timeout, user_email, user_name, created_at, targeted) VALUES ('acme', 1, 'reboot', '{}', 'all', '', '', '{}', 60, '', '', 1, 30)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.write.ExecContext(ctx, `INSERT INTO device_actions (tenant, action_id, device_id, type, status, action_status, progress,
		errors, error_count, user_email, user_name, serial_metadata, created_at, updated_at, phase)
		SELECT tenant, 1, id, 'reboot', 'Queued', 'Queued', 0, '{}', 0, '', '', metadata, 1, 1, 0 FROM devices`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.write.ExecContext(ctx, `UPDATE device_actions SET status = 'Downloading', action_status = 'Progress', progress = 40,
		initiated_at = 2, deadline = 60002, last_ts = 2, last_seq = 0 WHERE device_id = 'd01'`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.write.ExecContext(ctx, `UPDATE device_actions SET status = 'Failed', action_status = 'Failed',
		errors = '{"Failed":["disk full"]}', error_count = 1, initiated_at = 2, last_ts = 2, last_seq = 0 WHERE device_id = 'd02'`); err != nil {
		t.Fatal(err)
	}
	rows := func() [][]any {
		t.Helper()
		r, err := db.read.QueryContext(ctx, "SELECT * FROM device_actions ORDER BY tenant, action_id, device_id")
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		cols, _ := r.Columns()
		var out [][]any
		for r.Next() {
			v := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range v {
				ptrs[i] = &v[i]
			}
			if err := r.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			out = append(out, append([]any{cols}, v...))
		}
		return out
	}
	strs := func(q string) []string {
		t.Helper()
		s, err := queryStrings(ctx, db, q)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	const indexes = "SELECT name || ': ' || sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'device_actions' AND sql IS NOT NULL ORDER BY name"
	before, beforeIdx := rows(), strs(indexes)
	if len(before) != 30 || len(beforeIdx) < 10 {
		t.Fatalf("before: %d rows, indexes %q", len(before), beforeIdx)
	}
	if fk := strs("SELECT DISTINCT \"table\" FROM pragma_foreign_key_list('device_actions')"); len(fk) != 1 {
		t.Fatalf("before: foreign keys %q, want devices", fk)
	}
	// Through 0021: 0022 adds columns and indexes of its own
	// (TestFinalColumnsMigration).
	if _, err := db.migrate(ctx, 21); err != nil {
		t.Fatal(err)
	}
	if after := rows(); !reflect.DeepEqual(after, before) {
		t.Errorf("rows changed:\n%v\n%v", before, after)
	}
	if after := strs(indexes); !reflect.DeepEqual(after, beforeIdx) {
		t.Errorf("indexes changed:\n%q\n%q", beforeIdx, after)
	}
	if fk := strs("SELECT DISTINCT \"table\" FROM pragma_foreign_key_list('device_actions')"); len(fk) != 0 {
		t.Errorf("foreign keys %q left", fk)
	}
	// Migration 0018 counted them. They are read as FindAction reads
	// them, from the counts: FindAction itself reads tables of later
	// migrations.
	statuses := func() map[string]int {
		t.Helper()
		r, err := db.read.QueryContext(ctx, `SELECT action_status, CAST(sum(n) AS BIGINT) FROM device_action_counts
			WHERE tenant = 'acme' AND action_id = 1 GROUP BY action_status HAVING sum(n) <> 0`)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		out := map[string]int{}
		for r.Next() {
			var st string
			var n int
			if err := r.Scan(&st, &n); err != nil {
				t.Fatal(err)
			}
			out[st] = n
		}
		return out
	}
	if got, want := statuses(), map[string]int{"Queued": 28, "Progress": 1, "Failed": 1}; !reflect.DeepEqual(got, want) {
		t.Errorf("counts after migrating: %v, want %v", got, want)
	}
	// Deleting a device still deletes its device actions, and counts it.
	if err := db.DeleteDevice(ctx, "acme", "d02"); err != nil {
		t.Fatal(err)
	}
	if n := len(rows()); n != 29 {
		t.Errorf("%d device actions after deleting a device, want 29", n)
	}
	if got, want := statuses(), map[string]int{"Queued": 28, "Progress": 1}; !reflect.DeepEqual(got, want) {
		t.Errorf("counts after deleting a device: %v, want %v", got, want)
	}
}

// TestSearchIndexesOfExistingDevices upgrades a SQLite database holding
// devices through migration 0019: their count, search rows and metadata
// rows are built, and search, the metadata filter and the count read them.
func TestSearchIndexesOfExistingDevices(t *testing.T) {
	ctx := context.Background()
	db := openLocal(t, 18)
	for _, tenant := range []string{"acme", "beta", "empty"} {
		if _, _, err := db.CreateTenant(ctx, tenant); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range [][3]string{
		{"acme", "pump-1", `{"site":"Berlin","model":"x1"}`},
		{"acme", "pump-2", `{"site":"Paris","model":"x1"}`},
		{"acme", "valve-1", `{}`},
		{"beta", "pump-1", `{"site":"Berlin"}`},
	} {
		if _, err := db.write.ExecContext(ctx, "INSERT INTO devices (tenant, id, token_hash, metadata, components, created_at) VALUES (?, ?, '', ?, '{}', 0)",
			d[0], d[1], d[2]); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	page := fleet.Page{Page: 1, Limit: 50}
	for _, tc := range []struct {
		tenant string
		filter fleet.DeviceFilter
		want   string
	}{
		{"acme", fleet.DeviceFilter{}, "3 [pump-1 pump-2 valve-1]"},
		{"beta", fleet.DeviceFilter{}, "1 [pump-1]"},
		{"empty", fleet.DeviceFilter{}, "0 []"},
		{"acme", fleet.DeviceFilter{Search: "BERL"}, "1 [pump-1]"},
		{"acme", fleet.DeviceFilter{Search: "lve-"}, "1 [valve-1]"},
		{"beta", fleet.DeviceFilter{Search: "paris"}, "0 []"},
		{"acme", fleet.DeviceFilter{Metadata: map[string]string{"model": "x1"}}, "2 [pump-1 pump-2]"},
		{"beta", fleet.DeviceFilter{Metadata: map[string]string{"model": "x1"}}, "0 []"},
	} {
		tc.filter.Page = page
		devs, n, err := db.FindDevices(ctx, tc.tenant, tc.filter)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, d := range devs {
			ids = append(ids, d.ID)
		}
		if got := fmt.Sprintf("%d %v", n, ids); got != tc.want {
			t.Errorf("%s %+v: %s, want %s", tc.tenant, tc.filter, got, tc.want)
		}
	}
	for q, want := range map[string]int{
		"SELECT count(*) FROM device_texts":                                         4,
		"SELECT count(*) FROM device_search WHERE device_search MATCH '\"pump-1\"'": 2,
		"SELECT count(*) FROM device_metadata":                                      5,
	} {
		var n int
		if err := db.read.QueryRowContext(ctx, q).Scan(&n); err != nil || n != want {
			t.Errorf("%s = %d, %v; want %d", q, n, err, want)
		}
	}
}
