package sqlstore

import (
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/fleetd/fleet"
)

// TestRebuildWithoutForeignKey upgrades a SQLite database holding device
// actions through migration 0017, which rebuilds device_actions without
// its foreign key: every row keeps every column, every index is there
// again, and the key is gone.
func TestRebuildWithoutForeignKey(t *testing.T) {
	ctx := context.Background()
	db, err := Open(ctx, filepath.Join(t.TempDir(), "fleetd.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.migrate(ctx, 16); err != nil {
		t.Fatal(err)
	}
	if _, _, err := db.CreateTenant(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	var devs []fleet.NewDevice
	for i := range 30 {
		devs = append(devs, fleet.NewDevice{ID: fmt.Sprintf("d%02d", i), Metadata: map[string]string{"n": fmt.Sprint(i)}})
	}
	if _, err := db.CreateDevices(ctx, "acme", devs); err != nil {
		t.Fatal(err)
	}
	a, err := db.DispatchAction(ctx, "acme", &fleet.Dispatch{Action: "reboot", SearchType: fleet.SearchAll, Timeout: 60})
	if err != nil {
		t.Fatal(err)
	}
	// Rows in every state the columns can hold: started, ended with errors.
	p := 40
	if _, err := db.ReportStatus(ctx, "acme", []fleet.StatusReport{
		{DeviceID: "d01", ActionID: a.ID, State: "Downloading", Progress: &p},
		{DeviceID: "d02", ActionID: a.ID, State: "Failed", Errors: []string{"disk full"}},
	}); err != nil {
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
	if _, err := db.Migrate(ctx); err != nil {
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
	// Deleting a device still deletes its device actions.
	if err := db.DeleteDevice(ctx, "acme", "d02"); err != nil {
		t.Fatal(err)
	}
	if n := len(rows()); n != 29 {
		t.Errorf("%d device actions after deleting a device, want 29", n)
	}
}
