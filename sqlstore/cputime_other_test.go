//go:build !unix

package sqlstore_test

import "time"

// cpuTime is unknown here: BenchmarkReportBatch's CPU figure reads 0.
func cpuTime() time.Duration { return 0 }

// ioCount is unknown here: the benchmarks' I/O figures read 0.
type ioCount struct{ read, written int64 }

func ioBytes() ioCount { return ioCount{} }

// serverCPU is unknown here: the benchmarks' server CPU figures read 0.
func serverCPU() time.Duration { return 0 }
