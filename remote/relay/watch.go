package relay

import (
	"bytes"

	"github.com/fleetd/fleet/remote"
)

// watchHeld is how much of what the operator sends a session holds while
// it awaits the device (a stream's bytes read ahead, a WebSocket's
// messages); beyond it the rest waits in the leg, unread, and the leg's
// end is no longer seen before the device comes.
const watchHeld = 1 << 20

// opRead is what one read of the operator's leg gave while the device was
// awaited: a WebSocket's message, or the leg's end (err).
type opRead struct {
	binary bool
	b      []byte
	err    error
}

// opWatch reads the operator's leg while the session awaits the device's,
// so that an operator that leaves (an interrupted fleetctl half-closes its
// leg) ends the session at once rather than when the device's time is up.
// One goroutine reads the leg and delivers what it reads, in order, on
// reads: the relay takes each while it awaits the device, holding the
// messages (a terminal's size, a file's first bytes) and ending the
// session at the leg's end; once the device came it passes on what it
// holds (handOver), then what the reader read before it stopped (rest),
// as they would have been then, and relays the leg from there. A stream's
// bytes are read ahead into the leg's buffer instead (remote.Conn.ReadAhead),
// to be relayed or spliced from there as if they came then: its reader
// delivers only the leg's end.
type opWatch struct {
	op    *remote.Conn
	reads chan opRead   // the reader's deliveries; closed when it stopped
	stop  chan struct{} // closed when the device came, or the session ended without it
	held  []opRead      // the messages the relay took while it awaited
}

func watchOperator(op *remote.Conn) *opWatch {
	w := &opWatch{op: op, reads: make(chan opRead), stop: make(chan struct{})}
	go w.read()
	return w
}

// read reads the leg until it ends, what it read reaches watchHeld or the
// reader is stopped; a read under way when it is (a WebSocket's: until
// the operator's next message) is delivered still.
func (w *opWatch) read() {
	defer close(w.reads)
	stream := w.op.Stream()
	for size := 0; size < watchHeld; {
		var r opRead
		deliver := true
		if stream {
			size, r.err = w.op.ReadAhead(watchHeld)
			// Stopped, the end is the stop's (a past deadline) or is read
			// again by the relay after the bytes read ahead.
			deliver = r.err != nil && !w.stopped()
		} else {
			r.binary, r.b, r.err = w.op.ReadRaw()
			r.b = bytes.Clone(r.b) // ReadRaw's buffer is lent until the next read
			size += len(r.b)
		}
		if deliver {
			w.reads <- r
		}
		if r.err != nil || w.stopped() {
			return
		}
	}
	// Full: the rest waits in the leg, unread, until the reader is stopped.
	<-w.stop
}

// stopped reports whether the reader was stopped.
func (w *opWatch) stopped() bool {
	select {
	case <-w.stop:
		return true
	default:
		return false
	}
}

// stopReading has the reader stop after the read under way; a stream's
// ends at once (StopReadAhead).
func (w *opWatch) stopReading() {
	close(w.stop)
	if w.op.Stream() {
		w.op.StopReadAhead(true)
	}
}

// drop ends the watch of a session whose device did not come: the reader
// stops, and what it delivers still is dropped.
func (w *opWatch) drop() {
	w.stopReading()
	go w.discard()
}

// discard takes the reader's deliveries, to drop them, until it stopped.
func (w *opWatch) discard() {
	for range w.reads {
	}
}

// handOver ends the watch once the device came: it stops the reader and
// passes on with pass the messages held. It returns pass's failure, if
// one did, and then what the reader delivers still is dropped; else rest
// passes on that.
func (w *opWatch) handOver(pass func(binary bool, b []byte) error) error {
	w.stopReading()
	held := w.held
	w.held = nil
	for _, m := range held {
		if err := pass(m.binary, m.b); err != nil {
			go w.discard()
			return err
		}
	}
	return nil
}

// rest passes on with pass what the reader delivers after handOver, and
// returns once the reader stopped, when the leg may be read from where it
// left off: nil, the leg's end if the reader met it (a stream's is read
// again after the bytes read ahead) or pass's failure (remote.WriteError).
func (w *opWatch) rest(pass func(binary bool, b []byte) error) error {
	stream := w.op.Stream()
	for r := range w.reads {
		if stream {
			continue // the leg's end, read again after the bytes read ahead
		}
		if r.err != nil {
			return r.err // the reader stopped at it
		}
		if err := pass(r.binary, r.b); err != nil {
			go w.discard()
			return &remote.WriteError{Err: err}
		}
	}
	if stream {
		w.op.StopReadAhead(false)
	}
	return nil
}
