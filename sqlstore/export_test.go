package sqlstore

import (
	"bytes"
	"cmp"
	"compress/flate"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fleetd/fleet"
)

// ExplainAuditLogs returns the database's plans of FindAuditLogs' count
// and page queries for f, for tests of which index serves them.
func (db *DB) ExplainAuditLogs(ctx context.Context, tenant string, f fleet.AuditFilter) (count, page string, err error) {
	c, list, args := auditQueries(tenant, f)
	if count, err = db.explain(ctx, c, args...); err != nil {
		return "", "", err
	}
	page, err = db.explain(ctx, list+" LIMIT ? OFFSET ?", append(args, f.Page.Limit, f.Page.Offset())...)
	return count, page, err
}

// ExplainFleetRollups returns the database's plan of a fleet-wide
// aggregate's read of the rollups of kind ("1m" or "1h") of the partition
// holding at.
func (db *DB) ExplainFleetRollups(ctx context.Context, kind string, at time.Time) (string, error) {
	k := map[string]partKind{"1m": minutePart, "1h": hourPart, "10m": tenMinutePart}[kind]
	table := k.table
	if db.dialect == sqlite {
		table = k.name(k.start(millis(at)))
	}
	tx, err := db.read.BeginTx(ctx, nil)
	if err != nil {
		return "", err
	}
	defer tx.Rollback()
	if db.dialect == sqlite {
		// EXPLAIN does not look at the schema's version: a connection
		// that read nothing since an index was made plans without it.
		// A read does look, as every query fleetd runs does.
		if _, err := tx.ExecContext(ctx, "SELECT count(*) FROM sqlite_master"); err != nil {
			return "", err
		}
	} else {
		// A test's few rows fit in a page or two, which PostgreSQL reads
		// whole rather than through an index; at scale it would not.
		// What the test asks is which index serves the query.
		if _, err := tx.ExecContext(ctx, "SET LOCAL enable_seqscan = off"); err != nil {
			return "", err
		}
	}
	lo := millis(at)
	return db.explainOn(ctx, tx, rollupsQuery(table, "tenant = ? AND stream = ?", 1), "acme", "env", "temp", lo, lo+hourMs)
}

// explain returns the database's plan of q ("?" placeholders), one line
// per step: SQLite's EXPLAIN QUERY PLAN details, PostgreSQL's EXPLAIN.
func (db *DB) explain(ctx context.Context, q string, args ...any) (string, error) {
	return db.explainOn(ctx, db.read, q, args...)
}

