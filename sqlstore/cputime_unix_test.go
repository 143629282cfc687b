//go:build unix

package sqlstore_test

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuTime is the CPU time the process has used, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// ioCount is what the process has read and written through system calls,
// in bytes (Linux's /proc/self/io; zero elsewhere).
type ioCount struct{ read, written int64 }

func ioBytes() ioCount {
	var c ioCount
	data, _ := os.ReadFile("/proc/self/io")
	for line := range strings.SplitSeq(string(data), "\n") {
		name, value, _ := strings.Cut(line, ": ")
		n, _ := strconv.ParseInt(value, 10, 64)
		switch name {
		case "rchar":
			c.read = n
		case "wchar":
			c.written = n
		}
	}
	return c
}

// serverCPU is the CPU time, user and system, of a PostgreSQL cluster on
// this machine: the postmaster FLEETD_BENCH_PG_DATA names (a data
// directory) and its children. Zero when it is not set: a shared server's
// CPU is also other clients'. Children that exited are not counted, so
// measure between two readings taken while the store's connections are
// open.
func serverCPU() time.Duration {
	dir := os.Getenv("FLEETD_BENCH_PG_DATA")
	if dir == "" {
		return 0
	}
	pidFile, err := os.ReadFile(dir + "/postmaster.pid")
	if err != nil {
		return 0
	}
	postmaster, _, _ := strings.Cut(string(pidFile), "\n")
	procs, _ := os.ReadDir("/proc")
	var ticks int64
	for _, p := range procs {
		stat, err := os.ReadFile("/proc/" + p.Name() + "/stat")
		if err != nil {
			continue
		}
		// The fields after the command's closing parenthesis: state, ppid,
		// …; utime and stime are the 14th and 15th of the line.
		_, rest, ok := strings.Cut(string(stat), ") ")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 13 || (p.Name() != postmaster && f[1] != postmaster) {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + s
	}
	return time.Duration(ticks) * 10 * time.Millisecond // USER_HZ, 100 on Linux
}
