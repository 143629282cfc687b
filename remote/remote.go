// Package remote is the wire of remote sessions (docs/agent.md, Remote
// access), shared by the three programs on it: fleetctl and the console on
// the operator's side, fleetd in the middle, fleetd-agent on the device.
// A session is a WebSocket on each side of fleetd: binary messages carry
// the session's bytes (a terminal's, a TCP connection's, a file's), text
// messages carry Control messages as JSON. fleetd relays both as they are.
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
	"strings"
	"sync"
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

// MaxMessage is the largest message either side may send: a read of a
// terminal, a socket or a file goes in pieces of at most this.
const MaxMessage = 32 << 10

// maxRead is the read limit of either side: MaxMessage, and room for a
// control message's JSON.
const maxRead = MaxMessage + 1024

// Conn is one WebSocket. Reads are for one goroutine; writes may come
// from several.
type Conn struct {
	ws   *websocket.Conn
	mu   sync.Mutex
	rbuf *[]byte // the last message read, until the next read
}

// readBuffers are lent to a connection from the start of a message until
// the next read: a message is read in one piece without an allocation,
// and an idle connection, waiting for its next message, holds none.
var readBuffers = sync.Pool{New: func() any { b := make([]byte, maxRead); return &b }}

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
	if c.rbuf != nil {
		readBuffers.Put(c.rbuf)
		c.rbuf = nil
	}
	t, r, err := c.ws.NextReader()
	if err != nil {
		return false, nil, err
	}
	c.rbuf = readBuffers.Get().(*[]byte)
	// The read limit keeps a message within the buffer.
	n, err := io.ReadFull(r, *c.rbuf)
	if err == io.ErrUnexpectedEOF || err == io.EOF {
		err = nil
	}
	return t == websocket.BinaryMessage, (*c.rbuf)[:n], err
}

// WriteRaw sends a message as it came, for a relay.
func (c *Conn) WriteRaw(binary bool, data []byte) error {
	t := websocket.TextMessage
	if binary {
		t = websocket.BinaryMessage
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ws.SetWriteDeadline(time.Now().Add(writeTimeout))
	return c.ws.WriteMessage(t, data)
}

// writeTimeout bounds one write: a peer that reads nothing for this long
// is gone.
const writeTimeout = 30 * time.Second

// Write sends bytes.
func (c *Conn) Write(data []byte) error { return c.WriteRaw(true, data) }

// Send sends a control message.
func (c *Conn) Send(m Control) error {
	b, _ := json.Marshal(m)
	return c.WriteRaw(false, b)
}

// Pump sends what r reads as the session's bytes, in messages of at most
// MaxMessage, and an eof message when r ends. It returns when r ends or a
// write fails.
func (c *Conn) Pump(r io.Reader) error {
	buf := make([]byte, MaxMessage)
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

// Close sends a normal closure and closes the connection.
func (c *Conn) Close() error {
	c.mu.Lock()
	c.ws.SetWriteDeadline(time.Now().Add(time.Second))
	c.ws.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""))
	c.mu.Unlock()
	return c.ws.Close()
}

// Closed reports whether err is the end of the connection rather than a
// failure of it.
func Closed(err error) bool {
	return errors.Is(err, io.EOF) || websocket.IsCloseError(err, websocket.CloseNormalClosure, websocket.CloseGoingAway)
}

// writeBuffers are lent to a connection while it writes a message, so an
// idle session holds none: a message goes out in one frame and one write
// (MaxMessage and its header) at no cost to idle sessions' memory.
var writeBuffers = &sync.Pool{}

// fleetd's side reads through the HTTP server's own buffer (a read
// buffer size of 0 reuses it): an idle session's legs hold no other.
var upgrader = websocket.Upgrader{
	WriteBufferSize: maxRead, WriteBufferPool: writeBuffers,
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

// Upgrade answers an HTTP request with a WebSocket. w may be a wrapper
// that reaches the connection through Unwrap, as fleetd's are.
func Upgrade(w http.ResponseWriter, r *http.Request) (*Conn, error) {
	ws, err := upgrader.Upgrade(hijacker{w}, r, nil)
	if err != nil {
		return nil, err
	}
	ws.SetReadLimit(maxRead)
	return &Conn{ws: ws}, nil
}

// hijacker lends the library, which asks for an http.Hijacker, the
// connection under any wrappers.
type hijacker struct{ http.ResponseWriter }

func (h hijacker) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(h.ResponseWriter).Hijack()
}

// IsUpgrade reports whether r asks for a WebSocket.
func IsUpgrade(r *http.Request) bool { return websocket.IsWebSocketUpgrade(r) }

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
	// two messages takes what the socket has in one system call.
	d := websocket.Dialer{HandshakeTimeout: 30 * time.Second, ReadBufferSize: 2 * maxRead,
		WriteBufferSize: maxRead, WriteBufferPool: writeBuffers, TLSClientConfig: tc}
	ws, resp, err := d.DialContext(ctx, url, header)
	if err != nil {
		if resp != nil {
			defer resp.Body.Close()
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			var e struct {
				Message string `json:"message"`
			}
			if json.Unmarshal(b, &e) != nil || e.Message == "" {
				e.Message = strings.TrimSpace(string(b))
			}
			if e.Message == "" {
				e.Message = resp.Status
			}
			return nil, &RefusedError{Status: resp.StatusCode, Message: e.Message}
		}
		return nil, err
	}
	ws.SetReadLimit(maxRead)
	return &Conn{ws: ws}, nil
}
