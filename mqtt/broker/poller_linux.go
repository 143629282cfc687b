package broker

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"
)

// poller watches the sockets of parked connections with an epoll instance
// of its own (Go's netpoller wakes only a goroutine blocked in a read, and
// a parked connection has none): one goroutine for all of them, which
// wakes a connection when its socket has something to read or was closed
// by the device, and, looking once a second, when its keepalive deadline
// has passed (a timer each would cost more than a tenth of what a parked
// connection costs in all).
//
// A parked connection whose socket holds a lone PINGREQ, which is what an
// idle device sends once a keepalive, is answered here and stays parked
// (pingInPlace): waking it would give it a goroutine, a stack and a read
// buffer for ParkAfter, and an idle fleet pings all the time.
//
// Each registration is one-shot and level-triggered: bytes that arrived
// before the socket was registered wake it at once, and a woken socket is
// watched again only when its connection parks again. A registration is
// keyed by a number of the poller's, not by the file descriptor, which the
// system reuses once a connection is closed.
type poller struct {
	epfd   int
	wake   *os.File // written to stop the loop; its read end is registered under key 0
	wakeR  *os.File
	done   chan struct{}
	mu     sync.Mutex
	seq    uint64
	parked map[uint64]parking
}

// parking is a parked connection and its keepalive deadline (monoNow).
type parking struct {
	d        *device
	deadline int64
}

// sweepEvery is how often the poller looks for keepalive deadlines passed:
// a silent device is cut off at most this much after its one and a half
// keepalives.
const sweepEvery = time.Second

func newPoller() (*poller, error) {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		syscall.Close(epfd)
		return nil, err
	}
	p := &poller{epfd: epfd, wake: w, wakeR: r, done: make(chan struct{}), parked: map[uint64]parking{}}
	if err := p.ctl(syscall.EPOLL_CTL_ADD, int(r.Fd()), 0, syscall.EPOLLIN); err != nil {
		p.closeFiles()
		return nil, err
	}
	go p.loop()
	return p, nil
}

func (p *poller) ctl(op, fd int, key uint64, events uint32) error {
	ev := syscall.EpollEvent{Events: events, Fd: int32(uint32(key)), Pad: int32(uint32(key >> 32))}
	return syscall.EpollCtl(p.epfd, op, fd, &ev)
}

// watch registers d's socket, fd, under a new key, until d's keepalive
// deadline; the caller holds a reference to fd (syscall.RawConn.Control),
// so it is not closed meanwhile.
func (p *poller) watch(d *device, fd int, deadline int64) error {
	p.mu.Lock()
	p.seq++
	key := p.seq
	p.parked[key] = parking{d, deadline}
	d.parkKey = key
	p.mu.Unlock()
	const events = syscall.EPOLLIN | syscall.EPOLLRDHUP | syscall.EPOLLONESHOT
	err := p.ctl(syscall.EPOLL_CTL_MOD, fd, key, events)
	if errors.Is(err, syscall.ENOENT) {
		err = p.ctl(syscall.EPOLL_CTL_ADD, fd, key, events)
	}
	if err != nil {
		p.forget(d)
		return fmt.Errorf("epoll_ctl: %w", err)
	}
	return nil
}

// unwatch takes fd out of the epoll instance; fd is about to be closed
// while another descriptor of its socket stays open, which would leave it
// registered.
func (p *poller) unwatch(fd int) {
	_ = p.ctl(syscall.EPOLL_CTL_DEL, fd, 0, 0)
}

// forget drops d's registration: an event for it is ignored.
func (p *poller) forget(d *device) {
	p.mu.Lock()
	if p.parked[d.parkKey].d == d {
		delete(p.parked, d.parkKey)
	}
	p.mu.Unlock()
}

// count returns the number of connections parked now.
func (p *poller) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.parked)
}

func (p *poller) loop() {
	defer close(p.done)
	events := make([]syscall.EpollEvent, 128)
	swept := time.Now()
	for {
		n, err := syscall.EpollWait(p.epfd, events, int(sweepEvery/time.Millisecond))
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return // the instance is gone: nothing can be watched any more
		}
		for _, ev := range events[:n] {
			key := uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
			if key == 0 {
				return
			}
			p.mu.Lock()
			pk, ok := p.parked[key]
			delete(p.parked, key)
			p.mu.Unlock()
			if ok && !pk.d.pingInPlace(p) {
				pk.d.wake()
			}
		}
		if now := time.Now(); now.Sub(swept) >= sweepEvery {
			swept = now
			p.sweep(int64(now.Sub(monoBase)))
		}
	}
}

// sweep wakes the parked connections whose keepalive deadline has passed:
// each then finds its read's deadline passed, and ends.
func (p *poller) sweep(now int64) {
	var due []*device
	p.mu.Lock()
	for key, pk := range p.parked {
		if pk.deadline <= now {
			due = append(due, pk.d)
			delete(p.parked, key)
		}
	}
	p.mu.Unlock()
	for _, d := range due {
		d.wake()
	}
}

