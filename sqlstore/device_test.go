package sqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

func ptr(s string) *string { return &s }

func TestDevices(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, clk := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustTenant(t, db, "beta")
		toks, err := db.CreateDevices(ctx, "acme", []fleet.NewDevice{
			{ID: "pump-1", Metadata: map[string]string{"site": "Berlin", "model": "x1"}},
			{ID: "pump-2", Metadata: map[string]string{"site": "Paris", "model": "x1"}},
			{ID: "valve-1", Metadata: map[string]string{"site": "berlin-south"}},
			{Metadata: nil},
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(toks) != 4 || toks[3].ID == "" || !fleet.ValidDeviceID(toks[3].ID) {
			t.Fatalf("tokens = %+v, want a generated id for the fourth", toks)
		}

		t.Run("Find", func(t *testing.T) {
			d, err := db.FindDevice(ctx, "acme", "pump-1")
			if err != nil {
				t.Fatal(err)
			}
			if d.Metadata["site"] != "Berlin" || !d.CreatedAt.Equal(clk.Now()) || d.LastSeenAt != nil || len(d.Components) != 0 {
				t.Fatalf("device = %+v", d)
			}
		})
		t.Run("OtherTenantCannotSee", func(t *testing.T) {
			_, err := db.FindDevice(ctx, "beta", "pump-1")
			wantCode(t, err, fleet.ENOTFOUND)
			_, n, _ := db.FindDevices(ctx, "beta", fleet.DeviceFilter{Page: fleet.Page{Page: 1, Limit: 50}})
			if n != 0 {
				t.Fatalf("beta lists %d devices", n)
			}
			_, err = db.UpdateDeviceMetadata(ctx, "beta", "pump-1", map[string]*string{"a": ptr("b")})
			wantCode(t, err, fleet.ENOTFOUND)
			wantCode(t, db.DeleteDevice(ctx, "beta", "pump-1"), fleet.ENOTFOUND)
			_, err = db.RotateDeviceToken(ctx, "beta", "pump-1")
			wantCode(t, err, fleet.ENOTFOUND)
			wantCode(t, db.AuthenticateDevice(ctx, "beta", "pump-1", toks[0].Token), fleet.EUNAUTHENTICATED)
		})
		t.Run("List", func(t *testing.T) {
			for _, tc := range []struct {
				name   string
				filter fleet.DeviceFilter
				want   []string
			}{
				{"All", fleet.DeviceFilter{}, []string{"pump-1", "pump-2", "valve-1", toks[3].ID}},
				{"SearchID", fleet.DeviceFilter{Search: "PUMP"}, []string{"pump-1", "pump-2"}},
				{"SearchMetadataValue", fleet.DeviceFilter{Search: "berlin"}, []string{"pump-1", "valve-1"}},
				{"SearchNotKeys", fleet.DeviceFilter{Search: "model"}, nil},
				{"SearchPercentIsLiteral", fleet.DeviceFilter{Search: "%"}, nil},
				{"Metadata", fleet.DeviceFilter{Metadata: map[string]string{"model": "x1"}}, []string{"pump-1", "pump-2"}},
				{"MetadataExact", fleet.DeviceFilter{Metadata: map[string]string{"site": "berlin"}}, nil},
				{"MetadataAnd", fleet.DeviceFilter{Metadata: map[string]string{"model": "x1", "site": "Paris"}}, []string{"pump-2"}},
				{"SearchAndMetadata", fleet.DeviceFilter{Search: "1", Metadata: map[string]string{"model": "x1"}}, []string{"pump-1", "pump-2"}},
			} {
				t.Run(tc.name, func(t *testing.T) {
					tc.filter.Page = fleet.Page{Page: 1, Limit: 50}
					devs, n, err := db.FindDevices(ctx, "acme", tc.filter)
					if err != nil {
						t.Fatal(err)
					}
					var got []string
					for _, d := range devs {
						got = append(got, d.ID)
					}
					if n != len(tc.want) || fmt.Sprint(got) != fmt.Sprint(sortedIDs(tc.want)) {
						t.Fatalf("got %d %v, want %v", n, got, sortedIDs(tc.want))
					}
				})
			}
		})
		t.Run("Paging", func(t *testing.T) {
			devs, n, err := db.FindDevices(ctx, "acme", fleet.DeviceFilter{Page: fleet.Page{Page: 2, Limit: 3}})
			if err != nil || n != 4 || len(devs) != 1 {
				t.Fatalf("page 2 of 3: n = %d, len = %d, err = %v", n, len(devs), err)
			}
		})
		t.Run("DuplicateID", func(t *testing.T) {
			_, err := db.CreateDevices(ctx, "acme", []fleet.NewDevice{{ID: "new-1"}, {ID: "pump-1"}})
			wantCode(t, err, fleet.ECONFLICT)
			if !contains(fleet.ErrorMessage(err), "pump-1") || contains(fleet.ErrorMessage(err), "new-1") {
				t.Fatalf("message %q must name pump-1 alone", fleet.ErrorMessage(err))
			}
			// Atomic: new-1 was not created either.
			_, err = db.FindDevice(ctx, "acme", "new-1")
			wantCode(t, err, fleet.ENOTFOUND)
		})
		t.Run("DuplicateInList", func(t *testing.T) {
			_, err := db.CreateDevices(ctx, "acme", []fleet.NewDevice{{ID: "z"}, {ID: "z"}})
			wantCode(t, err, fleet.EINVALID)
		})
		t.Run("SameIDInOtherTenant", func(t *testing.T) {
			if _, err := db.CreateDevices(ctx, "beta", []fleet.NewDevice{{ID: "pump-1"}}); err != nil {
				t.Fatal(err)
			}
		})
		t.Run("PatchMerges", func(t *testing.T) {
			d, err := db.UpdateDeviceMetadata(ctx, "acme", "pump-1", map[string]*string{"site": ptr("Rome"), "model": nil, "new": ptr("v")})
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]string{"site": "Rome", "new": "v"}
			if fmt.Sprint(d.Metadata) != fmt.Sprint(want) {
				t.Fatalf("metadata = %v, want %v", d.Metadata, want)
			}
			d, _ = db.FindDevice(ctx, "acme", "pump-1")
			if fmt.Sprint(d.Metadata) != fmt.Sprint(want) {
				t.Fatalf("stored metadata = %v, want %v", d.Metadata, want)
			}
		})
		t.Run("PatchBeyondLimit", func(t *testing.T) {
			patch := map[string]*string{}
			for i := range fleet.MaxMetadataKeys {
				patch[fmt.Sprint("k", i)] = ptr("v")
			}
			_, err := db.UpdateDeviceMetadata(ctx, "acme", "pump-1", patch)
			wantCode(t, err, fleet.EINVALID)
		})
		t.Run("Tokens", func(t *testing.T) {
			if err := db.AuthenticateDevice(ctx, "acme", "pump-2", toks[1].Token); err != nil {
				t.Fatal(err)
			}
			wantCode(t, db.AuthenticateDevice(ctx, "acme", "pump-2", toks[0].Token), fleet.EUNAUTHENTICATED)
			newTok, err := db.RotateDeviceToken(ctx, "acme", "pump-2")
			if err != nil {
				t.Fatal(err)
			}
			wantCode(t, db.AuthenticateDevice(ctx, "acme", "pump-2", toks[1].Token), fleet.EUNAUTHENTICATED)
			if err := db.AuthenticateDevice(ctx, "acme", "pump-2", newTok); err != nil {
				t.Fatal(err)
			}
		})
		t.Run("Touch", func(t *testing.T) {
			if err := db.TouchDevice(ctx, "acme", "valve-1", clk.Now()); err != nil {
				t.Fatal(err)
			}
			d, _ := db.FindDevice(ctx, "acme", "valve-1")
			if d.LastSeenAt == nil || !d.LastSeenAt.Equal(clk.Now()) {
				t.Fatalf("last_seen_at = %v", d.LastSeenAt)
			}
		})
		t.Run("Delete", func(t *testing.T) {
			if err := db.DeleteDevice(ctx, "acme", "valve-1"); err != nil {
				t.Fatal(err)
			}
			_, err := db.FindDevice(ctx, "acme", "valve-1")
			wantCode(t, err, fleet.ENOTFOUND)
			wantCode(t, db.DeleteDevice(ctx, "acme", "valve-1"), fleet.ENOTFOUND)
		})
	})
}

