package bundle_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/firmware/bundle"
	"github.com/fleetd/fleet/firmware/bundle/bundletest"
)

func gzipped(s string) string {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write([]byte(s))
	zw.Close()
	return buf.String()
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

const goodManifest = `{"version": "2.3.0", "components": [
	{"component_name": "bootloader", "version_number": "1.2.0", "file_name": "boot.bin"},
	{"component_name": "app", "version_number": "2.3.0", "file_name": "app/app.bin.gz",
	 "dependencies": [{"component_name": "bootloader", "min_version": "1.1.0"}]}]}`

func TestParse(t *testing.T) {
	app := gzipped(strings.Repeat("application ", 1000))
	for _, gz := range []bool{false, true} {
		name := "tar"
		if gz {
			name = "tar.gz"
		}
		t.Run(name, func(t *testing.T) {
			a := bundletest.Archive(t, gz,
				bundletest.File{Name: "./app/", Type: tar.TypeDir},
				bundletest.File{Name: "./app/app.bin.gz", Body: app},
				bundletest.File{Name: "boot.bin", Body: "bootloader"},
				bundletest.File{Name: "README", Body: "extra files are allowed"},
				bundletest.File{Name: "manifest.json", Body: goodManifest},
			)
			f, err := bundle.Parse(bytes.NewReader(a), bundle.ParseOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if f.ContentLength != int64(len(a)) || f.Checksum != sha(a) || f.Gzipped != gz {
				t.Fatalf("archive: length %d checksum %s gzipped %v; want %d %s %v", f.ContentLength, f.Checksum, f.Gzipped, len(a), sha(a), gz)
			}
			tarLen := int64(len(a))
			if gz {
				zr, _ := gzip.NewReader(bytes.NewReader(a))
				tarLen, _ = io.Copy(io.Discard, zr)
			}
			if f.UncompressedSize != tarLen {
				t.Fatalf("uncompressed_size = %d, want %d (the tar stream)", f.UncompressedSize, tarLen)
			}
			m := f.Manifest
			if m.Version != "2.3.0" || len(m.Components) != 2 {
				t.Fatalf("manifest = %+v", m)
			}
			boot, appC := m.Components[0], m.Components[1]
			if boot.Checksum != sha([]byte("bootloader")) || boot.ContentLength != 10 || boot.UncompressedSize != 10 {
				t.Fatalf("bootloader = %+v", boot)
			}
			if appC.FileName != "app/app.bin.gz" || appC.Checksum != sha([]byte(app)) || appC.ContentLength != int64(len(app)) || appC.UncompressedSize != 12000 {
				t.Fatalf("app = %+v; a .gz component's checksum is of the file as stored, its uncompressed size inflated", appC)
			}
			if len(appC.Dependencies) != 1 || appC.Dependencies[0] != (fleet.Dependency{ComponentName: "bootloader", MinVersion: "1.1.0"}) {
				t.Fatalf("app dependencies = %+v", appC.Dependencies)
			}
		})
	}
}

func TestParseRejects(t *testing.T) {
	manifest := func(s string) bundletest.File { return bundletest.File{Name: "manifest.json", Body: s} }
	one := func(extra string) string {
		return `{"version": "1.0.0", "components": [{"component_name": "app", "version_number": "1.0.0", "file_name": "app.bin"` + extra + `}]}`
	}
	app := bundletest.File{Name: "app.bin", Body: "app"}
	tests := []struct {
		name  string
		data  []byte
		field string // a field the error names, if any
		words string // words the message must contain
	}{
		{"NoManifest", bundletest.Archive(t, false, app), "", "no manifest.json"},
		{"ManifestNotAtRoot", bundletest.Archive(t, false, app, bundletest.File{Name: "sub/manifest.json", Body: one("")}), "", "no manifest.json"},
		{"Empty", nil, "", "no manifest.json"},
		{"ListedFileMissing", bundletest.Archive(t, false, manifest(one(""))), "manifest.components[0].file_name", "app.bin"},
		{"DotDot", bundletest.Archive(t, false, app, bundletest.File{Name: "../x", Body: "x"}, manifest(one(""))), "", `"../x"`},
		{"DotDotInside", bundletest.Archive(t, false, app, bundletest.File{Name: "a/../../x", Body: "x"}, manifest(one(""))), "", `"a/../../x"`},
		{"Absolute", bundletest.Archive(t, false, app, bundletest.File{Name: "/etc/passwd", Body: "x"}, manifest(one(""))), "", `"/etc/passwd"`},
		{"Symlink", bundletest.Archive(t, false, bundletest.File{Name: "app.bin", Type: tar.TypeSymlink, Link: "/etc/shadow"}, manifest(one(""))), "", "symbolic link"},
		{"HardLink", bundletest.Archive(t, false, bundletest.File{Name: "app.bin", Type: tar.TypeLink, Link: "x"}, manifest(one(""))), "", "hard link"},
		{"Device", bundletest.Archive(t, false, app, bundletest.File{Name: "dev", Type: tar.TypeChar}, manifest(one(""))), "", "device"},
		{"Fifo", bundletest.Archive(t, false, app, bundletest.File{Name: "fifo", Type: tar.TypeFifo}, manifest(one(""))), "", "pipe"},
		{"Duplicate", bundletest.Archive(t, false, app, app, manifest(one(""))), "", `"app.bin" appears more than once`},
		{"FileThenDirectory", bundletest.Archive(t, false, app, bundletest.File{Name: "app.bin/", Type: tar.TypeDir}, manifest(one(""))), "", `"app.bin" appears more than once`},
		{"DirectoryThenFile", bundletest.Archive(t, false, bundletest.File{Name: "app.bin/", Type: tar.TypeDir}, app, manifest(one(""))), "", `"app.bin" appears more than once`},
		{"FileInsideFile", bundletest.Archive(t, false, app, bundletest.File{Name: "app.bin/x", Body: "x"}, manifest(one(""))), "", `inside "app.bin"`},
		{"TooManyDirectories", bundletest.Archive(t, false, append(manyDirs(fleet.MaxArchiveFiles), app, manifest(one("")))...), "", "more than 10000 entries"},
		{"BadVersion", bundletest.Archive(t, false, app, manifest(strings.Replace(one(""), `"version": "1.0.0"`, `"version": "1.0-beta"`, 1))), "manifest.version", "version"},
		{"BadComponentVersion", bundletest.Archive(t, false, app, manifest(strings.Replace(one(""), `"version_number": "1.0.0"`, `"version_number": "v1"`, 1))), "manifest.components[0].version_number", "version_number"},
		{"VersionNotString", bundletest.Archive(t, false, app, manifest(`{"version": 1, "components": []}`)), "manifest.version", "string"},
		{"UnknownField", bundletest.Archive(t, false, app, manifest(strings.Replace(one(""), `"version": "1.0.0"`, `"version": "1.0.0", "vendor": "x"`, 1))), "manifest.vendor", "vendor"},
		{"UnknownComponentField", bundletest.Archive(t, false, app, manifest(one(`, "size": 3`))), "manifest.components[0].size", "size"},
		{"DuplicateKey", bundletest.Archive(t, false, app, manifest(`{"version": "1.0.0", "version": "1.0.1", "components": []}`)), "", "manifest.json"},
		{"NotJSON", bundletest.Archive(t, false, app, manifest(`{"version": `)), "", "manifest.json is not valid JSON"},
		{"NoComponents", bundletest.Archive(t, false, app, manifest(`{"version": "1.0.0", "components": []}`)), "manifest.components", "at least one"},
		{"DuplicateComponent", bundletest.Archive(t, false, app, manifest(`{"version": "1.0.0", "components": [
			{"component_name": "app", "version_number": "1.0.0", "file_name": "app.bin"},
			{"component_name": "app", "version_number": "1.0.1", "file_name": "app.bin"}]}`)), "manifest.components[1].component_name", "listed already"},
		{"Contradiction", bundletest.Archive(t, false, app, bundletest.File{Name: "boot.bin", Body: "b"}, manifest(`{"version": "1.0.0", "components": [
			{"component_name": "bootloader", "version_number": "1.0.0", "file_name": "boot.bin"},
			{"component_name": "app", "version_number": "1.0.0", "file_name": "app.bin",
			 "dependencies": [{"component_name": "bootloader", "min_version": "1.1.0"}]}]}`)), "manifest.components", "bootloader >= 1.1.0"},
		{"SelfDependency", bundletest.Archive(t, false, app, manifest(one(`, "dependencies": [{"component_name": "app", "min_version": "1.0.0"}]`))), "manifest.components[0].dependencies[0].component_name", "itself"},
		{"BadMinVersion", bundletest.Archive(t, false, app, manifest(one(`, "dependencies": [{"component_name": "boot", "min_version": ">=1"}]`))), "manifest.components[0].dependencies[0].min_version", "min_version"},
		{"FileNameEscapes", bundletest.Archive(t, false, app, manifest(strings.Replace(one(""), `"app.bin"`, `"../app.bin"`, 1))), "manifest.components[0].file_name", "escapes"},
		{"ComponentNotGzip", bundletest.Archive(t, false, bundletest.File{Name: "app.bin.gz", Body: "not gzip"}, manifest(strings.Replace(one(""), `"app.bin"`, `"app.bin.gz"`, 1))), "manifest.components[0].file_name", "app.bin.gz"},
		{"CorruptGzip", corrupt(bundletest.Archive(t, true, app, manifest(one("")))), "", "gzip"},
		{"TruncatedGzip", bundletest.Archive(t, true, app, manifest(one("")))[:40], "", "gzip"},
		{"NotAnArchive", []byte(strings.Repeat("this is not a tar file ", 100)), "", "tar"},
		{"TruncatedTar", bundletest.Archive(t, false, bundletest.File{Name: "app.bin", Body: strings.Repeat("x", 2000)}, manifest(one("")))[:1024], "", "tar"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := bundle.Parse(bytes.NewReader(tt.data), bundle.ParseOptions{})
			if fleet.ErrorCode(err) != fleet.EINVALID {
				t.Fatalf("error = %v, want %s", err, fleet.EINVALID)
			}
			if msg := fleet.ErrorMessage(err); !strings.Contains(msg, tt.words) {
				t.Errorf("message %q does not mention %q", msg, tt.words)
			}
			if tt.field != "" {
				var fe *fleet.Error
				if !asFleetError(err, &fe) || fe.Fields[tt.field] == "" {
					t.Errorf("error %v does not name field %s", err, tt.field)
				}
			}
		})
	}
}

// manyDirs is n directory entries.
func manyDirs(n int) []bundletest.File {
	fs := make([]bundletest.File, n)
	for i := range fs {
		fs[i] = bundletest.File{Name: fmt.Sprintf("d%d/", i), Type: tar.TypeDir}
	}
	return fs
}

func asFleetError(err error, fe **fleet.Error) bool {
	e, ok := err.(*fleet.Error)
	*fe = e
	return ok
}

// corrupt flips bytes in the middle of a gzip stream.
func corrupt(b []byte) []byte {
	c := bytes.Clone(b)
	for i := len(c) / 2; i < len(c)/2+8 && i < len(c)-8; i++ {
		c[i] ^= 0xff
	}
	return c
}

func TestParseInflateLimit(t *testing.T) {
	bomb := gzipped(strings.Repeat("\x00", 1<<20))
	a := bundletest.Archive(t, false, bundletest.File{Name: "app.bin.gz", Body: bomb},
		bundletest.File{Name: "manifest.json", Body: `{"version": "1.0.0", "components": [{"component_name": "app", "version_number": "1.0.0", "file_name": "app.bin.gz"}]}`})
	_, err := bundle.Parse(bytes.NewReader(a), bundle.ParseOptions{MaxInflated: 1 << 16})
	if fleet.ErrorCode(err) != fleet.EINVALID || !strings.Contains(fleet.ErrorMessage(err), "inflates") {
		t.Fatalf("error = %v, want an inflate limit error", err)
	}
}

// TestParseInflateRatio: a gzip bomb is refused once it has inflated more
// than MaxRatio times the bytes read, long before the absolute limit
// (docs/reliability.md#smaller-bounds; at 10129e9 a 17.7 MB upload
// inflated 16 GiB first).
func TestParseInflateRatio(t *testing.T) {
	bomb := gzipped(strings.Repeat("\x00", 64<<20)) // 64 MiB in about 64 KiB
	a := bundletest.Archive(t, false, bundletest.File{Name: "app.bin.gz", Body: bomb},
		bundletest.File{Name: "manifest.json", Body: `{"version": "1.0.0", "components": [{"component_name": "app", "version_number": "1.0.0", "file_name": "app.bin.gz"}]}`})
	_, err := bundle.Parse(bytes.NewReader(a), bundle.ParseOptions{MaxRatio: 10})
	if fleet.ErrorCode(err) != fleet.EINVALID || !strings.Contains(fleet.ErrorMessage(err), "times its size") {
		t.Fatalf("error = %v, want the ratio refused", err)
	}
	// An archive that inflates within the ratio passes.
	if _, err := bundle.Parse(bytes.NewReader(a), bundle.ParseOptions{MaxRatio: 2000}); err != nil {
		t.Fatalf("within the ratio: %v", err)
	}
}

// TestParseReaderError shows that an error of the upload itself (a cut
// connection) is returned as it is, not as a bad archive.
func TestParseReaderError(t *testing.T) {
	cut := fleet.Errorf(fleet.ETOOLARGE, "too large")
	a := bundletest.Archive(t, false, bundletest.File{Name: "app.bin", Body: strings.Repeat("x", 5000)})
	_, err := bundle.Parse(io.MultiReader(bytes.NewReader(a[:3000]), errReader{cut}), bundle.ParseOptions{})
	if err != cut {
		t.Fatalf("error = %v, want the reader's", err)
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

func TestBuild(t *testing.T) {
	var buf bytes.Buffer
	srcs := []bundle.Source{
		{ComponentName: "bootloader", VersionNumber: "1.2.0", FileName: "boot.bin", Size: 4, Body: strings.NewReader("boot")},
		{ComponentName: "app", VersionNumber: "2.3.0", FileName: "app.bin", Size: 3, Body: strings.NewReader("app"),
			Dependencies: []fleet.Dependency{{ComponentName: "bootloader", MinVersion: "1.1.0"}}},
	}
	if err := bundle.Build(&buf, "2.3.0", srcs, true); err != nil {
		t.Fatal(err)
	}
	f, err := bundle.Parse(bytes.NewReader(buf.Bytes()), bundle.ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if f.Manifest.Version != "2.3.0" || len(f.Manifest.Components) != 2 || f.Manifest.Components[1].Checksum != sha([]byte("app")) {
		t.Fatalf("parsed = %+v", f.Manifest)
	}
	t.Run("Reproducible", func(t *testing.T) {
		var again bytes.Buffer
		srcs[0].Body, srcs[1].Body = strings.NewReader("boot"), strings.NewReader("app")
		if err := bundle.Build(&again, "2.3.0", srcs, true); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf.Bytes(), again.Bytes()) {
			t.Fatal("the same inputs made different archives")
		}
	})
	t.Run("Contradiction", func(t *testing.T) {
		bad := []bundle.Source{
			{ComponentName: "bootloader", VersionNumber: "1.0.0", FileName: "boot.bin", Size: 4, Body: strings.NewReader("boot")},
			srcs[1],
		}
		if err := bundle.Build(io.Discard, "2.3.0", bad, true); fleet.ErrorCode(err) != fleet.EINVALID {
			t.Fatalf("error = %v, want %s", err, fleet.EINVALID)
		}
	})
}
