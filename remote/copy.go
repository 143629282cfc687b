package remote

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"
)

// The one way a session's messages are passed on: fleetd from leg to leg
// (Relay), fleetctl and the agent between a leg and a local TCP
// connection (Join). A stream leg's bytes go from socket to socket by
// splice(2) where both ends are TCP without TLS and nobody needs to see
// them (a recording does): spliceN, through a pipe, one message at a
// time, so the counts and the idle clock move with each message (at most
// LargeMessage bytes), and a failure is known for the sender's (its read)
// or the receiver's (its write).

// spliceMin is the smallest message whose bytes are spliced: a smaller
// one (a keystroke, a terminal's line) is read and written with its
// header in one system call, so that the other side wakes once for it.
const spliceMin = 16 << 10

// pass reads c's messages until a read fails, handing each to give. A
// message is in memory (b, lent until give returns), except a stream's
// bytes when splice says they may be copied from its connection and
// they are at least spliceMin: then body holds its n bytes, which give
// must consume (read or splice).
func (c *Conn) pass(splice func() bool, give func(binary bool, b []byte, n int, body *msgBody) error) error {
	for {
		if c.st != nil && c.st.tcp != nil && splice() {
			typ, n, err := c.st.next()
			if err != nil {
				return err
			}
			if typ == StreamBytes && n >= spliceMin {
				if err := give(true, nil, n, c.st.body(n)); err != nil {
					return err
				}
				continue
			}
			b, err := c.readBody(n, c.st)
			if err != nil {
				return err
			}
			if err := give(typ == StreamBytes, b, n, nil); err != nil {
				return err
			}
			continue
		}
		binary, b, err := c.ReadRaw()
		if err != nil {
			return err
		}
		if err := give(binary, b, len(b), nil); err != nil {
			return err
		}
	}
}

// WriteError is Relay's end when the leg written to took no more.
type WriteError struct{ Err error }

func (e *WriteError) Error() string { return "write failed: " + e.Err.Error() }
func (e *WriteError) Unwrap() error { return e.Err }

// Relay passes from's messages to to until reading from fails (that
// error) or writing to does (a *WriteError). seen is told of each message
// (binary, its length) once passed, with its bytes when it was read into
// memory; look, when it reports true, asks that the bytes be (a recording
// wants them), else two stream legs on TCP splice them, but for a message
// larger than to reads (MessageSizeHeader), which is read and cut to its
// size.
func Relay(to, from *Conn, look func() bool, seen func(binary bool, n int, b []byte)) error {
	splice := func() bool { return to.st != nil && to.st.tcp != nil && !look() }
	return from.pass(splice, func(binary bool, b []byte, n int, body *msgBody) error {
		if body != nil && n > to.peerMax {
			// The leg written to reads smaller messages than this one
			// (it said so, MessageSizeHeader): the bytes are read and
			// cut to its size, as a WebSocket's are.
			b, err := from.readBody(n, body)
			if err != nil {
				return err
			}
			if err := to.WriteRaw(true, b); err != nil {
				return &WriteError{err}
			}
			seen(true, n, b)
			return nil
		}
		if body != nil {
			// A sender that stops within a message must not hold the
			// leg written to (its lock) for ever: the message comes
			// within the time its write has.
			timeout := writeTimeout()
			from.st.nc.SetReadDeadline(time.Now().Add(timeout))
			written, rerr, werr := to.spliceMessage(StreamBytes, body)
			from.st.nc.SetReadDeadline(time.Time{})
			if written > 0 {
				seen(true, int(written), nil)
			}
			if werr != nil {
				return &WriteError{werr}
			}
			if errors.Is(rerr, os.ErrDeadlineExceeded) {
				return fmt.Errorf("the sender stopped within a message for %s: %w", timeout, rerr)
			}
			return rerr
		}
		if err := to.WriteRaw(binary, b); err != nil {
			return &WriteError{err}
		}
		seen(binary, n, b)
		return nil
	})
}

// Join joins a session to a local TCP connection both ways, as the two
// ends of a port forward do: what tcp reads is sent (an eof message when
// it ends), the session's bytes are written to it (spliced from a stream
// leg on TCP), the other side's eof half-closes it. Once both ways have
// ended it says it sends no more (CloseWrite), which ends the session,
// and reads on until fleetd closes the leg, which fleetd does to the
// operator's once it has recorded the end. It returns when the session's
// messages end (so, or otherwise) or tcp takes no more: nil, or an error
// message that came (fleetd's, or the other side's, such as a port that
// refused).
// tcp's socket buffers are set to localBuffer.
func (c *Conn) Join(tcp *net.TCPConn) error {
	tcp.SetReadBuffer(localBuffer)
	tcp.SetWriteBuffer(localBuffer)
	var mu sync.Mutex
	var sent, got bool // our eof, the other side's
	go func() {
		if c.Pump(tcp) != nil {
			return
		}
		mu.Lock()
		sent = true
		both := got
		mu.Unlock()
		if both {
			c.CloseWrite(joinPatience)
		}
	}()
	always := func() bool { return true }
	err := c.pass(always, func(binary bool, b []byte, n int, body *msgBody) error {
		if binary && body != nil {
			_, rerr, werr := body.spliceTo(tcp)
			if werr != nil {
				return errTCPWrite
			}
			return rerr
		}
		if binary {
			if _, err := tcp.Write(b); err != nil {
				return errTCPWrite
			}
			return nil
		}
		var m Control
		if err := json.Unmarshal(b, &m); err != nil {
			return fmt.Errorf("a control message that is not JSON: %w", err)
		}
		switch m.Type {
		case TypeEOF:
			tcp.CloseWrite()
			mu.Lock()
			got = true
			both := sent
			mu.Unlock()
			if both {
				c.CloseWrite(joinPatience)
			}
		case TypeError:
			return &sessionError{m.Message}
		}
		return nil
	})
	var se *sessionError
	if errors.As(err, &se) {
		return errors.New(se.msg)
	}
	return nil
}

// joinPatience is how long Join waits, once both ways have ended, for
// the leg's close.
const joinPatience = time.Minute

// localBuffer is the size Join sets a local connection's socket buffers
// to (the kernel doubles it), both ways, rather than leave them to the
// kernel's autotuning: on loopback, where fleetctl's and the agent's
// local connections are, a bulk forward grew them to megabytes (send
// queues of 4 MB, receive buffers of up to 16 MB), and each byte was read
// from memory long out of cache. Half a MiB keeps what is in flight
// within the caches at no cost in throughput (a loopback round trip is
// microseconds): a forwarded MiB took 7-10% less CPU. The legs to fleetd
// keep the kernel's sizes: over a network they need them
// (docs/benchmarks-notebook.md, "A forward's local connections").
const localBuffer = 256 << 10

// errTCPWrite ends Join when the local connection takes no more.
var errTCPWrite = errors.New("the local connection took no more")

// sessionError is an error message that came on the session.
type sessionError struct{ msg string }

func (e *sessionError) Error() string { return e.msg }