func sortedIDs(ids []string) []string {
	out := append([]string(nil), ids...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

// TestGroupCommit checks that concurrent writers share transactions and that
// one failing writer does not fail its neighbours in the same batch.
func TestGroupCommit(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, _ := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		if _, err := db.CreateDevices(ctx, "acme", []fleet.NewDevice{{ID: "taken"}}); err != nil {
			t.Fatal(err)
		}
		const n = 200
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id := fmt.Sprint("d", i)
				if i%10 == 0 {
					id = "taken"
				}
				_, errs[i] = db.CreateDevices(ctx, "acme", []fleet.NewDevice{{ID: id}})
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if i%10 == 0 {
				wantCode(t, err, fleet.ECONFLICT)
			} else if err != nil {
				t.Fatalf("writer %d: %v", i, err)
			}
		}
		_, count, err := db.FindDevices(ctx, "acme", fleet.DeviceFilter{Page: fleet.Page{Page: 1, Limit: 1}})
		if err != nil || count != 1+n-n/10 {
			t.Fatalf("devices = %d, %v; want %d", count, err, 1+n-n/10)
		}
	})
}

// BenchmarkCreateDevices measures bulk provisioning, whose goal is at least
// 100,000 devices/s on SQLite (BENCHMARKS.md, "Go micro-benchmarks"). The
// CPU per device is this process's in CreateDevices (on PostgreSQL the
// server's is not in it), which load moves less than the rate; making the
// devices is in neither.
func BenchmarkCreateDevices(b *testing.B) {
	for _, be := range sqlstoretest.Backends() {
		b.Run(be.Name, func(b *testing.B) {
			db := sqlstoretest.MustOpen(b, be, sqlstoretest.Options{})
			ctx := context.Background()
			if _, _, err := db.CreateTenant(ctx, "bench"); err != nil {
				b.Fatal(err)
			}
			const batch = 100_000
			devs := make([]fleet.NewDevice, batch)
			var cpu time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				for j := range devs {
					devs[j] = fleet.NewDevice{ID: fmt.Sprintf("dev-%d-%d", i, j), Metadata: map[string]string{"fleet": "bench", "n": fmt.Sprint(j % 100)}}
				}
				b.StartTimer()
				cpu0 := cpuTime()
				if _, err := db.CreateDevices(ctx, "bench", devs); err != nil {
					b.Fatal(err)
				}
				cpu += cpuTime() - cpu0
			}
			b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "devices/s")
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N*batch), "cpu-µs/device")
		})
	}
}

