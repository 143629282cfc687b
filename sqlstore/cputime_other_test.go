//go:build !unix

package sqlstore_test

import "time"

// cpuTime is unknown here: BenchmarkReportBatch's CPU figure reads 0.
func cpuTime() time.Duration { return 0 }
