// Package remote is the wire of remote sessions (docs/agent.md, Remote
// access), shared by the three programs on it: fleetctl and the console on
// the operator's side, fleetd in the middle, fleetd-agent on the device.
// A session is a leg on each side of fleetd, a WebSocket or a stream
// (stream.go): binary messages carry the session's bytes (a terminal's, a
// TCP connection's, a file's), text messages carry Control messages as
// JSON. fleetd relays both as they are (Relay).
//
// The WebSocket library (gorilla/websocket, already in the module graph
// through the MQTT client) stays behind Conn, Dial and Upgrade.
package remote

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

// Control is a text message: what is not the session's bytes.
type Control struct {
	Type string `json:"type"`
	// resize (operator to device): the terminal's size.
	Cols int `json:"cols,omitempty"`
	Rows int `json:"rows,omitempty"`
	// exit (device to operator): the shell's or command's exit status, or
	// 0 for a file put that was written.
	Code int `json:"code"`
	// error (either way): why the session cannot go on.
	Message string `json:"message,omitempty"`
	// file (the sender of a file): its size in bytes.
	Size int64 `json:"size,omitempty"`
}

// The types of Control.
const (
	TypeResize = "resize"
	TypeExit   = "exit"
	TypeError  = "error"
	TypeEOF    = "eof" // no more bytes from this side (stdin closed, file sent, TCP half-close)
	TypeFile   = "file"
)

// MaxMessage is the largest message a side sends to one that did not say
// it reads more: agents and fleetctl from before the size was negotiated
// (and a browser's console) read messages of at most this, and so does a
// fleetd of then.
const MaxMessage = 32 << 10

// LargeMessage is the largest message this package's ends read, which
// each announces when its WebSocket is set up (MessageSizeHeader): a port
// forward or a file moves in a quarter of the messages (and system calls)
// of MaxMessage's. Larger would save little more and lend larger buffers
// to each message a busy relay holds.
const LargeMessage = 256 << 10

// MessageSizeHeader carries, on the WebSocket's upgrade request (from
// fleetctl and the agent) and on fleetd's answer, the largest message the
// side that sends it reads, in bytes. Each side sends messages of at most
// what the other announced, and of MaxMessage to one that announced
// nothing; fleetd splits the session's bytes to what the leg it writes to
// reads, so either leg may be old.
const MessageSizeHeader = "Fleetd-Remote-Max-Message"

// controlRoom is a read's room over a message's bytes for a control
// message's JSON.
const controlRoom = 1024

// maxRead is the read limit of either side: LargeMessage, and room for a
// control message.
const maxRead = LargeMessage + controlRoom

// Conn is one leg: a WebSocket or a stream. Reads are for one goroutine;
// writes may come from several.
type Conn struct {
	ws   *websocket.Conn // a WebSocket leg, or
	st   *stream         // a stream leg
	mu   sync.Mutex
	rbuf *[]byte // the last message read, until the next read
	// large: the last message read did not fit a small buffer, so the
	// next is read into a large one at once (a stream's messages are).
	large bool
	// peerMax is the largest message the other side reads: binary
	// messages are sent in pieces of at most this.
	peerMax int
	// closeBy is when reads end (unix nanoseconds), once this side has
	// said it sends no more (CloseWrite), and writes at the latest.
	closeBy atomic.Int64
}

// Read buffers are lent to a connection from the start of a message until
// the next read: a message is read in one piece without an allocation,
// and an idle connection, waiting for its next message, holds none. A
// message starts in a small buffer (a keystroke, a control, an old side's
// piece) and moves to a large one if it does not fit; a connection whose
// last message was large starts the next in a large one.
var (
	smallReads = sync.Pool{New: func() any { b := make([]byte, MaxMessage+controlRoom); return &b }}
	largeReads = sync.Pool{New: func() any { b := make([]byte, maxRead); return &b }}
)

// Stream reports whether c is a stream leg rather than a WebSocket.
func (c *Conn) Stream() bool { return c.st != nil }

// MaxSend returns the largest message c sends: what the other side said
// it reads, or MaxMessage. A reader of the session's bytes reads pieces
// of this size.
func (c *Conn) MaxSend() int { return c.peerMax }