// explainOn is explain on a connection pool or a transaction of db.
func (db *DB) explainOn(ctx context.Context, on interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, q string, args ...any) (string, error) {
	explain := "EXPLAIN "
	if db.dialect == sqlite {
		explain = "EXPLAIN QUERY PLAN "
	}
	rows, err := on.QueryContext(ctx, db.dialect.rebind(explain+q), args...)
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

// ReportStatusCountingHOT is ReportStatus that also returns, on
// PostgreSQL, how many rows of device_actions the reports' statements
// updated and how many of those updates were heap-only (HOT): the
// backend's counters of its transaction, read before and after the
// reports in that transaction, so that nothing waits for the statistics
// to be flushed.
func (db *DB) ReportStatusCountingHOT(ctx context.Context, tenant string, reports []fleet.StatusReport) (updated, hot int64, err error) {
	if db.dialect != postgres {
		_, err := db.ReportStatus(ctx, tenant, reports)
		return 0, 0, err
	}
	const counters = "SELECT pg_stat_get_xact_tuples_updated('device_actions'::regclass), pg_stat_get_xact_tuples_hot_updated('device_actions'::regclass)"
	err = db.update(ctx, func(ctx context.Context, tx *Tx) error {
		var u0, h0, u1, h1 int64
		if err := tx.queryRow(ctx, counters).Scan(&u0, &h0); err != nil {
			return err
		}
		found, err := tx.applyReports(ctx, tenant, reports, db.advanceable(reports))
		if err != nil {
			return err
		}
		for i, ok := range found {
			if !ok {
				return fmt.Errorf("report %d found no device action", i)
			}
		}
		if err := tx.queryRow(ctx, counters).Scan(&u1, &h1); err != nil {
			return err
		}
		updated, hot = u1-u0, h1-h0
		return nil
	})
	return updated, hot, err
}

// Reloptions returns a table's storage parameters on PostgreSQL
// ("fillfactor=90"), joined by commas.
func (db *DB) Reloptions(ctx context.Context, table string) (string, error) {
	var opts sql.NullString
	err := db.read.QueryRowContext(ctx, "SELECT array_to_string(reloptions, ',') FROM pg_class WHERE oid = $1::regclass", table).Scan(&opts)
	return opts.String, err
}

// TouchDevicesCountingReads is TouchDevices that also returns, on
// PostgreSQL, how many rows of devices its statements read (readsOf).
func (db *DB) TouchDevicesCountingReads(ctx context.Context, tenant string, ids []string, t time.Time) (read int64, err error) {
	if db.dialect != postgres {
		return 0, db.TouchDevices(ctx, tenant, ids, t)
	}
	return db.readsOf(ctx, "devices", func(ctx context.Context, tx *Tx) error {
		return tx.touchDevices(ctx, tenant, ids, t)
	})
}

// LockReportRowsCountingReads runs the reports' locking SELECT of the
// device actions of action on devs, as a batch of reports does, and
// returns, on PostgreSQL, how many rows of device_actions it read
// (readsOf).
func (db *DB) LockReportRowsCountingReads(ctx context.Context, tenant string, action int64, devs []string) (read int64, err error) {
	if db.dialect != postgres {
		return 0, nil
	}
	return db.readsOf(ctx, "device_actions", func(ctx context.Context, tx *Tx) error {
		rows := map[reportKey]*reportRow{}
		if err := tx.loadReportRows(ctx, tenant, action, devs, rows); err != nil {
			return err
		}
		if len(rows) != len(devs) {
			return fmt.Errorf("%d device actions locked, want %d", len(rows), len(devs))
		}
		return nil
	})
}

// readsOf runs fn in a write transaction on PostgreSQL with its
// statements' generic plans, those PostgreSQL keeps for a prepared
// statement after its first five runs on a connection, and returns how
// many rows of table they read from the heap: by sequential and bitmap
// scans of the table and by index scans of any of its indexes, the
// transaction's own counters before and after.
func (db *DB) readsOf(ctx context.Context, table string, fn func(ctx context.Context, tx *Tx) error) (read int64, err error) {
	counters := `SELECT (pg_stat_get_xact_tuples_returned(?::regclass) + pg_stat_get_xact_tuples_fetched(?::regclass) +
		(SELECT COALESCE(sum(pg_stat_get_xact_tuples_fetched(indexrelid)), 0) FROM pg_index WHERE indrelid = ?::regclass))::bigint`
	err = db.update(ctx, func(ctx context.Context, tx *Tx) error {
		var r0, r1 int64
		if err := tx.queryRow(ctx, counters, table, table, table).Scan(&r0); err != nil {
			return err
		}
		if _, err := tx.exec(ctx, "SET LOCAL plan_cache_mode = force_generic_plan"); err != nil {
			return err
		}
		if err := fn(ctx, tx); err != nil {
			return err
		}
		if _, err := tx.exec(ctx, "SET LOCAL plan_cache_mode = auto"); err != nil {
			return err
		}
		if err := tx.queryRow(ctx, counters, table, table, table).Scan(&r1); err != nil {
			return err
		}
		read = r1 - r0
		return nil
	})
	return read, err
}

// AggregateRaw is Aggregate read from raw points whatever the interval,
// for tests that compare the rollups with it.
func (db *DB) AggregateRaw(ctx context.Context, tenant, device, stream string, q fleet.AggregateQuery) ([]fleet.Bucket, error) {
	series, err := db.aggregate(ctx, tenant, device, stream, q, true)
	return series[""], err
}

// SetMaxSeriesBuckets lowers the buckets a fleet-wide aggregate by device
// may hold (fleet.MaxSeriesBuckets), so that a test reaches it with a few
// points.
func (db *DB) SetMaxSeriesBuckets(n int) { db.history.maxSeries = n }

// SetDesiredChunk sets how many devices one transaction of a desired
// rollout's release changes, until restore.
func SetDesiredChunk(n int) (restore func()) {
	old := desiredChunk
	desiredChunk = n
	return func() { desiredChunk = old }
}

// ReportColumns is every column a status report writes of a device
// action, as text, NULL as "NULL".
func (db *DB) ReportColumns(ctx context.Context, tenant string, action int64, device string) (string, error) {
	cols := []string{"status", "action_status", "progress", "errors", "error_count", "last_ts", "last_seq", "initiated_at", "deadline", "updated_at"}
	for i, c := range cols {
		cols[i] = "COALESCE(CAST(" + c + " AS TEXT), 'NULL')"
	}
	var s string
	err := db.queryRow(ctx, "SELECT "+strings.Join(cols, " || '|' || ")+
		" FROM device_actions WHERE tenant = ? AND action_id = ? AND device_id = ?", tenant, action, device).Scan(&s)
	return s, err
}

// MigratedAt makes the database one that migration 0048 found with
// rollups: 10-minute rollups whole only from the bucket of from, those
// before it deleted (those of points rolled up before the migration
// would not be whole) and the partitions wholly before it dropped, and
// the 10-minute partitions forgotten, as by a fleetd started after the
// migration.
func (db *DB) MigratedAt(ctx context.Context, from time.Time) error {
	ms := floorTo(millis(from), tenMinutesMs)
	starts, err := db.partitions(ctx, db, tenMinutePart)
	if err != nil {
		return err
	}
	for _, s := range starts {
		if tenMinutePart.next(s) <= ms {
			err = db.Exec(ctx, "DROP TABLE "+tenMinutePart.name(s)) // as if never made
		} else {
			err = db.Exec(ctx, "DELETE FROM "+tenMinutePart.name(s)+" WHERE bucket < ?", ms)
		}
		if err != nil {
			return err
		}
	}
	db.history.known.Range(func(name, _ any) bool {
		if _, ok := tenMinutePart.parse(name.(string)); ok {
			db.history.known.Delete(name)
		}
		return true
	})
	db.history.tenMinutesFrom.Store(ms)
	return db.Exec(ctx, "UPDATE stream_rollups_10m_from SET bucket = ?", ms)
}

// TenMinuteRollupsFrom returns the epoch milliseconds of the bucket
// 10-minute rollups are whole from.
func (db *DB) TenMinuteRollupsFrom(ctx context.Context) (int64, error) {
	return db.tenMinuteRollupsFrom(ctx)
}

// DropPartitionWhole drops the partition name with one DROP TABLE in a
// write job, as MaintainHistory did before it dropped SQLite's in slices:
// the benchmark's baseline.
func (db *DB) DropPartitionWhole(ctx context.Context, name string) error {
	return db.updateAlone(ctx, func(ctx context.Context, tx *Tx) error {
		_, err := tx.tx.ExecContext(ctx, "DROP TABLE "+name)
		return err
	})
}

// DropIfExpired drops the partition of table starting at start as the
// maintenance does once it found it expired (on SQLite in slices, on
// PostgreSQL detached first), checking again that it is, and reports
// whether it dropped it.
func (db *DB) DropIfExpired(ctx context.Context, table string, start time.Time) (bool, error) {
	for _, k := range partKinds {
		if k.table == table {
			if db.dialect == sqlite {
				return db.dropSliced(ctx, k, millis(start))
			}
			return db.dropDetached(ctx, k, millis(start))
		}
	}
	return false, fmt.Errorf("no partitioned table %s", table)
}

// SetReportsReadFirst makes db apply every status report by reading its
// device action first, as before advanceReports: the reference its
// statement is checked against.
func (db *DB) SetReportsReadFirst(on bool) { db.reportsReadFirst = on }

// AdvanceReportsPlan applies reports (each a candidate of
// advanceReports, on a device action in Progress) with advanceReports
// alone and returns how many it wrote and, on PostgreSQL, how many rows of
// device_actions its statement read with the generic plan (readsOf); on
// SQLite, the plan of its statement (EXPLAIN QUERY PLAN, read back from
// the statement text it ran).
func (db *DB) AdvanceReportsPlan(ctx context.Context, tenant string, reports []fleet.StatusReport) (advanced int, read int64, plan string, err error) {
	run := func(ctx context.Context, tx *Tx) error {
		found := make([]bool, len(reports))
		n, err := tx.advanceReports(ctx, tenant, reports, advanceCandidates(reports), found)
		advanced = n
		return err
	}
	if db.dialect == postgres {
		read, err = db.readsOf(ctx, "device_actions", run)
		return advanced, read, "", err
	}
	err = db.update(ctx, func(ctx context.Context, tx *Tx) error {
		if err := run(ctx, tx); err != nil {
			return err
		}
		var vals []any
		for _, r := range reports {
			vals = append(vals, r.ActionID, r.DeviceID, r.State, *r.Progress, *r.Timestamp, *r.Sequence)
		}
		q, args := tx.advanceStatement(tenant, vals)
		rows, err := tx.query(ctx, "EXPLAIN QUERY PLAN "+q, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		var lines []string
		for rows.Next() {
			var id, parent, notused int
			var detail string
			if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
				return err
			}
			lines = append(lines, detail)
		}
		plan = strings.Join(lines, "\n")
		return rows.Err()
	})
	return advanced, 0, plan, err
}

// PackDeflate compresses a chunk's points as fleetd wrote chunks before
// Zstandard (DEFLATE at its fastest), for tests that old chunks still read.
func PackDeflate(text []byte) []byte {
	var out bytes.Buffer
	w, _ := flate.NewWriter(&out, flate.BestSpeed)
	w.Write(text)
	w.Close()
	return out.Bytes()
}

// UnpackPoints is unpackPoints, a chunk's points read back.
func UnpackPoints(b []byte) ([]byte, error) { return unpackPoints(b) }

// ReportInOneBatch runs one ReportStatus job for each of reports in one
// group commit's transaction, as a commit loop batches concurrent callers,
// and returns the batch's error.
func (db *DB) ReportInOneBatch(ctx context.Context, tenant string, reports ...[]fleet.StatusReport) error {
	errs, err := db.tryBatch(nil, db.reportJobs(ctx, tenant, reports))
	return cmp.Or(err, errors.Join(errs...))
}

// reportJobs are the ReportStatus jobs of reports' callers, each with ctx
// and a channel for its answer.
func (db *DB) reportJobs(ctx context.Context, tenant string, reports [][]fleet.StatusReport) []*job {
	batch := make([]*job, len(reports))
	for i, r := range reports {
		batch[i], _ = db.reportJob(tenant, r)
		batch[i].ctx, batch[i].done = ctx, make(chan error, 1)
	}
	return batch
}

// ReportThroughRunBatch is ReportInOneBatch through the commit loop's
// runBatch, which runs a batch that failed as a whole again a job at a time;
// it returns the jobs' answers joined.
func (db *DB) ReportThroughRunBatch(ctx context.Context, tenant string, reports ...[]fleet.StatusReport) error {
	batch := db.reportJobs(ctx, tenant, reports)
	db.runBatch(nil, batch)
	errs := make([]error, len(batch))
	for i, j := range batch {
		errs[i] = <-j.done
	}
	return errors.Join(errs...)
}

// BeginWrite begins a write transaction outside the commit loops, to hold
// locks beside them.
func (db *DB) BeginWrite(ctx context.Context) (*sql.Tx, error) { return db.write.BeginTx(ctx, nil) }
