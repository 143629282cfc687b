package fleetdtest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"

	fwbundle "github.com/fleetd/fleet/firmware/bundle"

	"github.com/fleetd/fleet"
)

// Bundle is a firmware bundle as the API shows it.
type Bundle struct {
	ID               string `json:"id"`
	Version          string `json:"version"`
	FileName         string `json:"file_name"`
	UploadStatus     string `json:"upload_status"`
	UploadError      string `json:"upload_error"`
	ContentLength    *int64 `json:"content_length"`
	UncompressedSize *int64 `json:"uncompressed_size"`
	Checksum         *string
	Declared         *struct {
		Checksum string
	}
	Firmwares []FirmwareJSON
}

// FirmwareJSON is one component of a Bundle.
type FirmwareJSON struct {
	ID               string `json:"id"`
	ComponentName    string `json:"component_name"`
	VersionNumber    string `json:"version_number"`
	FileName         string `json:"file_name"`
	Checksum         string `json:"checksum"`
	ContentLength    int64  `json:"content_length"`
	UncompressedSize int64  `json:"uncompressed_size"`
	IsDeactivated    bool   `json:"is_deactivated"`
	Dependencies     []fleet.Dependency
}

// Part is one component of a test bundle.
type Part struct {
	Name, Version, Body string
	Deps                []fleet.Dependency
}

// MakeBundle builds a bundle archive (tar.gz) as `fleetd bundle create`
// would.
func MakeBundle(t testing.TB, version string, parts ...Part) []byte {
	t.Helper()
	var srcs []fwbundle.Source
	for _, p := range parts {
		srcs = append(srcs, fwbundle.Source{ComponentName: p.Name, VersionNumber: p.Version, FileName: p.Name + ".bin",
			Dependencies: p.Deps, Size: int64(len(p.Body)), Body: strings.NewReader(p.Body)})
	}
	var buf bytes.Buffer
	if err := fwbundle.Build(&buf, version, srcs, true); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// SHA256Hex is the hex SHA-256 of b.
func SHA256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// MultipartBody wraps an archive as the part "file" of a form.
func MultipartBody(t testing.TB, fileName string, data []byte) ([]byte, string) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	w, err := mw.CreateFormFile("file", fileName)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(data)
	mw.Close()
	return buf.Bytes(), mw.FormDataContentType()
}

// Upload sends an archive as a multipart upload.
func (s *Server) Upload(t *testing.T, c Creds, data []byte) *Response {
	t.Helper()
	body, ct := MultipartBody(t, "bundle.tar.gz", data)
	return s.Send(t, Req{Method: "POST", Path: "/api/v1/firmware-bundles", Creds: c, Raw: body, ContentType: ct})
}

// MustUpload uploads an archive and returns the completed bundle.
func (s *Server) MustUpload(t *testing.T, c Creds, data []byte) Bundle {
	t.Helper()
	var b Bundle
	s.Upload(t, c, data).Want(t, 201).Decode(t, &b)
	return b
}

// PutFile sends the archive of a pending record.
func (s *Server) PutFile(t *testing.T, c Creds, id string, data []byte) *Response {
	t.Helper()
	return s.Send(t, Req{Method: "PUT", Path: "/api/v1/firmware-bundles/id/" + id + "/file", Creds: c, Raw: data, ContentType: "application/octet-stream"})
}

var (
	Bootloader = Part{Name: "bootloader", Version: "1.2.0", Body: "bootloader 1.2.0"}
	App230     = Part{Name: "app", Version: "2.3.0", Body: strings.Repeat("app 2.3.0 ", 5000),
		Deps: []fleet.Dependency{{ComponentName: "bootloader", MinVersion: "1.1.0"}}}
)

// Get makes a raw request, not validated against the OpenAPI document:
// for archives, ranges and conditional answers.
func (s *Server) Get(t *testing.T, c Creds, path string, header ...string) (*http.Response, []byte) {
	t.Helper()
	hr, err := http.NewRequest("GET", s.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Tenant != "" {
		hr.Header.Set("x-service-tenant", c.Tenant)
		hr.Header.Set("x-service-api-key", c.Key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		hr.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}