// Read returns the next message: its bytes, or a control message. The
// bytes are valid until the next Read or ReadRaw.
func (c *Conn) Read() (data []byte, ctl *Control, err error) {
	binary, b, err := c.ReadRaw()
	if err != nil || binary {
		return b, nil, err
	}
	var m Control
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, nil, fmt.Errorf("a control message that is not JSON: %w", err)
	}
	return nil, &m, nil
}

// ReadRaw returns the next message as it came, for a relay. Its bytes are
// valid until the next Read or ReadRaw.
func (c *Conn) ReadRaw() (binary bool, data []byte, err error) {
	c.release()
	if c.st != nil {
		typ, n, err := c.st.next()
		if err != nil {
			return false, nil, err
		}
		b, err := c.readBody(n, c.st)
		return typ == StreamBytes, b, err
	}
	t, r, err := c.ws.NextReader()
	if err != nil {
		return false, nil, err
	}
	if c.large {
		c.rbuf = largeReads.Get().(*[]byte)
	} else {
		c.rbuf = smallReads.Get().(*[]byte)
	}
	// The read limit keeps a message within the large buffer.
	n, err := io.ReadFull(r, *c.rbuf)
	if err == nil && len(*c.rbuf) < maxRead {
		// A small buffer full: the message may go on.
		large := largeReads.Get().(*[]byte)
		copy(*large, (*c.rbuf)[:n])
		c.release()
		c.rbuf = large
		var m int
		m, err = io.ReadFull(r, (*large)[n:])
		n += m
	}
	if err == io.ErrUnexpectedEOF || err == io.EOF {
		err = nil
	}
	c.large = n > MaxMessage+controlRoom
	return t == websocket.BinaryMessage, (*c.rbuf)[:n], err
}

// readBody reads a stream message's n bytes into a pooled buffer, lent
// until the next read.
func (c *Conn) readBody(n int, r io.Reader) ([]byte, error) {
	c.release()
	if n > MaxMessage+controlRoom {
		c.rbuf = largeReads.Get().(*[]byte)
	} else {
		c.rbuf = smallReads.Get().(*[]byte)
	}
	_, err := io.ReadFull(r, (*c.rbuf)[:n])
	if err == io.ErrUnexpectedEOF || err == io.EOF && n > 0 {
		err = errMidMessage
	}
	return (*c.rbuf)[:n], err
}

// errMidMessage is a read's end when the connection ended within a
// message.
var errMidMessage = errors.New("the connection ended within a message")

// release returns the last message's buffer to its pool.
func (c *Conn) release() {
	if c.rbuf == nil {
		return
	}
	if len(*c.rbuf) == maxRead {
		largeReads.Put(c.rbuf)
	} else {
		smallReads.Put(c.rbuf)
	}
	c.rbuf = nil
}

// WriteRaw sends a message as it came, for a relay: binary messages
// larger than the other side reads go in pieces it does (the session's
// bytes are a stream; their cut into messages means nothing).
func (c *Conn) WriteRaw(binary bool, data []byte) error {
	t := websocket.TextMessage
	if binary {
		t = websocket.BinaryMessage
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.st != nil {
		c.st.nc.SetWriteDeadline(c.writeDeadline())
		typ := byte(StreamControl)
		if binary {
			typ = StreamBytes
		}
		for binary && len(data) > c.peerMax {
			if err := c.st.write(typ, data[:c.peerMax]); err != nil {
				return err
			}
			data = data[c.peerMax:]
		}
		return c.st.write(typ, data)
	}
	c.ws.SetWriteDeadline(c.writeDeadline())
	for binary && len(data) > c.peerMax {
		if err := c.ws.WriteMessage(t, data[:c.peerMax]); err != nil {
			return err
		}
		data = data[c.peerMax:]
	}
	return c.ws.WriteMessage(t, data)
}

// writeDeadline is a write's: writeTimeout from now, or the patience's
// end once this side has said it sends no more (CloseWrite).
func (c *Conn) writeDeadline() time.Time {
	d := time.Now().Add(writeTimeout())
	if by := c.closeBy.Load(); by != 0 && by < d.UnixNano() {
		return time.Unix(0, by)
	}
	return d
}

// writeTimeout bounds one write: a peer that reads nothing for this long
// is gone. 30 seconds; tests shorten it.
func writeTimeout() time.Duration { return time.Duration(writeTimeoutNanos.Load()) }

var writeTimeoutNanos atomic.Int64

func init() { writeTimeoutNanos.Store(int64(30 * time.Second)) }

// Write sends bytes.
func (c *Conn) Write(data []byte) error { return c.WriteRaw(true, data) }

// Send sends a control message.
func (c *Conn) Send(m Control) error {
	b, _ := json.Marshal(m)
	return c.WriteRaw(false, b)
}

// Pump sends what r reads as the session's bytes, in messages of at most
// MaxSend, and an eof message when r ends. It returns when r ends or a
// write fails.
func (c *Conn) Pump(r io.Reader) error {
	buf := make([]byte, c.peerMax)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if werr := c.Write(buf[:n]); werr != nil {
				return werr
			}
		}
		if err != nil {
			c.Send(Control{Type: TypeEOF})
			if err == io.EOF {
				return nil
			}
			return err
		}
	}
}

