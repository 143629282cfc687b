// Package bundle is the firmware bundle archive: built from component
// files (Build, BuildFile) and parsed and verified as it streams (Parse).
// It knows no storage, so the client CLI builds bundles with it without
// linking the server's blob stores.
package bundle

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/codec"
)

// ManifestName is the manifest's path at the root of every bundle.
const ManifestName = "manifest.json"

// MaxManifestSize bounds manifest.json, which is read into memory.
const MaxManifestSize = 1 << 20

// DefaultMaxInflated bounds the bytes Parse inflates (the tar stream of a
// gzipped archive plus every .gz component), so that a small archive
// cannot keep a server busy with a gzip bomb.
const DefaultMaxInflated int64 = 16 << 30

// DefaultMaxRatio bounds the bytes Parse inflates by the archive bytes it
// has read: at 10129e9 a 17.7 MB upload inflated 16 GiB (20 CPU-seconds)
// before it was refused. Firmware compresses a few times over; a sparse
// disk image may reach tens. InflateSlack is allowed beyond the ratio, for
// small archives.
const (
	DefaultMaxRatio       = 100
	InflateSlack    int64 = 1 << 20
)

// ParseOptions tune Parse; the zero value uses the defaults.
type ParseOptions struct {
	MaxInflated int64 // bytes in all; fleetd passes --max-upload-bytes
	MaxRatio    int64 // bytes inflated per archive byte read, beyond InflateSlack
}

// counter counts the bytes written to it.
type counter struct{ n int64 }

func (c *counter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return len(p), nil
}

// inflation is what one Parse may inflate: at most left bytes more, and
// no more than ratio times the archive bytes read so far (raw).
type inflation struct {
	left, ratio, done int64
	raw               *counter
}

// budget fails a read once its inflation is over either bound.
type budget struct {
	r io.Reader
	f *inflation
}

var errInflateBudget = errors.New("inflates beyond the limit")

func (b budget) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	f := b.f
	f.left -= int64(n)
	f.done += int64(n)
	if f.left < 0 || f.done > f.ratio*f.raw.n+InflateSlack {
		return n, errInflateBudget
	}
	return n, err
}

// entry is what Parse learned of one regular file of the archive.
type entry struct {
	checksum      string
	contentLength int64
	inflated      int64 // for .gz files
	gzipErr       error // for .gz files that do not inflate
}

func invalid(format string, args ...any) error {
	return fleet.Errorf(fleet.EINVALID, format, args...)
}

