package sqlstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

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

// BenchmarkCreateDevices measures bulk provisioning; issue 2 asks for at
// least 100,000 devices/s on SQLite.
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
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for j := range devs {
					devs[j] = fleet.NewDevice{ID: fmt.Sprintf("dev-%d-%d", i, j), Metadata: map[string]string{"fleet": "bench", "n": fmt.Sprint(j % 100)}}
				}
				if _, err := db.CreateDevices(ctx, "bench", devs); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "devices/s")
		})
	}
}

var _ = sqlstore.Options{}
