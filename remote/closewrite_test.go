package remote

import (
	"bytes"
	"io"
	"testing"
	"time"
)

// TestCloseWriteBetweenMessages half-closes a stream leg while another
// goroutine writes large messages to it (fleetctl's stdin pumped, when it
// is done with the session): the half-close waits for the message being
// written, so the other side reads whole messages, then the leg's end,
// never a message cut short (errMidMessage, or the end within a header).
func TestCloseWriteBetweenMessages(t *testing.T) {
	for range 5 {
		leg, legPeer := tcpPair(t)
		c := &Conn{st: newStream(leg, nil), peerMax: LargeMessage}
		peer := &Conn{st: newStream(legPeer, nil), peerMax: LargeMessage}
		msg := bytes.Repeat([]byte("m"), LargeMessage)
		go func() {
			for c.Write(msg) == nil {
			}
		}()
		read := make(chan error, 1)
		go func() {
			for {
				_, b, err := peer.ReadRaw()
				if err != nil {
					read <- err
					return
				}
				if len(b) != len(msg) {
					read <- io.ErrShortBuffer
					return
				}
			}
		}()
		time.Sleep(20 * time.Millisecond)
		c.CloseWrite(10 * time.Second)
		select {
		case err := <-read:
			if err != io.EOF {
				t.Fatalf("the other side read %v, want whole messages then io.EOF", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the other side still reads 10s after the half-close")
		}
		c.Close()
	}
}
