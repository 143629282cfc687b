package sqlstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// fillAuditLogs adds n audit logs to tenant, a millisecond apart: one in a
// thousand tenant.auth.update, one in a hundred apikey.create, the rest
// device.update, as a busy fleet's log is mostly its devices'.
func fillAuditLogs(t testing.TB, db *sqlstore.DB, tenant string, n int) {
	t.Helper()
	ctx := context.Background()
	err := db.Exec(ctx, `INSERT INTO audit_logs (tenant, actor, role, user_email, action, target, details, request_id, created_at)
		WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < ?)
		SELECT ?, 'ops', 'operator', '',
			CASE WHEN i % 1000 = 0 THEN 'tenant.auth.update' WHEN i % 100 = 0 THEN 'apikey.create' ELSE 'device.update' END,
			'devices/d', '{}', '', i FROM c`, n, tenant)
	if err == nil {
		err = db.Exec(ctx, "ANALYZE")
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestAuditLogPlans checks that the audit log's action filter, by kind or
// by action, is served by audit_logs_by_kind (migration 0020) on both
// databases, for the count and for the page, with and without a time
// range; and that it finds what it should among 20,000 logs.
func TestAuditLogPlans(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, _ := mustOpen(t, b)
		mustTenant(t, db, "acme")
		const n = 20_000
		fillAuditLogs(t, db, "acme", n)
		ctx := context.Background()
		since := time.UnixMilli(n/2 + 1)
		for _, tc := range []struct {
			f    fleet.AuditFilter
			want int
		}{
			{fleet.AuditFilter{Action: "apikey"}, n/100 - n/1000},
			{fleet.AuditFilter{Action: "apikey.create"}, n/100 - n/1000},
			{fleet.AuditFilter{Action: "tenant"}, n/1000 + 1}, // and the tenant's tenant.create
			{fleet.AuditFilter{Action: "tenant.auth"}, n / 1000},
			{fleet.AuditFilter{Action: "tenant.auth.update", Since: &since}, n / 2000},
			{fleet.AuditFilter{Action: "tenant.a"}, 0},
			{fleet.AuditFilter{Action: "apikey", Actor: "ops"}, n/100 - n/1000},
		} {
			tc.f.Page = fleet.Page{Page: 2, Limit: 5}
			name := tc.f.Action
			if tc.f.Since != nil {
				name += ",since"
			}
			if tc.f.Actor != "" {
				name += ",actor"
			}
			t.Run(name, func(t *testing.T) {
				logs, got, err := db.FindAuditLogs(ctx, "acme", tc.f)
				if err != nil {
					t.Fatal(err)
				}
				if got != tc.want || len(logs) != min(5, max(0, tc.want-5)) {
					t.Fatalf("count = %d with %d on page 2, want %d", got, len(logs), tc.want)
				}
				for i, l := range logs {
					if l.Action != tc.f.Action && !strings.HasPrefix(l.Action, tc.f.Action+".") {
						t.Errorf("log %d is %s", l.ID, l.Action)
					}
					if i > 0 && l.CreatedAt.After(logs[i-1].CreatedAt) {
						t.Errorf("log %d is newer than the one before it", l.ID)
					}
				}
				count, page, err := db.ExplainAuditLogs(ctx, "acme", tc.f)
				if err != nil {
					t.Fatal(err)
				}
				for q, plan := range map[string]string{"count": count, "page": page} {
					if !strings.Contains(plan, "audit_logs_by_kind") {
						t.Errorf("the %s query does not use audit_logs_by_kind:\n%s", q, plan)
					}
				}
			})
		}
	})
}

// BenchmarkFindAuditLogs reads the first page of a rare kind of action
// (apikey: one log in a hundred) and its count among 100,000 audit logs,
// with audit_logs_by_kind and, after dropping it, without: the ratio is
// what migration 0020 gives the console's and the API's filter.
func BenchmarkFindAuditLogs(b *testing.B) {
	for _, be := range sqlstoretest.Backends() {
		b.Run(be.Name, func(b *testing.B) {
			db := sqlstoretest.MustOpen(b, be, sqlstoretest.Options{})
			mustTenant(b, db, "acme")
			fillAuditLogs(b, db, "acme", 100_000)
			ctx := context.Background()
			f := fleet.AuditFilter{Action: "apikey", Page: fleet.Page{Page: 1, Limit: 50}}
			run := func(b *testing.B) {
				for b.Loop() {
					if _, n, err := db.FindAuditLogs(ctx, "acme", f); err != nil || n != 900 {
						b.Fatalf("n = %d, err = %v", n, err)
					}
				}
			}
			b.Run("by_kind_index", run)
			if err := db.Exec(ctx, "DROP INDEX audit_logs_by_kind"); err != nil {
				b.Fatal(err)
			}
			b.Run("without_index", run)
		})
	}
}
