package bundle

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/fleetd/fleet"
)

// Source is one component file to put into a bundle: Size bytes read from
// Body, stored at FileName.
type Source struct {
	ComponentName string
	VersionNumber string
	FileName      string
	Dependencies  []fleet.Dependency
	Size          int64
	Body          io.Reader
}

// manifestJSON is manifest.json as Build writes it.
type manifestJSON struct {
	Version    string          `json:"version"`
	Components []componentJSON `json:"components"`
}

type componentJSON struct {
	ComponentName string             `json:"component_name"`
	VersionNumber string             `json:"version_number"`
	FileName      string             `json:"file_name"`
	Dependencies  []fleet.Dependency `json:"dependencies,omitempty"`
}

// buildTime is every entry's modification time: the same inputs make the
// same archive, byte for byte, and so the same checksum.
var buildTime = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)

// Build writes a bundle archive of srcs to w: manifest.json first, then
// each file, gzipped when compress is set. The manifest is checked as the
// server will check it before anything is written.
func Build(w io.Writer, version string, srcs []Source, compress bool) error {
	m := manifestJSON{Version: version}
	for _, s := range srcs {
		m.Components = append(m.Components, componentJSON{s.ComponentName, s.VersionNumber, s.FileName, s.Dependencies})
	}
	manifest, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if _, err := ParseManifest(manifest); err != nil {
		return err
	}
	files := map[string]bool{}
	for _, s := range srcs {
		if files[s.FileName] {
			return fmt.Errorf("two components are stored as %s; rename one of the files", s.FileName)
		}
		files[s.FileName] = true
	}
	var zw *gzip.Writer
	if compress {
		zw = gzip.NewWriter(w)
		w = zw
	}
	tw := tar.NewWriter(w)
	if err := writeFile(tw, ManifestName, int64(len(manifest)), bytes.NewReader(manifest)); err != nil {
		return err
	}
	for _, s := range srcs {
		if err := writeFile(tw, s.FileName, s.Size, s.Body); err != nil {
			return fmt.Errorf("%s: %w", s.FileName, err)
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if zw != nil {
		return zw.Close()
	}
	return nil
}

func writeFile(tw *tar.Writer, name string, size int64, body io.Reader) error {
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Size: size, Mode: 0o644, ModTime: buildTime}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	n, err := io.Copy(tw, body)
	if err != nil {
		return err
	}
	if n != size {
		return fmt.Errorf("read %d bytes, expected %d", n, size)
	}
	return nil
}
