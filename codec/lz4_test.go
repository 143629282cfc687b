package codec_test

import (
	"bytes"
	"testing"

	"github.com/pierrec/lz4/v4"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/codec"
)

func TestInflateLZ4(t *testing.T) {
	frame := func(b []byte) []byte {
		var out bytes.Buffer
		w := lz4.NewWriter(&out)
		w.Write(b)
		w.Close()
		return out.Bytes()
	}
	points := []byte(`[{"sequence":1,"lat":12.9}]`)
	if got, err := codec.InflateLZ4(frame(points), len(points)); err != nil || !bytes.Equal(got, points) {
		t.Fatalf("InflateLZ4 = %q, %v; want the array back", got, err)
	}
	for name, in := range map[string][]byte{
		"PastTheLimit": frame(bytes.Repeat([]byte(" "), 10_000)),
		"NotAFrame":    []byte(`[{"sequence":1}]`),
		"Truncated":    frame(points)[:10],
		"Empty":        nil,
	} {
		if _, err := codec.InflateLZ4(in, 1000); fleet.ErrorCode(err) != fleet.EINVALID {
			t.Errorf("%s: %v, want EINVALID", name, err)
		}
	}
}
