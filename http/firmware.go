package fleethttp

import (
	"errors"
	"io"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/codec"
	"github.com/google/uuid"
)

// bundleCreate is the JSON body that makes a pending bundle record.
type bundleCreate struct {
	Version  string `json:"version" openapi:"required" doc:"the bundle's version: numbers separated by dots; the archive's manifest must say the same"`
	FileName string `json:"file_name" openapi:"required" doc:"the archive's file name as devices store it"`
}

// declaration is S5's body.
type declaration struct {
	UncompressedSize int64  `json:"uncompressed_size" openapi:"required" doc:"bytes of the tar stream (inflated when the archive is gzipped)"`
	Checksum         string `json:"checksum" openapi:"required" doc:"SHA-256 of the archive, 64 hex digits"`
	ContentLength    int64  `json:"content_length" openapi:"required" doc:"bytes of the archive"`
}

// firmwareUpdate is S8's body; each field is optional.
type firmwareUpdate struct {
	IsDeactivated    bool               `json:"is_deactivated,omitempty" doc:"true stops new dispatches of every bundle that contains this version"`
	UncompressedSize int64              `json:"uncompressed_size,omitempty"`
	Dependencies     []fleet.Dependency `json:"dependencies,omitempty" doc:"replaces the list"`
}

type bundleList struct {
	FirmwareBundles []*fleet.Bundle `json:"firmware_bundles"`
	Count           int             `json:"count"`
}

type firmwareList struct {
	Firmwares []*fleet.Firmware `json:"firmwares"`
	Count     int               `json:"count"`
}

// uploadTypes names what the upload endpoints take besides the four
// encodings.
const uploadTypes = "multipart/form-data (part \"file\") or application/octet-stream"

// bundleID returns the {id} of the path, which must be a UUID.
func bundleID(r *http.Request) (uuid.UUID, error) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil || len(r.PathValue("id")) != 36 {
		return uuid.Nil, pathError("id", "firmware bundle id", "must be a UUID such as 3f1c9a0e-8d2b-4c55-9e61-0a7d2b9c4e10")
	}
	return id, nil
}

// uploadBody turns what can go wrong while reading an upload into errors a
// client can act on: too large (413) or cut short (400).
type uploadBody struct {
	r     io.Reader
	limit int64
}

func (u uploadBody) Read(p []byte) (int, error) {
	n, err := u.r.Read(p)
	if err != nil && err != io.EOF {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return n, tooLarge(u.limit)
		}
		return n, fleet.Errorf(fleet.EINVALID, "the upload did not arrive whole: %v", err)
	}
	return n, err
}

// uploadReader returns the archive of an upload request: the raw body, or
// the part "file" of a multipart body, limited to Limits.Upload. The
// archive is streamed, never read here.
func (s *Server) uploadReader(w http.ResponseWriter, r *http.Request) (archive io.Reader, fileName string, err error) {
	if r.ContentLength > s.Limits.Upload {
		return nil, "", tooLarge(s.Limits.Upload)
	}
	r.Body = http.MaxBytesReader(w, r.Body, s.Limits.Upload)
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch mt {
	case "application/octet-stream", "application/gzip", "application/x-gzip", "application/x-tar":
		return uploadBody{r.Body, s.Limits.Upload}, "", nil
	case "multipart/form-data":
		mr, err := r.MultipartReader()
		if err != nil {
			return nil, "", fleet.Errorf(fleet.EINVALID, "the multipart body is malformed: %v", err)
		}
		part, err := mr.NextPart()
		if err == io.EOF {
			return nil, "", fleet.FieldErrors(map[string]string{"file": "is required: send the archive in the multipart part named file"})
		} else if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				return nil, "", tooLarge(s.Limits.Upload)
			}
			return nil, "", fleet.Errorf(fleet.EINVALID, "the multipart body is malformed: %v", err)
		}
		if part.FormName() != "file" {
			return nil, "", fleet.FieldErrors(map[string]string{part.FormName(): "is not a known part; send only the archive, in the part named file"})
		}
		return uploadBody{part, s.Limits.Upload}, part.FileName(), nil
	}
	return nil, "", fleet.Errorf(fleet.EUNSUPPORTED, "Content-Type %q is not supported here: use %s", r.Header.Get("Content-Type"), uploadTypes)
}

