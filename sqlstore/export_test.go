package sqlstore

import (
	"context"
	"strings"

	"github.com/fleetd/fleet"
)

// ExplainAuditLogs returns the database's plans of FindAuditLogs' count
// and page queries for f, for tests of which index serves them.
func (db *DB) ExplainAuditLogs(ctx context.Context, tenant string, f fleet.AuditFilter) (count, page string, err error) {
	c, list, args := auditQueries(tenant, f)
	explain := "EXPLAIN "
	if db.dialect == sqlite {
		explain = "EXPLAIN QUERY PLAN "
	}
	plan := func(q string, args ...any) (string, error) {
		rows, err := db.read.QueryContext(ctx, db.dialect.rebind(explain+q), args...)
		if err != nil {
			return "", err
		}
		defer rows.Close()
		cols, _ := rows.Columns()
		var lines []string
		for rows.Next() {
			vals := make([]any, len(cols))
			for i := range vals {
				vals[i] = new(any)
			}
			if err := rows.Scan(vals...); err != nil {
				return "", err
			}
			// SQLite's detail and PostgreSQL's one column are last.
			lines = append(lines, strings.TrimSpace(string(asText(*vals[len(vals)-1].(*any)))))
		}
		return strings.Join(lines, "\n"), rows.Err()
	}
	if count, err = plan(c, args...); err != nil {
		return "", "", err
	}
	page, err = plan(list+" LIMIT ? OFFSET ?", append(args, f.Page.Limit, f.Page.Offset())...)
	return count, page, err
}

func asText(v any) []byte {
	switch v := v.(type) {
	case string:
		return []byte(v)
	case []byte:
		return v
	}
	return nil
}

// Exec runs a statement with "?" placeholders outside the store's rules,
// for tests that fill tables in bulk.
func (db *DB) Exec(ctx context.Context, q string, args ...any) error {
	_, err := db.write.ExecContext(ctx, db.dialect.rebind(q), args...)
	return err
}

// MigrateTo applies the migrations numbered up to last, for tests of a
// migration on the data of the ones before it.
func (db *DB) MigrateTo(ctx context.Context, last int) error {
	_, err := db.migrate(ctx, last)
	return err
}
