package remote_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/remote"
)

// relayServer is fleetd's part in little: the legs that dial /operator
// and /device are joined by remote.Relay both ways, and what each way
// passed is counted.
type relayServer struct {
	*httptest.Server
	mu        sync.Mutex
	legs      [2]*remote.Conn
	streams   [2]bool
	bytes     [2]int64 // first leg to second, second to first
	ended     chan error
	from      [2]chan error // each way's end: from the first leg, from the second
	recording bool          // the relay looks at the bytes
}

func newRelayServer(t *testing.T, tls bool) *relayServer {
	rs := &relayServer{ended: make(chan error, 2), from: [2]chan error{make(chan error, 1), make(chan error, 1)}}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := remote.Upgrade(w, r)
		if err != nil {
			t.Errorf("upgrade: %v", err)
			return
		}
		i := 0
		if r.URL.Path == "/device" {
			i = 1
		}
		rs.mu.Lock()
		rs.legs[i], rs.streams[i] = c, c.Stream()
		if rs.legs[0] != nil && rs.legs[1] != nil {
			a, b := rs.legs[0], rs.legs[1]
			look := func() bool { return rs.recording }
			count := func(i int) func(bool, int, []byte) {
				return func(binary bool, n int, _ []byte) {
					if binary {
						rs.mu.Lock()
						rs.bytes[i] += int64(n)
						rs.mu.Unlock()
					}
				}
			}
			go func() { err := remote.Relay(b, a, look, count(0)); rs.from[0] <- err; rs.ended <- err; b.Close() }()
			go func() { err := remote.Relay(a, b, look, count(1)); rs.from[1] <- err; rs.ended <- err; a.Close() }()
		}
		rs.mu.Unlock()
	})
	if tls {
		rs.Server = httptest.NewTLSServer(h)
	} else {
		rs.Server = httptest.NewServer(h)
	}
	t.Cleanup(rs.Close)
	return rs
}

// service is a device's TCP service: it answers each connection with the
// SHA-256 of all it read, once the connection half-closes, and closes.
func service(t *testing.T) string {
	return fleetdtest.DeviceService(t, func(c net.Conn) {
		h := sha256.New()
		io.Copy(h, c)
		c.Write(h.Sum(nil))
	})
}

// forwardThrough runs a port forward over two legs of rs as fleetctl and
// the agent do (Join), each leg a stream or a WebSocket, and checks what
// comes through both ways, with half-closes both ways.
func forwardThrough(t *testing.T, rs *relayServer, opStream, devStream bool, tc *tls.Config) {
	t.Helper()
	dial := func(stream bool, path string) *remote.Conn {
		d := remote.Dial
		if stream {
			d = remote.DialStream
		}
		c, err := d(context.Background(), rs.URL+path, nil, tc)
		if err != nil {
			t.Fatal(err)
		}
		if c.Stream() != stream {
			t.Fatalf("a leg dialled as a stream (%v) is one: %v", stream, c.Stream())
		}
		return c
	}
	op := dial(opStream, "/operator")
	dev := dial(devStream, "/device")
	// The device's side: Join to the service.
	svc, err := net.Dial("tcp", service(t))
	if err != nil {
		t.Fatal(err)
	}
	devDone := make(chan error, 1)
	go func() { devDone <- dev.Join(svc.(*net.TCPConn)); dev.Close(); svc.Close() }()
	// The operator's side: Join to one end of a local connection, the
	// test's client on the other.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	opDone := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			opDone <- err
			return
		}
		opDone <- op.Join(c.(*net.TCPConn))
		op.Close()
		c.Close()
	}()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	data := payload(3<<20 + 12345)
	go func() {
		client.Write(data)
		client.(*net.TCPConn).CloseWrite()
	}()
	got, err := io.ReadAll(client)
	if err != nil {
		t.Fatal(err)
	}
	want := sha256.Sum256(data)
	if !bytes.Equal(got, want[:]) {
		t.Fatalf("the service's answer %x, want %x", got, want)
	}
	if err := <-opDone; err != nil {
		t.Errorf("the operator's Join: %v", err)
	}
	if err := <-devDone; err != nil {
		t.Errorf("the device's Join: %v", err)
	}
	for range 2 {
		<-rs.ended
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.bytes != [2]int64{int64(len(data)), sha256.Size} {
		t.Errorf("relayed %v bytes each way, want %d and %d", rs.bytes, len(data), sha256.Size)
	}
	if rs.streams[0] != opStream || rs.streams[1] != devStream {
		t.Errorf("the server's legs are streams: %v", rs.streams)
	}
}