// handleCreateBundle uploads an archive (multipart) or makes a pending
// record (a JSON-like body).
func (s *Server) handleCreateBundle(w http.ResponseWriter, r *http.Request) error {
	ct := r.Header.Get("Content-Type")
	if mt, _, _ := mime.ParseMediaType(ct); mt == "multipart/form-data" {
		archive, fileName, err := s.uploadReader(w, r)
		if err != nil {
			return err
		}
		b, created, err := s.Firmware.UploadBundle(r.Context(), tenantOf(r), fileName, archive)
		if err != nil {
			return err
		}
		location(w, r, "/api/v1/firmware-bundles/id/", b.ID.String())
		status := http.StatusCreated
		if !created {
			status = http.StatusOK // stored already, byte for byte
		}
		s.respond(w, r, status, b)
		return nil
	}
	if _, ok := codec.FormatOf(ct); !ok {
		return fleet.Errorf(fleet.EUNSUPPORTED, "Content-Type %q is not supported here: use multipart/form-data (part \"file\") to upload an archive, or one of %s for a pending record", ct, supportedTypes())
	}
	body, err := s.decode(w, r, s.Limits.Body, ordinaryElements)
	if err != nil {
		return err
	}
	f := fleet.NewFields(body)
	version := f.String("version", true)
	if f.Has("version") && !fleet.ValidVersion(version) {
		f.Fail("version", fleet.VersionRule)
	}
	fileName := f.String("file_name", true)
	if f.Has("file_name") && !fleet.ValidFileName(fileName) {
		f.Fail("file_name", fleet.FileNameRule)
	}
	if err := f.Err(); err != nil {
		return err
	}
	b, err := s.Firmware.CreatePendingBundle(r.Context(), tenantOf(r), version, fileName)
	if err != nil {
		return err
	}
	location(w, r, "/api/v1/firmware-bundles/id/", b.ID.String())
	s.respond(w, r, http.StatusCreated, b)
	return nil
}

// handleUploadBundleFile receives the archive of a pending record.
func (s *Server) handleUploadBundleFile(w http.ResponseWriter, r *http.Request) error {
	id, err := bundleID(r)
	if err != nil {
		return err
	}
	archive, _, err := s.uploadReader(w, r)
	if err != nil {
		return err
	}
	b, err := s.Firmware.UploadBundleFile(r.Context(), tenantOf(r), id, archive)
	if err != nil {
		return err
	}
	s.respond(w, r, http.StatusOK, b)
	return nil
}

// handleDeclareBundle is S5.
func (s *Server) handleDeclareBundle(w http.ResponseWriter, r *http.Request) error {
	id, err := bundleID(r)
	if err != nil {
		return err
	}
	body, err := s.decode(w, r, s.Limits.Body, ordinaryElements)
	if err != nil {
		return err
	}
	f := fleet.NewFields(body)
	d := fleet.Declaration{
		UncompressedSize: f.Int("uncompressed_size", true, 0, 1<<62),
		Checksum:         f.String("checksum", true),
		ContentLength:    f.Int("content_length", true, 0, 1<<62),
	}
	if f.Has("checksum") && !fleet.ValidChecksum(d.Checksum) {
		f.Fail("checksum", fleet.ChecksumRule)
	}
	if err := f.Err(); err != nil {
		return err
	}
	d.Checksum = strings.ToLower(d.Checksum)
	b, err := s.Firmware.DeclareBundle(r.Context(), tenantOf(r), id, d)
	if err != nil {
		return err
	}
	return s.quiet(w, r, http.StatusNoContent, func() (any, error) { return b, nil })
}