// BenchmarkUpdateDeviceMetadata measures one device's metadata patch, one
// transaction each, in a tenant of 10,000 devices.
func BenchmarkUpdateDeviceMetadata(b *testing.B) {
	for _, be := range sqlstoretest.Backends() {
		b.Run(be.Name, func(b *testing.B) {
			db := sqlstoretest.MustOpen(b, be, sqlstoretest.Options{})
			ctx := context.Background()
			if _, _, err := db.CreateTenant(ctx, "bench"); err != nil {
				b.Fatal(err)
			}
			devs := make([]fleet.NewDevice, 10_000)
			for j := range devs {
				devs[j] = fleet.NewDevice{ID: fmt.Sprintf("dev-%d", j), Metadata: map[string]string{"fleet": "bench", "n": fmt.Sprint(j % 100)}}
			}
			if _, err := db.CreateDevices(ctx, "bench", devs); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				v := fmt.Sprint("site-", i)
				if _, err := db.UpdateDeviceMetadata(ctx, "bench", devs[i%len(devs)].ID, map[string]*string{"site": &v}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

var _ = sqlstore.Options{}

// TestDeleteDeviceRacingDispatch deletes devices while dispatches to all
// the tenant's devices run, both at once: whichever commits first, no
// device action of a deleted device remains. On PostgreSQL, where
// device_actions has no foreign key to devices, a lock orders the two; the
// hourly sweep removes what a broken rule would leave.
func TestDeleteDeviceRacingDispatch(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, _ := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		numberedDevices(t, db, "acme", "keep-%02d", 20)
		for round := range 20 {
			doomed := numberedDevices(t, db, "acme", fmt.Sprintf("r%02d-%%02d", round), 5)
			var wg sync.WaitGroup
			var actions []int64
			var mu sync.Mutex
			for range 3 {
				wg.Go(func() {
					a, err := db.DispatchAction(ctx, "acme", dispatch("reboot", "all"))
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					actions = append(actions, a.ID)
					mu.Unlock()
				})
			}
			for _, id := range doomed {
				wg.Go(func() {
					if err := db.DeleteDevice(ctx, "acme", id); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			for _, id := range actions {
				das, n, err := db.FindDeviceActions(ctx, "acme", fleet.DeviceActionFilter{ActionID: id, Page: fleet.Page{Page: 1, Limit: 1000}})
				if err != nil {
					t.Fatal(err)
				}
				for _, da := range das {
					if strings.HasPrefix(da.DeviceID, fmt.Sprintf("r%02d-", round)) {
						t.Fatalf("round %d: action %d has device action of deleted device %s (%d listed)", round, id, da.DeviceID, n)
					}
				}
				a, err := db.FindAction(ctx, "acme", id)
				if err != nil {
					t.Fatal(err)
				}
				total := 0
				for _, c := range a.Statuses {
					total += c
				}
				if total != n {
					t.Fatalf("action %d counts %d device actions, lists %d", id, total, n)
				}
			}
		}
		if n, err := db.RemoveOrphanDeviceActions(ctx, 1000); err != nil || n != 0 {
			t.Fatalf("the sweep found %d orphans: %v", n, err)
		}
	})
}

// TestOrphanSweep makes, on PostgreSQL, the orphan the rule prevents (a
// device action whose device is gone, written behind the store's back) and
// sweeps it.
func TestOrphanSweep(t *testing.T) {
	for _, b := range sqlstoretest.Backends() {
		if b.Name != "postgres" {
			continue
		}
		dsn := b.DSN(t)
		db, err := sqlstore.Open(context.Background(), dsn, sqlstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		ctx := context.Background()
		if _, err := db.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		mustTenant(t, db, "acme")
		ids := numberedDevices(t, db, "acme", "d%d", 3)
		a := mustDispatch(t, db, "acme", dispatch("reboot", "all"))
		raw, err := sql.Open("pgx", dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		if _, err := raw.Exec(`INSERT INTO device_actions (tenant, action_id, device_id, type, status, action_status, progress, errors, error_count,
			user_email, user_name, serial_metadata, created_at, updated_at, phase) VALUES ('acme', $1, 'ghost', 'reboot', 'Queued', 'Queued', 0, '{}', 0, '', '', '{}', 0, 0, 0)`, a.ID); err != nil {
			t.Fatalf("an orphan: %v", err)
		}
		// Counted, as the dispatch that left it would have.
		if _, err := raw.Exec(`UPDATE device_action_counts SET n = n + 1 WHERE tenant = 'acme' AND action_id = $1 AND phase = 0
			AND action_status = 'Queued' AND slot = (SELECT min(slot) FROM device_action_counts WHERE tenant = 'acme' AND action_id = $1)`, a.ID); err != nil {
			t.Fatalf("count the orphan: %v", err)
		}
		if n, err := db.RemoveOrphanDeviceActions(ctx, 1000); err != nil || n != 1 {
			t.Fatalf("swept %d, %v; want the orphan", n, err)
		}
		if _, n, _ := db.FindDeviceActions(ctx, "acme", fleet.DeviceActionFilter{ActionID: a.ID, Page: fleet.Page{Page: 1, Limit: 10}}); n != len(ids) {
			t.Fatalf("%d device actions left, want %d", n, len(ids))
		}
		if drift, err := sqlstoretest.CountDrift(b, dsn); err != nil || len(drift) > 0 {
			t.Fatalf("counts after the sweep: %q, %v", drift, err)
		}
	}
}

// numberedDevices provisions n devices named by format and their number,
// and returns their ids.
func numberedDevices(t testing.TB, db *sqlstore.DB, tenant, format string, n int) []string {
	t.Helper()
	devs := map[string]map[string]string{}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf(format, i)
		devs[ids[i]] = nil
	}
	mustDevices(t, db, tenant, devs)
	return ids
}
