package fleethttp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/blob"
	"github.com/fleetd/fleet/firmware"
	"github.com/fleetd/fleet/firmware/bundle"
	fleethttp "github.com/fleetd/fleet/http"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// firmwareAPI is the HTTP API with the firmware service on SQLite, an
// upload limit of 64 KiB, and tenant acme's admin key.
type firmwareAPI struct {
	h   http.Handler
	fw  *firmware.Service
	key string
}

func newFirmwareAPI(t *testing.T) *firmwareAPI {
	t.Helper()
	db := sqlstoretest.MustOpen(t, sqlstoretest.Backends()[0], sqlstoretest.Options{})
	_, key, err := db.CreateTenant(context.Background(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	blobs, err := blob.OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	fw := &firmware.Service{Store: db, Blobs: blobs, PublicURL: "https://fleet.example.com"}
	s := &fleethttp.Server{Tenants: db, Devices: db, Audit: db, Firmware: fw,
		Limits: fleethttp.Limits{Body: 1 << 20, Bulk: 1 << 20, Upload: 64 << 10}}
	return &firmwareAPI{h: s.Handler(), fw: fw, key: key}
}

// do sends a request as acme's admin (unless header says otherwise) and
// returns the answer.
func (a *firmwareAPI) do(method, target string, body io.Reader, header ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, "http://fleet.example.com"+target, body)
	r.Header.Set("X-Service-Tenant", "acme")
	r.Header.Set("X-Service-Api-Key", a.key)
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	if _, ok := body.(*unsized); ok {
		r.ContentLength = -1 // as a chunked request
	}
	w := httptest.NewRecorder()
	a.h.ServeHTTP(w, r)
	return w
}

// unsized hides its length, as a chunked body does.
type unsized struct{ io.Reader }

func bundleArchive(t *testing.T, version string, size int) []byte {
	t.Helper()
	var buf bytes.Buffer
	body := strings.Repeat("x", size)
	err := bundle.Build(&buf, version, []bundle.Source{{ComponentName: "app", VersionNumber: version, FileName: "app.bin", Size: int64(size), Body: strings.NewReader(body)}}, false)
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func uploadForm(t *testing.T, part string, data []byte) (*bytes.Buffer, string) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	if part != "" {
		w, _ := mw.CreateFormFile(part, "fw.tar")
		w.Write(data)
	}
	mw.Close()
	return &buf, mw.FormDataContentType()
}

func wantFirmwareStatus(t *testing.T, w *httptest.ResponseRecorder, status int, field string) {
	t.Helper()
	if w.Code != status {
		t.Fatalf("status %d, want %d: %s", w.Code, status, w.Body)
	}
	if field != "" {
		var e struct{ Fields map[string]string }
		json.Unmarshal(w.Body.Bytes(), &e)
		if e.Fields[field] == "" {
			t.Fatalf("error %s does not name %s", w.Body, field)
		}
	}
}

func TestFirmwareUploadRequests(t *testing.T) {
	a := newFirmwareAPI(t)
	t.Run("OverTheLimitWhileStreaming", func(t *testing.T) {
		body, ct := uploadForm(t, "file", bundleArchive(t, "1.0.0", 100_000))
		wantFirmwareStatus(t, a.do("POST", "/api/v1/firmware-bundles", &unsized{body}, "Content-Type", ct), 413, "")
	})
	t.Run("OverTheLimitAnnounced", func(t *testing.T) {
		body, ct := uploadForm(t, "file", bundleArchive(t, "1.0.0", 100_000))
		wantFirmwareStatus(t, a.do("POST", "/api/v1/firmware-bundles", body, "Content-Type", ct), 413, "")
	})
	t.Run("Parts", func(t *testing.T) {
		body, ct := uploadForm(t, "meta", bundleArchive(t, "1.0.0", 10))
		wantFirmwareStatus(t, a.do("POST", "/api/v1/firmware-bundles", body, "Content-Type", ct), 400, "meta")
		body, ct = uploadForm(t, "", nil)
		wantFirmwareStatus(t, a.do("POST", "/api/v1/firmware-bundles", body, "Content-Type", ct), 400, "file")
		wantFirmwareStatus(t, a.do("POST", "/api/v1/firmware-bundles", strings.NewReader("--x\r\n"), "Content-Type", "multipart/form-data"), 400, "")
	})
	t.Run("ContentTypes", func(t *testing.T) {
		p, err := a.fw.CreatePendingBundle(context.Background(), "acme", "2.0.0", "fw.tar")
		if err != nil {
			t.Fatal(err)
		}
		path := "/api/v1/firmware-bundles/id/" + p.ID.String() + "/file"
		data := bundleArchive(t, "2.0.0", 10)
		wantFirmwareStatus(t, a.do("PUT", path, bytes.NewReader(data), "Content-Type", "text/plain"), 415, "")
		wantFirmwareStatus(t, a.do("PUT", path, bytes.NewReader(data)), 415, "")
		wantFirmwareStatus(t, a.do("POST", "/api/v1/firmware-bundles", bytes.NewReader(data), "Content-Type", "application/octet-stream"), 415, "")
		wantFirmwareStatus(t, a.do("PUT", path, bytes.NewReader(data), "Content-Type", "application/x-tar; foo=bar"), 200, "")
	})
	t.Run("Ids", func(t *testing.T) {
		for _, id := range []string{"xyz", "3f1c9a0e8d2b4c559e610a7d2b9c4e10", "urn:uuid:3f1c9a0e-8d2b-4c55-9e61-0a7d2b9c4e10", "{3f1c9a0e-8d2b-4c55-9e61-0a7d2b9c4e10}"} {
			wantFirmwareStatus(t, a.do("GET", "/api/v1/firmware-bundles/id/"+url.PathEscape(id), nil), 400, "id")
		}
	})
}

func TestFirmwareArtifactRequests(t *testing.T) {
	a := newFirmwareAPI(t)
	ctx := context.Background()
	data := bundleArchive(t, "1.0.0", 1000)
	b, _, err := a.fw.UploadBundle(ctx, "acme", "fw.tar", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	signed, err := a.fw.SignArtifactURL(ctx, "acme", b.ID, time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	target := strings.TrimPrefix(signed, "https://fleet.example.com")

	t.Run("SignedURLWinsOverHeaders", func(t *testing.T) {
		w := a.do("GET", target, nil, "X-Service-Api-Key", "fk_wrong")
		if w.Code != 200 || !bytes.Equal(w.Body.Bytes(), data) {
			t.Fatalf("status %d, %d bytes", w.Code, w.Body.Len())
		}
	})
	t.Run("Head", func(t *testing.T) {
		w := a.do("HEAD", target, nil, "X-Service-Api-Key", "")
		if w.Code != 200 || w.Body.Len() != 0 || w.Header().Get("Content-Length") != strconv.Itoa(len(data)) {
			t.Fatalf("HEAD: %d, %d bytes, length %s", w.Code, w.Body.Len(), w.Header().Get("Content-Length"))
		}
	})
	t.Run("PartialSignedParameters", func(t *testing.T) {
		u, _ := url.Parse(target)
		q := u.Query()
		q.Del("signature")
		w := a.do("GET", u.Path+"?"+q.Encode(), nil)
		wantFirmwareStatus(t, w, 401, "")
	})
	t.Run("Tenant", func(t *testing.T) {
		// A key of the right tenant is enough; the tenant of a signed URL
		// is its own query parameter.
		wantFirmwareStatus(t, a.do("GET", "/api/v1/firmware-bundles/id/"+b.ID.String()+"/artifact", nil), 200, "")
		wantFirmwareStatus(t, a.do("GET", "/api/v1/firmware-bundles/id/"+b.ID.String()+"/artifact", nil, "X-Service-Tenant", ""), 401, "")
	})
}
