package firmware

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"crypto/md5"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/blob"
	"github.com/google/uuid"
)

// componentsPrefix begins the blob key of every component file:
// components/{tenant}/{sha-256 of the file}. A file is stored once per
// tenant, whichever bundles carry it, as its firmware record is.
const componentsPrefix = "components"

func componentKey(tenant, checksum string) string {
	return path.Join(componentsPrefix, tenant, checksum)
}

// storeComponents reads a committed archive once more and stores each
// component's file as an object of its own, so that a client can fetch
// one component, with ranges (hawkBit DDI, docs/hawkbit.md), and computes
// the MD5 and SHA-1 such clients check. A file stored already, for an
// earlier bundle sharing the firmware, is only hashed. Memory stays flat:
// the archive streams through tar into the blob store.
func (s *Service) storeComponents(ctx context.Context, tenant string, f *fleet.BundleFile) error {
	obj, err := s.Blobs.Open(ctx, f.BlobKey)
	if err != nil {
		return fmt.Errorf("open archive %s: %w", f.BlobKey, err)
	}
	defer obj.Close()
	var r io.Reader = bufio.NewReaderSize(obj, 64<<10)
	if f.Gzipped {
		zr, err := gzip.NewReader(r)
		if err != nil {
			return fmt.Errorf("read archive %s: %w", f.BlobKey, err)
		}
		r = zr
	}
	byFile := map[string][]*fleet.Firmware{}
	for _, c := range f.Manifest.Components {
		byFile[c.FileName] = append(byFile[c.FileName], c)
	}
	tr := tar.NewReader(r)
	for len(byFile) > 0 {
		hdr, err := tr.Next()
		if err != nil {
			return fmt.Errorf("read archive %s: %w", f.BlobKey, err)
		}
		name := path.Clean(hdr.Name) // as Parse named it; Parse refused the names it could not clean
		cs := byFile[name]
		if len(cs) == 0 || (hdr.Typeflag != tar.TypeReg && hdr.Typeflag != '\x00') {
			continue
		}
		delete(byFile, name)
		md, sh := md5.New(), sha1.New()
		if err := s.storeComponent(ctx, componentKey(tenant, cs[0].Checksum), cs[0].ContentLength, io.TeeReader(tr, io.MultiWriter(md, sh))); err != nil {
			return err
		}
		for _, c := range cs {
			c.MD5, c.SHA1 = hex.EncodeToString(md.Sum(nil)), hex.EncodeToString(sh.Sum(nil))
		}
	}
	return nil
}

// storeComponent stores one file under key unless it is there; either way
// it reads r to its end.
func (s *Service) storeComponent(ctx context.Context, key string, size int64, r io.Reader) error {
	if o, err := s.Blobs.Open(ctx, key); err == nil {
		o.Close()
		_, err := io.Copy(io.Discard, r)
		return err
	} else if !errors.Is(err, blob.ErrNotFound) {
		return fmt.Errorf("open component %s: %w", key, err)
	}
	p, err := s.Blobs.Put(ctx, key, r)
	if err != nil {
		return fmt.Errorf("store component %s: %w", key, err)
	}
	if p.Size() != size {
		s.abort(ctx, p)
		return fmt.Errorf("store component %s: %d bytes, the archive said %d", key, p.Size(), size)
	}
	if err := p.Commit(ctx); err != nil {
		s.abort(ctx, p)
		return fmt.Errorf("commit component %s: %w", key, err)
	}
	return nil
}

// OpenComponent opens the file of a component version, as stored at the
// upload of a bundle carrying it.
func (s *Service) OpenComponent(ctx context.Context, tenant string, id uuid.UUID) (*fleet.Firmware, fleet.Artifact, error) {
	fw, err := s.Store.FindFirmwareByID(ctx, tenant, id)
	if err != nil {
		return nil, nil, err
	}
	obj, err := s.Blobs.Open(ctx, componentKey(tenant, fw.Checksum))
	if errors.Is(err, blob.ErrNotFound) {
		return nil, nil, fleet.Errorf(fleet.ENOTFOUND, "component %s version %s has no file of its own: upload a bundle carrying it again", fw.ComponentName, fw.VersionNumber)
	} else if err != nil {
		return nil, nil, fmt.Errorf("open component %s %s: %w", fw.ComponentName, fw.VersionNumber, err)
	}
	art, err := s.redirectable(ctx, obj, componentKey(tenant, fw.Checksum), path.Base(fw.FileName))
	return fw, art, err
}
