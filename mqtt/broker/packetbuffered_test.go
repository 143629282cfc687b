package broker

import (
	"bufio"
	"errors"
	"testing"
)

// oneRead gives what one Read takes of its bytes, then refuses: a socket
// with nothing more to read.
type oneRead struct {
	b    []byte
	done bool
}

var errWouldBlock = errors.New("would block")

func (o *oneRead) Read(p []byte) (int, error) {
	if o.done || len(o.b) == 0 {
		return 0, errWouldBlock
	}
	o.done = true
	return copy(p, o.b), nil
}

// TestPacketBuffered checks that packetBuffered says a packet is buffered
// exactly when readPacket can read it without another read from the
// socket, for every prefix of packets whose remaining length takes one,
// two and three bytes, one larger than the read buffer, and two packets
// back to back.
func TestPacketBuffered(t *testing.T) {
	packet := func(n int) []byte {
		b := []byte{typePublish<<4 | 2}
		for {
			c := byte(n & 0x7f)
			if n >>= 7; n > 0 {
				c |= 0x80
			}
			b = append(b, c)
			if n == 0 {
				break
			}
		}
		return b
	}
	var streams [][]byte
	for _, n := range []int{0, 5, 127, 128, 300, 16_383, 16_384, 2 * readBufferSize} {
		streams = append(streams, append(packet(n), make([]byte, n)...))
	}
	two := append(append(packet(3), "abc"...), append(packet(2), "de"...)...)
	streams = append(streams, two)
	for _, s := range streams {
		for end := 0; end <= len(s); end++ {
			r := bufio.NewReaderSize(&oneRead{b: s[:end]}, readBufferSize)
			r.Peek(1) // the one read, as idleWait's
			buffered := packetBuffered(r)
			_, _, err := readPacket(r, 1<<20)
			if read := err == nil; buffered != read {
				t.Fatalf("%d of %d bytes (first bytes % x): packetBuffered %v, readPacket's error %v", end, len(s), s[:min(end, 4)], buffered, err)
			}
		}
	}
}