// TestStreamLegs runs a port forward over each kind of leg: two streams
// (spliced in the relay), a stream and a WebSocket each way round (the
// relay converts), two streams that a recording relay reads, and two
// streams over TLS; the bytes, the half-closes and the counts come
// through all of them.
func TestStreamLegs(t *testing.T) {
	for _, c := range []struct {
		name         string
		op, dev, tls bool
		recording    bool
	}{
		{name: "Streams", op: true, dev: true},
		{name: "StreamToWebSocket", op: true, dev: false},
		{name: "WebSocketToStream", op: false, dev: true},
		{name: "WebSockets", op: false, dev: false},
		{name: "StreamsRead", op: true, dev: true, recording: true},
		{name: "StreamsTLS", op: true, dev: true, tls: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			rs := newRelayServer(t, c.tls)
			rs.recording = c.recording
			var tc *tls.Config
			if c.tls {
				tc = rs.Client().Transport.(*http.Transport).TLSClientConfig
			}
			forwardThrough(t, rs, c.op, c.dev, tc)
		})
	}
}

// TestStreamFallsBack: DialStream to a server that knows only WebSockets
// (a fleetd of before) opens a WebSocket.
func TestStreamFallsBack(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !websocket.IsWebSocketUpgrade(r) {
			http.Error(w, `{"error":"invalid","message":"this is a WebSocket: connect with an Upgrade request"}`, http.StatusBadRequest)
			return
		}
		ws, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer ws.Close()
		ws.WriteMessage(websocket.BinaryMessage, []byte("old"))
	}))
	defer srv.Close()
	c, err := remote.DialStream(context.Background(), srv.URL, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Stream() {
		t.Fatal("a stream to a server that knows none")
	}
	if b, _, err := c.Read(); err != nil || string(b) != "old" {
		t.Fatalf("read %q, %v", b, err)
	}
	// fleetd's refusals of the session itself are not tried again.
	refuse := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if websocket.IsWebSocketUpgrade(r) {
			t.Errorf("a refused stream was tried again as a WebSocket")
		}
		w.WriteHeader(http.StatusNotFound)
		w.Write([]byte(`{"error":"not_found","message":"no remote session \"x\" waits to be joined"}`))
	}))
	defer refuse.Close()
	_, err = remote.DialStream(context.Background(), refuse.URL, nil, nil)
	var re *remote.RefusedError
	if !errors.As(err, &re) || re.Status != 404 || re.Message != `no remote session "x" waits to be joined` {
		t.Fatalf("refused with %v", err)
	}
}

