package remote

import (
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestSpliceClosesADroppedPipe: a splice whose write fails leaves bytes
// in its pipe, which is then not pooled again; its descriptors are closed
// at once, not when the garbage collector next finds the pipe (a
// receiver that stops within every message would otherwise hold two
// descriptors and up to a pipe's size of kernel memory each time).
func TestSpliceClosesADroppedPipe(t *testing.T) {
	// The pool emptied (but for what another P keeps to itself), the
	// splice makes a pipe of its own, which must not be open after it.
	for pipes.Get() != nil {
	}
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
	before := openPipes(t)
	written, rerr, werr := spliceN(dst, src, int64(len(msg)))
	if written != 0 || rerr != nil || werr == nil {
		t.Fatalf("spliceN = %d, %v, %v; want the write's failure", written, rerr, werr)
	}
	for p := range openPipes(t) {
		if !before[p] {
			t.Errorf("%s open after the failed splice", p)
		}
	}
}

// TestJoinSetsLocalBuffers: Join fixes its local connection's socket
// buffers at localBuffer (the kernel doubles it) rather than leave them
// to the kernel's autotuning, which grows a bulk forward's to megabytes.
// The kernel caps what is asked at net.core.rmem_max and wmem_max
// (socket(7)): a host whose caps are below localBuffer has its caps,
// doubled.
func TestJoinSetsLocalBuffers(t *testing.T) {
	leg, legPeer := tcpPair(t)
	local, localPeer := tcpPair(t)
	c := &Conn{st: newStream(leg, nil), peerMax: LargeMessage}
	done := make(chan error, 1)
	go func() { done <- c.Join(local) }()
	// Both peers gone, the session's messages end and Join returns.
	legPeer.Close()
	localPeer.Close()
	if err := <-done; err != nil {
		t.Fatalf("Join: %v", err)
	}
	rc, err := local.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	for _, opt := range []struct {
		name string
		opt  int
		max  string
	}{{"SO_RCVBUF", syscall.SO_RCVBUF, "rmem_max"}, {"SO_SNDBUF", syscall.SO_SNDBUF, "wmem_max"}} {
		b, err := os.ReadFile("/proc/sys/net/core/" + opt.max)
		if err != nil {
			t.Skipf("the kernel's cap on %s: %v", opt.name, err)
		}
		capped, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatalf("net.core.%s: %v", opt.max, err)
		}
		want := 2 * min(localBuffer, capped)
		var n int
		var gerr error
		if err := rc.Control(func(fd uintptr) { n, gerr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, opt.opt) }); err != nil {
			t.Fatal(err)
		}
		if gerr != nil {
			t.Fatal(gerr)
		}
		if n != want {
			t.Errorf("%s = %d after Join, want %d (twice %d, net.core.%s %d)", opt.name, n, want, localBuffer, opt.max, capped)
		}
	}
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

// openPipes returns the pipes the process has descriptors of, "pipe:[…]".
func openPipes(t *testing.T) map[string]bool {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	open := map[string]bool{}
	for _, e := range ents {
		to, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		if strings.HasPrefix(to, "pipe:") {
			open[to] = true
		}
	}
	return open
}
