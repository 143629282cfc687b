package remote

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// A stream leg (docs/agent.md, The session's messages) is an HTTP/1.1
// Upgrade to StreamProtocol rather than to a WebSocket: the same messages,
// each a five-byte header (its type, StreamBytes or StreamControl, and its
// length, big-endian) and its bytes, neither masked nor framed further.
// fleetctl and the agent offer it; fleetd accepts it, and relays between
// two stream legs on TCP by splice(2) (Relay), each message's bytes going
// from one socket to the other without being read into fleetd; the
// browser's console, and fleetctl and agents of before, keep WebSocket
// legs, and fleetd converts between the two when the legs differ.

// StreamProtocol is the token of a stream leg's Upgrade header.
const StreamProtocol = "fleetd-stream/1"

// The types of a stream's messages.
const (
	StreamControl = 1 // a Control, as JSON (a WebSocket's text message)
	StreamBytes   = 2 // the session's bytes (a binary message)
)

// streamHeader is the length of a stream message's header.
const streamHeader = 5

// stream is a stream leg's connection.
type stream struct {
	nc net.Conn // what the leg was set up on: closes, sets deadlines
	// tcp is nc's TCP connection when nothing that changes the bytes
	// (TLS) is between: a message's bytes may be spliced to or from it.
	tcp *net.TCPConn
	// pending holds what was read past the handshake, read first.
	pending []byte
	hdr     [streamHeader]byte // the header being read
}

func newStream(nc net.Conn, pending []byte) *stream {
	return &stream{nc: nc, pending: pending, tcp: tcpOf(nc)}
}

// Read reads the connection, what was read past the handshake first.
func (s *stream) Read(p []byte) (int, error) {
	if len(s.pending) > 0 {
		n := copy(p, s.pending)
		s.pending = s.pending[n:]
		return n, nil
	}
	return s.nc.Read(p)
}

// next reads a message's header: its type and length.
func (s *stream) next() (typ byte, n int, err error) {
	if _, err := io.ReadFull(s, s.hdr[:]); err != nil {
		if err == io.ErrUnexpectedEOF {
			err = errors.New("the connection ended within a message's header")
		}
		return 0, 0, err
	}
	typ, n = s.hdr[0], int(binary.BigEndian.Uint32(s.hdr[1:]))
	switch {
	case typ != StreamBytes && typ != StreamControl:
		return 0, 0, fmt.Errorf("a message of unknown type %d", typ)
	case n > maxRead:
		return 0, 0, fmt.Errorf("a message of %d bytes, more than the %d read", n, maxRead)
	}
	return typ, n, nil
}

// msgBody is a stream message's bytes still in its connection, to be
// passed on whole: read (Read), or moved to a TCP connection (spliceTo),
// which says which side failed.
type msgBody struct {
	s    *stream
	left int64
}

// body is the next n bytes, a message's.
func (s *stream) body(n int) *msgBody { return &msgBody{s: s, left: int64(n)} }

// Read reads the message's bytes, then io.EOF.
func (b *msgBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.s.Read(p)
	b.left -= int64(n)
	return n, err
}

// spliceTo writes the message's bytes to dst, spliced from socket to
// socket but for what was read ahead of them. rerr is the failure to
// read them (errMidMessage when the connection ended first), werr the
// failure to write them, never both.
func (b *msgBody) spliceTo(dst *net.TCPConn) (written int64, rerr, werr error) {
	if k := min(int64(len(b.s.pending)), b.left); k > 0 {
		n, err := dst.Write(b.s.pending[:k])
		b.s.pending, b.left, written = b.s.pending[n:], b.left-int64(n), int64(n)
		if err != nil {
			return written, nil, err
		}
	}
	if b.left == 0 {
		return written, nil, nil
	}
	n, rerr, werr := spliceN(dst, b.s.tcp, b.left)
	b.left -= n
	if rerr == io.ErrUnexpectedEOF {
		rerr = errMidMessage
	}
	return written + n, rerr, werr
}