func (s *Server) handleGetBundle(w http.ResponseWriter, r *http.Request) error {
	return getOne(s, w, r, bundleID, s.Firmware.FindBundle)
}

func (s *Server) handleDeleteBundle(w http.ResponseWriter, r *http.Request) error {
	id, err := bundleID(r)
	if err != nil {
		return err
	}
	if err := s.Firmware.DeleteBundle(r.Context(), tenantOf(r), id); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// bundleVersion returns the {version} of the path, which must be a valid
// version.
func bundleVersion(r *http.Request) (string, error) {
	return pathValue(r, "version", "version", fleet.ValidVersion, fleet.VersionRule)
}

// handleGetBundleByVersion is S6.
func (s *Server) handleGetBundleByVersion(w http.ResponseWriter, r *http.Request) error {
	return getOne(s, w, r, bundleVersion, s.Firmware.FindBundleByVersion)
}

func (s *Server) handleListBundles(w http.ResponseWriter, r *http.Request) error {
	q := newQuery(r)
	filter := fleet.BundleFilter{
		UploadStatus: q.Enum("upload_status", "", fleet.UploadPending, fleet.UploadCompleted, fleet.UploadFailed),
		Page:         q.Page(),
	}
	if err := q.Err(); err != nil {
		return err
	}
	bs, n, err := s.Firmware.FindBundles(r.Context(), tenantOf(r), filter)
	if err != nil {
		return err
	}
	s.respond(w, r, http.StatusOK, bundleList{FirmwareBundles: bs, Count: n})
	return nil
}

// componentPath returns the component name of the path, which must be
// valid.
func componentPath(r *http.Request) (string, error) {
	return pathValue(r, "component_name", "component name", fleet.ValidComponentName, fleet.ComponentRule)
}

// handleUpdateFirmware is S8.
func (s *Server) handleUpdateFirmware(w http.ResponseWriter, r *http.Request) error {
	component, err := componentPath(r)
	if err != nil {
		return err
	}
	version, err := pathValue(r, "version_number", "version number", fleet.ValidVersion, fleet.VersionRule)
	if err != nil {
		return err
	}
	body, err := s.decode(w, r, s.Limits.Body, ordinaryElements)
	if err != nil {
		return err
	}
	f := fleet.NewFields(body)
	var u fleet.FirmwareUpdate
	if f.Has("is_deactivated") {
		v := f.Bool("is_deactivated", false)
		u.IsDeactivated = &v
	}
	if f.Has("uncompressed_size") {
		v := f.Int("uncompressed_size", false, 0, 1<<62)
		u.UncompressedSize = &v
	}
	if f.Has("dependencies") {
		deps := []fleet.Dependency{}
		for i, item := range f.Array("dependencies", false) {
			df := f.Element("dependencies", i, item)
			if df == nil {
				continue
			}
			deps = append(deps, fleet.Dependency{ComponentName: df.String("component_name", true), MinVersion: df.String("min_version", true)})
			df.Unknown()
		}
		if field, problem := fleet.ValidateDependencies(component, deps); problem != "" {
			f.Fail("dependencies"+field, problem)
		}
		u.Dependencies = &deps
	}
	if err := f.Err(); err != nil {
		return err
	}
	if u == (fleet.FirmwareUpdate{}) {
		return fleet.Errorf(fleet.EINVALID, "nothing to update: send at least one of is_deactivated, uncompressed_size, dependencies")
	}
	fw, err := s.Firmware.UpdateFirmware(r.Context(), tenantOf(r), component, version, u)
	if err != nil {
		return err
	}
	return s.quiet(w, r, http.StatusNoContent, func() (any, error) { return fw, nil })
}

func (s *Server) handleListFirmwares(w http.ResponseWriter, r *http.Request) error {
	component, err := componentPath(r)
	if err != nil {
		return err
	}
	q := newQuery(r)
	p := q.Page()
	if err := q.Err(); err != nil {
		return err
	}
	fws, n, err := s.Firmware.FindFirmwares(r.Context(), tenantOf(r), component, p)
	if err != nil {
		return err
	}
	s.respond(w, r, http.StatusOK, firmwareList{Firmwares: fws, Count: n})
	return nil
}

// handleArtifact serves a completed bundle's archive to the holder of an
// API key (viewer or more) or of a signed URL, which is what devices get.
// The route is public so that this handler can accept either; API keys
// are checked by the one authenticate. Ranges (single, multiple, suffix),
// ETag and If-None-Match/If-Range are http.ServeContent's, so a device on
// a bad link resumes where it was cut.
// MaxRanges caps the ranges of one artifact request, as Apache's
// MaxRanges does: a signed URL needs no key, and 1,800 one-byte ranges made
// fleetd write a multipart part's headers for every byte. A request with
// more gets the whole archive.
const MaxRanges = 16

func (s *Server) handleArtifact(w http.ResponseWriter, r *http.Request) error {
	id, err := bundleID(r)
	if err != nil {
		return err
	}
	q := newQuery(r)
	tenant, expires, signature := q.String("tenant"), q.String("expires"), q.String("signature")
	if err := q.Err(); err != nil {
		return err
	}
	if tenant != "" || expires != "" || signature != "" {
		if err := s.Firmware.VerifyArtifactURL(r.Context(), tenant, id, expires, signature); err != nil {
			return err
		}
	} else {
		a, err := s.authenticate(r, fleet.PermRead)
		if err != nil {
			return err
		}
		if err := s.limitActor(w, fleet.PermRead, a); err != nil {
			return err
		}
		tenant = a.Tenant
		r = r.WithContext(fleet.NewContextWithActor(r.Context(), a))
	}
	b, art, err := s.Firmware.OpenArtifact(r.Context(), tenant, id)
	if err != nil {
		return err
	}
	defer art.Close()
	// A presigned URL of the bucket serves it (Range and ETag included)
	// without passing through fleetd.
	if ra, ok := art.(fleet.RedirectArtifact); ok {
		http.Redirect(w, r, ra.RedirectURL(), http.StatusTemporaryRedirect)
		return nil
	}
	h := w.Header()
	h.Set("ETag", `"`+*b.Checksum+`"`)
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": b.FileName}))
	// Caches may keep it but must revalidate: the ETag never changes for a
	// bundle, and a signed URL's query is part of the cache key anyway.
	h.Set("Cache-Control", "private, no-cache")
	if rg := r.Header.Get("Range"); strings.Count(rg, ",") >= MaxRanges {
		r = r.Clone(r.Context())
		r.Header.Del("Range") // the whole archive, once
	}
	http.ServeContent(&rangeErrorWriter{ResponseWriter: w, s: s, r: r, size: *b.ContentLength}, r, "", time.Time{}, art)
	return nil
}

// rangeErrorWriter answers an unsatisfiable Range with fleetd's error body
// where http.ServeContent would write a line of plain text; everything
// else, Content-Range included, is ServeContent's.
type rangeErrorWriter struct {
	http.ResponseWriter
	s         *Server
	r         *http.Request
	size      int64
	swallowed bool // ServeContent's own body
}

func (w *rangeErrorWriter) WriteHeader(code int) {
	if code != http.StatusRequestedRangeNotSatisfiable {
		w.ResponseWriter.WriteHeader(code)
		return
	}
	w.swallowed = true
	h := w.Header()
	h.Del("Content-Disposition")
	h.Del("X-Content-Type-Options")
	w.s.Error(w.ResponseWriter, w.r, fleet.Errorf(fleet.ERANGE,
		"the Range header asks for no byte of the archive, which has %d bytes (the first is 0)", w.size))
}

// Unwrap lets http.ResponseController reach the connection.
func (w *rangeErrorWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *rangeErrorWriter) Write(b []byte) (int, error) {
	if w.swallowed {
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}
