package sqlstore

import (
	"bytes"
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet"
)

// TestUnpackPointsBounds: a chunk that inflates past maxChunkText, in
// either codec, and bytes of neither are errors, not memory.
func TestUnpackPointsBounds(t *testing.T) {
	big := make([]byte, maxChunkText+1)
	for name, packed := range map[string][]byte{
		"zstd":    packPoints(big),
		"deflate": PackDeflate(big),
		"neither": []byte("[[1,2,{}]]"),
		"cut":     packPoints([]byte(`[[1,2,{"temp":21.5}]]`))[:9],
	} {
		if text, err := unpackPoints(packed); err == nil {
			t.Errorf("%s: %d bytes, no error", name, len(text))
		}
	}
	text := []byte(`[[1,2,{"temp":21.5}]]`)
	if got, err := unpackPoints(packPoints(text)); err != nil || !bytes.Equal(got, text) {
		t.Errorf("round trip: %q, %v", got, err)
	}
}

// TestChunkTextBound: a batch whose points of one hour take more than
// maxChunkText is refused when it is kept, not written as a chunk that
// unpackPoints then refuses at every read of the stream.
func TestChunkTextBound(t *testing.T) {
	db := openLocal(t, math.MaxInt)
	ctx := context.Background()
	if _, _, err := db.CreateTenant(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("a", maxChunkText/2+1)
	now := time.Now()
	pts := []fleet.DataPoint{
		{Stream: "env", Timestamp: now, Sequence: 1, Data: map[string]any{"s": big}, ReceivedAt: now},
		{Stream: "env", Timestamp: now, Sequence: 2, Data: map[string]any{"s": big}, ReceivedAt: now},
	}
	if _, err := db.prepareHistory(ctx, "acme", pts); fleet.ErrorCode(err) != fleet.EINVALID {
		t.Fatalf("a chunk of %d bytes of points: %v, want EINVALID", 2*len(big), err)
	}
	if _, err := db.prepareHistory(ctx, "acme", pts[:1]); err != nil {
		t.Fatalf("a chunk of %d bytes of points: %v", len(big), err)
	}
}
