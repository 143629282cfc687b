package sqlstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

func TestRedeliveries(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, clk := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		if _, err := db.CreateDevices(ctx, "acme", []fleet.NewDevice{{ID: "d1"}, {ID: "d2"}}); err != nil {
			t.Fatal(err)
		}
		claim := func(owner string) []fleet.Redelivery {
			t.Helper()
			rs, err := db.ClaimRedeliveries(ctx, owner, time.Minute, 10)
			if err != nil {
				t.Fatal(err)
			}
			return rs
		}

		// Not due yet; unknown devices are ignored.
		for _, d := range []string{"d1", "d2", "ghost"} {
			if err := db.ScheduleRedelivery(ctx, "acme", d, clk.Now().Add(time.Second)); err != nil {
				t.Fatal(err)
			}
		}
		if rs := claim("a"); len(rs) != 0 {
			t.Fatalf("claimed %v before due", rs)
		}
		clk.Add(time.Second)
		rs := claim("a")
		if len(rs) != 2 {
			t.Fatalf("claimed %v, want d1 and d2", rs)
		}
		// Another replica sees nothing while the lease holds.
		if got := claim("b"); len(got) != 0 {
			t.Fatalf("b claimed %v during a's lease", got)
		}

		// d1 is served. d2 arrives again during the claim: completing the
		// old claim keeps it, due again for anyone.
		byDev := map[string]fleet.Redelivery{}
		for _, r := range rs {
			byDev[r.DeviceID] = r
		}
		if err := db.CompleteRedelivery(ctx, byDev["d1"], "a", true); err != nil {
			t.Fatal(err)
		}
		if err := db.ScheduleRedelivery(ctx, "acme", "d2", clk.Now()); err != nil {
			t.Fatal(err)
		}
		if err := db.CompleteRedelivery(ctx, byDev["d2"], "a", true); err != nil {
			t.Fatal(err)
		}
		got := claim("b")
		if len(got) != 1 || got[0].DeviceID != "d2" || got[0].Version != byDev["d2"].Version+1 {
			t.Fatalf("b claimed %v, want d2 at its next version", got)
		}

		// b dies with its claim: a takes it over once the lease ran out.
		if got := claim("a"); len(got) != 0 {
			t.Fatalf("a claimed %v during b's lease", got)
		}
		clk.Add(time.Minute + time.Millisecond)
		got = claim("a")
		if len(got) != 1 || got[0].DeviceID != "d2" {
			t.Fatalf("a claimed %v after b's lease, want d2", got)
		}
		// b, late, cannot release what it no longer holds.
		if err := db.CompleteRedelivery(ctx, got[0], "b", false); err != nil {
			t.Fatal(err)
		}
		if again := claim("b"); len(again) != 0 {
			t.Fatalf("b's stale release freed a's claim: %v", again)
		}
		// a could not serve it: it is due again at once.
		if err := db.CompleteRedelivery(ctx, got[0], "a", false); err != nil {
			t.Fatal(err)
		}
		got = claim("b")
		if len(got) != 1 {
			t.Fatalf("released redelivery not claimable: %v", got)
		}
		if err := db.CompleteRedelivery(ctx, got[0], "b", true); err != nil {
			t.Fatal(err)
		}
		if got := claim("a"); len(got) != 0 {
			t.Fatalf("claimed %v after completion", got)
		}

		// A deleted device takes its record with it.
		if err := db.ScheduleRedelivery(ctx, "acme", "d1", clk.Now()); err != nil {
			t.Fatal(err)
		}
		if err := db.DeleteDevice(ctx, "acme", "d1"); err != nil {
			t.Fatal(err)
		}
		if got := claim("a"); len(got) != 0 {
			t.Fatalf("claimed %v of a deleted device", got)
		}
	})
}
