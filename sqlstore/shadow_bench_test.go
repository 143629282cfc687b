package sqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// BenchmarkShadowWrites is fleetbench's twin load in the store: 64
// writers, each a desired change (as PATCH /api/v1/devices/{id}/shadow)
// or a reported one (as a device's publish) of a device of its own at a
// time, every write a change. It reports the wall time and this process's
// CPU a write and, on PostgreSQL, the CPU of the server's backends that
// served this process's connections (Linux's /proc), and the group
// commit's batching: writes a transaction job, jobs a commit.
//
//	go test ./sqlstore -run '^$' -bench ShadowWrites -benchtime 3000x
func BenchmarkShadowWrites(b *testing.B) {
	for _, be := range sqlstoretest.Backends() {
		for _, section := range []string{fleet.ShadowDesired, fleet.ShadowReported} {
			b.Run(be.Name+"/"+section, func(b *testing.B) { benchShadowWrites(b, be, section) })
		}
	}
}

func benchShadowWrites(b *testing.B, be sqlstoretest.Backend, section string) {
	const writers, perWriter = 64, 50
	var dsn string
	at := be
	at.DSN = func(t testing.TB) string { dsn = be.DSN(t); return dsn }
	db := sqlstoretest.MustOpen(b, at, sqlstoretest.Options{})
	ctx := context.Background()
	mustTenant(b, db, "acme")
	devs := map[string]map[string]string{}
	for i := range writers * perWriter {
		devs[fmt.Sprintf("dev-%05d", i)] = nil
	}
	mustDevices(b, db, "acme", devs)
	var raw *sql.DB
	if be.Name == "postgres" {
		raw = openRaw(b, be, dsn)
	}
	write := func(w, n int) error {
		dev := fmt.Sprintf("dev-%05d", w*perWriter+n%perWriter)
		patch := map[string]any{"n": int64(n), "net": map[string]any{"ssid": "plant", "band": "5g"}}
		var err error
		if section == fleet.ShadowDesired {
			_, err = db.UpdateDesired(ctx, "acme", dev, patch, nil)
		} else {
			_, err = db.UpdateReported(ctx, "acme", dev, patch)
		}
		return err
	}
	run := func(total int) error {
		var next atomic.Int64
		var wg sync.WaitGroup
		errs := make([]error, writers)
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n := next.Add(1); n <= int64(total); n = next.Add(1) {
					if err := write(w, int(n)); err != nil {
						errs[w] = err
						return
					}
				}
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return err
			}
		}
		return nil
	}
	if err := run(writers * 4); err != nil { // warm: connections open, statements prepared
		b.Fatal(err)
	}
	b.ResetTimer()
	cpu0, server0, st0 := cpuTime(), backendCPU(raw), db.Stats()
	if err := run(b.N); err != nil {
		b.Fatal(err)
	}
	cpu, server, st := cpuTime()-cpu0, backendCPU(raw)-server0, db.Stats()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/float64(st.Jobs-st0.Jobs), "writes/job")
	b.ReportMetric(float64(st.Jobs-st0.Jobs)/float64(st.Commits-st0.Commits), "jobs/commit")
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/write")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/write")
	if raw != nil {
		b.ReportMetric(float64(server.Microseconds())/float64(b.N), "server-cpu-µs/write")
	}
}

// backendCPU is the CPU time of the PostgreSQL backends serving this
// process's connections, found by their client ports; 0 without raw (or
// /proc).
func backendCPU(raw *sql.DB) time.Duration {
	if raw == nil {
		return 0
	}
	ports := map[int]bool{}
	inodes := map[string]bool{}
	fds, _ := os.ReadDir("/proc/self/fd")
	for _, fd := range fds {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	for _, f := range []string{"/proc/self/net/tcp", "/proc/self/net/tcp6"} {
		data, _ := os.ReadFile(f)
		for _, line := range strings.Split(string(data), "\n")[1:] {
			fs := strings.Fields(line)
			if len(fs) < 10 || !inodes[fs[9]] {
				continue
			}
			if _, port, ok := strings.Cut(fs[1], ":"); ok {
				if p, err := strconv.ParseInt(port, 16, 32); err == nil {
					ports[int(p)] = true
				}
			}
		}
	}
	rows, err := raw.Query("SELECT pid, client_port FROM pg_stat_activity WHERE client_port IS NOT NULL")
	if err != nil {
		return 0
	}
	defer rows.Close()
	var total time.Duration
	for rows.Next() {
		var pid, port int
		if rows.Scan(&pid, &port) != nil || !ports[port] {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// After the command's closing parenthesis: utime and stime are
		// fields 14 and 15, in clock ticks of 10 ms.
		fs := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(fs) > 13 {
			u, _ := strconv.ParseInt(fs[11], 10, 64)
			s, _ := strconv.ParseInt(fs[12], 10, 64)
			total += time.Duration(u+s) * 10 * time.Millisecond
		}
	}
	return total
}
