package sqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/sqlstore"
)

// BenchmarkDispatchIndexes measures, on SQLite, what each index of
// device_actions (and the foreign key to devices it had until migration
// 0017) costs a dispatch's INSERT … SELECT: the statement the store runs,
// into device_actions as it is and with one part added or taken away,
// beside fleetbench's baseline (a table with its primary key only). Each
// run starts from a copy of the same database of benchDevices() devices,
// named as fleetbench's million-device fleet is (tenant dispatch-large,
// ids dp1-<run>-0000000, a SHA-256 token hash each). raw reads them;
// raw_fleetbench is fleetbench's baseline as it runs, which reads a
// three-column table of tenant "b" and ids dev-0000000. rowid and
// without_rowid make device_actions a rowid table with a separate index of
// its key (as migration 0017 made it) or WITHOUT ROWID, whatever the
// migrations made it; with_casts runs the statement as it was until
// 2026-11-26, its constants cast as PostgreSQL needs.
// behind_100k inserts in front of 100,000 device actions of another
// tenant, as fleetbench's million does in front of its 100,000: a leaf
// split then balances its page with their full one beside it (29% more
// CPU than behind_tenant, the same WAL).
// behind_100k_by_device_not_queued is behind_100k with
// device_actions_by_device leaving Queued rows out, as 0045 did for the
// status index: what that lever would save a dispatch (not done: see
// docs/benchmarks-notebook.md, "device_actions_by_device without Queued").
// Compare cpu-ms/op, the process's CPU time for the insert and its commit,
// within one run: wall time on a shared machine moves with its neighbours
// (commit-ms/op is the COMMIT's, most of it the WAL's fsync).
// The WAL's figures do not move with load: wal-MB/op is what the
// transaction wrote to it, spilled-MB/op how much of that SQLite wrote
// before the COMMIT (dirty pages its 2 MiB page cache could not hold), and
// reread-MB/op what the COMMIT read back from it (when a spilled page was
// changed again, SQLite rewrites the checksum of every frame after it).
func BenchmarkDispatchIndexes(b *testing.B) {
	// As fleetd's writer: no checkpoint in a commit.
	const pragmas = "_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=busy_timeout(10000)&_pragma=foreign_keys(1)&_pragma=temp_store(MEMORY)&_pragma=wal_autocheckpoint(0)&_txlock=immediate"
	ctx := context.Background()
	n := benchDevices()
	dir := b.TempDir()
	base := filepath.Join(dir, "base.db")
	st, err := sqlstore.Open(ctx, base, sqlstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := st.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	if _, _, err := st.CreateTenant(ctx, "dispatch-large"); err != nil {
		b.Fatal(err)
	}
	st.Close()
	open := func(path string) *sql.DB {
		db, err := sql.Open("sqlite", "file:"+path+"?"+pragmas)
		if err != nil {
			b.Fatal(err)
		}
		db.SetMaxOpenConns(1)
		return db
	}
	db := open(base)
	for _, q := range []string{
		fmt.Sprintf(`INSERT INTO devices (tenant, id, token_hash, metadata, components, created_at)
			WITH RECURSIVE c(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM c WHERE i + 1 < %d)
			SELECT 'dispatch-large', printf('dp1-1a2b3c4d-%%07d', i), lower(hex(randomblob(32))), '{}', '{}', 0 FROM c`, n),
		"CREATE TABLE ins_src (tenant TEXT NOT NULL, id TEXT NOT NULL, metadata TEXT NOT NULL, PRIMARY KEY (tenant, id))",
		fmt.Sprintf(`INSERT INTO ins_src WITH RECURSIVE c(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM c WHERE i + 1 < %d)
			SELECT 'b', printf('dev-%%07d', i), '{}' FROM c`, n),
		`CREATE TABLE raw (tenant TEXT NOT NULL, action_id BIGINT NOT NULL, device_id TEXT NOT NULL, type TEXT NOT NULL,
			status TEXT NOT NULL, action_status TEXT NOT NULL, progress INTEGER NOT NULL, errors TEXT NOT NULL,
			error_count INTEGER NOT NULL, user_email TEXT NOT NULL, user_name TEXT NOT NULL, serial_metadata TEXT NOT NULL,
			created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL, PRIMARY KEY (tenant, action_id, device_id))`,
		"PRAGMA wal_checkpoint(TRUNCATE)",
	} {
		if _, err := db.Exec(q); err != nil {
			b.Fatal(err)
		}
	}
	var table string
	if err := db.QueryRow("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'device_actions'").Scan(&table); err != nil {
		b.Fatal(err)
	}
	indexes := map[string]string{}
	rows, err := db.Query("SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'device_actions' AND sql IS NOT NULL")
	if err != nil {
		b.Fatal(err)
	}
	for rows.Next() {
		var name, q string
		if err := rows.Scan(&name, &q); err != nil {
			b.Fatal(err)
		}
		indexes[name] = q
	}
	rows.Close()
	db.Close()
	var partial []string
	for name := range indexes {
		if strings.Contains(name, "_final_") || name == "device_actions_by_deadline" || name == "device_actions_failed_by_time" {
			partial = append(partial, name)
		}
	}
	// The dispatch's statement, as insertTargets writes it on SQLite, and
	// as it wrote it until 2026-11-26, with PostgreSQL's casts.
	const insert = `INSERT INTO device_actions (tenant, action_id, device_id, type, status, action_status, progress, errors, error_count,
		user_email, user_name, serial_metadata, created_at, updated_at, phase)
		SELECT tenant, ?, id, ?, 'Queued', 'Queued', 0, '{}', 0, ?, ?, metadata, ?, ?, 0 FROM devices WHERE tenant = ?`
	const withCasts = `INSERT INTO device_actions (tenant, action_id, device_id, type, status, action_status, progress, errors, error_count,
		user_email, user_name, serial_metadata, created_at, updated_at, phase)
		SELECT tenant, CAST(? AS BIGINT), id, CAST(? AS TEXT), 'Queued', 'Queued', 0, CAST('{}' AS TEXT), 0,
		CAST(? AS TEXT), CAST(? AS TEXT), metadata, CAST(? AS BIGINT), CAST(? AS BIGINT), 0 FROM devices WHERE tenant = ?`
	variants := []struct {
		name       string
		foreignKey bool
		without    []string
		// behind: another tenant's device action sorts after the new
		// ones, as in any database but one whose last tenant dispatches,
		// so no index takes them by appending to its last page.
		behind bool
		// behindRows: as behind, with this many device actions of the
		// other tenant rather than one, as fleetbench's million lands
		// before its 100,000's.
		behindRows int
		// kind makes the table a rowid table ("rowid") or WITHOUT ROWID
		// ("without_rowid"), whatever the migrations made it.
		kind string
		// notQueued makes these indexes leave Queued rows out, as
		// migration 0045 made device_actions_by_status.
		notQueued []string
	}{
		{name: "device_actions"},
		{name: "behind_tenant", behind: true},
		{name: "behind_100k", behindRows: 100_000},
		{name: "behind_100k_by_device_not_queued", behindRows: 100_000, notQueued: []string{"device_actions_by_device"}},
		{name: "rowid", kind: "rowid"},
		{name: "rowid_behind", kind: "rowid", behind: true},
		{name: "without_rowid", kind: "without_rowid"},
		{name: "without_rowid_behind", kind: "without_rowid", behind: true},
		{name: "with_foreign_key", foreignKey: true},
		{name: "without_by_device", without: []string{"device_actions_by_device"}},
		{name: "without_by_status", without: []string{"device_actions_by_status"}},
		{name: "without_partial", without: partial},
		{name: "primary_key_only", without: append([]string{"device_actions_by_device", "device_actions_by_status"}, partial...)},
		{name: "with_casts"},
		{name: "raw"},
		{name: "raw_fleetbench"},
	}
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			var cpu, spilled, reread, wal int64
			var commit time.Duration
			for b.Loop() {
				b.StopTimer()
				path := filepath.Join(b.TempDir(), "v.db")
				copyFile(b, path, base)
				db := open(path)
				ddl := []string{"DROP TABLE device_actions"}
				t, found := strings.CutSuffix(strings.TrimSpace(table), " WITHOUT ROWID")
				if v.foreignKey {
					t = t[:strings.LastIndex(t, ")")] + ",\n    FOREIGN KEY (tenant, device_id) REFERENCES devices (tenant, id) ON DELETE CASCADE\n)"
				}
				if v.kind == "without_rowid" || found && v.kind != "rowid" {
					t += " WITHOUT ROWID"
				}
				ddl = append(ddl, t)
				for name, q := range indexes {
					if slices.Contains(v.notQueued, name) {
						q += " WHERE action_status <> 'Queued'"
					}
					if !slices.Contains(v.without, name) {
						ddl = append(ddl, q)
					}
				}
				if v.behind {
					ddl = append(ddl, `INSERT INTO device_actions (tenant, action_id, device_id, type, status, action_status, progress, errors,
						error_count, user_email, user_name, serial_metadata, created_at, updated_at, phase)
						VALUES ('zz', 1, 'x', 't', 'Queued', 'Queued', 0, '{}', 0, '', '', '{}', 0, 0, 0)`)
				}
				if v.behindRows > 0 {
					ddl = append(ddl, fmt.Sprintf(`INSERT INTO device_actions (tenant, action_id, device_id, type, status, action_status, progress, errors,
						error_count, user_email, user_name, serial_metadata, created_at, updated_at, phase)
						WITH RECURSIVE c(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM c WHERE i + 1 < %d)
						SELECT 'dispatch-small', 1, printf('dp0-1a2b3c4d-%%07d', i), 'reboot', 'Queued', 'Queued', 0, '{}', 0, '', 'admin', '{}', 0, 0, 0 FROM c`, v.behindRows))
				}
				if !strings.HasPrefix(v.name, "raw") {
					// The WAL is emptied after, so that wal-MB/op is the
					// insert's alone and its reads find every page in the
					// database file, as the baseline's do.
					for _, q := range append(ddl, "PRAGMA wal_checkpoint(TRUNCATE)") {
						if _, err := db.Exec(q); err != nil {
							b.Fatal(q, err)
						}
					}
				}
				b.StartTimer()
				c0, io0 := cpuTime(), ioBytes()
				tx, err := db.Begin()
				if err != nil {
					b.Fatal(err)
				}
				switch v.name {
				case "raw":
					_, err = tx.Exec(`INSERT INTO raw SELECT tenant, 1, id, 'reboot', 'Queued', 'Queued', 0, '{}', 0,
						'', 'admin', metadata, 0, 0 FROM devices WHERE tenant = 'dispatch-large'`)
				case "raw_fleetbench":
					_, err = tx.Exec(`INSERT INTO raw SELECT tenant, 1, id, 'reboot', 'Queued', 'Queued', 0, '{}', 0,
						'', 'admin', metadata, 0, 0 FROM ins_src WHERE tenant = 'b'`)
				case "with_casts":
					_, err = tx.Exec(withCasts, 1, "reboot", "", "admin", 0, 0, "dispatch-large")
				default:
					_, err = tx.Exec(insert, 1, "reboot", "", "admin", 0, 0, "dispatch-large")
				}
				if err != nil {
					b.Fatal(err)
				}
				io1 := ioBytes()
				tc := time.Now()
				if err := tx.Commit(); err != nil {
					b.Fatal(err)
				}
				commit += time.Since(tc)
				cpu += int64(cpuTime() - c0)
				io2 := ioBytes()
				b.StopTimer()
				spilled += io1.written - io0.written
				reread += io2.read - io1.read
				wal += fileSize(b, path+"-wal")
				db.Close()
				b.StartTimer()
			}
			b.ReportMetric(float64(cpu)/1e6/float64(b.N), "cpu-ms/op")
			b.ReportMetric(float64(commit.Milliseconds())/float64(b.N), "commit-ms/op")
			b.ReportMetric(float64(wal)/(1<<20)/float64(b.N), "wal-MB/op")
			b.ReportMetric(float64(spilled)/(1<<20)/float64(b.N), "spilled-MB/op")
			b.ReportMetric(float64(reread)/(1<<20)/float64(b.N), "reread-MB/op")
		})
	}
}

func copyFile(b *testing.B, dst, src string) {
	in, err := os.Open(src)
	if err != nil {
		b.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		b.Fatal(err)
	}
	if err := out.Close(); err != nil {
		b.Fatal(err)
	}
}

func fileSize(b *testing.B, path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	return fi.Size()
}
