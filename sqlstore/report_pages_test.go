package sqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore"
)

// BenchmarkReportPages measures, on SQLite, what status reports write to
// the WAL and cost the writer, with device_actions as a rowid table (as
// migration 0017 made it), WITHOUT ROWID, and a rowid table with
// device_actions_by_status as it was before migration 0023 (rowid_0022:
// without initiated_at, so that an entry a report moves lands on a random
// page of its new status's range): a dispatch to
// benchDevices() devices, then reports in store calls of 24, one commit
// each, one caller (so the figures are the SQL's and the commit's, not
// the group commit's): a first report on 24,000 devices in random order
// (what most of s10-random's reports are), a second report on the same
// devices, then a first report on 24,000 devices in the order of their
// ids, as S10's come. The WAL is never restarted, so its growth is what
// the reports wrote. Per report: frames-* the WAL frames, cpu-us-* the
// process's CPU (user and system), read-KB-* what it read through system
// calls (pages beyond the writer's page cache). row-bytes is a row's
// average size in the table's leaves (its record and cell header), and
// pages-* the pages of the table, of its key's index when it has one and
// of device_actions_by_status, after the dispatch (the rows rebuilt in
// key order).
func BenchmarkReportPages(b *testing.B) {
	for _, kind := range []string{"rowid", "without_rowid", "rowid_0022"} {
		b.Run(kind, func(b *testing.B) {
			ctx := context.Background()
			n := benchDevices()
			const batch, reports = 24, 24_000
			if n < 2*reports {
				b.Fatalf("FLEETD_BENCH_DEVICES=%d: the benchmark needs %d", n, 2*reports)
			}
			sums := map[string]float64{}
			for b.Loop() {
				b.StopTimer()
				path := filepath.Join(b.TempDir(), "fleetd.db")
				db, err := sqlstore.Open(ctx, path, sqlstore.Options{WALLimit: -1})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := db.Migrate(ctx); err != nil {
					b.Fatal(err)
				}
				benchTenant(b, db, n)
				a, err := db.DispatchAction(ctx, "bench", dispatch("reboot", "all"))
				if err != nil {
					b.Fatal(err)
				}
				db.Close()
				rebuildDeviceActions(b, path, kind == "without_rowid")
				if kind == "rowid_0022" {
					execSQLite(b, path, "DROP INDEX device_actions_by_status",
						"CREATE INDEX device_actions_by_status ON device_actions (tenant, action_id, action_status, phase)",
						"PRAGMA wal_checkpoint(TRUNCATE)")
				}
				for k, v := range deviceActionsPages(b, path) {
					sums[k] += v
				}
				if db, err = sqlstore.Open(ctx, path, sqlstore.Options{WALLimit: -1}); err != nil {
					b.Fatal(err)
				}
				random := rand.Perm(n - reports)[:reports]
				var ordered []int // the last devices, none of random's
				for i := range reports {
					ordered = append(ordered, n-reports+i)
				}
				seq := int64(0)
				run := func(name string, devs []int, state string) {
					wal0, c0, io0 := fileSize(b, path+"-wal"), cpuTime(), ioBytes()
					b.StartTimer()
					for start := 0; start < len(devs); start += batch {
						var rs []fleet.StatusReport
						for _, d := range devs[start:min(start+batch, len(devs))] {
							seq++
							rs = append(rs, fleet.StatusReport{DeviceID: fmt.Sprintf("dev-%07d", d), ActionID: a.ID, State: state,
								Progress: intp(int(seq % 100)), Timestamp: i64(seq), Sequence: i64(seq)})
						}
						if _, err := db.ReportStatus(ctx, "bench", rs); err != nil {
							b.Fatal(err)
						}
					}
					b.StopTimer()
					sums["frames-"+name] += float64(fileSize(b, path+"-wal")-wal0) / (4096 + 24) / float64(len(devs))
					sums["cpu-us-"+name] += float64(cpuTime()-c0) / float64(time.Microsecond) / float64(len(devs))
					sums["read-KB-"+name] += float64(ioBytes().read-io0.read) / 1024 / float64(len(devs))
				}
				run("first", random, "Downloading")
				run("second", random, "Installing")
				run("seq", ordered, "Downloading")
				db.Close()
				b.StartTimer()
			}
			for k, v := range sums {
				b.ReportMetric(v/float64(b.N), k)
			}
		})
	}
}

// rebuildDeviceActions rebuilds device_actions in the SQLite database at
// path as a rowid table or WITHOUT ROWID, with its rows (inserted in key
// order) and indexes, whichever it was.
func rebuildDeviceActions(b *testing.B, path string, withoutRowid bool) {
	b.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)")
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	table, indexes := deviceActionsSchema(b, db)
	table = "CREATE TABLE device_actions_kind " + table[strings.Index(table, "("):]
	table = strings.TrimSuffix(strings.TrimSpace(table), " WITHOUT ROWID")
	if withoutRowid {
		table += " WITHOUT ROWID"
	}
	// The stored columns: generated ones (migration 0022) are computed.
	var cols string
	if err := db.QueryRow("SELECT group_concat(name, ', ') FROM pragma_table_xinfo('device_actions') WHERE hidden = 0").Scan(&cols); err != nil {
		b.Fatal(err)
	}
	ddl := []string{table,
		"INSERT INTO device_actions_kind (" + cols + ") SELECT " + cols + " FROM device_actions ORDER BY tenant, action_id, device_id",
		"DROP TABLE device_actions",
		"ALTER TABLE device_actions_kind RENAME TO device_actions"}
	for _, q := range append(ddl, indexes...) {
		if _, err := db.Exec(q); err != nil {
			b.Fatal(q, err)
		}
	}
	if _, err := db.Exec("PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
		b.Fatal(err)
	}
}

// execSQLite runs statements on the SQLite database at path.
func execSQLite(b *testing.B, path string, stmts ...string) {
	b.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)")
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	for _, q := range stmts {
		if _, err := db.Exec(q); err != nil {
			b.Fatal(q, err)
		}
	}
}

// deviceActionsSchema returns the statements that create device_actions
// and its indexes.
func deviceActionsSchema(b *testing.B, db *sql.DB) (table string, indexes []string) {
	b.Helper()
	if err := db.QueryRow("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'device_actions'").Scan(&table); err != nil {
		b.Fatal(err)
	}
	rows, err := db.Query("SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'device_actions' AND sql IS NOT NULL ORDER BY name")
	if err != nil {
		b.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var q string
		if err := rows.Scan(&q); err != nil {
			b.Fatal(err)
		}
		indexes = append(indexes, q)
	}
	return table, indexes
}

// deviceActionsPages reads SQLite's dbstat for the database at path: the
// average size of a device action in the table's leaves (row-bytes) and
// the pages of the table, its key's index and device_actions_by_status.
func deviceActionsPages(b *testing.B, path string) map[string]float64 {
	b.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=query_only(1)")
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	out := map[string]float64{}
	var bytes, cells float64
	if err := db.QueryRow(`SELECT sum(payload + ncell * 4), sum(ncell) FROM dbstat
		WHERE name = 'device_actions' AND pagetype = 'leaf'`).Scan(&bytes, &cells); err != nil {
		b.Fatal(err)
	}
	out["row-bytes"] = bytes / cells
	for key, name := range map[string]string{"pages-table": "device_actions", "pages-key": "sqlite_autoindex_device_actions_1",
		"pages-by_status": "device_actions_by_status"} {
		var n float64
		if err := db.QueryRow("SELECT count(*) FROM dbstat WHERE name = ?", name).Scan(&n); err != nil {
			b.Fatal(err)
		}
		out[key] = n
	}
	return out
}