// Close sends a normal closure and closes the connection. A stream's
// closure is its connection's end after a whole message; its lock is not
// waited for, so that closing ends a message being spliced to it.
func (c *Conn) Close() error {
	if c.st != nil {
		return c.st.nc.Close()
	}
	c.mu.Lock()
	c.ws.SetWriteDeadline(time.Now().Add(time.Second))
	c.ws.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""))
	c.mu.Unlock()
	return c.ws.Close()
}

// CloseWrite says that this side sends no more and leaves the leg to be
// read until the other side closes it: a stream's connection is
// half-closed (shutdown(SHUT_WR), or TLS's close_notify), a WebSocket's
// close message is sent, after the message being written, if one is
// (under the writers' lock: never within it). fleetd ends a session when
// either leg ends, and closes the operator's leg only once the end is
// recorded (docs/agent.md, Caps): an operator that reads its leg to its
// close (Finish) then knows the session no longer counts. Reads after it
// end at patience's end (os.ErrDeadlineExceeded) if the other side has
// not closed by then; a later CloseWrite or Finish may shorten that time,
// never lengthen it: one patience in all. A message being written gets
// until then too.
func (c *Conn) CloseWrite(patience time.Duration) error {
	by := time.Now().Add(patience).UnixNano()
	for {
		old := c.closeBy.Load()
		if old != 0 && old <= by {
			by = old
			break
		}
		if c.closeBy.CompareAndSwap(old, by) {
			break
		}
	}
	deadline := time.Unix(0, by)
	var nc interface {
		SetReadDeadline(time.Time) error
		SetWriteDeadline(time.Time) error
	} = c.ws
	if c.st != nil {
		nc = c.st.nc
	}
	nc.SetReadDeadline(deadline)
	if !c.mu.TryLock() {
		// A message is being written: it has until then.
		nc.SetWriteDeadline(deadline)
		c.mu.Lock()
	}
	defer c.mu.Unlock()
	if c.st != nil {
		if cw, ok := c.st.nc.(interface{ CloseWrite() error }); ok {
			return cw.CloseWrite()
		}
		return c.st.nc.Close()
	}
	c.ws.SetWriteDeadline(time.Now().Add(time.Second))
	return c.ws.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""))
}

// Finish ends the session from this side once it has what it wanted
// (CloseWrite), reads and drops what still comes until the other side
// closes the leg, and closes it. It returns nil once the other side
// closed it (or the connection failed: it is gone either way), or
// os.ErrDeadlineExceeded when patience passed first.
func (c *Conn) Finish(patience time.Duration) error {
	defer c.Close()
	c.CloseWrite(patience)
	for {
		if _, _, err := c.ReadRaw(); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return err
			}
			return nil
		}
	}
}

// Closed reports whether err is the end of the connection rather than a
// failure of it.
func Closed(err error) bool {
	return errors.Is(err, io.EOF) || websocket.IsCloseError(err, websocket.CloseNormalClosure, websocket.CloseGoingAway)
}

// Write buffers are lent to a connection while it writes a message, so
// an idle session holds none. fleetd's side (not masked) sends a message's
// bytes from where they are, in one system call with the frame's header
// (gorilla copies into the buffer only what fits, and writes the rest
// beside it): its buffer is small, for headers and control messages.
// fleetctl's and the agent's side mask what they send (RFC 6455, 5.3),
// which gorilla does in the buffer: it holds a whole message, so a
// message is one frame and one write.
var (
	serverWrites = &sync.Pool{}
	clientWrites = &sync.Pool{}
)

