package sqlstore

import (
	"bytes"
	"compress/flate"
	"testing"
)

// TestUnpackPointsBounds: a chunk that inflates past maxChunkText, in
// either codec, and bytes of neither are errors, not memory.
func TestUnpackPointsBounds(t *testing.T) {
	big := make([]byte, maxChunkText+1)
	var deflated bytes.Buffer
	w, _ := flate.NewWriter(&deflated, flate.BestSpeed)
	w.Write(big)
	w.Close()
	for name, packed := range map[string][]byte{
		"zstd":    packPoints(big),
		"deflate": deflated.Bytes(),
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
