package bundle_test

import (
	"archive/tar"
	"bytes"
	"testing"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/firmware/bundle"
	"github.com/fleetd/fleet/firmware/bundle/bundletest"
)

// FuzzParseBundle feeds arbitrary archives to the parser: it must never
// panic, must refuse with EINVALID only, and what it accepts must be
// measured right.
func FuzzParseBundle(f *testing.F) {
	f.Add(bundletest.Archive(f, false, bundletest.File{Name: "app.bin", Body: "app"}, bundletest.File{Name: "manifest.json", Body: `{"version": "1.0.0", "components": [{"component_name": "app", "version_number": "1.0.0", "file_name": "app.bin"}]}`}))
	f.Add(bundletest.Archive(f, true, bundletest.File{Name: "./boot.bin", Body: "boot"}, bundletest.File{Name: "app.bin.gz", Body: gzipped("app")}, bundletest.File{Name: "manifest.json", Body: goodManifestFlat}))
	f.Add(bundletest.Archive(f, false, bundletest.File{Name: "d/", Type: tar.TypeDir}, bundletest.File{Name: "l", Type: tar.TypeSymlink, Link: "../x"}))
	f.Add([]byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		bf, err := bundle.Parse(bytes.NewReader(data), bundle.ParseOptions{MaxInflated: 64 << 20})
		if err != nil {
			if fleet.ErrorCode(err) != fleet.EINVALID {
				t.Fatalf("error %v is not %s", err, fleet.EINVALID)
			}
			return
		}
		if bf.ContentLength != int64(len(data)) || bf.Checksum != sha(data) {
			t.Fatalf("accepted archive measured as %d bytes, %s; it has %d, %s", bf.ContentLength, bf.Checksum, len(data), sha(data))
		}
		if len(bf.Manifest.Components) == 0 || !fleet.ValidVersion(bf.Manifest.Version) {
			t.Fatalf("accepted manifest %+v", bf.Manifest)
		}
	})
}

const goodManifestFlat = `{"version": "2.3.0", "components": [
	{"component_name": "bootloader", "version_number": "1.2.0", "file_name": "boot.bin"},
	{"component_name": "app", "version_number": "2.3.0", "file_name": "app.bin.gz",
	 "dependencies": [{"component_name": "bootloader", "min_version": "1.1.0"}]}]}`