// serverWriteBuffer is the size of fleetd's side's write buffer.
const serverWriteBuffer = 2 << 10

// fleetd's side reads through the HTTP server's own buffer (a read
// buffer size of 0 reuses it): an idle session's legs hold no other.
var upgrader = websocket.Upgrader{
	WriteBufferSize: serverWriteBuffer, WriteBufferPool: serverWrites,
	// Programs (fleetctl, fleetd-agent) send no Origin; a browser's must be
	// this host's, so that another site's page cannot open a session with
	// its visitor's console cookie.
	CheckOrigin: func(r *http.Request) bool {
		o := r.Header.Get("Origin")
		if o == "" {
			return true
		}
		_, host, _ := strings.Cut(o, "://")
		return strings.EqualFold(host, r.Host)
	},
}

// peerMax reads the size the other side announced in h, or MaxMessage.
func peerMax(h http.Header) int {
	n, err := strconv.Atoi(h.Get(MessageSizeHeader))
	if err != nil || n < MaxMessage {
		return MaxMessage
	}
	return min(n, LargeMessage)
}

// Upgrade answers an HTTP request with a leg: a stream if it asks for
// one (StreamProtocol), else a WebSocket. w may be a wrapper that
// reaches the connection through Unwrap, as fleetd's are.
func Upgrade(w http.ResponseWriter, r *http.Request) (*Conn, error) {
	if asksStream(r.Header) {
		return upgradeStream(w, r)
	}
	ws, err := upgrader.Upgrade(hijacker{w}, r, http.Header{MessageSizeHeader: {strconv.Itoa(LargeMessage)}})
	if err != nil {
		return nil, err
	}
	ws.SetReadLimit(maxRead)
	// The other side's close is answered when this side closes (Close),
	// not at once as the library would: fleetd closes an operator's leg
	// once it has recorded the session's end, which the operator waits
	// for (CloseWrite).
	ws.SetCloseHandler(func(int, string) error { return nil })
	return &Conn{ws: ws, peerMax: peerMax(r.Header)}, nil
}

// hijacker lends the library, which asks for an http.Hijacker, the
// connection under any wrappers.
type hijacker struct{ http.ResponseWriter }

func (h hijacker) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(h.ResponseWriter).Hijack()
}

// IsUpgrade reports whether r asks for a leg: a WebSocket or a stream.
func IsUpgrade(r *http.Request) bool {
	return websocket.IsWebSocketUpgrade(r) || IsStream(r)
}

// RefusedError is fleetd's answer to a session it refused: the HTTP status
// and the message of its error body.
type RefusedError struct {
	Status  int
	Message string
}

func (e *RefusedError) Error() string { return e.Message }

// Dial opens a WebSocket to url (http or https; ws and wss too) with
// header, trusting tc's roots over TLS (nil: the system's). A refusal is a
// *RefusedError with the server's message.
func Dial(ctx context.Context, url string, header http.Header, tc *tls.Config) (*Conn, error) {
	url = strings.Replace(strings.Replace(url, "https://", "wss://", 1), "http://", "ws://", 1)
	// fleetctl and the agent hold a session or two each: a read buffer of
	// two small messages takes what the socket has in one system call (a
	// large message's bytes past it are read straight into its buffer).
	d := websocket.Dialer{HandshakeTimeout: 30 * time.Second, ReadBufferSize: 2 * (MaxMessage + controlRoom),
		WriteBufferSize: maxRead, WriteBufferPool: clientWrites, TLSClientConfig: tc}
	if header = header.Clone(); header == nil {
		header = http.Header{}
	}
	header.Set(MessageSizeHeader, strconv.Itoa(LargeMessage))
	ws, resp, err := d.DialContext(ctx, url, header)
	if err != nil {
		if resp != nil {
			defer resp.Body.Close()
			return nil, refusal(resp)
		}
		return nil, err
	}
	ws.SetReadLimit(maxRead)
	return &Conn{ws: ws, peerMax: peerMax(resp.Header)}, nil
}
