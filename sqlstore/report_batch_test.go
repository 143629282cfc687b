package sqlstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestLargeReportBatches checks a batch of reports larger than the size
// classes (on PostgreSQL one array a column, pgArrays; on SQLite VALUES of
// reportChunk rows) against the same reports applied one at a time, on
// two actions dispatched to the same 150 devices: every column a report
// writes must end the same, through first reports, errors, final states
// and progress alone.
func TestLargeReportBatches(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, clk := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		const n = 150 // a chunk of 100 and one of 50
		ids := make([]string, n)
		devs := map[string]map[string]string{}
		for i := range ids {
			ids[i] = fmt.Sprintf("dev-%03d", i)
			devs[ids[i]] = nil
		}
		mustDevices(t, db, "acme", devs)
		batched := mustDispatch(t, db, "acme", dispatch("update", "default", ids...))
		alone := mustDispatch(t, db, "acme", dispatch("update", "default", ids...))
		round := func(r int, action int64) []fleet.StatusReport {
			var rs []fleet.StatusReport
			for i, d := range ids {
				rep := fleet.StatusReport{DeviceID: d, ActionID: action, State: "Downloading", Progress: intp(10 * r),
					Timestamp: i64(int64(r)), Sequence: i64(int64(i))}
				switch {
				case r == 2 && i%3 == 0:
					rep.Errors = []string{fmt.Sprintf("slow link %d", i)}
				case r == 3 && i%5 == 0:
					rep.State = "Completed"
				case r == 3 && i%7 == 0:
					rep.State, rep.Errors = "Failed", []string{"disk full"}
				}
				rs = append(rs, rep)
			}
			return rs
		}
		for r := 1; r <= 4; r++ {
			clk.Add(time.Second)
			mustReport(t, db, "acme", round(r, batched.ID)...)
			for _, rep := range round(r, alone.ID) {
				mustReport(t, db, "acme", rep)
			}
		}
		for _, d := range ids {
			got, err := db.ReportColumns(ctx, "acme", batched.ID, d)
			if err != nil {
				t.Fatal(err)
			}
			want, err := db.ReportColumns(ctx, "acme", alone.ID, d)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("%s: reported in batches %s, one at a time %s", d, got, want)
			}
		}
	})
}