// Parse reads a bundle archive (tar, or tar.gz) to its end, validates it
// and computes the bundle's and each component's checksum and sizes. It
// never holds more than one manifest and small buffers in memory,
// whatever the archive's size. Every problem with the archive is EINVALID
// naming the file or field; an error of r is returned as it is.
func Parse(r io.Reader, opt ParseOptions) (*fleet.BundleFile, error) {
	sum, raw := sha256.New(), &counter{}
	left := &inflation{left: opt.maxInflated(), ratio: opt.MaxRatio, raw: raw}
	if left.ratio <= 0 {
		left.ratio = DefaultMaxRatio
	}
	src := &readErr{r: r}
	br := bufio.NewReaderSize(io.TeeReader(src, io.MultiWriter(sum, raw)), 64<<10)
	magic, _ := br.Peek(2)
	var stream io.Reader = br
	gzipped := len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b
	if gzipped {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, src.or(invalid("the archive is not valid gzip: %v", err))
		}
		stream = budget{zr, left}
	}
	tarBytes := &counter{}
	tarStream := io.TeeReader(stream, tarBytes)
	tr := tar.NewReader(tarStream)
	corrupt := func(err error) error {
		if errors.Is(err, errInflateBudget) {
			return invalid("the archive inflates to more than %d bytes, or more than %d times its size", opt.maxInflated(), left.ratio)
		}
		if gzipped {
			return src.or(invalid("the archive is corrupt (gzip): %v", err))
		}
		return src.or(invalid("the archive is not a valid tar file: %v", err))
	}

	files := map[string]*entry{}
	dirs := map[string]bool{}
	var manifest []byte
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		} else if err != nil {
			return nil, corrupt(err)
		}
		name, problem := entryName(hdr.Name)
		if problem != "" {
			return nil, invalid("archive entry %q: %s", hdr.Name, problem)
		}
		isDir := false
		switch hdr.Typeflag {
		case tar.TypeReg, '\x00': // '\x00' is the old TypeRegA
		case tar.TypeXGlobalHeader:
			continue
		case tar.TypeDir:
			isDir = true
		case tar.TypeSymlink:
			return nil, invalid("archive entry %q is a symbolic link; a bundle may hold only regular files and directories", hdr.Name)
		case tar.TypeLink:
			return nil, invalid("archive entry %q is a hard link; a bundle may hold only regular files and directories", hdr.Name)
		case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
			return nil, invalid("archive entry %q is a device or pipe; a bundle may hold only regular files and directories", hdr.Name)
		default:
			return nil, invalid("archive entry %q has unsupported type %q; a bundle may hold only regular files and directories", hdr.Name, hdr.Typeflag)
		}
		for k := range hdr.PAXRecords {
			if strings.HasPrefix(k, "GNU.sparse.") {
				return nil, invalid("archive entry %q is a sparse file; a bundle may hold only regular files", hdr.Name)
			}
		}
		// Directories count as entries and share the names' space: at
		// 10129e9 a million directory entries were accepted, and
		// "app.bin/" after "app.bin" passed the duplicate check.
		if _, dup := files[name]; dup || dirs[name] {
			return nil, invalid("archive entry %q appears more than once", name)
		}
		if len(files)+len(dirs) >= fleet.MaxArchiveFiles {
			return nil, invalid("the archive holds more than %d entries (files and directories)", fleet.MaxArchiveFiles)
		}
		for p := path.Dir(name); p != "."; p = path.Dir(p) {
			if _, isFile := files[p]; isFile {
				return nil, invalid("archive entry %q is inside %q, which is a file", name, p)
			}
		}
		if isDir {
			dirs[name] = true
			continue
		}
		if name == ManifestName {
			manifest, err = io.ReadAll(io.LimitReader(tr, MaxManifestSize+1))
			if err != nil {
				return nil, corrupt(err)
			}
			if len(manifest) > MaxManifestSize {
				return nil, invalid("%s is larger than %d bytes", ManifestName, MaxManifestSize)
			}
			files[name] = &entry{}
			continue
		}
		e, err := readEntry(tr, name, left)
		if err != nil {
			return nil, corrupt(err)
		}
		files[name] = e
	}
	// The rest of the tar stream (end blocks, padding) counts as tar
	// bytes, and a gzip stream must be read to its end to check its CRC.
	if _, err := io.Copy(io.Discard, tarStream); err != nil {
		return nil, corrupt(err)
	}
	if _, err := io.Copy(io.Discard, br); err != nil {
		return nil, corrupt(err)
	}

	if manifest == nil {
		return nil, invalid("the archive has no %s at its root", ManifestName)
	}
	m, err := ParseManifest(manifest)
	if err != nil {
		return nil, err
	}
	for i, c := range m.Components {
		e := files[c.FileName]
		field := fmt.Sprintf("manifest.components[%d].file_name", i)
		if e == nil || c.FileName == ManifestName {
			return nil, &fleet.Error{Code: fleet.EINVALID,
				Message: fmt.Sprintf("%s lists %s for component %s, but the archive has no such file", ManifestName, c.FileName, c.ComponentName),
				Fields:  map[string]string{field: c.FileName + " is not in the archive"}}
		}
		if e.gzipErr != nil {
			return nil, &fleet.Error{Code: fleet.EINVALID,
				Message: fmt.Sprintf("component file %s ends in .gz but does not inflate: %v", c.FileName, e.gzipErr),
				Fields:  map[string]string{field: c.FileName + " is not valid gzip"}}
		}
		c.Checksum, c.ContentLength, c.UncompressedSize = e.checksum, e.contentLength, e.contentLength
		if strings.HasSuffix(c.FileName, ".gz") {
			c.UncompressedSize = e.inflated
		}
	}
	return &fleet.BundleFile{
		ContentLength:    raw.n,
		UncompressedSize: tarBytes.n,
		Checksum:         hex.EncodeToString(sum.Sum(nil)),
		Gzipped:          gzipped,
		Manifest:         *m,
	}, nil
}

func (o ParseOptions) maxInflated() int64 {
	if o.MaxInflated <= 0 {
		return DefaultMaxInflated
	}
	return o.MaxInflated
}

// readErr remembers an error of the upload itself (a cut connection, a
// body over the limit), which must win over what it did to the archive.
type readErr struct {
	r   io.Reader
	err error
}

func (e *readErr) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF {
		e.err = err
	}
	return n, err
}

// or returns the reader's own error if it had one, else err.
func (e *readErr) or(err error) error {
	if e.err != nil {
		return e.err
	}
	return err
}

// readEntry hashes and counts one file; a .gz file is inflated too, to
// learn its uncompressed size.
func readEntry(r io.Reader, name string, left *inflation) (*entry, error) {
	sum, n := sha256.New(), &counter{}
	src := io.TeeReader(r, io.MultiWriter(sum, n))
	e := &entry{}
	if strings.HasSuffix(name, ".gz") {
		zr, err := gzip.NewReader(src)
		if err == nil {
			e.inflated, err = io.Copy(io.Discard, budget{zr, left})
		}
		if errors.Is(err, errInflateBudget) {
			return nil, err
		}
		e.gzipErr = err
	}
	// The rest of the file, all of it when it is not gzip; an error here
	// is the archive's, not the component's.
	if _, err := io.Copy(io.Discard, src); err != nil {
		return nil, err
	}
	e.checksum, e.contentLength = hex.EncodeToString(sum.Sum(nil)), n.n
	return e, nil
}