// copyN copies n bytes from src to dst through a pooled buffer: rerr is
// the failure to read src (io.ErrUnexpectedEOF when it ended first), werr
// the failure to write dst.
func copyN(dst io.Writer, src io.Reader, n int64) (written int64, rerr, werr error) {
	buf := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(buf)
	for written < n {
		m, err := src.Read((*buf)[:min(int64(len(*buf)), n-written)])
		if m > 0 {
			w, err := dst.Write((*buf)[:m])
			written += int64(w)
			if err != nil {
				return written, nil, err
			}
		}
		if err == io.EOF && written < n {
			return written, io.ErrUnexpectedEOF, nil
		}
		if err != nil {
			return written, err, nil
		}
	}
	return written, nil, nil
}

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}

// write sends one message, its header and its bytes in one system call
// (writev(2) on TCP; one TLS record for a small message), so that the
// other side wakes once for it: a keystroke's header and byte written
// apart were two segments, and under load two wake-ups.
func (s *stream) write(typ byte, data []byte) error {
	var h [streamHeader]byte
	h[0] = typ
	binary.BigEndian.PutUint32(h[1:], uint32(len(data)))
	if s.tcp != nil {
		bufs := net.Buffers{h[:], data}
		_, err := bufs.WriteTo(s.tcp)
		return err
	}
	if len(data) <= smallWrite {
		b := smallWrites.Get().(*[]byte)
		defer smallWrites.Put(b)
		m := append(append((*b)[:0], h[:]...), data...)
		_, err := s.nc.Write(m)
		return err
	}
	bufs := net.Buffers{h[:], data}
	_, err := bufs.WriteTo(s.nc)
	return err
}

// smallWrite is the largest message a stream over TLS sends in one
// piece with its header, through a buffer of smallWrites.
const smallWrite = 4 << 10

var smallWrites = sync.Pool{New: func() any { b := make([]byte, 0, streamHeader+smallWrite); return &b }}

// spliceMessage writes a stream message whose bytes are body's (a
// stream's, on TCP both), under c's lock: the header, then the bytes from
// socket to socket. rerr is the failure to read them, the sender's (it
// ended, was reset or stalled within the message: what was sent cannot be
// taken back, and c has half a message; it ends with the session), werr
// the failure to write to c, never both.
func (c *Conn) spliceMessage(typ byte, body *msgBody) (written int64, rerr, werr error) {
	var h [streamHeader]byte
	h[0] = typ
	binary.BigEndian.PutUint32(h[1:], uint32(body.left))
	c.mu.Lock()
	defer c.mu.Unlock()
	c.st.nc.SetWriteDeadline(time.Now().Add(writeTimeout()))
	if _, err := c.st.nc.Write(h[:]); err != nil {
		return 0, nil, err
	}
	return body.spliceTo(c.st.tcp)
}

// upgradeStream answers r, which asked for StreamProtocol, with 101 and
// the connection under w.
func upgradeStream(w http.ResponseWriter, r *http.Request) (*Conn, error) {
	nc, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		http.Error(w, "this connection cannot be upgraded", http.StatusInternalServerError)
		return nil, err
	}
	if brw.Reader.Buffered() > 0 {
		nc.Close()
		return nil, errors.New("the client sent bytes before the upgrade was answered")
	}
	nc.SetDeadline(time.Now().Add(writeTimeout()))
	_, err = io.WriteString(nc, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: "+StreamProtocol+
		"\r\n"+MessageSizeHeader+": "+strconv.Itoa(LargeMessage)+"\r\n\r\n")
	if err != nil {
		nc.Close()
		return nil, err
	}
	// The HTTP server's deadlines are the request's, not the session's.
	nc.SetDeadline(time.Time{})
	return &Conn{st: newStream(nc, nil), peerMax: peerMax(r.Header)}, nil
}

// IsStream reports whether r asks for a stream leg.
func IsStream(r *http.Request) bool { return r.Method == http.MethodGet && asksStream(r.Header) }

