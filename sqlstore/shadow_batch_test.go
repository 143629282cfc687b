package sqlstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestShadowBatches applies batches of single shadow writes as the shadow
// workers gather them from concurrent requests: each write is answered as
// if it were alone, in the batch's order.
func TestShadowBatches(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, clk := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		if _, err := db.CreateDevices(ctx, "acme", []fleet.NewDevice{{ID: "d1"}, {ID: "d2"}, {ID: "d3"}, {ID: "d4"}}); err != nil {
			t.Fatal(err)
		}
		version := func(n int64) *int64 { return &n }
		as := func(name, request string) context.Context {
			c := fleet.NewContextWithActor(ctx, &fleet.Actor{Tenant: "acme", UserName: name, Role: fleet.RoleOperator})
			return fleet.NewContextWithRequestID(c, request)
		}

		t.Run("OneDeviceTwiceInOrder", func(t *testing.T) {
			clk.Add(time.Second)
			out, errs := db.ApplyShadowBatch(ctx, "acme", []sqlstore.ShadowWrite{
				{Ctx: as("ann", "r1"), Device: "d1", Desired: true, Patch: map[string]any{"rate": int64(5), "mode": "eco"}, Version: version(0)},
				{Device: "d1", Patch: map[string]any{"rate": int64(5)}},
				{Ctx: as("bob", "r2"), Device: "d1", Desired: true, Patch: map[string]any{"rate": int64(7)}, Version: version(1)},
			})
			for i, err := range errs {
				if err != nil {
					t.Fatalf("write %d: %v", i, err)
				}
			}
			if out[0].Version != 1 || text(t, out[0].Desired) != `{"mode":"eco","rate":5}` || text(t, out[0].Delta) != `{"mode":"eco","rate":5}` {
				t.Errorf("the first write's answer: %+v", out[0])
			}
			if text(t, out[1].Delta) != `{"mode":"eco"}` || out[1].Version != 1 {
				t.Errorf("the report's answer: %+v", out[1])
			}
			if out[2].Version != 2 || text(t, out[2].Desired) != `{"mode":"eco","rate":7}` || text(t, out[2].Delta) != `{"mode":"eco","rate":7}` {
				t.Errorf("the second write's answer: %+v", out[2])
			}
			// The device is told once, by the last write, of the delta
			// that committed.
			if out[0].DeltaChanged || out[1].DeltaChanged || !out[2].DeltaChanged {
				t.Errorf("delta changed: %v %v %v", out[0].DeltaChanged, out[1].DeltaChanged, out[2].DeltaChanged)
			}
			if !out[0].DesiredChanged || out[1].DesiredChanged || !out[2].DesiredChanged {
				t.Errorf("desired changed: %v %v %v", out[0].DesiredChanged, out[1].DesiredChanged, out[2].DesiredChanged)
			}
			s, err := db.FindShadow(ctx, "acme", "d1")
			if err != nil {
				t.Fatal(err)
			}
			if s.Version != 2 || text(t, s.Desired) != `{"mode":"eco","rate":7}` || text(t, s.Reported) != `{"rate":5}` || s.InSync ||
				!s.DesiredUpdatedAt.Equal(clk.Now()) || !s.ReportedUpdatedAt.Equal(clk.Now()) {
				t.Fatalf("stored: %+v", s)
			}
			// Each change audited with its request's actor and the
			// desired state before it.
			logs, _, err := db.FindAuditLogs(ctx, "acme", fleet.AuditFilter{Action: "device.shadow.update", Page: fleet.Page{Page: 1, Limit: 10}})
			if err != nil {
				t.Fatal(err)
			}
			byVersion := map[int64]*fleet.AuditLog{}
			for _, l := range logs {
				if v, _ := fleet.AsInt(l.Details["version"]); l.Target == "devices/d1" {
					byVersion[v] = l
				}
			}
			if l := byVersion[1]; l == nil || l.Actor != "ann" || l.RequestID != "r1" || text(t, l.Details["previous"]) != `{}` {
				t.Errorf("version 1's audit: %+v", l)
			}
			if l := byVersion[2]; l == nil || l.Actor != "bob" || l.RequestID != "r2" || text(t, l.Details["previous"]) != `{"mode":"eco","rate":5}` ||
				text(t, l.Details["desired"]) != `{"rate":7}` {
				t.Errorf("version 2's audit: %+v", l)
			}
		})
		t.Run("AChangeUndoneInTheBatchTellsNothing", func(t *testing.T) {
			out, errs := db.ApplyShadowBatch(ctx, "acme", []sqlstore.ShadowWrite{
				{Device: "d1", Desired: true, Patch: map[string]any{"mode": "max"}},
				{Device: "d1", Desired: true, Patch: map[string]any{"mode": "eco"}},
			})
			if errs[0] != nil || errs[1] != nil {
				t.Fatal(errs)
			}
			if out[1].Version != 4 || out[0].DeltaChanged || out[1].DeltaChanged {
				t.Fatalf("answers: %+v, %+v", out[0], out[1])
			}
		})
		t.Run("StaleVersionFailsAlone", func(t *testing.T) {
			out, errs := db.ApplyShadowBatch(ctx, "acme", []sqlstore.ShadowWrite{
				{Device: "d2", Desired: true, Patch: map[string]any{"a": int64(1)}, Version: version(0)},
				{Device: "d3", Desired: true, Patch: map[string]any{"a": int64(1)}, Version: version(9)},
				{Device: "d2", Desired: true, Patch: map[string]any{"b": int64(1)}, Version: version(0)}, // stale after the first
				{Device: "d4", Desired: true, Patch: map[string]any{"a": int64(1)}},
				{Device: "nope", Desired: true, Patch: map[string]any{"a": int64(1)}},
				{Device: "d4", Desired: true, Patch: map[string]any{"deep": map[string]any{"1": map[string]any{"2": map[string]any{"3": map[string]any{"4": map[string]any{"5": map[string]any{"6": map[string]any{"7": map[string]any{"8": 1}}}}}}}}}},
			})
			if errs[0] != nil || errs[3] != nil {
				t.Fatalf("good writes failed: %v", errs)
			}
			if fleet.ErrorCode(errs[1]) != fleet.ECONFLICT || fleet.ErrorCode(errs[2]) != fleet.ECONFLICT {
				t.Fatalf("stale writes: %v, %v", errs[1], errs[2])
			}
			if fleet.ErrorCode(errs[4]) != fleet.ENOTFOUND || fleet.ErrorCode(errs[5]) != fleet.EINVALID {
				t.Fatalf("a write to no device: %v; one too deep: %v", errs[4], errs[5])
			}
			if out[1] != nil || out[2] != nil || out[0].Version != 1 || !out[0].DeltaChanged || out[3].Version != 1 || !out[3].DeltaChanged {
				t.Fatalf("answers: %+v", out)
			}
			for dev, want := range map[string]string{"d2": `{"a":1}`, "d3": `{}`, "d4": `{"a":1}`} {
				s, err := db.FindShadow(ctx, "acme", dev)
				if err != nil {
					t.Fatal(err)
				}
				if got := text(t, s.Desired); got != want {
					t.Errorf("%s desired = %s, want %s", dev, got, want)
				}
			}
		})
		t.Run("AFailingWriteLosesNoOther", func(t *testing.T) {
			out, errs := db.ApplyShadowBatch(ctx, "acme", []sqlstore.ShadowWrite{
				{Device: "d3", Patch: map[string]any{"up": true}},
				{Device: "d4", Patch: map[string]any{"up": true}, Fail: "INSERT INTO no_such_table VALUES (1)"},
				{Device: "d3", Desired: true, Patch: map[string]any{"up": true}},
			})
			if errs[0] != nil || errs[2] != nil || errs[1] == nil {
				t.Fatalf("errors: %v", errs)
			}
			if !out[2].InSync || out[2].Version != 1 || out[1] != nil {
				t.Fatalf("answers: %+v", out)
			}
			for dev, want := range map[string]string{"d3": `{"up":true}`, "d4": `{}`} {
				s, err := db.FindShadow(ctx, "acme", dev)
				if err != nil {
					t.Fatal(err)
				}
				if got := text(t, s.Reported); got != want {
					t.Errorf("%s reported = %s, want %s", dev, got, want)
				}
			}
		})
	})
}