// close stops the loop; connections still parked are not woken (the
// server wakes them as it closes them).
func (p *poller) close() {
	p.wake.Write([]byte{0})
	<-p.done
	p.closeFiles()
}

func (p *poller) closeFiles() {
	syscall.Close(p.epfd)
	p.wake.Close()
	p.wakeR.Close()
}

// pingInPlace answers d's PINGREQ on the poller's goroutine if that is all
// its socket holds, and watches the socket again until the new keepalive
// deadline: the connection stays parked. It reports false, having done
// nothing, when the socket holds anything else (or nothing: the device
// closed it), when a write to the device is under way, or when the answer
// cannot be written without waiting; the caller then wakes d.
//
// wmu is held throughout: nothing else writes to the device meanwhile, and
// the connection cannot be closed (closing takes wmu) while the poller acts
// as its reader.
func (d *device) pingInPlace(p *poller) bool {
	for !d.wmu.TryLock() {
		// While the socket is held apart, wmu is held only for moments
		// (the parking goroutine finishing, a writer or closer taking the
		// socket back): wait for it. Once the connection has the socket
		// back, a write may hold wmu until its deadline: wake instead.
		if d.fd.Load() == 0 {
			return false
		}
		runtime.Gosched()
	}
	defer d.wmu.Unlock()
	if d.closed.Load() || !d.parked.Load() {
		return false
	}
	if d.fd.Load() == 0 {
		return false
	}
	pingresp := [2]byte{typePingresp << 4, 0}
	answered, short := false, false
	deadline := monoNow() + int64(time.Duration(d.keepalive)*time.Second*3/2)
	var werr error
	func(fd int) {
		var b [3]byte // a third byte says the PINGREQ is not alone
		n, _, err := syscall.Recvfrom(fd, b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		if err != nil || n != 2 || b[0] != typePingreq<<4 || b[1] != 0 {
			return
		}
		// The answer first: the PINGREQ is taken off the socket only once
		// it is answered, and otherwise left to the connection's reader.
		w, err := syscall.Write(fd, pingresp[:])
		if err != nil || w != len(pingresp) {
			short = w > 0
			return
		}
		d.s.stats.parkedPings.Add(1)
		if n, _, err := syscall.Recvfrom(fd, b[:2], syscall.MSG_DONTWAIT); err != nil || n != 2 {
			return // the reader will find the socket's error, or answer again: a device ignores a second PINGRESP
		}
		answered = true
		d.deadline = deadline // the poller reads for the connection now
		werr = p.watch(d, fd, deadline)
	}(int(d.fd.Load()))
	switch {
	case short: // half a packet written: the stream is broken
		d.closeLocked(0, errors.New("a PINGRESP written in part"))
		return true // closing woke the connection, to end
	case !answered:
		return false
	case werr != nil:
		return false // not watched: the connection needs its goroutine back
	}
	return true
}

// detachLocked holds the socket apart from its connection for parking: a
// descriptor of its own in d.fd, and the connection closed, which frees
// what Go's network poller kept for it; wmu is held.
func (d *device) detachLocked() error {
	raw, err := d.conn().(*net.TCPConn).SyscallConn()
	if err != nil {
		return err
	}
	var fd uintptr
	var errno syscall.Errno
	err = raw.Control(func(s uintptr) {
		fd, _, errno = syscall.Syscall(syscall.SYS_FCNTL, s, syscall.F_DUPFD_CLOEXEC, 3)
	})
	if err != nil {
		return err
	}
	if errno != 0 {
		return fmt.Errorf("dup: %w", errno)
	}
	_ = d.conn().Close() // the socket stays open: fd is another descriptor of it
	d.live.Store(nil)
	d.fd.Store(int32(fd))
	return nil
}

// attachLocked gives the socket held apart a connection again, as d.live;
// wmu is held. If it cannot, the socket is closed and so is the
// connection.
func (d *device) attachLocked() {
	fd := int(d.fd.Load())
	if fd == 0 {
		return
	}
	d.s.poller.unwatch(fd)
	f := os.NewFile(uintptr(fd), "mqtt")
	c, err := net.FileConn(f) // a descriptor of its own
	_ = f.Close()
	tc, ok := c.(*net.TCPConn)
	if err == nil && !ok {
		c.Close()
		err = fmt.Errorf("a %T, not TCP", c)
	}
	if err != nil {
		d.fd.Store(0) // closed with f
		d.closeLocked(0, fmt.Errorf("waking a parked connection: %w", err))
		return
	}
	d.live.Store(tc)
	d.writeBy = 0 // the new connection has no write deadline yet
	d.fd.Store(0) // after live: resume reads fd without wmu
}

// closeApartLocked closes the socket held apart while parked, sending
// disconnect first if there is one and it can go without waiting; wmu is
// held. Closing its last descriptor takes it out of the poller's epoll
// instance.
func (d *device) closeApartLocked(disconnect []byte) {
	if disconnect != nil {
		_, _ = syscall.Write(int(d.fd.Load()), disconnect)
	}
	_ = syscall.Close(int(d.fd.Load()))
	d.fd.Store(0)
}