// asksStream reports whether an Upgrade header names StreamProtocol.
func asksStream(h http.Header) bool {
	for _, v := range h.Values("Upgrade") {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), StreamProtocol) {
				return true
			}
		}
	}
	return false
}

// DialStream opens a stream leg to rawURL (http or https) with header,
// trusting tc's roots over TLS (nil: the system's), as fleetctl and the
// agent do: a fleetd of before, or something between that passes only
// WebSockets, answers otherwise, and then it opens a WebSocket (Dial).
// fleetd's refusals of the session itself (401, 403, 404, 409, 429) are
// a *RefusedError at once.
func DialStream(ctx context.Context, rawURL string, header http.Header, tc *tls.Config) (*Conn, error) {
	c, err := dialStream(ctx, rawURL, header, tc)
	var refused *RefusedError
	if errors.As(err, &refused) {
		switch refused.Status {
		case http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound, http.StatusConflict, http.StatusTooManyRequests:
			return nil, err
		}
		return Dial(ctx, rawURL, header, tc)
	}
	return c, err
}

func dialStream(ctx context.Context, rawURL string, header http.Header, tc *tls.Config) (*Conn, error) {
	rawURL = strings.Replace(strings.Replace(rawURL, "wss://", "https://", 1), "ws://", "http://", 1)
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", StreamProtocol)
	req.Header.Set(MessageSizeHeader, strconv.Itoa(LargeMessage))
	nc, br, resp, err := roundTrip(ctx, req, tc)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols || !asksStream(resp.Header) {
		defer nc.Close()
		defer resp.Body.Close()
		return nil, refusal(resp)
	}
	var pending []byte
	if n := br.Buffered(); n > 0 {
		b, _ := br.Peek(n)
		pending = bytes.Clone(b)
	}
	return &Conn{st: newStream(nc, pending), peerMax: peerMax(resp.Header)}, nil
}

// refusal is the *RefusedError of an answer other than an upgrade: its
// status and its error body's message.
func refusal(resp *http.Response) error {
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
	return &RefusedError{Status: resp.StatusCode, Message: e.Message}
}

// tcpOf is c's TCP connection when nothing that changes the bytes (TLS)
// is between, else nil.
func tcpOf(c net.Conn) *net.TCPConn {
	for c != nil {
		if t, ok := c.(*net.TCPConn); ok {
			return t
		}
		u, ok := c.(interface{ NetConn() net.Conn })
		if _, isTLS := c.(*tls.Conn); !ok || isTLS {
			return nil
		}
		c = u.NetConn()
	}
	return nil
}

// ProxyStream sends r, which asks for a stream leg (IsStream), to the
// server at target (another replica) as it came, with out's headers set,
// and answers with what that server answers. A leg it accepts is passed
// on byte for byte both ways, spliced between the two TCP connections
// when neither has TLS, until both ways end: the server relaying the
// session reads its messages, this one does not. An error is returned,
// nothing answered, when the server cannot be reached.
func ProxyStream(w http.ResponseWriter, r *http.Request, target *url.URL, out http.Header, tc *tls.Config) error {
	u := *target
	u.Path, u.RawPath, u.RawQuery = r.URL.Path, r.URL.RawPath, r.URL.RawQuery
	req := r.Clone(r.Context())
	req.URL, req.RequestURI = &u, ""
	for k, v := range out {
		req.Header[k] = v
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", StreamProtocol)
	for _, h := range []string{"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "Forwarded"} {
		req.Header.Del(h) // as httputil.ReverseProxy's Rewrite does
	}
	nc, br, resp, err := roundTrip(r.Context(), req, tc)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer nc.Close()
		defer resp.Body.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
		return nil
	}
	client, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		nc.Close()
		return nil
	}
	go func() {
		defer nc.Close()
		defer client.Close()
		if err := resp.Write(brw); err != nil || brw.Flush() != nil {
			return
		}
		// What the server sent past its answer, then the rest as it
		// comes.
		if n := br.Buffered(); n > 0 {
			b, _ := br.Peek(n)
			if _, err := client.Write(b); err != nil {
				return
			}
		}
		// A leg's messages say where its bytes end (eof): the relaying
		// replica's end of the connection is the leg's, and ends both.
		// The client's end is passed on as it came, a half-close, and
		// the relaying replica's close awaited: an operator that
		// half-closes its leg reads it until fleetd has recorded the
		// session's end (Conn.CloseWrite).
		fromServer := make(chan struct{})
		go func() { copyOneWay(client, nc, nil); close(fromServer) }()
		go func() {
			copyOneWay(nc, client, brw.Reader)
			if cw, ok := nc.(interface{ CloseWrite() error }); !ok || cw.CloseWrite() != nil {
				nc.Close()
			}
		}()
		<-fromServer
	}()
	return nil
}

