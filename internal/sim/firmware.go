package sim

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/fleetd/fleet/action"
	"github.com/fleetd/fleet/firmware/bundle"
)

// simFirmwareTimeout bounds one simulated firmware download.
const simFirmwareTimeout = 10 * time.Minute

// simDownloadAttempts is how often a simulated device tries a download
// (resuming where it was cut) before it gives up.
const simDownloadAttempts = 3

// updateFirmware is what a simulated device does with update_firmware, as
// the uplink agent would: it downloads the bundle from the signed URL in
// the payload (resuming with Range after a cut), reports Downloading with
// its progress, checks the checksum and length, and reports Completed, or
// Failed with the reason (--fail-rate's devices fail after the download, as
// an installation that goes wrong).
func (d *simDevice) updateFirmware(ctx context.Context, m action.Message) {
	var seq int64
	report := func(state string, progress int, errs ...string) bool {
		seq++
		return d.report(m.ID, state, progress, seq, errs...)
	}
	lastReported := 0 // the progress last reported
	fail := func(reason string) {
		if report("Failed", lastReported, reason) {
			d.sim.failed.Add(1)
		}
	}
	var p struct {
		URL           string `json:"url"`
		Checksum      string `json:"checksum"`
		ContentLength int64  `json:"content-length"`
	}
	if err := json.Unmarshal([]byte(m.Payload), &p); err != nil || p.URL == "" || p.ContentLength <= 0 {
		fail("update_firmware payload without url and content-length")
		return
	}
	if !report("Received", 0) {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, simFirmwareTimeout)
	defer cancel()
	sum := sha256.New()
	var got int64
	progress := func(n int) {
		got += int64(n)
		// Every tenth, where uplink reports every percent: fewer messages.
		// A --step after each, so that a demonstration's downloads take
		// as long as its other actions, however small the archive.
		if pct := int(got * 100 / p.ContentLength); pct/10 > lastReported/10 && pct < 100 {
			lastReported = pct
			report("Downloading", pct)
			select {
			case <-time.After(d.sim.cfg.step):
			case <-ctx.Done():
			}
		}
	}
	// Reads of a tenth at most, so that each tenth is reported and paced.
	chunk := int(min(32<<10, max(1, p.ContentLength/10)))
	var err error
	for attempt := 0; attempt < simDownloadAttempts; attempt++ {
		if err = d.download(ctx, p.URL, p.Checksum, got, chunk, sum, progress); err == nil || ctx.Err() != nil || errors.Is(err, bundle.ErrFinal) {
			break
		}
	}
	switch {
	case ctx.Err() != nil && errors.Is(context.Cause(ctx), context.Canceled):
		return // cancelled: the cancel_action reports
	case err != nil:
		fail("download failed: " + err.Error())
	case got != p.ContentLength:
		fail(fmt.Sprintf("content length mismatch: downloaded %d bytes, expected %d", got, p.ContentLength))
	case hex.EncodeToString(sum.Sum(nil)) != p.Checksum:
		fail(fmt.Sprintf("checksum mismatch: downloaded %s, expected %s", hex.EncodeToString(sum.Sum(nil)), p.Checksum))
	case d.fails():
		fail("simulated installation failure")
	default:
		if report("Completed", 100) {
			d.sim.completed.Add(1)
			d.updated()
		}
	}
}

// download fetches url from offset on, into sum, telling progress of each
// read of at most chunk bytes. A bundle changed since the first attempt
// comes whole, and is not the one whose start was read: that ends the
// download.
func (d *simDevice) download(ctx context.Context, url, checksum string, offset int64, chunk int, sum io.Writer, progress func(int)) error {
	body, from, err := bundle.OpenDownload(ctx, url, checksum, offset)
	if err != nil {
		return err
	}
	defer body.Close()
	if from != offset {
		return fmt.Errorf("%w: the archive changed during the download", bundle.ErrFinal)
	}
	buf := make([]byte, chunk)
	for {
		n, err := body.Read(buf)
		if n > 0 {
			sum.Write(buf[:n])
			progress(n)
		}
		if err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
	}
}
