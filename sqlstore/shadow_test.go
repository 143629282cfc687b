package sqlstore_test

import (
	"context"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

func TestShadows(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, clk := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustTenant(t, db, "beta")
		if _, err := db.CreateDevices(ctx, "acme", []fleet.NewDevice{{ID: "d1"}, {ID: "d2"}, {ID: "gone"}}); err != nil {
			t.Fatal(err)
		}
		if _, err := db.CreateDevices(ctx, "beta", []fleet.NewDevice{{ID: "d1"}}); err != nil {
			t.Fatal(err)
		}
		version := func(n int64) *int64 { return &n }

		t.Run("EmptyAtFirst", func(t *testing.T) {
			s, err := db.FindShadow(ctx, "acme", "d1")
			if err != nil {
				t.Fatal(err)
			}
			if s.Version != 0 || len(s.Desired) != 0 || len(s.Reported) != 0 || len(s.Delta) != 0 || !s.InSync || s.DesiredUpdatedAt != nil || s.ReportedUpdatedAt != nil {
				t.Fatalf("shadow = %+v", s)
			}
		})
		t.Run("DesiredAndReported", func(t *testing.T) {
			s, err := db.UpdateDesired(ctx, "acme", "d1", map[string]any{"rate": int64(5), "net": map[string]any{"ssid": "plant", "band": "5g"}}, version(0))
			if err != nil {
				t.Fatal(err)
			}
			if s.Version != 1 || s.InSync || s.DesiredUpdatedAt == nil || !s.DesiredUpdatedAt.Equal(clk.Now()) {
				t.Fatalf("after the first change: %+v", s)
			}
			clk.Add(time.Second)
			s, err = db.UpdateReported(ctx, "acme", "d1", map[string]any{"rate": 5.0, "net": map[string]any{"ssid": "plant", "band": "2g"}, "uptime": int64(7)})
			if err != nil {
				t.Fatal(err)
			}
			if got := text(t, s.Delta); got != `{"net":{"band":"5g"}}` || s.Version != 1 || !s.ReportedUpdatedAt.Equal(clk.Now()) {
				t.Fatalf("delta = %s, shadow %+v", got, s)
			}
			// null deletes; the device catches up.
			s, err = db.UpdateDesired(ctx, "acme", "d1", map[string]any{"net": map[string]any{"band": nil}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := text(t, s.Desired); got != `{"net":{"ssid":"plant"},"rate":5}` || !s.InSync || s.Version != 2 {
				t.Fatalf("desired = %s, shadow %+v", got, s)
			}
			read, err := db.FindShadow(ctx, "acme", "d1")
			if err != nil {
				t.Fatal(err)
			}
			if text(t, read) != text(t, s) {
				t.Fatalf("read %s, want what the write answered, %s", text(t, read), text(t, s))
			}
		})
		t.Run("StaleVersion", func(t *testing.T) {
			_, err := db.UpdateDesired(ctx, "acme", "d1", map[string]any{"rate": int64(6)}, version(1))
			wantCode(t, err, fleet.ECONFLICT)
			s, _ := db.FindShadow(ctx, "acme", "d1")
			if s.Desired["rate"] != int64(5) || s.Version != 2 {
				t.Fatalf("a stale write changed the shadow: %+v", s)
			}
		})
		t.Run("NoChangeKeepsVersion", func(t *testing.T) {
			s, err := db.UpdateDesired(ctx, "acme", "d1", map[string]any{"rate": int64(5), "absent": nil}, nil)
			if err != nil || s.Version != 2 {
				t.Fatalf("version = %d, %v; want 2", s.Version, err)
			}
		})
		t.Run("Limits", func(t *testing.T) {
			big := map[string]any{"blob": strings.Repeat("x", fleet.MaxShadowSection)}
			_, err := db.UpdateDesired(ctx, "acme", "d2", big, nil)
			wantCode(t, err, fleet.ETOOLARGE)
			_, err = db.UpdateReported(ctx, "acme", "d2", big)
			wantCode(t, err, fleet.ETOOLARGE)
			// Two halves that fit alone do not fit together.
			half := map[string]any{"a": strings.Repeat("x", fleet.MaxShadowSection/2)}
			if _, err := db.UpdateDesired(ctx, "acme", "d2", half, nil); err != nil {
				t.Fatal(err)
			}
			_, err = db.UpdateDesired(ctx, "acme", "d2", map[string]any{"b": half["a"]}, nil)
			wantCode(t, err, fleet.ETOOLARGE)
			var deep any = int64(1)
			for range fleet.MaxShadowDepth {
				deep = map[string]any{"x": deep}
			}
			_, err = db.UpdateDesired(ctx, "acme", "d2", map[string]any{"deep": deep}, nil)
			wantCode(t, err, fleet.EINVALID)
			if e := err.(*fleet.Error); e.Fields["desired.deep.x.x.x.x.x.x.x.x"] == "" {
				t.Fatalf("fields = %v", e.Fields)
			}
			s, _ := db.FindShadow(ctx, "acme", "d2")
			if s.Version != 1 || len(s.Desired) != 1 {
				t.Fatalf("refused writes changed the shadow: version %d, %d keys", s.Version, len(s.Desired))
			}
		})
		t.Run("Tenants", func(t *testing.T) {
			if _, err := db.UpdateDesired(ctx, "beta", "d1", map[string]any{"owner": "beta"}, nil); err != nil {
				t.Fatal(err)
			}
			a, _ := db.FindShadow(ctx, "acme", "d1")
			if _, ok := a.Desired["owner"]; ok {
				t.Fatalf("beta's write reached acme's device: %+v", a.Desired)
			}
			for _, err := range []error{
				func() error { _, err := db.FindShadow(ctx, "beta", "d2"); return err }(),
				func() error {
					_, err := db.UpdateDesired(ctx, "beta", "d2", map[string]any{"a": int64(1)}, nil)
					return err
				}(),
				func() error {
					_, err := db.UpdateReported(ctx, "beta", "d2", map[string]any{"a": int64(1)})
					return err
				}(),
			} {
				wantCode(t, err, fleet.ENOTFOUND)
			}
		})
		t.Run("DeletedWithItsDevice", func(t *testing.T) {
			if _, err := db.UpdateDesired(ctx, "acme", "gone", map[string]any{"a": int64(1)}, nil); err != nil {
				t.Fatal(err)
			}
			if err := db.DeleteDevice(ctx, "acme", "gone"); err != nil {
				t.Fatal(err)
			}
			if _, err := db.CreateDevices(ctx, "acme", []fleet.NewDevice{{ID: "gone"}}); err != nil {
				t.Fatal(err)
			}
			if s, _ := db.FindShadow(ctx, "acme", "gone"); s.Version != 0 || len(s.Desired) != 0 {
				t.Fatalf("a new device of the same id has the old one's shadow: %+v", s)
			}
		})
		t.Run("AuditKeepsThePrevious", func(t *testing.T) {
			logs, _, err := db.FindAuditLogs(ctx, "acme", fleet.AuditFilter{Action: "device.shadow.update", Page: fleet.Page{Page: 1, Limit: 50}})
			if err != nil {
				t.Fatal(err)
			}
			var found bool
			for _, l := range logs {
				if v, _ := fleet.AsInt(l.Details["version"]); l.Target == "devices/d1" && v == 2 {
					found = true
					if got := text(t, l.Details["previous"]); got != `{"net":{"band":"5g","ssid":"plant"},"rate":5}` {
						t.Errorf("previous = %s", got)
					}
					if got := text(t, l.Details["desired"]); got != `{"net":{"band":null}}` {
						t.Errorf("desired = %s", got)
					}
				}
			}
			if !found {
				t.Fatalf("no audit log of version 2 among %d", len(logs))
			}
		})
		t.Run("ConcurrentWritersTakeTurns", func(t *testing.T) {
			var wg sync.WaitGroup
			errs := make([]error, 8)
			for i := range errs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, errs[i] = db.UpdateDesired(ctx, "acme", "d2", map[string]any{"n" + string(rune('a'+i)): int64(i)}, nil)
				}()
			}
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			s, _ := db.FindShadow(ctx, "acme", "d2")
			if s.Version != 9 || len(s.Desired) != 9 {
				t.Fatalf("version %d with %d keys, want 9 and 9: a write was lost", s.Version, len(s.Desired))
			}
		})
	})
}

