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