// entryName cleans an archive path ("./a//b" is "a/b") and says what is
// wrong with one that could land outside the directory it is unpacked in.
func entryName(name string) (string, string) {
	switch {
	case name == "":
		return "", "has an empty name"
	case strings.HasPrefix(name, "/"):
		return "", "is an absolute path; paths must stay inside the archive"
	case strings.ContainsAny(name, "\\\x00"):
		return "", "contains a backslash or NUL; paths must be plain slash-separated names"
	}
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return "", "escapes the archive with ..; paths must stay inside the archive"
		}
	}
	return path.Clean(name), ""
}

// ParseManifest decodes manifest.json strictly (duplicate keys, unknown
// fields and wrong types are errors naming the field) and checks it: valid
// versions and names, no component twice, dependencies the bundle itself
// does not contradict.
func ParseManifest(b []byte) (*fleet.Manifest, error) {
	v, err := codec.Decode(codec.JSON, b)
	if err != nil {
		return nil, invalid("%s is not valid JSON: %s", ManifestName, fleet.ErrorMessage(err))
	}
	f := fleet.NewFields(v)
	m := &fleet.Manifest{Version: f.String("version", true)}
	if f.Has("version") && !fleet.ValidVersion(m.Version) {
		f.Fail("version", fleet.VersionRule)
	}
	items := f.Array("components", true)
	if f.Has("components") && items != nil && len(items) == 0 {
		f.Fail("components", "must list at least one component")
	} else if len(items) > fleet.MaxComponents {
		f.Fail("components", fmt.Sprintf("must list at most %d components", fleet.MaxComponents))
		items = nil
	}
	seen := map[string]int{}
	for i, item := range items {
		cf := f.Element("components", i, item)
		if cf == nil {
			continue
		}
		c := readComponent(cf)
		cf.Unknown()
		if j, dup := seen[c.ComponentName]; dup && c.ComponentName != "" {
			f.Fail(fmt.Sprintf("components[%d].component_name", i), fmt.Sprintf("%s is listed already at components[%d]", c.ComponentName, j))
		}
		seen[c.ComponentName] = i
		m.Components = append(m.Components, c)
	}
	if err := f.Err(); err != nil {
		return nil, manifestError(err)
	}
	if broken := fleet.BrokenDependency(nil, m.Components); broken != "" {
		return nil, &fleet.Error{Code: fleet.EINVALID, Message: ManifestName + " contradicts itself: " + broken,
			Fields: map[string]string{"manifest.components": broken}}
	}
	return m, nil
}

func readComponent(f *fleet.Fields) *fleet.Firmware {
	c := &fleet.Firmware{Dependencies: []fleet.Dependency{}}
	if c.ComponentName = f.String("component_name", true); f.Has("component_name") && !fleet.ValidComponentName(c.ComponentName) {
		f.Fail("component_name", fleet.ComponentRule)
	}
	if c.VersionNumber = f.String("version_number", true); f.Has("version_number") && !fleet.ValidVersion(c.VersionNumber) {
		f.Fail("version_number", fleet.VersionRule)
	}
	if name := f.String("file_name", true); f.Has("file_name") {
		clean, problem := entryName(name)
		if problem == "" && (clean == "." || len(name) > 1024) {
			problem = "must name a file in the archive"
		}
		if problem != "" {
			f.Fail("file_name", problem)
		}
		c.FileName = clean
	}
	for i, item := range f.Array("dependencies", false) {
		df := f.Element("dependencies", i, item)
		if df == nil {
			continue
		}
		d := fleet.Dependency{ComponentName: df.String("component_name", true), MinVersion: df.String("min_version", true)}
		df.Unknown()
		c.Dependencies = append(c.Dependencies, d)
	}
	if field, problem := fleet.ValidateDependencies(c.ComponentName, c.Dependencies); problem != "" {
		f.Fail("dependencies"+field, problem)
	}
	return c
}

// manifestError names manifest fields as manifest.<path>.
func manifestError(err error) error {
	var fe *fleet.Error
	if !errors.As(err, &fe) {
		return err
	}
	fields := make(map[string]string, len(fe.Fields))
	var names []string
	for k, v := range fe.Fields {
		fields["manifest."+k] = v
		names = append(names, k+" "+v)
	}
	sort.Strings(names)
	return &fleet.Error{Code: fleet.EINVALID, Message: ManifestName + " is invalid: " + strings.Join(names, "; "), Fields: fields}
}
