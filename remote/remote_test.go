package remote_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gorilla/websocket"

	"github.com/fleetd/fleet/remote"
)

// payload is n bytes that are not all alike, so a piece out of place
// shows.
func payload(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i * 7 / 3)
	}
	return b
}

// oldRead is what fleetctl and fleetd-agent read before the size was
// negotiated: a message at most 32 KiB and a control message's room.
const oldRead = remote.MaxMessage + 1024

// TestMessageSize: ends of this package announce the larger size and send
// messages up to it to each other; to an end that announced nothing (an
// agent or a fleetctl of before, or a fleetd of before) they send at most
// MaxMessage, cutting the session's bytes into pieces it reads, in order.
func TestMessageSize(t *testing.T) {
	big := payload(remote.LargeMessage - 1000)
	// One side sends big as one Write, then a control message; the other
	// reads until the control message and returns the messages' sizes and
	// their bytes.
	type got struct {
		sizes []int
		bytes []byte
		err   error
	}
	readNew := func(c *remote.Conn) (g got) {
		for {
			b, ctl, err := c.Read()
			if err != nil {
				g.err = err
				return g
			}
			if ctl != nil {
				return g
			}
			g.sizes = append(g.sizes, len(b))
			g.bytes = append(g.bytes, b...)
		}
	}
	readOld := func(ws *websocket.Conn) (g got) {
		ws.SetReadLimit(oldRead)
		for {
			typ, b, err := ws.ReadMessage()
			if err != nil {
				g.err = err
				return g
			}
			if typ == websocket.TextMessage {
				return g
			}
			g.sizes = append(g.sizes, len(b))
			g.bytes = append(g.bytes, b...)
		}
	}
	check := func(t *testing.T, g got, max int) {
		t.Helper()
		if g.err != nil {
			t.Fatalf("after messages of %v: %v", g.sizes, g.err)
		}
		if !bytes.Equal(g.bytes, big) {
			t.Fatalf("got %d bytes in messages of %v, not the %d sent", len(g.bytes), g.sizes, len(big))
		}
		for _, n := range g.sizes {
			if n > max {
				t.Fatalf("messages of %v: more than %d", g.sizes, max)
			}
		}
		if max == remote.LargeMessage && len(g.sizes) != 1 {
			t.Fatalf("messages of %v: the bytes came in pieces", g.sizes)
		}
	}
	send := func(c *remote.Conn) {
		c.Write(big)
		c.Send(remote.Control{Type: remote.TypeEOF})
	}
	ws := func(u string) string { return "ws" + strings.TrimPrefix(u, "http") }

	t.Run("Both", func(t *testing.T) {
		done := make(chan got, 1)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			c, err := remote.Upgrade(w, r)
			if err != nil {
				return
			}
			defer c.Close()
			if c.MaxSend() != remote.LargeMessage {
				t.Errorf("fleetd's side sends %d", c.MaxSend())
			}
			done <- readNew(c)
			send(c)
			c.Read()
		}))
		defer srv.Close()
		c, err := remote.Dial(context.Background(), srv.URL, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if c.MaxSend() != remote.LargeMessage {
			t.Errorf("the dialer sends %d", c.MaxSend())
		}
		send(c)
		check(t, <-done, remote.LargeMessage)
		check(t, readNew(c), remote.LargeMessage)
	})

	t.Run("OldDialer", func(t *testing.T) {
		// An agent or fleetctl of before: announces nothing.
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			c, err := remote.Upgrade(w, r)
			if err != nil {
				return
			}
			defer c.Close()
			send(c)
			c.Read()
		}))
		defer srv.Close()
		old, resp, err := websocket.DefaultDialer.Dial(ws(srv.URL), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer old.Close()
		if resp.Header.Get(remote.MessageSizeHeader) == "" {
			t.Errorf("fleetd's side did not say what it reads")
		}
		check(t, readOld(old), remote.MaxMessage)
	})

	t.Run("OldServer", func(t *testing.T) {
		// A fleetd of before: answers nothing, reads at most 33 KiB.
		done := make(chan got, 1)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get(remote.MessageSizeHeader) == "" {
				t.Errorf("the dialer did not say what it reads")
			}
			old, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
			if err != nil {
				return
			}
			defer old.Close()
			done <- readOld(old)
		}))
		defer srv.Close()
		c, err := remote.Dial(context.Background(), srv.URL, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if c.MaxSend() != remote.MaxMessage {
			t.Errorf("the dialer sends %d to a fleetd that said nothing", c.MaxSend())
		}
		go c.Pump(bytes.NewReader(big)) // as fleetctl forward does
		check(t, <-done, remote.MaxMessage)
	})
}
