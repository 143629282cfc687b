package remote

import (
	"errors"
	"net"
	"os"
	"strconv"
	"testing"
)

// TestSpliceClosesADroppedPipe: a splice whose write fails leaves bytes
// in its pipe, which is then not pooled again; its descriptors are closed
// at once, not when the garbage collector next finds the pipe (a
// receiver that stops within every message would otherwise hold two
// descriptors and up to a pipe's size of kernel memory each time).
func TestSpliceClosesADroppedPipe(t *testing.T) {
	for pipes.Get() != nil { // the pool holds the pipe below alone
	}
	p := getPipe()
	if p == nil {
		t.Skip("no pipe can be made")
	}
	ends := []string{fdTarget(t, p.r), fdTarget(t, p.w)}
	pipes.Put(p)
	src, srcPeer := tcpPair(t)
	dst, dstPeer := tcpPair(t)
	// The receiver resets its connection, and dst has heard it.
	dstPeer.SetLinger(0)
	dstPeer.Close()
	if _, err := dst.Read(make([]byte, 1)); err == nil {
		t.Fatal("read a byte of a connection reset")
	}
	msg := make([]byte, 1000)
	if _, err := srcPeer.Write(msg); err != nil {
		t.Fatal(err)
	}
	written, rerr, werr := spliceN(dst, src, int64(len(msg)))
	if written != 0 || rerr != nil || werr == nil {
		t.Fatalf("spliceN = %d, %v, %v; want the write's failure", written, rerr, werr)
	}
	// Either spliceN took that pipe and closed it, or a collection
	// emptied the pool before and the pipe's cleanup closed it: its
	// descriptors, whatever they are now, are not of it.
	if got := []string{fdTarget(t, p.r), fdTarget(t, p.w)}; got[0] == ends[0] || got[1] == ends[1] {
		t.Errorf("the pipe's descriptors %d and %d are still %v after the failed splice", p.r, p.w, got)
	}
}

// fdTarget is what the process's descriptor fd is ("pipe:[…]"), "" when
// it is not open.
func fdTarget(t *testing.T, fd int) string {
	t.Helper()
	to, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if errors.Is(err, os.ErrNotExist) {
		return ""
	} else if err != nil {
		t.Fatal(err)
	}
	return to
}

// tcpPair returns the two ends of a TCP connection.
func tcpPair(t *testing.T) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return s.(*net.TCPConn), c.(*net.TCPConn)
}
