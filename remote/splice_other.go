//go:build !linux

package remote

import "net"

// spliceN copies n bytes from src to dst: rerr is the failure to read
// src, werr the failure to write dst (splice_linux.go splices them).
func spliceN(dst, src *net.TCPConn, n int64) (written int64, rerr, werr error) {
	return copyN(dst, src, n)
}