// TestStreamSpliceCutsToPeerMax: between two stream legs on TCP, a
// message larger than the leg written to said it reads
// (MessageSizeHeader) reaches it cut to that size, as over a WebSocket,
// not spliced whole.
func TestStreamSpliceCutsToPeerMax(t *testing.T) {
	rs := newRelayServer(t, false)
	op, err := remote.DialStream(context.Background(), rs.URL+"/operator", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	// The device's leg, by hand: a stream that reads messages of 32 KiB.
	const small = remote.MaxMessage
	nc, err := net.Dial("tcp", rs.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	fmt.Fprintf(nc, "GET /device HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: %s\r\n%s: %d\r\n\r\n",
		remote.StreamProtocol, remote.MessageSizeHeader, small)
	br := bufio.NewReader(nc)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("the device's leg answered %s", resp.Status)
	}
	data := payload(remote.LargeMessage)
	if op.MaxSend() != len(data) {
		t.Fatalf("the operator's leg sends messages of %d bytes, want %d", op.MaxSend(), len(data))
	}
	if err := op.Write(data); err != nil { // one message
		t.Fatal(err)
	}
	var got []byte
	for len(got) < len(data) {
		var h [5]byte
		if _, err := io.ReadFull(br, h[:]); err != nil {
			t.Fatalf("after %d bytes: %v", len(got), err)
		}
		n := int(binary.BigEndian.Uint32(h[1:]))
		if h[0] != remote.StreamBytes || n > small {
			t.Fatalf("a message of type %d and %d bytes to a leg that reads %d", h[0], n, small)
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(br, b); err != nil {
			t.Fatal(err)
		}
		got = append(got, b...)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("the bytes differ")
	}
}

// rawLeg opens a stream leg to rs at path by hand, as a side that reads
// messages of LargeMessage.
func rawLeg(t *testing.T, rs *relayServer, path string) (*net.TCPConn, *bufio.Reader) {
	t.Helper()
	nc, err := net.Dial("tcp", rs.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	fmt.Fprintf(nc, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: %s\r\n%s: %d\r\n\r\n",
		path, remote.StreamProtocol, remote.MessageSizeHeader, remote.LargeMessage)
	br := bufio.NewReader(nc)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("%s answered %s", path, resp.Status)
	}
	return nc.(*net.TCPConn), br
}

// streamHeader is a stream message's header: its type and length.
func streamHeader(typ byte, n int) []byte {
	h := []byte{typ, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(h[1:], uint32(n))
	return h
}

// TestStreamSpliceBlamesTheSideThatFailed: between two stream legs on
// TCP, where a message's bytes are spliced, a failure is the side's that
// failed. A sender that resets its connection, or stalls, within a
// message ends the relay with the error of its read, not a *WriteError
// (which a relay tells as the receiver's: fleetd's "a side stopped
// reading"); a receiver that stops reading ends it with a *WriteError.
// The bytes that passed are counted either way.
func TestStreamSpliceBlamesTheSideThatFailed(t *testing.T) {
	const part = 100 << 10 // of a message of LargeMessage
	// sendPart sends a message's header and its first part from op, and
	// waits until dev has them all: the relay waits for the rest.
	sendPart := func(t *testing.T, op *net.TCPConn, dev *bufio.Reader) {
		t.Helper()
		data := payload(part)
		if _, err := op.Write(append(streamHeader(remote.StreamBytes, remote.LargeMessage), data...)); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 5+part)
		if _, err := io.ReadFull(dev, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got[:5], streamHeader(remote.StreamBytes, remote.LargeMessage)) || !bytes.Equal(got[5:], data) {
			t.Fatal("the device's leg got other bytes than were sent")
		}
	}
	counted := func(t *testing.T, rs *relayServer, want int64) {
		t.Helper()
		rs.mu.Lock()
		defer rs.mu.Unlock()
		if rs.bytes[0] != want {
			t.Errorf("counted %d bytes to the device, want %d", rs.bytes[0], want)
		}
	}
	t.Run("SenderResets", func(t *testing.T) {
		rs := newRelayServer(t, false)
		op, _ := rawLeg(t, rs, "/operator")
		_, dev := rawLeg(t, rs, "/device")
		sendPart(t, op, dev)
		op.SetLinger(0) // its close resets the connection
		op.Close()
		err := <-rs.from[0]
		var wf *remote.WriteError
		if errors.As(err, &wf) || !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("the relay ended with %v (%T), want the read's connection reset", err, err)
		}
		counted(t, rs, part)
	})
	t.Run("SenderStalls", func(t *testing.T) {
		remote.SetWriteTimeout(t, 200*time.Millisecond)
		rs := newRelayServer(t, false)
		op, _ := rawLeg(t, rs, "/operator")
		_, dev := rawLeg(t, rs, "/device")
		sendPart(t, op, dev)
		err := <-rs.from[0]
		var wf *remote.WriteError
		if errors.As(err, &wf) || !errors.Is(err, os.ErrDeadlineExceeded) || !strings.Contains(err.Error(), "the sender stopped within a message for 200ms") {
			t.Fatalf("the relay ended with %v (%T), want the sender's stall", err, err)
		}
		counted(t, rs, part)
	})
	t.Run("ReceiverStopsReading", func(t *testing.T) {
		remote.SetWriteTimeout(t, 200*time.Millisecond)
		rs := newRelayServer(t, false)
		op, _ := rawLeg(t, rs, "/operator")
		rawLeg(t, rs, "/device") // reads nothing
		msg := append(streamHeader(remote.StreamBytes, remote.LargeMessage), payload(remote.LargeMessage)...)
		sent := make(chan int64, 1)
		go func() {
			var n int64
			for {
				if _, err := op.Write(msg); err != nil {
					sent <- n
					return
				}
				n += remote.LargeMessage
			}
		}()
		err := <-rs.from[0]
		var wf *remote.WriteError
		if !errors.As(err, &wf) || !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("the relay ended with %v (%T), want a *WriteError of the write's deadline", err, err)
		}
		op.Close()
		n := <-sent
		rs.mu.Lock()
		got := rs.bytes[0]
		rs.mu.Unlock()
		if got <= 0 || got > n {
			t.Errorf("counted %d bytes to the device, of %d sent", got, n)
		}
	})
}
