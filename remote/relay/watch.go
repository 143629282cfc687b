package relay

import (
	"bytes"
	"sync"

	"github.com/fleetd/fleet/remote"
)

// watchHeld is how much of what the operator sends a session holds while
// it awaits the device (a stream's bytes read ahead, a WebSocket's
// messages); beyond it the rest waits in the leg, unread, and the leg's
// end is no longer seen before the device comes.
const watchHeld = 1 << 20

// heldMessage is one of the operator's messages read before the device
// came, to be passed on when it does.
type heldMessage struct {
	binary bool
	b      []byte
}

// opWatch reads the operator's leg while the session awaits the device's,
// so that an operator that leaves (an interrupted fleetctl half-closes its
// leg) ends the session at once rather than when the device's time is up.
// What the operator sends meanwhile (a terminal's size, a file's first
// bytes) is held and passed on when the device comes (handOver), as it
// would have been then; the goroutine that reads the leg goes on as its
// relay's.
type opWatch struct {
	op   *remote.Conn
	gone chan struct{} // closed when the leg ended before the device came
	// came is closed once the held messages are passed on (relay is
	// set), or the session ended without the device (relay is nil).
	came  chan struct{}
	relay func(held bool, binary bool, b []byte, err error)

	mu     sync.Mutex
	handed bool // the held messages were passed on: the reader passes its own
	held   []heldMessage
	size   int
	err    error // the leg's end, once it came
}

func watchOperator(op *remote.Conn) *opWatch {
	w := &opWatch{op: op, gone: make(chan struct{}), came: make(chan struct{})}
	go w.read()
	return w
}

// read reads the leg until it ends, the held messages reach watchHeld or
// the device comes; then it hands over to the relay, if there is one. A
// stream's bytes are read ahead into its buffer (remote.Conn.ReadAhead),
// to be relayed from there as if they came then; a WebSocket's messages
// are held.
func (w *opWatch) read() {
	stream := w.op.Stream()
	for {
		var binary bool
		var b []byte
		var err error
		full := false
		if stream {
			var n int
			n, err = w.op.ReadAhead(watchHeld)
			full = n >= watchHeld
		} else {
			binary, b, err = w.op.ReadRaw()
		}
		w.mu.Lock()
		if w.handed {
			w.mu.Unlock()
			<-w.came
			if stream {
				// What was read ahead is relayed first; the leg's
				// end, if it came, is read again after it.
				w.op.StopReadAhead(false)
				w.relay(true, false, nil, nil)
				return
			}
			w.relay(false, binary, b, err)
			return
		}
		if err != nil {
			w.err = err
			w.mu.Unlock()
			close(w.gone)
			break
		}
		if !stream {
			w.held = append(w.held, heldMessage{binary, bytes.Clone(b)})
			w.size += len(b)
			full = w.size >= watchHeld
		}
		w.mu.Unlock()
		if full {
			break
		}
	}
	// The reader stops here: what is held, and the leg's end if it
	// came, are passed on by handOver.
	<-w.came
	if w.relay != nil {
		w.mu.Lock()
		err := w.err
		w.mu.Unlock()
		if stream {
			w.op.StopReadAhead(false)
			err = nil
		}
		w.relay(true, false, nil, err)
	}
}

// handOver passes the held messages on with pass, and has relay read the
// leg on: relay is called once, by the reader, with its message in hand
// (held false) or with none (held true: the reader had stopped, err its
// end if it came, else nil and relay reads on). A nil relay says the
// device did not come: the reader stops, its message dropped.
// It returns pass's failure, if one did.
func (w *opWatch) handOver(pass func(binary bool, b []byte) error, relay func(held bool, binary bool, b []byte, err error)) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	defer close(w.came)
	w.handed = true
	if w.op.Stream() {
		w.op.StopReadAhead(true)
	}
	if relay == nil {
		w.relay = func(bool, bool, []byte, error) {}
		return nil
	}
	w.relay = relay
	held := w.held
	w.held = nil
	for _, m := range held {
		if err := pass(m.binary, m.b); err != nil {
			return err
		}
	}
	return nil
}
