package broker

import (
	"bufio"
	"errors"
	"net"
	"sync"
)

// Parking: an idle connection holds no goroutine and no read buffer.
//
// A connection's goroutine blocked in a read keeps its stack (4 KiB once it
// has handled a publish) and its 1 KiB read buffer: with the device's state
// and the socket, about 12 KB of fleetd's memory for a device that says
// nothing (10 KB measured before parking; Mosquitto 0.7 to 1.8 KB). So a
// connection with nothing buffered that stays silent for ParkAfter parks:
// its read buffer goes back to a pool, its socket is watched by the server's
// poller (epoll, one goroutine for all), and its goroutine ends. What is
// left is the device's state and the socket (BENCHMARKS.md).
//
// A parked connection is woken, on a new goroutine with a buffer from the
// pool, by whichever comes first: its socket readable (a packet, or the
// device closing it), its keepalive deadline (the poller looks once a
// second), or the server closing it.
// Writes to the device (actions, SendAction) never needed the reading
// goroutine and go on while it is parked. Only plain TCP connections park:
// a TLS connection may hold decrypted bytes its socket no longer shows.

// readers are the read buffers of connections that are reading.
var readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, readBufferSize) }}

func getReader(nc net.Conn) *bufio.Reader {
	r := readers.Get().(*bufio.Reader)
	r.Reset(nc)
	return r
}

func putReader(r *bufio.Reader) {
	r.Reset(nil)
	readers.Put(r)
}

// errParked ends a readLoop whose connection parked: it is not over.
var errParked = errors.New("parked")

// serve reads and handles the device's packets until the connection ends,
// then unregisters it and ends its handling; or until it parks.
func (d *device) serve(r *bufio.Reader) {
	err := d.readLoop(r)
	if err == errParked {
		return
	}
	putReader(r)
	d.end(err)
	d.s.unregister(d)
	d.done(nil)
}

// idleWait waits ParkAfter for the device's next packet, with nothing
// buffered, and parks the connection if none came. It returns errParked
// once parked, nil when there is a packet to read (or the connection could
// not park), and the read's error if the connection failed.
func (d *device) idleWait(r *bufio.Reader) error {
	grace := monoNow() + int64(d.s.cfg.ParkAfter)
	if grace >= d.deadline {
		return nil // the keepalive's deadline comes first
	}
	_ = d.conn().SetReadDeadline(monoTime(grace))
	if _, err := r.Peek(1); err == nil || !isTimeout(err) {
		return err
	}
	if d.park(r) {
		return errParked
	}
	return nil
}

// isTimeout reports whether err is a read's deadline passing. Its own
// function, so that the error it looks into is allocated only when there is
// one: idleWait runs before every packet of a busy device.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// park hands the socket to the poller and reports true; from then on the
// calling goroutine must not touch the device: a wake may already have
// started another. It reports false if the socket cannot be watched: the
// goroutine reads on, from r.
//
// The socket is held apart from its net.Conn while parked (detachLocked):
// the connection is closed, which gives Go's network poller back its poll
// descriptor (about 300 bytes off the heap, with its deadline timers) and
// the connection's finalizer, half a kilobyte a parked connection that the
// runtime would otherwise keep (docs/benchmarks-notebook.md, "Idle
// connections: what a start pays once"). Waking rebuilds a net.Conn around
// the socket: a few more system calls a wake.
func (d *device) park(r *bufio.Reader) bool {
	p := d.s.poller
	d.wmu.Lock()
	defer d.wmu.Unlock()
	if d.closed.Load() {
		return false // the reader finds it closed
	}
	if err := d.detachLocked(); err != nil {
		d.s.log.Debug("mqtt: cannot park an idle connection; it keeps its goroutine", "tenant", d.tenant, "device", d.id, "err", err)
		return false
	}
	d.parked.Store(true)
	if err := p.watch(d, int(d.fd.Load()), d.deadline); err != nil && d.parked.CompareAndSwap(true, false) {
		d.s.log.Debug("mqtt: cannot park an idle connection; it keeps its goroutine", "tenant", d.tenant, "device", d.id, "err", err)
		d.attachLocked()
		r.Reset(d.conn())
		return false
	}
	// Parked, or woken already (and read on by the waker's goroutine,
	// once wmu is free).
	putReader(r)
	return true
}

// wake resumes a parked connection on a goroutine of its own; it does
// nothing to one that is not parked.
func (d *device) wake() {
	if !d.parked.CompareAndSwap(true, false) {
		return
	}
	d.s.poller.forget(d)
	go d.resume()
}

// resume gives a woken connection's socket its net.Conn back, and reads on.
// A connection woken by a write to it has it back already: its reading does
// not wait behind the write (to a device that does not read, up to
// WriteTimeout).
func (d *device) resume() {
	if d.fd.Load() != 0 {
		d.wmu.Lock()
		d.attachLocked()
		d.wmu.Unlock()
	}
	d.serve(getReader(d.conn()))
}
