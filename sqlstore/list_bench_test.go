package sqlstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// BenchmarkListPages reads a list's second page of 50, as the API does,
// from a tenant of 2,000 devices (a tenth of them at site "b"), 20 groups
// (a page of 10, each counted) and 10,000 audit logs, and reports the process's CPU a page: on SQLite
// it is the database's work too. A page's LIMIT was a bound parameter,
// which made SQLite prepare the statement again at each run
// (docs/benchmarks-notebook.md, "LIMIT in the statement's text").
func BenchmarkListPages(b *testing.B) {
	for _, be := range sqlstoretest.Backends() {
		b.Run(be.Name, func(b *testing.B) {
			db := sqlstoretest.MustOpen(b, be, sqlstoretest.Options{})
			mustTenant(b, db, "acme")
			devs := map[string]map[string]string{}
			for i := range 2000 {
				site := "a"
				if i%10 == 0 {
					site = "b"
				}
				devs[fmt.Sprintf("dev-%05d", i)] = map[string]string{"site": site}
			}
			mustDevices(b, db, "acme", devs)
			ctx := context.Background()
			for i := range 20 {
				if _, err := db.CreateGroup(ctx, "acme", &fleet.Group{Name: fmt.Sprintf("g%02d", i), Selector: fmt.Sprintf("site = %c", 'a'+i%2)}); err != nil {
					b.Fatal(err)
				}
			}
			// Not fillAuditLogs: its ANALYZE gives SQLite STAT4 samples
			// (modernc's SQLite is built with them), with which every
			// statement comparing an indexed column to a parameter is
			// prepared again at each run too; fleetd never analyzes SQLite.
			if err := db.Exec(ctx, `INSERT INTO audit_logs (tenant, actor, role, user_email, action, target, details, request_id, created_at)
				WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 10000)
				SELECT 'acme', 'ops', 'operator', '', 'device.update', 'devices/d', '{}', '', i FROM c`); err != nil {
				b.Fatal(err)
			}
			page := fleet.Page{Page: 2, Limit: 50}
			lists := []struct {
				name string
				read func() (int, error)
			}{
				{"devices", func() (int, error) {
					ds, _, err := db.FindDevices(ctx, "acme", fleet.DeviceFilter{Page: page})
					return len(ds), err
				}},
				{"devices_of_site", func() (int, error) {
					ds, _, err := db.FindDevices(ctx, "acme", fleet.DeviceFilter{Metadata: map[string]string{"site": "a"}, Page: page})
					return len(ds), err
				}},
				{"groups", func() (int, error) {
					gs, _, err := db.FindGroups(ctx, "acme", fleet.Page{Page: 1, Limit: 10})
					return len(gs), err
				}},
				{"audit", func() (int, error) {
					ls, _, err := db.FindAuditLogs(ctx, "acme", fleet.AuditFilter{Page: page})
					return len(ls), err
				}},
			}
			for _, l := range lists {
				b.Run(l.name, func(b *testing.B) {
					var cpu time.Duration
					for b.Loop() {
						c0 := cpuTime()
						n, err := l.read()
						cpu += cpuTime() - c0
						if err != nil || (n != 50 && n != 10) {
							b.Fatalf("%d items, err %v", n, err)
						}
					}
					b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/page")
				})
			}
		})
	}
}
