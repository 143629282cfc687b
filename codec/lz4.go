package codec

import (
	"bytes"
	"errors"
	"io"

	"github.com/pierrec/lz4/v4"

	"github.com/fleetd/fleet"
)

// InflateLZ4 decodes an LZ4 frame (the format of the uplink agent's
// compressed streams) and refuses one that inflates past limit bytes
// (EINVALID, as a payload that is not a frame is): a small frame may
// inflate a thousandfold, and what it inflates to is held and decoded.
func InflateLZ4(frame []byte, limit int) ([]byte, error) {
	var out bytes.Buffer
	r := lz4.NewReader(bytes.NewReader(frame))
	n, err := io.Copy(&out, io.LimitReader(r, int64(limit)+1))
	switch {
	case len(frame) == 0, err != nil && errors.Is(err, lz4.ErrInvalidFrame):
		return nil, fleet.Errorf(fleet.EINVALID, "the payload is not an LZ4 frame")
	case err != nil:
		return nil, fleet.Errorf(fleet.EINVALID, "the LZ4 frame cannot be decoded: %v", err)
	case n > int64(limit):
		return nil, fleet.Errorf(fleet.EINVALID, "the LZ4 frame inflates past %d bytes, the most a payload may be", limit)
	}
	return out.Bytes(), nil
}