// TestShadowStatistics: on PostgreSQL, shadows made through the batches
// refresh the statistics of device_shadows once they grew by a thousand
// (docs/benchmarks-notebook.md, "Shadow batches and stale statistics").
// SQLite plans without statistics and keeps no count.
func TestShadowStatistics(t *testing.T) {
	b := sqlstoretest.Postgres(t, "PostgreSQL's statistics")
	db, raw := openWithRaw(t, b)
	ctx := context.Background()
	mustTenant(t, db, "acme")
	devs := make([]fleet.NewDevice, 1100)
	for i := range devs {
		devs[i] = fleet.NewDevice{ID: fmt.Sprintf("d%04d", i)}
	}
	if _, err := db.CreateDevices(ctx, "acme", devs); err != nil {
		t.Fatal(err)
	}
	analyzed := func() bool {
		t.Helper()
		var n int
		if err := raw.QueryRow(`SELECT count(*) FROM pg_stats WHERE schemaname = current_schema() AND tablename = 'device_shadows'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	write := func(from, to int) {
		t.Helper()
		var ws []sqlstore.ShadowWrite
		for i := from; i < to; i++ {
			ws = append(ws, sqlstore.ShadowWrite{Device: devs[i].ID, Patch: map[string]any{"rate": int64(i)}})
		}
		_, errs := db.ApplyShadowBatch(ctx, "acme", ws)
		for i, err := range errs {
			if err != nil {
				t.Fatalf("write %d: %v", from+i, err)
			}
		}
	}
	for from := 0; from < 900; from += 100 {
		write(from, from+100)
	}
	if analyzed() {
		t.Fatal("device_shadows analyzed after 900 shadows")
	}
	write(900, 1000)
	if !analyzed() {
		t.Fatal("device_shadows not analyzed after 1,000 shadows")
	}
}