// copyOneWay copies from to to until from ends, spliced between two
// TCP connections: one way of a leg proxied to another replica.
// buffered is what an HTTP server read of from already, if any.
func copyOneWay(to, from net.Conn, buffered *bufio.Reader) {
	var src io.Reader = from
	if t := tcpOf(from); t != nil {
		src = t
	}
	if buffered != nil && buffered.Buffered() > 0 {
		src = io.MultiReader(io.LimitReader(buffered, int64(buffered.Buffered())), src)
	}
	var dst io.Writer = to
	if t := tcpOf(to); t != nil {
		dst = t
	}
	io.Copy(dst, src)
}

// roundTrip sends req on a connection of its own and reads the answer:
// the connection and its reader, which may hold bytes past the answer.
func roundTrip(ctx context.Context, req *http.Request, tc *tls.Config) (net.Conn, *bufio.Reader, *http.Response, error) {
	host := req.URL.Host
	if req.URL.Port() == "" {
		port := "80"
		if req.URL.Scheme == "https" {
			port = "443"
		}
		host = net.JoinHostPort(req.URL.Hostname(), port)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		return nil, nil, nil, err
	}
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Now()) })
	defer stop()
	if req.URL.Scheme == "https" {
		cfg := &tls.Config{}
		if tc != nil {
			cfg = tc.Clone()
		}
		if cfg.ServerName == "" {
			cfg.ServerName = req.URL.Hostname()
		}
		t := tls.Client(nc, cfg)
		if err := t.HandshakeContext(ctx); err != nil {
			nc.Close()
			return nil, nil, nil, err
		}
		nc = t
	}
	if err := req.Write(nc); err != nil {
		nc.Close()
		return nil, nil, nil, err
	}
	br := bufio.NewReader(nc)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		nc.Close()
		return nil, nil, nil, err
	}
	if !stop() {
		nc.Close()
		return nil, nil, nil, ctx.Err()
	}
	nc.SetDeadline(time.Time{})
	return nc, br, resp, nil
}

// ReadAhead reads what a stream leg's other side has sent into the leg's
// buffer, to be read (or spliced) after as if it came then, while it holds
// less than max: one read, which blocks until something comes, the leg
// ends (its error) or StopReadAhead. It returns what the buffer holds. A
// relay reads an operator's leg so while it awaits the device's, to see
// the operator leave. A WebSocket's leg cannot (an error).
func (c *Conn) ReadAhead(max int) (int, error) {
	s := c.st
	if s == nil {
		return 0, errors.New("a WebSocket leg reads no bytes ahead")
	}
	if len(s.pending) >= max {
		return len(s.pending), nil
	}
	buf := make([]byte, min(max-len(s.pending), 64<<10))
	n, err := s.nc.Read(buf)
	// A copy: pending may be the handshake's buffer.
	s.pending = append(s.pending[:len(s.pending):len(s.pending)], buf[:n]...)
	return len(s.pending), err
}

// StopReadAhead ends a ReadAhead under way (it returns
// os.ErrDeadlineExceeded, having read nothing), and any later, until
// StopReadAhead(false).
func (c *Conn) StopReadAhead(stop bool) {
	if stop {
		c.st.nc.SetReadDeadline(time.Unix(1, 0))
		return
	}
	c.st.nc.SetReadDeadline(time.Time{})
}
