package remote

import (
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"syscall"
)

// spliceN moves n bytes from src to dst by splice(2), through a pipe:
// src's bytes into it, then out of it to dst, each system call
// non-blocking, waiting in Go's network poller (and within the
// connections' deadlines) when src has nothing or dst takes nothing. It
// is what (*net.TCPConn).ReadFrom does, but for its error: rerr is the
// failure to read src (io.ErrUnexpectedEOF when it ended first), werr
// the failure to write dst, never both, so that a relay knows which side
// failed.
func spliceN(dst, src *net.TCPConn, n int64) (written int64, rerr, werr error) {
	rc, err := src.SyscallConn()
	if err != nil {
		return 0, err, nil
	}
	wc, err := dst.SyscallConn()
	if err != nil {
		return 0, nil, err
	}
	p := getPipe()
	if p == nil {
		return copyN(dst, src, n)
	}
	var moved int64
	var serr error
	fill := func(fd uintptr) bool { // src into the pipe
		for {
			moved, serr = syscall.Splice(int(fd), nil, p.w, nil, int(min(n-written, int64(p.size))), spliceMove|spliceNonblock)
			if serr != syscall.EINTR {
				return serr != syscall.EAGAIN
			}
		}
	}
	pump := func(fd uintptr) bool { // the pipe out to dst
		for {
			moved, serr = syscall.Splice(p.r, nil, int(fd), nil, p.held, spliceMove|spliceNonblock)
			if serr != syscall.EINTR {
				return serr != syscall.EAGAIN
			}
		}
	}
	for written < n {
		// The pipe is empty: what src holds, up to the pipe's size,
		// goes into it without waiting for dst.
		if err := rc.Read(fill); err != nil {
			rerr = err
			break
		}
		if serr != nil {
			rerr = spliceError("read", src, serr)
			break
		}
		if moved == 0 {
			rerr = io.ErrUnexpectedEOF
			break
		}
		p.held = int(moved)
		for p.held > 0 {
			if err := wc.Write(pump); err != nil {
				werr = err
				break
			}
			if serr != nil {
				werr = spliceError("write", dst, serr)
				break
			}
			if moved == 0 {
				werr = io.ErrShortWrite
				break
			}
			p.held -= int(moved)
			written += moved
		}
		if werr != nil {
			break
		}
	}
	if p.held == 0 {
		pipes.Put(p)
	} else {
		// It holds bytes that went nowhere: closed now, not when the
		// garbage collector finds it, so that receivers that stop
		// within messages do not pile up descriptors and pipe buffers.
		p.close()
	}
	return written, rerr, werr
}

// spliceError is a failed splice(2) on c, as net's own errors read.
func spliceError(op string, c *net.TCPConn, err error) error {
	return &net.OpError{Op: op, Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: os.NewSyscallError("splice", err)}
}

// splice(2)'s flags: move pages rather than copy them where the kernel
// can; do not block on the pipe (the sockets do not block either).
const (
	spliceMove     = 0x1
	spliceNonblock = 0x2
)

// A pipe is splice's way between two sockets: held is what it holds.
type pipe struct {
	r, w    int
	size    int // what it holds at most
	held    int
	cleanup runtime.Cleanup // closes it once unreachable, if not closed before
}

// close closes the pipe, which must not be used again.
func (p *pipe) close() {
	p.cleanup.Stop()
	syscall.Close(p.r)
	syscall.Close(p.w)
}

// Pipes are pooled, lent while a message passes: an idle session holds
// none. One that the pool drops is closed by its cleanup.
var pipes sync.Pool

// getPipe returns an empty pipe, nil when none can be made.
func getPipe() *pipe {
	if p, ok := pipes.Get().(*pipe); ok {
		return p
	}
	var fds [2]int
	if err := syscall.Pipe2(fds[:], syscall.O_CLOEXEC|syscall.O_NONBLOCK); err != nil {
		return nil
	}
	p := &pipe{r: fds[0], w: fds[1], size: 64 << 10}
	// A whole message in one pass where the system allows it
	// (/proc/sys/fs/pipe-max-size, 1 MiB by default); the default size
	// otherwise.
	if n, _, e := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fds[1]), syscall.F_SETPIPE_SZ, LargeMessage); e == 0 {
		p.size = int(n)
	}
	p.cleanup = runtime.AddCleanup(p, func(fds [2]int) { syscall.Close(fds[0]); syscall.Close(fds[1]) }, fds)
	return p
}