func text(t *testing.T, v any) string {
	t.Helper()
	b, err := fleet.MarshalCanonical(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestShadowLargeFloats: floats of 2^53 and more, which PostgreSQL's jsonb
// would give back as integers, are read back as the floats they were, and
// an identical document sent again is no change: the version stays, on
// both databases.
func TestShadowLargeFloats(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, _ := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		if _, err := db.CreateDevices(ctx, "acme", []fleet.NewDevice{{ID: "d1"}}); err != nil {
			t.Fatal(err)
		}
		doc := func() map[string]any {
			return map[string]any{"big": 3.551759552515556e17, "two53": float64(1 << 53), "neg": -9.1e18, "huge": 1e300,
				"tiny": 1e-7, "int": int64(1 << 60), "nested": map[string]any{"x": 1.5e20, "list": []any{9.007199254740993e15, 2.0}}}
		}
		for i := range 3 {
			s, err := db.UpdateDesired(ctx, "acme", "d1", doc(), nil)
			if err != nil {
				t.Fatal(err)
			}
			if s.Version != 1 {
				t.Fatalf("desired sent %d times: version %d, want 1", i+1, s.Version)
			}
			s, err = db.UpdateReported(ctx, "acme", "d1", doc())
			if err != nil {
				t.Fatal(err)
			}
			if !s.InSync || s.Version != 1 {
				t.Fatalf("reported sent %d times: %+v", i+1, s)
			}
		}
		s, err := db.FindShadow(ctx, "acme", "d1")
		if err != nil {
			t.Fatal(err)
		}
		for _, section := range []map[string]any{s.Desired, s.Reported} {
			if !reflect.DeepEqual(section, doc()) {
				t.Fatalf("read back %#v, want %#v", section, doc())
			}
		}
	})
}
