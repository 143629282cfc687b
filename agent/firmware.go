package agent

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/fleetd/fleet/firmware/bundle"
)

// firmwarePayload is what update_firmware brings (docs/firmware.md,
// update_firmware): the bundle's signed URL, its SHA-256 and length, and
// its components, each with the SHA-256 of its file as stored in the
// archive.
type firmwarePayload struct {
	Version       string `json:"version"`
	URL           string `json:"url"`
	Checksum      string `json:"checksum"`
	ContentLength int64  `json:"content-length"`
	Components    []struct {
		ComponentName string `json:"component_name"`
		VersionNumber string `json:"version_number"`
		FileName      string `json:"file_name"`
		Checksum      string `json:"checksum"`
		ContentLength int64  `json:"content_length"`
	} `json:"components"`
}

// downloadAttempts is how often a download is tried, each resuming where
// the last was cut, before update_firmware fails.
const downloadAttempts = 5

// updateFirmware downloads the bundle (resuming with Range and If-Range),
// checks its length and SHA-256, unpacks each component checking its own
// SHA-256, and runs --install-hook for each, in the bundle's order.
func (a *Agent) updateFirmware(ctx context.Context, id, payload string) error {
	var p firmwarePayload
	if err := json.Unmarshal([]byte(payload), &p); err != nil || p.URL == "" || p.ContentLength <= 0 || len(p.Checksum) != 64 {
		return errors.New("update_firmware's payload has no url, content-length and checksum")
	}
	hook := strings.Fields(a.cfg.InstallHook)
	if len(hook) == 0 {
		return errors.New("firmware installation is not configured on this device (--install-hook)")
	}
	if err := os.MkdirAll(a.cfg.DownloadDir, 0o700); err != nil {
		return fmt.Errorf("download directory: %v", err)
	}
	// Named by checksum: a download cut by a restart of the agent resumes
	// when the same bundle comes again.
	file := filepath.Join(a.cfg.DownloadDir, strings.ToLower(p.Checksum)+".bundle")
	if err := a.download(ctx, id, p, file); err != nil {
		return err
	}
	dir := file + ".d"
	os.RemoveAll(dir)
	defer os.RemoveAll(dir)
	a.report(id, "Extracting", 100)
	paths, err := extractComponents(file, dir, p)
	if err != nil {
		return err
	}
	for i, c := range p.Components {
		a.report(id, "Installing", i*100/len(p.Components))
		argv := make([]string, len(hook))
		for j, w := range hook {
			argv[j] = strings.NewReplacer("{file}", paths[i], "{component}", c.ComponentName, "{version}", c.VersionNumber).Replace(w)
		}
		if err := a.runProgram(ctx, id, argv, payload, "Installing"); err != nil {
			return fmt.Errorf("installing %s %s: %w", c.ComponentName, c.VersionNumber, err)
		}
	}
	os.Remove(file)
	return nil
}

// download fetches p.URL into file, continuing a partial file, and checks
// the whole against p's length and checksum. A resumed file that does not
// match is fetched again whole, once.
func (a *Agent) download(ctx context.Context, id string, p firmwarePayload, file string) error {
	a.report(id, "Downloading", 0)
	var err error
	wholeAgain := false
	for attempt := 0; attempt < downloadAttempts; attempt++ {
		if attempt > 0 {
			select {
			case <-time.After(time.Duration(attempt) * time.Second):
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
		err = a.fetch(ctx, id, p, file)
		if err == nil {
			err = checkFile(file, p.ContentLength, p.Checksum)
			if err == nil {
				return nil
			}
			os.Remove(file)
			if wholeAgain {
				return err
			}
			wholeAgain = true
			continue
		}
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		if errors.Is(err, bundle.ErrFinal) {
			break
		}
		a.log.Info("download cut; resuming", "action", id, "err", err)
	}
	return fmt.Errorf("download failed: %w", err)
}

// fetch appends to file what it lacks of p's archive.
func (a *Agent) fetch(ctx context.Context, id string, p firmwarePayload, file string) error {
	f, err := os.OpenFile(file, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("%w: %v", bundle.ErrFinal, err)
	}
	defer f.Close()
	have, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return err
	}
	if have == p.ContentLength {
		return nil
	}
	if have > p.ContentLength {
		have = 0
	}
	body, have, err := bundle.OpenDownload(ctx, p.URL, p.Checksum, have)
	if err != nil {
		return err
	}
	defer body.Close()
	if err := f.Truncate(have); err != nil {
		return err
	}
	if _, err := f.Seek(have, io.SeekStart); err != nil {
		return err
	}
	w := &progressWriter{w: f, got: have, total: p.ContentLength, report: func(pct int) { a.report(id, "Downloading", pct) }}
	if _, err := io.Copy(w, io.LimitReader(body, p.ContentLength-have)); err != nil {
		return err
	}
	return f.Sync()
}

// progressWriter reports each further tenth of a download.
type progressWriter struct {
	w          io.Writer
	got, total int64
	last       int
	report     func(int)
}

func (p *progressWriter) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	p.got += int64(n)
	if pct := int(p.got * 100 / p.total); pct/10 > p.last/10 && pct < 100 {
		p.last = pct
		p.report(pct)
	}
	return n, err
}

// checkFile checks a download's length and SHA-256.
func checkFile(file string, size int64, checksum string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return err
	}
	if n != size {
		return fmt.Errorf("download is %d bytes, expected %d", n, size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); !strings.EqualFold(got, checksum) {
		return fmt.Errorf("checksum mismatch: downloaded %s, expected %s", got, strings.ToLower(checksum))
	}
	return nil
}

// extractComponents writes each of p's components from the archive into
// dir and checks its SHA-256; it returns their paths in p's order. Only
// the listed files are written, each under a name of the agent's choosing,
// so nothing in the archive can write outside dir.
func extractComponents(archive, dir string, p firmwarePayload) ([]string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	want := map[string]int{}
	for i, c := range p.Components {
		want[path.Clean(c.FileName)] = i
	}
	f, err := os.Open(archive)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	br := bufio.NewReader(f)
	var r io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("the bundle is not a readable gzip: %v", err)
		}
		r = gz
	}
	paths := make([]string, len(p.Components))
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("the bundle is not a readable tar: %v", err)
		}
		i, ok := want[path.Clean(h.Name)]
		if !ok || h.Typeflag != tar.TypeReg || paths[i] != "" {
			continue
		}
		c := p.Components[i]
		paths[i] = filepath.Join(dir, fmt.Sprintf("%d-%s", i, path.Base(h.Name)))
		out, err := os.OpenFile(paths[i], os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, err
		}
		sum := sha256.New()
		_, err = io.Copy(io.MultiWriter(out, sum), tr)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, fmt.Errorf("extracting %s: %v", h.Name, err)
		}
		if got := hex.EncodeToString(sum.Sum(nil)); !strings.EqualFold(got, c.Checksum) {
			return nil, fmt.Errorf("component %s: checksum mismatch: %s in the bundle, expected %s", c.ComponentName, got, strings.ToLower(c.Checksum))
		}
	}
	for i, c := range p.Components {
		if paths[i] == "" {
			return nil, fmt.Errorf("component %s: %s is not in the bundle", c.ComponentName, c.FileName)
		}
	}
	return paths, nil
}
