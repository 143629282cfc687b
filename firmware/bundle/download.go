package bundle

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// ErrFinal marks a download answer that asking again would not change (a
// 4xx, or a request that cannot be made).
var ErrFinal = errors.New("final")

// OpenDownload asks url, a bundle's signed download URL, for its bytes
// from offset on, as a device resuming a cut download does
// (docs/firmware.md, "Downloads"): from a non-zero offset it sends Range,
// with If-Range naming the archive's checksum, so that a bundle changed
// meanwhile comes whole. from is where the body starts: offset, or 0 when
// the server sent the archive whole. An answer that is not the archive, or
// not from offset, is an error, with the server's message, wrapping
// ErrFinal unless it is a 5xx. The caller closes the body.
func OpenDownload(ctx context.Context, url, checksum string, offset int64) (body io.ReadCloser, from int64, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %v", ErrFinal, err)
	}
	if offset > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", offset))
		req.Header.Set("If-Range", `"`+strings.ToLower(checksum)+`"`)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, 0, err
	}
	switch resp.StatusCode {
	case http.StatusPartialContent:
		// Bytes from anywhere but offset, appended, would make a file
		// that is not the archive.
		var start int64
		if _, err := fmt.Sscanf(resp.Header.Get("Content-Range"), "bytes %d-", &start); err != nil || start != offset {
			resp.Body.Close()
			return nil, 0, fmt.Errorf("%w: asked for the archive from byte %d, the server sent Content-Range %q",
				ErrFinal, offset, resp.Header.Get("Content-Range"))
		}
		return resp.Body, offset, nil
	case http.StatusOK:
		return resp.Body, 0, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	var e struct{ Message string }
	if json.Unmarshal(b, &e) != nil || e.Message == "" {
		e.Message = string(bytes.TrimSpace(b))
	}
	err = fmt.Errorf("%s: %s", resp.Status, e.Message)
	if resp.StatusCode < 500 {
		err = fmt.Errorf("%w: %w", ErrFinal, err)
	}
	return nil, 0, err
}
