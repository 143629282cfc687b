// Package bundletest writes tar archives for tests of firmware bundles,
// entry by entry, including the malformed ones bundle.Build refuses to
// write: links, devices, paths that escape, files a manifest lacks.
package bundletest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"testing"
)

// File is one tar entry; Type 0 is a regular file.
type File struct {
	Name string
	Body string
	Type byte
	Link string
}

// Archive makes a tar (gzipped when gz) of files, in order.
func Archive(t testing.TB, gz bool, files ...File) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w io.Writer = &buf
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(&buf)
		w = zw
	}
	tw := tar.NewWriter(w)
	for _, f := range files {
		typ := f.Type
		if typ == 0 {
			typ = tar.TypeReg
		}
		hdr := &tar.Header{Name: f.Name, Typeflag: typ, Mode: 0o644, Linkname: f.Link}
		if typ == tar.TypeReg {
			hdr.Size = int64(len(f.Body))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if typ == tar.TypeReg {
			if _, err := io.WriteString(tw, f.Body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if zw != nil {
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}
