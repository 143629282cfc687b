package firmware_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"mime/multipart"
	"net"
	"net/http"
	neturl "net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/action"
	fwbundle "github.com/fleetd/fleet/firmware/bundle"
	"github.com/fleetd/fleet/firmware/bundle/bundletest"
	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
	"github.com/minio/minio-go/v7"
)

// runStores runs f on each database backend with each blob store, so that
// every promise of docs/firmware.md is checked on both.
func runStores(t *testing.T, f func(t *testing.T, b sqlstoretest.Backend, store string)) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		for _, store := range []string{"file", "s3"} {
			t.Run(store, func(t *testing.T) { f(t, b, store) })
		}
	})
}

// dataFiles lists the regular files under the server's data directory, or
// the objects and multipart uploads in progress in its S3 bucket.
func dataFiles(t *testing.T, s *fleetdtest.Server) []string {
	t.Helper()
	var files []string
	if s.S3 != nil {
		c := s.S3.Client(t)
		for o := range c.ListObjects(context.Background(), s.S3.Bucket, minio.ListObjectsOptions{Recursive: true}) {
			if o.Err != nil {
				t.Fatal(o.Err)
			}
			files = append(files, o.Key)
		}
		for u := range c.ListIncompleteUploads(context.Background(), s.S3.Bucket, "", true) {
			if u.Err != nil {
				t.Fatal(u.Err)
			}
			files = append(files, "upload of "+u.Key)
		}
		return files
	}
	filepath.WalkDir(s.DataDir, func(path string, e fs.DirEntry, err error) error {
		if err == nil && !e.IsDir() {
			files = append(files, strings.TrimPrefix(path, s.DataDir))
		}
		return nil
	})
	return files
}

// bundleCount is how many bundles the tenant has.
func bundleCount(t *testing.T, s *fleetdtest.Server, c fleetdtest.Creds) int {
	t.Helper()
	var list struct{ Count int }
	s.Do(t, c, "GET", "/api/v1/firmware-bundles", nil).Want(t, 200).Decode(t, &list)
	return list.Count
}

func wantError(t *testing.T, r *fleetdtest.Response, status int, field string, words ...string) {
	t.Helper()
	r.Want(t, status)
	var e struct {
		Message string
		Fields  map[string]string
	}
	r.Decode(t, &e)
	if field != "" && e.Fields[field] == "" {
		t.Errorf("%s: error %s does not name field %s", r.Req, r.Body, field)
	}
	for _, w := range words {
		if !strings.Contains(e.Message+fmt.Sprint(e.Fields), w) {
			t.Errorf("%s: error %s does not mention %q", r.Req, r.Body, w)
		}
	}
}

func TestFirmwareUploads(t *testing.T) {
	t.Parallel()
	runStores(t, func(t *testing.T, b sqlstoretest.Backend, store string) {
		s := fleetdtest.StartOn(t, b, store)
		admin := s.Admin()
		data := fleetdtest.MakeBundle(t, "2.3.0", fleetdtest.Bootloader, fleetdtest.App230)
		var first fleetdtest.Bundle

		t.Run("Multipart", func(t *testing.T) {
			r := s.Upload(t, admin, data).Want(t, 201)
			r.Decode(t, &first)
			if loc := r.Header.Get("Location"); !strings.HasSuffix(loc, "/api/v1/firmware-bundles/id/"+first.ID) {
				t.Fatalf("Location = %q", loc)
			}
			if first.UploadStatus != "completed" || first.Version != "2.3.0" || first.FileName != "bundle.tar.gz" ||
				*first.Checksum != fleetdtest.SHA256Hex(data) || *first.ContentLength != int64(len(data)) || *first.UncompressedSize <= int64(len(data)) {
				t.Fatalf("bundle = %+v", first)
			}
			if len(first.Firmwares) != 2 || first.Firmwares[1].ComponentName != "app" || first.Firmwares[1].Checksum != fleetdtest.SHA256Hex([]byte(fleetdtest.App230.Body)) ||
				first.Firmwares[1].ContentLength != int64(len(fleetdtest.App230.Body)) || first.Firmwares[1].Dependencies[0].MinVersion != "1.1.0" {
				t.Fatalf("firmwares = %+v", first.Firmwares)
			}
		})
		t.Run("ReadS6", func(t *testing.T) {
			var byVersion, byID fleetdtest.Bundle
			s.Do(t, admin, "GET", "/api/v1/firmware-bundles/version/2.3.0", nil).Want(t, 200).Decode(t, &byVersion)
			s.Do(t, admin, "GET", "/api/v1/firmware-bundles/id/"+first.ID, nil).Want(t, 200).Decode(t, &byID)
			if byVersion.ID != first.ID || byID.ID != first.ID || len(byVersion.Firmwares) != 2 {
				t.Fatalf("S6 = %+v, by id = %+v", byVersion, byID)
			}
			wantError(t, s.Do(t, admin, "GET", "/api/v1/firmware-bundles/version/9.9.9", nil), 404, "")
			wantError(t, s.Do(t, admin, "GET", "/api/v1/firmware-bundles/version/latest", nil), 400, "version")
			wantError(t, s.Do(t, admin, "GET", "/api/v1/firmware-bundles/id/not-a-uuid", nil), 400, "id")
		})
		t.Run("TransitUUIDs", func(t *testing.T) {
			r := s.Send(t, fleetdtest.Req{Method: "GET", Path: "/api/v1/firmware-bundles/id/" + first.ID, Creds: admin, Header: http.Header{"Accept": {"application/transit+json"}}}).Want(t, 200)
			if !bytes.Contains(r.Body, []byte(`"~u`+first.ID+`"`)) {
				t.Fatalf("the Transit answer does not carry the id as a UUID: %s", r.Body[:min(200, len(r.Body))])
			}
			r = s.Send(t, fleetdtest.Req{Method: "GET", Path: "/api/v1/firmware-bundles/id/" + first.ID, Creds: admin, Header: http.Header{"Accept": {"application/edn"}}}).Want(t, 200)
			if !bytes.Contains(r.Body, []byte(`#uuid "`+first.ID+`"`)) {
				t.Fatalf("the EDN answer does not carry the id as a UUID")
			}
		})
		t.Run("SameArchiveAgain", func(t *testing.T) {
			// A re-run CI job uploads its build again: the bundle there
			// is, 200, and nothing more stored.
			files, n := dataFiles(t, s), bundleCount(t, s, admin)
			var again fleetdtest.Bundle
			r := s.Upload(t, admin, data).Want(t, 200)
			r.Decode(t, &again)
			if again.ID != first.ID || again.UploadStatus != "completed" || len(again.Firmwares) != 2 {
				t.Fatalf("the same archive again: %+v, want bundle %s", again, first.ID)
			}
			if loc := r.Header.Get("Location"); !strings.HasSuffix(loc, "/api/v1/firmware-bundles/id/"+first.ID) {
				t.Fatalf("Location = %q", loc)
			}
			if got := dataFiles(t, s); strings.Join(got, " ") != strings.Join(files, " ") || bundleCount(t, s, admin) != n {
				t.Fatalf("files %v, want %v", got, files)
			}
		})
		t.Run("VersionConflict", func(t *testing.T) {
			wantError(t, s.Upload(t, admin, fleetdtest.MakeBundle(t, "2.3.0", fleetdtest.Part{Name: "other", Version: "1.0.0", Body: "x"})), 409, "", "2.3.0", "another archive")
			wantError(t, s.Do(t, admin, "POST", "/api/v1/firmware-bundles", map[string]any{"version": "2.3.0", "file_name": "x.tar.gz"}), 409, "", "2.3.0")
		})
		t.Run("ComponentConflict", func(t *testing.T) {
			changed := fleetdtest.App230
			changed.Body = "another app 2.3.0"
			wantError(t, s.Upload(t, admin, fleetdtest.MakeBundle(t, "2.3.1", fleetdtest.Bootloader, changed)), 409, "", "app", "2.3.0", "checksum")
		})
		t.Run("SharedFirmware", func(t *testing.T) {
			b := s.MustUpload(t, admin, fleetdtest.MakeBundle(t, "2.4.0", fleetdtest.Bootloader, fleetdtest.Part{Name: "app", Version: "2.4.0", Body: "app 2.4.0"}))
			if b.Firmwares[0].ID != first.Firmwares[0].ID {
				t.Fatalf("bootloader 1.2.0 is not shared: %s vs %s", b.Firmwares[0].ID, first.Firmwares[0].ID)
			}
		})
		t.Run("Rejections", func(t *testing.T) {
			before := dataFiles(t, s)
			noManifest := makeTar(t, false, "app.bin", "x")
			wantError(t, s.Upload(t, admin, noManifest), 400, "", "manifest.json")
			wantError(t, s.Upload(t, admin, []byte("\x1f\x8b\x08\x00garbage")), 400, "", "gzip")
			escape := makeTar(t, false, "../evil", "x", "manifest.json", `{}`)
			wantError(t, s.Upload(t, admin, escape), 400, "", "../evil")
			contradiction := makeTar(t, true, "boot.bin", "b", "app.bin", "a", "manifest.json", `{"version": "5.0.0", "components": [
				{"component_name": "bootloader", "version_number": "1.0.0", "file_name": "boot.bin"},
				{"component_name": "app", "version_number": "5.0.0", "file_name": "app.bin", "dependencies": [{"component_name": "bootloader", "min_version": "1.1.0"}]}]}`)
			wantError(t, s.Upload(t, admin, contradiction), 400, "manifest.components", "bootloader >= 1.1.0")
			missing := makeTar(t, false, "manifest.json", `{"version": "5.0.0", "components": [{"component_name": "app", "version_number": "5.0.0", "file_name": "app.bin"}]}`)
			wantError(t, s.Upload(t, admin, missing), 400, "manifest.components[0].file_name", "app.bin")
			if after := dataFiles(t, s); len(after) != len(before) {
				t.Fatalf("refused uploads left files: %v, before %v", after, before)
			}
		})
		t.Run("BadRequests", func(t *testing.T) {
			body, ct := fleetdtest.MultipartBody(t, "x", data)
			wrongPart := bytes.Replace(body, []byte(`name="file"`), []byte(`name="archive"`), 1)
			wantError(t, s.Send(t, fleetdtest.Req{Method: "POST", Path: "/api/v1/firmware-bundles", Creds: admin, Raw: wrongPart, ContentType: ct}), 400, "archive")
			r := s.Send(t, fleetdtest.Req{Method: "POST", Path: "/api/v1/firmware-bundles", Creds: admin, Raw: data, ContentType: "application/zip"}).Want(t, 415)
			if !strings.Contains(string(r.Body), "multipart/form-data") {
				t.Fatalf("415 does not say what to send: %s", r.Body)
			}
			wantError(t, s.Do(t, admin, "POST", "/api/v1/firmware-bundles", map[string]any{"version": "3.0.0"}), 400, "file_name")
			wantError(t, s.Do(t, admin, "POST", "/api/v1/firmware-bundles", map[string]any{"version": "3.0", "file_name": "a/b"}), 400, "file_name")
			wantError(t, s.Do(t, admin, "POST", "/api/v1/firmware-bundles", map[string]any{"version": 3, "file_name": "x"}), 400, "version")
			wantError(t, s.Do(t, admin, "POST", "/api/v1/firmware-bundles", map[string]any{"version": "3.0", "file_name": "x", "size": 1}), 400, "size")
		})
		t.Run("List", func(t *testing.T) {
			var list struct {
				FirmwareBundles []fleetdtest.Bundle `json:"firmware_bundles"`
				Count           int
			}
			s.Do(t, admin, "GET", "/api/v1/firmware-bundles?limit=1", nil).Want(t, 200).Decode(t, &list)
			if list.Count != 2 || len(list.FirmwareBundles) != 1 || list.FirmwareBundles[0].Version != "2.4.0" {
				t.Fatalf("list = %+v", list)
			}
			s.Do(t, admin, "GET", "/api/v1/firmware-bundles?upload_status=pending", nil).Want(t, 200).Decode(t, &list)
			if list.Count != 0 {
				t.Fatalf("pending = %+v", list)
			}
			wantError(t, s.Do(t, admin, "GET", "/api/v1/firmware-bundles?upload_status=done", nil), 400, "upload_status")
		})
	})
}

// makeTar builds an archive from name, body pairs, without the checks of
// fwbundle.Build: for archives the server must refuse.
func makeTar(t *testing.T, gz bool, pairs ...string) []byte {
	t.Helper()
	var files []bundletest.File
	for i := 0; i+1 < len(pairs); i += 2 {
		files = append(files, bundletest.File{Name: pairs[i], Body: pairs[i+1]})
	}
	return bundletest.Archive(t, gz, files...)
}

func TestFirmwarePendingUploads(t *testing.T) {
	t.Parallel()
	runStores(t, func(t *testing.T, b sqlstoretest.Backend, store string) {
		s := fleetdtest.StartOn(t, b, store)
		admin := s.Admin()
		pending := func(version string) fleetdtest.Bundle {
			t.Helper()
			var p fleetdtest.Bundle
			r := s.Do(t, admin, "POST", "/api/v1/firmware-bundles", map[string]any{"version": version, "file_name": "fw-" + version + ".tar.gz"}).Want(t, 201)
			r.Decode(t, &p)
			if p.UploadStatus != "pending" || p.Checksum != nil || !strings.HasSuffix(r.Header.Get("Location"), "/id/"+p.ID) {
				t.Fatalf("pending = %+v", p)
			}
			return p
		}
		declare := func(id string, data []byte) map[string]any {
			zr := gunzipLen(t, data)
			return map[string]any{"uncompressed_size": zr, "checksum": fleetdtest.SHA256Hex(data), "content_length": len(data)}
		}
		bundleOf := func(id string) fleetdtest.Bundle {
			var got fleetdtest.Bundle
			s.Do(t, admin, "GET", "/api/v1/firmware-bundles/id/"+id, nil).Want(t, 200).Decode(t, &got)
			return got
		}

		t.Run("DeclareThenFile", func(t *testing.T) {
			p := pending("1.0.0")
			data := fleetdtest.MakeBundle(t, "1.0.0", fleetdtest.Part{Name: "app", Version: "1.0.0", Body: "app 1.0.0"})
			r := s.Do(t, admin, "PUT", "/api/v1/firmware-bundles/id/"+p.ID, declare(p.ID, data)).Want(t, 204)
			if len(r.Body) != 0 {
				t.Fatalf("S5 answered a body: %s", r.Body)
			}
			if got := bundleOf(p.ID); got.UploadStatus != "pending" || got.Declared == nil {
				t.Fatalf("after S5 alone: %+v", got)
			}
			var done fleetdtest.Bundle
			s.PutFile(t, admin, p.ID, data).Want(t, 200).Decode(t, &done)
			if done.UploadStatus != "completed" || *done.Checksum != fleetdtest.SHA256Hex(data) || len(done.Firmwares) != 1 || done.FileName != "fw-1.0.0.tar.gz" {
				t.Fatalf("after the file: %+v", done)
			}
		})
		t.Run("FileThenDeclare", func(t *testing.T) {
			p := pending("1.0.1")
			data := fleetdtest.MakeBundle(t, "1.0.1", fleetdtest.Part{Name: "app", Version: "1.0.1", Body: "app 1.0.1"})
			var got fleetdtest.Bundle
			s.PutFile(t, admin, p.ID, data).Want(t, 200).Decode(t, &got)
			if got.UploadStatus != "pending" || *got.Checksum != fleetdtest.SHA256Hex(data) {
				t.Fatalf("after the file alone: %+v", got)
			}
			// In any of the four encodings; with Prefer, the bundle.
			r := s.Send(t, fleetdtest.Req{Method: "PUT", Path: "/api/v1/firmware-bundles/id/" + p.ID, Creds: admin,
				Raw:         []byte(fmt.Sprintf(`{:checksum %q :content_length %d :uncompressed_size %d}`, fleetdtest.SHA256Hex(data), len(data), gunzipLen(t, data))),
				ContentType: "application/edn", Header: http.Header{"Prefer": {"return=representation"}}}).Want(t, 200)
			r.Decode(t, &got)
			if got.UploadStatus != "completed" || len(got.Firmwares) != 1 {
				t.Fatalf("after S5: %+v", got)
			}
			// Declaring the same again confirms; declaring otherwise is 409
			// and changes nothing.
			s.Do(t, admin, "PUT", "/api/v1/firmware-bundles/id/"+p.ID, declare(p.ID, data)).Want(t, 204)
			wrong := declare(p.ID, data)
			wrong["content_length"] = len(data) + 1
			wantError(t, s.Do(t, admin, "PUT", "/api/v1/firmware-bundles/id/"+p.ID, wrong), 409, "content_length")
			if got := bundleOf(p.ID); got.UploadStatus != "completed" {
				t.Fatalf("a wrong declaration changed a completed bundle: %+v", got)
			}
		})
		t.Run("MismatchAfterFile", func(t *testing.T) {
			p := pending("1.0.2")
			data := fleetdtest.MakeBundle(t, "1.0.2", fleetdtest.Part{Name: "app", Version: "1.0.2", Body: "app 1.0.2"})
			s.PutFile(t, admin, p.ID, data).Want(t, 200)
			filesWithArchive := len(dataFiles(t, s))
			wrong := declare(p.ID, data)
			wrong["checksum"] = strings.Repeat("0", 64)
			wantError(t, s.Do(t, admin, "PUT", "/api/v1/firmware-bundles/id/"+p.ID, wrong), 409, "checksum", "checksum")
			got := bundleOf(p.ID)
			if got.UploadStatus != "failed" || !strings.Contains(got.UploadError, "checksum") || strings.Contains(got.UploadError, "content_length") {
				t.Fatalf("after a wrong checksum: %+v", got)
			}
			var s6 fleetdtest.Bundle
			s.Do(t, admin, "GET", "/api/v1/firmware-bundles/version/1.0.2", nil).Want(t, 200).Decode(t, &s6)
			if s6.UploadError == "" || s6.UploadStatus != "failed" {
				t.Fatalf("S6 of a failed bundle = %+v", s6)
			}
			if n := len(dataFiles(t, s)); n != filesWithArchive-1 {
				t.Fatalf("the failed bundle's archive was kept: %d files, had %d", n, filesWithArchive)
			}
			// Failed is final.
			wantError(t, s.Do(t, admin, "PUT", "/api/v1/firmware-bundles/id/"+p.ID, declare(p.ID, data)), 409, "", "failed")
			wantError(t, s.PutFile(t, admin, p.ID, data), 409, "", "failed")
			resp, _ := s.Get(t, admin, "/api/v1/firmware-bundles/id/"+p.ID+"/artifact")
			if resp.StatusCode != 409 {
				t.Fatalf("artifact of a failed bundle: %d", resp.StatusCode)
			}
			// The version is free again.
			retry := pending("1.0.2")
			s.Do(t, admin, "PUT", "/api/v1/firmware-bundles/id/"+retry.ID, declare(retry.ID, data)).Want(t, 204)
			s.PutFile(t, admin, retry.ID, data).Want(t, 200)
			s.Do(t, admin, "GET", "/api/v1/firmware-bundles/version/1.0.2", nil).Want(t, 200).Decode(t, &s6)
			if s6.ID != retry.ID || s6.UploadStatus != "completed" {
				t.Fatalf("S6 after a retry = %+v", s6)
			}
		})
		t.Run("MismatchAtFile", func(t *testing.T) {
			p := pending("1.0.3")
			data := fleetdtest.MakeBundle(t, "1.0.3", fleetdtest.Part{Name: "app", Version: "1.0.3", Body: "app 1.0.3"})
			wrong := declare(p.ID, data)
			wrong["uncompressed_size"] = 1
			s.Do(t, admin, "PUT", "/api/v1/firmware-bundles/id/"+p.ID, wrong).Want(t, 204)
			wantError(t, s.PutFile(t, admin, p.ID, data), 409, "uncompressed_size", "uncompressed_size")
			if got := bundleOf(p.ID); got.UploadStatus != "failed" || !strings.Contains(got.UploadError, "uncompressed_size") {
				t.Fatalf("after the file: %+v", got)
			}
		})
		t.Run("ReUploads", func(t *testing.T) {
			p := pending("1.0.4")
			data := fleetdtest.MakeBundle(t, "1.0.4", fleetdtest.Part{Name: "app", Version: "1.0.4", Body: "app 1.0.4"})
			s.PutFile(t, admin, p.ID, data).Want(t, 200)
			wantError(t, s.PutFile(t, admin, p.ID, data), 409, "", "already")
			s.Do(t, admin, "PUT", "/api/v1/firmware-bundles/id/"+p.ID, declare(p.ID, data)).Want(t, 204)
			// The same bytes again to the completed bundle are a re-run:
			// 200 with it. Others are a change, refused.
			files := dataFiles(t, s)
			var again fleetdtest.Bundle
			s.PutFile(t, admin, p.ID, data).Want(t, 200).Decode(t, &again)
			if again.ID != p.ID || again.UploadStatus != "completed" || *again.Checksum != fleetdtest.SHA256Hex(data) {
				t.Fatalf("the same file again: %+v", again)
			}
			wantError(t, s.PutFile(t, admin, p.ID, fleetdtest.MakeBundle(t, "1.0.4", fleetdtest.Part{Name: "app", Version: "1.0.4", Body: "rebuilt"})), 409, "", "completed")
			if got := dataFiles(t, s); strings.Join(got, " ") != strings.Join(files, " ") {
				t.Fatalf("files %v, want %v", got, files)
			}
		})
		t.Run("ManifestVersionDiffers", func(t *testing.T) {
			p := pending("1.0.5")
			wantError(t, s.PutFile(t, admin, p.ID, fleetdtest.MakeBundle(t, "1.0.6", fleetdtest.Part{Name: "app", Version: "1.0.6", Body: "x"})), 400, "manifest.version", "1.0.5")
			if got := bundleOf(p.ID); got.UploadStatus != "pending" || got.Checksum != nil {
				t.Fatalf("a refused archive changed the record: %+v", got)
			}
		})
		t.Run("MultipartFile", func(t *testing.T) {
			p := pending("1.0.7")
			data := fleetdtest.MakeBundle(t, "1.0.7", fleetdtest.Part{Name: "app", Version: "1.0.7", Body: "x7"})
			body, ct := fleetdtest.MultipartBody(t, "ignored.tar.gz", data)
			s.Send(t, fleetdtest.Req{Method: "PUT", Path: "/api/v1/firmware-bundles/id/" + p.ID + "/file", Creds: admin, Raw: body, ContentType: ct}).Want(t, 200)
		})
		t.Run("StrictS5", func(t *testing.T) {
			p := pending("1.0.8")
			good := map[string]any{"uncompressed_size": 10, "checksum": strings.Repeat("a", 64), "content_length": 5}
			for field, bad := range map[string]any{"uncompressed_size": "10", "content_length": 5.5, "checksum": 12} {
				body := map[string]any{}
				for k, v := range good {
					body[k] = v
				}
				body[field] = bad
				wantError(t, s.Do(t, admin, "PUT", "/api/v1/firmware-bundles/id/"+p.ID, body), 400, field)
			}
			wantError(t, s.Do(t, admin, "PUT", "/api/v1/firmware-bundles/id/"+p.ID, map[string]any{"checksum": "abc", "content_length": 1, "uncompressed_size": 1}), 400, "checksum")
			wantError(t, s.Do(t, admin, "PUT", "/api/v1/firmware-bundles/id/"+p.ID, map[string]any{"checksum": strings.Repeat("a", 64)}), 400, "content_length")
			extra := map[string]any{"upload_status": "completed"}
			for k, v := range good {
				extra[k] = v
			}
			wantError(t, s.Do(t, admin, "PUT", "/api/v1/firmware-bundles/id/"+p.ID, extra), 400, "upload_status")
			// 30.0 is an integer.
			s.Send(t, fleetdtest.Req{Method: "PUT", Path: "/api/v1/firmware-bundles/id/" + p.ID, Creds: admin,
				Raw: []byte(`{"uncompressed_size": 10.0, "checksum": "` + strings.Repeat("A", 64) + `", "content_length": 5}`), ContentType: "application/json"}).Want(t, 204)
			wantError(t, s.Do(t, admin, "PUT", "/api/v1/firmware-bundles/id/00000000-0000-0000-0000-000000000000", good), 404, "")
		})
		t.Run("Delete", func(t *testing.T) {
			p := pending("1.0.9")
			data := fleetdtest.MakeBundle(t, "1.0.9", fleetdtest.Part{Name: "app", Version: "1.0.9", Body: "x9"})
			s.PutFile(t, admin, p.ID, data).Want(t, 200)
			before := len(dataFiles(t, s))
			s.Do(t, admin, "DELETE", "/api/v1/firmware-bundles/id/"+p.ID, nil).Want(t, 204)
			wantError(t, s.Do(t, admin, "GET", "/api/v1/firmware-bundles/id/"+p.ID, nil), 404, "")
			if n := len(dataFiles(t, s)); n != before-1 {
				t.Fatalf("the deleted bundle's archive remains: %d files, had %d", n, before)
			}
		})
	})
}

// gunzipLen is the inflated size of a gzip stream.
func gunzipLen(t *testing.T, data []byte) int64 {
	t.Helper()
	n, err := io.Copy(io.Discard, mustGunzip(t, data))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestFirmwareUploadFailuresLeaveNothing(t *testing.T) {
	t.Parallel()
	runStores(t, func(t *testing.T, b sqlstoretest.Backend, store string) {
		s := fleetdtest.StartOn(t, b, store, "--max-upload-bytes", "65536")
		admin := s.Admin()
		big := makeTar(t, false, "app.bin", strings.Repeat("x", 100_000), "manifest.json",
			`{"version": "1.0.0", "components": [{"component_name": "app", "version_number": "1.0.0", "file_name": "app.bin"}]}`)

		t.Run("TooLarge", func(t *testing.T) {
			wantError(t, s.Upload(t, admin, big), 413, "")
			p := fleetdtest.Bundle{}
			s.Do(t, admin, "POST", "/api/v1/firmware-bundles", map[string]any{"version": "1.0.0", "file_name": "a.tar"}).Want(t, 201).Decode(t, &p)
			wantError(t, s.PutFile(t, admin, p.ID, big), 413, "")
			// Without a Content-Length the limit is found while streaming.
			hr, _ := http.NewRequest("PUT", s.URL+"/api/v1/firmware-bundles/id/"+p.ID+"/file", io.MultiReader(bytes.NewReader(big)))
			hr.Header.Set("Content-Type", "application/octet-stream")
			hr.Header.Set("x-service-tenant", admin.Tenant)
			hr.Header.Set("x-service-api-key", admin.Key)
			resp, err := http.DefaultClient.Do(hr)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 413 || hr.ContentLength > 0 {
				t.Fatalf("chunked upload over the limit: %d", resp.StatusCode)
			}
			var got fleetdtest.Bundle
			s.Do(t, admin, "GET", "/api/v1/firmware-bundles/id/"+p.ID, nil).Want(t, 200).Decode(t, &got)
			if got.UploadStatus != "pending" || got.Checksum != nil {
				t.Fatalf("after refused uploads: %+v", got)
			}
			s.Do(t, admin, "DELETE", "/api/v1/firmware-bundles/id/"+p.ID, nil).Want(t, 204)
		})
		t.Run("ClientCut", func(t *testing.T) {
			body, ct := fleetdtest.MultipartBody(t, "b.tar", big[:60_000])
			conn, err := net.Dial("tcp", strings.TrimPrefix(s.URL, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(conn, "POST /api/v1/firmware-bundles HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\nContent-Length: %d\r\nx-service-tenant: %s\r\nx-service-api-key: %s\r\n\r\n",
				ct, len(body)+1000, admin.Tenant, admin.Key)
			conn.Write(body[:len(body)-100])
			// Once the server streams the upload to a temporary file, cut
			// the connection; the server must remove the file.
			fleetdtest.Eventually(t, "a temporary file", func() bool { return len(dataFiles(t, s)) > 0 })
			conn.Close()
			fleetdtest.Eventually(t, "no files", func() bool { return len(dataFiles(t, s)) == 0 })
		})
		t.Run("NothingRemains", func(t *testing.T) {
			if files := dataFiles(t, s); len(files) != 0 {
				t.Fatalf("failed uploads left files: %v", files)
			}
			if n := bundleCount(t, s, admin); n != 0 {
				t.Fatalf("failed uploads left %d records", n)
			}
		})
	})
}

func mustGunzip(t *testing.T, data []byte) io.Reader {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	return zr
}

func TestFirmwareArtifact(t *testing.T) {
	t.Parallel()
	runStores(t, func(t *testing.T, b sqlstoretest.Backend, store string) {
		s := fleetdtest.StartOn(t, b, store)
		admin := s.Admin()
		viewer := s.NewKey(t, admin, "viewer", "viewer")
		data := fleetdtest.MakeBundle(t, "2.3.0", fleetdtest.Bootloader, fleetdtest.App230)
		bd := s.MustUpload(t, admin, data)
		path := "/api/v1/firmware-bundles/id/" + bd.ID + "/artifact"
		etag := `"` + fleetdtest.SHA256Hex(data) + `"`

		t.Run("Whole", func(t *testing.T) {
			resp, body := s.Get(t, viewer, path)
			if resp.StatusCode != 200 || !bytes.Equal(body, data) {
				t.Fatalf("status %d, %d bytes; want 200 and the archive (%d bytes)", resp.StatusCode, len(body), len(data))
			}
			h := resp.Header
			if h.Get("ETag") != etag || h.Get("Accept-Ranges") != "bytes" || h.Get("Content-Length") != fmt.Sprint(len(data)) ||
				h.Get("Content-Type") != "application/octet-stream" || !strings.Contains(h.Get("Content-Disposition"), "bundle.tar.gz") {
				t.Fatalf("headers = %v", h)
			}
		})
		t.Run("Head", func(t *testing.T) {
			hr, _ := http.NewRequest("HEAD", s.URL+path, nil)
			hr.Header.Set("x-service-tenant", viewer.Tenant)
			hr.Header.Set("x-service-api-key", viewer.Key)
			resp, err := http.DefaultClient.Do(hr)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 || resp.ContentLength != int64(len(data)) {
				t.Fatalf("HEAD: %d, length %d", resp.StatusCode, resp.ContentLength)
			}
		})
		t.Run("Range", func(t *testing.T) {
			resp, body := s.Get(t, viewer, path, "Range", "bytes=10-19")
			if resp.StatusCode != 206 || !bytes.Equal(body, data[10:20]) || resp.Header.Get("Content-Range") != fmt.Sprintf("bytes 10-19/%d", len(data)) {
				t.Fatalf("single range: %d %q %q", resp.StatusCode, resp.Header.Get("Content-Range"), body)
			}
			resp, body = s.Get(t, viewer, path, "Range", "bytes=-16")
			if resp.StatusCode != 206 || !bytes.Equal(body, data[len(data)-16:]) {
				t.Fatalf("suffix range: %d, %d bytes", resp.StatusCode, len(body))
			}
			resp, body = s.Get(t, viewer, path, "Range", "bytes=0-3,20-23")
			if resp.StatusCode != 206 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "multipart/byteranges") ||
				!bytes.Contains(body, data[0:4]) || !bytes.Contains(body, data[20:24]) {
				t.Fatalf("multiple ranges: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			resp, body = s.Get(t, viewer, path, "Range", fmt.Sprintf("bytes=%d-", len(data)+10))
			if resp.StatusCode != 416 || resp.Header.Get("Content-Range") != fmt.Sprintf("bytes */%d", len(data)) {
				t.Fatalf("unsatisfiable range: %d %q", resp.StatusCode, resp.Header.Get("Content-Range"))
			}
			// fleetd's error body, not ServeContent's line of text, and
			// not an attachment.
			var e struct{ Error, Message string }
			if err := json.Unmarshal(body, &e); err != nil || e.Error != "range_not_satisfiable" || !strings.Contains(e.Message, fmt.Sprint(len(data))) ||
				resp.Header.Get("Content-Type") != "application/json" || resp.Header.Get("Content-Disposition") != "" {
				t.Fatalf("unsatisfiable range: %q %q %s", resp.Header.Get("Content-Type"), resp.Header.Get("Content-Disposition"), body)
			}
		})
		t.Run("Resume", func(t *testing.T) {
			// A device reads part of the archive, loses the link, and
			// asks for the rest if it is still the same archive.
			cut := len(data) / 3
			resp, rest := s.Get(t, viewer, path, "Range", fmt.Sprintf("bytes=%d-", cut), "If-Range", etag)
			if resp.StatusCode != 206 || !bytes.Equal(append(bytes.Clone(data[:cut]), rest...), data) {
				t.Fatalf("resume: %d, %d bytes", resp.StatusCode, len(rest))
			}
			resp, whole := s.Get(t, viewer, path, "Range", fmt.Sprintf("bytes=%d-", cut), "If-Range", `"another"`)
			if resp.StatusCode != 200 || !bytes.Equal(whole, data) {
				t.Fatalf("If-Range with another ETag: %d, want the whole archive", resp.StatusCode)
			}
		})
		t.Run("Conditional", func(t *testing.T) {
			resp, body := s.Get(t, viewer, path, "If-None-Match", etag)
			if resp.StatusCode != 304 || len(body) != 0 {
				t.Fatalf("If-None-Match: %d, %d bytes", resp.StatusCode, len(body))
			}
			resp, _ = s.Get(t, viewer, path, "If-None-Match", `"other"`)
			if resp.StatusCode != 200 {
				t.Fatalf("If-None-Match of another ETag: %d", resp.StatusCode)
			}
		})
		t.Run("Refused", func(t *testing.T) {
			for name, c := range map[string]fleetdtest.Creds{"NoKey": {}, "WrongKey": {Tenant: admin.Tenant, Key: "fk_wrong"}} {
				if resp, _ := s.Get(t, c, path); resp.StatusCode != 401 {
					t.Errorf("%s: %d, want 401", name, resp.StatusCode)
				}
			}
			device := s.NewKey(t, admin, "gateway", "device")
			if resp, _ := s.Get(t, device, path); resp.StatusCode != 403 {
				t.Errorf("device role: %d, want 403", resp.StatusCode)
			}
			other := s.NewTenant(t, "other")
			if resp, _ := s.Get(t, other, path); resp.StatusCode != 404 {
				t.Errorf("another tenant: %d, want 404", resp.StatusCode)
			}
			if resp, _ := s.Get(t, viewer, path+"?download=1"); resp.StatusCode != 400 {
				t.Errorf("unknown query parameter: %d, want 400", resp.StatusCode)
			}
			if resp, _ := s.Get(t, viewer, path+"?tenant=default&expires=99999999999&signature=AAAA"); resp.StatusCode != 401 {
				t.Errorf("forged signature: %d, want 401", resp.StatusCode)
			}
			var p fleetdtest.Bundle
			s.Do(t, admin, "POST", "/api/v1/firmware-bundles", map[string]any{"version": "9.0.0", "file_name": "x.tar"}).Want(t, 201).Decode(t, &p)
			if resp, _ := s.Get(t, viewer, "/api/v1/firmware-bundles/id/"+p.ID+"/artifact"); resp.StatusCode != 409 {
				t.Errorf("pending bundle: %d, want 409", resp.StatusCode)
			}
		})
	})
}

func TestFirmwareComponents(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		admin := s.Admin()
		for _, v := range []string{"1.9.9", "1.10.0", "1.2.0"} {
			s.MustUpload(t, admin, fleetdtest.MakeBundle(t, v, fleetdtest.Part{Name: "app", Version: v, Body: "app " + v}))
		}
		type list struct {
			Firmwares []fleetdtest.FirmwareJSON
			Count     int
		}

		t.Run("List", func(t *testing.T) {
			var l list
			s.Do(t, admin, "GET", "/api/v1/firmwares/component/app?limit=2", nil).Want(t, 200).Decode(t, &l)
			if l.Count != 3 || len(l.Firmwares) != 2 || l.Firmwares[0].VersionNumber != "1.10.0" || l.Firmwares[1].VersionNumber != "1.9.9" {
				t.Fatalf("list = %+v; want 1.10.0, 1.9.9 of 3 (numeric order)", l)
			}
			wantError(t, s.Do(t, admin, "GET", "/api/v1/firmwares/component/nothing", nil), 404, "")
			wantError(t, s.Do(t, admin, "GET", "/api/v1/firmwares/component/bad%20name", nil), 400, "component_name")
		})
		t.Run("S8", func(t *testing.T) {
			path := "/api/v1/firmwares/component/app/1.9.9"
			r := s.Do(t, admin, "PUT", path, map[string]any{"is_deactivated": true}).Want(t, 204)
			if len(r.Body) != 0 {
				t.Fatalf("S8 answered a body: %s", r.Body)
			}
			var fw fleetdtest.FirmwareJSON
			s.Send(t, fleetdtest.Req{Method: "PUT", Path: path, Creds: admin, Body: map[string]any{
				"uncompressed_size": 4096, "dependencies": []any{map[string]any{"component_name": "bootloader", "min_version": "1.1.0"}},
			}, Header: http.Header{"Prefer": {"return=representation"}}}).Want(t, 200).Decode(t, &fw)
			if !fw.IsDeactivated || fw.UncompressedSize != 4096 || len(fw.Dependencies) != 1 || fw.Dependencies[0].ComponentName != "bootloader" {
				t.Fatalf("after S8: %+v", fw)
			}
			var bd fleetdtest.Bundle
			s.Do(t, admin, "GET", "/api/v1/firmware-bundles/version/1.9.9", nil).Want(t, 200).Decode(t, &bd)
			if !bd.Firmwares[0].IsDeactivated {
				t.Fatal("S6 does not show the deactivation")
			}
			s.Do(t, admin, "PUT", path, map[string]any{"is_deactivated": false, "dependencies": []any{}}).Want(t, 204)
			s.Do(t, admin, "GET", "/api/v1/firmware-bundles/version/1.9.9", nil).Want(t, 200).Decode(t, &bd)
			if bd.Firmwares[0].IsDeactivated || len(bd.Firmwares[0].Dependencies) != 0 || bd.Firmwares[0].UncompressedSize != 4096 {
				t.Fatalf("after reactivation: %+v", bd.Firmwares[0])
			}
		})
		t.Run("S8Invalid", func(t *testing.T) {
			path := "/api/v1/firmwares/component/app/1.9.9"
			wantError(t, s.Do(t, admin, "PUT", path, map[string]any{"is_deactivated": "true"}), 400, "is_deactivated")
			wantError(t, s.Do(t, admin, "PUT", path, map[string]any{"uncompressed_size": -1}), 400, "uncompressed_size")
			wantError(t, s.Do(t, admin, "PUT", path, map[string]any{"uncompressed_size": "12"}), 400, "uncompressed_size")
			wantError(t, s.Do(t, admin, "PUT", path, map[string]any{"dependencies": []any{map[string]any{"component_name": "app", "min_version": "1"}}}), 400, "dependencies[0].component_name")
			wantError(t, s.Do(t, admin, "PUT", path, map[string]any{"dependencies": []any{map[string]any{"component_name": "boot", "min_version": "x"}}}), 400, "dependencies[0].min_version")
			wantError(t, s.Do(t, admin, "PUT", path, map[string]any{"dependencies": []any{map[string]any{"component_name": "boot", "min_version": "1", "max_version": "2"}}}), 400, "dependencies[0].max_version")
			wantError(t, s.Do(t, admin, "PUT", path, map[string]any{"checksum": "x"}), 400, "checksum")
			wantError(t, s.Do(t, admin, "PUT", path, map[string]any{}), 400, "")
			wantError(t, s.Do(t, admin, "PUT", "/api/v1/firmwares/component/app/7.7.7", map[string]any{"is_deactivated": true}), 404, "")
			wantError(t, s.Do(t, admin, "PUT", "/api/v1/firmwares/component/app/v1", map[string]any{"is_deactivated": true}), 400, "version_number")
		})
	})
}

// TestFirmwareAccess is the role matrix and tenant isolation of every
// firmware endpoint.
func TestFirmwareAccess(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		admin := s.Admin()
		bd := s.MustUpload(t, admin, fleetdtest.MakeBundle(t, "2.3.0", fleetdtest.Bootloader, fleetdtest.App230))
		var p fleetdtest.Bundle
		s.Do(t, admin, "POST", "/api/v1/firmware-bundles", map[string]any{"version": "3.0.0", "file_name": "x.tar.gz"}).Want(t, 201).Decode(t, &p)
		archive := fleetdtest.MakeBundle(t, "3.0.0", fleetdtest.Part{Name: "app", Version: "3.0.0", Body: "x"})
		decl := map[string]any{"uncompressed_size": gunzipLen(t, archive), "checksum": fleetdtest.SHA256Hex(archive), "content_length": len(archive)}
		s8 := map[string]any{"is_deactivated": false}

		type call struct {
			name, method, path string
			body               any
			write              bool
		}
		calls := []call{
			{"List", "GET", "/api/v1/firmware-bundles", nil, false},
			{"ReadByID", "GET", "/api/v1/firmware-bundles/id/" + bd.ID, nil, false},
			{"ReadByVersion", "GET", "/api/v1/firmware-bundles/version/2.3.0", nil, false},
			{"ListComponent", "GET", "/api/v1/firmwares/component/app", nil, false},
			{"Create", "POST", "/api/v1/firmware-bundles", map[string]any{"version": "4.0.0", "file_name": "x"}, true},
			{"Declare", "PUT", "/api/v1/firmware-bundles/id/" + p.ID, decl, true},
			{"File", "PUT", "/api/v1/firmware-bundles/id/" + p.ID + "/file", archive, true},
			{"S8", "PUT", "/api/v1/firmwares/component/app/2.3.0", s8, true},
			{"Delete", "DELETE", "/api/v1/firmware-bundles/id/" + p.ID, nil, true},
		}
		send := func(c fleetdtest.Creds, cl call) *fleetdtest.Response {
			rq := fleetdtest.Req{Method: cl.method, Path: cl.path, Creds: c, Body: cl.body}
			if raw, ok := cl.body.([]byte); ok {
				rq.Body, rq.Raw, rq.ContentType = nil, raw, "application/octet-stream"
			}
			return s.Send(t, rq)
		}
		t.Run("Roles", func(t *testing.T) {
			viewer := s.NewKey(t, admin, "viewer", "viewer")
			device := s.NewKey(t, admin, "gateway", "device")
			for _, cl := range calls {
				if got := send(device, cl).Status; got != 403 {
					t.Errorf("device %s: %d, want 403", cl.name, got)
				}
				if cl.write {
					if got := send(viewer, cl).Status; got != 403 {
						t.Errorf("viewer %s: %d, want 403", cl.name, got)
					}
				} else if got := send(viewer, cl).Status; got != 200 {
					t.Errorf("viewer %s: %d, want 200", cl.name, got)
				}
				if got := send(fleetdtest.Creds{Tenant: admin.Tenant, Key: "fk_nope"}, cl).Status; got != 401 {
					t.Errorf("wrong key %s: %d, want 401", cl.name, got)
				}
			}
		})
		t.Run("OtherTenant", func(t *testing.T) {
			other := s.NewTenant(t, "other")
			for _, cl := range calls {
				r := send(other, cl)
				switch cl.name {
				case "List":
					var l struct{ Count int }
					r.Want(t, 200).Decode(t, &l)
					if l.Count != 0 {
						t.Errorf("another tenant lists %d bundles", l.Count)
					}
				case "Create":
					r.Want(t, 201) // its own record, in its own tenant
				default:
					if r.Status != 404 {
						t.Errorf("another tenant %s: %d, want 404; body %s", cl.name, r.Status, r.Body)
					}
				}
			}
			// Nothing the other tenant did touched ours.
			var got fleetdtest.Bundle
			s.Do(t, admin, "GET", "/api/v1/firmware-bundles/id/"+p.ID, nil).Want(t, 200).Decode(t, &got)
			if got.UploadStatus != "pending" || got.Declared != nil || got.Checksum != nil {
				t.Fatalf("our pending bundle changed: %+v", got)
			}
		})
		t.Run("Operator", func(t *testing.T) {
			op := s.NewKey(t, admin, "op", "operator")
			for _, cl := range calls {
				if r := send(op, cl); r.Status >= 300 {
					t.Errorf("operator %s: %d %s", cl.name, r.Status, r.Body)
				}
			}
		})
	})
}

// pattern is an endless stream of bytes, cheap to make: archives of any
// size are generated on the fly, never stored.
type pattern struct{ i byte }

func (p *pattern) Read(b []byte) (int, error) {
	for k := range b {
		b[k] = p.i
		p.i = p.i*31 + 7
	}
	return len(b), nil
}

// heapPeak samples the heap in use until stop is closed and returns the
// largest reading.
func heapPeak(stop <-chan struct{}) <-chan uint64 {
	out := make(chan uint64, 1)
	go func() {
		var peak uint64
		var ms runtime.MemStats
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
			select {
			case <-stop:
				out <- peak
				return
			case <-tick.C:
			}
		}
	}()
	return out
}

// TestFirmwareUploadFlatMemory uploads a 500 MB bundle generated while it
// is sent, through the real server, and shows that the heap stays flat:
// the archive is streamed to disk, or to S3 a part at a time, while hashed
// and parsed, never held.
// Both the client and the server live in this process, so the sample
// covers both. FLEETD_UPLOAD_MB changes the size.
func TestFirmwareUploadFlatMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("uploads 500 MB")
	}
	size := int64(500)
	if v := os.Getenv("FLEETD_UPLOAD_MB"); v != "" {
		fmt.Sscan(v, &size)
	}
	size <<= 20
	for _, store := range []string{"file", "s3"} {
		t.Run(store, func(t *testing.T) { uploadFlat(t, store, size) })
	}
}

func uploadFlat(t *testing.T, store string, size int64) {
	s := fleetdtest.StartOn(t, sqlstoretest.Backends()[0], store)
	admin := s.Admin()

	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	sum := sha256.New()
	go func() {
		fw, err := mw.CreateFormFile("file", "big.tar")
		if err == nil {
			src := []fwbundle.Source{{ComponentName: "rootfs", VersionNumber: "1.0.0", FileName: "rootfs.img", Size: size, Body: io.LimitReader(&pattern{}, size)}}
			err = fwbundle.Build(io.MultiWriter(fw, sum), "1.0.0", src, false)
		}
		if err == nil {
			err = mw.Close()
		}
		pw.CloseWithError(err)
	}()
	hr, _ := http.NewRequest("POST", s.URL+"/api/v1/firmware-bundles", pr)
	hr.Header.Set("Content-Type", mw.FormDataContentType())
	hr.Header.Set("x-service-tenant", admin.Tenant)
	hr.Header.Set("x-service-api-key", admin.Key)

	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapInuse
	stop := make(chan struct{})
	peak := heapPeak(stop)
	start := time.Now()
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	elapsed := time.Since(start)
	close(stop)
	top := <-peak
	if resp.StatusCode != 201 {
		t.Fatalf("upload: %d %s", resp.StatusCode, body)
	}
	var b fleetdtest.Bundle
	if err := json.Unmarshal(body, &b); err != nil {
		t.Fatal(err)
	}
	if *b.Checksum != hex.EncodeToString(sum.Sum(nil)) || *b.ContentLength <= size || b.Firmwares[0].ContentLength != size {
		t.Fatalf("bundle = %+v", b)
	}
	growth := int64(top) - int64(base)
	t.Logf("uploaded %d MB in %v (%.0f MB/s, client, server, disk and fsync in one process); heap in use %.1f MB before, peak %.1f MB (+%.1f MB)",
		size>>20, elapsed.Round(time.Millisecond), float64(size)/(1<<20)/elapsed.Seconds(), float64(base)/(1<<20), float64(top)/(1<<20), float64(growth)/(1<<20))
	// S3 holds a part (8 MiB) in memory per upload in progress, and the
	// pass that stores the component's file holds another; with what the
	// collector has not yet reclaimed of the client library's buffers, the
	// peak was +37 MB for 500 MB. Buffering the archive would be +500 MB.
	limit := int64(32 << 20)
	if store == "s3" {
		limit = 48 << 20
	}
	if growth > limit {
		t.Fatalf("the heap grew by %d MB while uploading %d MB: the archive is being buffered", growth>>20, size>>20)
	}
}

// installFirmware plays a device that takes an update_firmware: it reads
// the payload, downloads the artifact from the signed URL with no other
// credential, resuming once after a cut, checks the checksum and length,
// reports progress and then Completed (or Failed naming the mismatch).
func installFirmware(t *testing.T, d *fleetdtest.MQTTDevice, m action.Message) (params map[string]any) {
	t.Helper()
	if err := json.Unmarshal([]byte(m.Payload), &params); err != nil {
		t.Fatalf("payload %s: %v", m.Payload, err)
	}
	url, _ := params["url"].(string)
	half := func() []byte {
		req, _ := http.NewRequest("GET", url, nil)
		req.Header.Set("Range", "bytes=0-99")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 206 {
			t.Fatalf("first part: %d %s", resp.StatusCode, b)
		}
		return b
	}()
	d.Report(t, map[string]any{"id": m.ID, "state": "Downloading", "progress": 10, "sequence": 1})
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-", len(half)))
	req.Header.Set("If-Range", fmt.Sprintf("%q", params["checksum"]))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 206 {
		t.Fatalf("resume: %d %s", resp.StatusCode, rest)
	}
	d.Report(t, map[string]any{"id": m.ID, "state": "Downloading", "progress": 90, "sequence": 2})
	data := append(half, rest...)
	switch {
	case fleetdtest.SHA256Hex(data) != params["checksum"]:
		d.Report(t, map[string]any{"id": m.ID, "state": "Failed", "errors": []string{"checksum mismatch"}, "sequence": 3})
	case float64(len(data)) != params["content-length"]:
		d.Report(t, map[string]any{"id": m.ID, "state": "Failed", "errors": []string{"content length mismatch"}, "sequence": 3})
	default:
		d.Report(t, map[string]any{"id": m.ID, "state": "Completed", "progress": 100, "sequence": 3})
	}
	return params
}

func TestFirmwareUpdateEndToEnd(t *testing.T) {
	t.Parallel()
	runStores(t, func(t *testing.T, b sqlstoretest.Backend, store string) {
		s := fleetdtest.StartOn(t, b, store, "--log-level", "info") // to see that no signature is logged
		admin := s.Admin()
		boot100 := fleetdtest.Part{Name: "bootloader", Version: "1.0.0", Body: "bootloader 1.0.0"}
		old := s.MustUpload(t, admin, fleetdtest.MakeBundle(t, "1.0.0", boot100))
		data := fleetdtest.MakeBundle(t, "2.3.0", fleetdtest.Bootloader, fleetdtest.App230)
		bd := s.MustUpload(t, admin, data)
		tok := map[string]string{}
		for _, id := range []string{"dev-new", "dev-old", "dev-off"} {
			tok[id] = s.MustDevice(t, admin, id, nil).Token
		}
		devNew := s.ConnectDevice(t, "default", "dev-new", tok["dev-new"])
		devOld := s.ConnectDevice(t, "default", "dev-old", tok["dev-old"])
		update := func(version string, timeout int, devices ...string) *fleetdtest.Response {
			return s.Do(t, admin, "POST", "/api/v1/actions", map[string]any{"action": "update_firmware",
				"params": map[string]any{"version": version}, "search_type": "default", "device_ids": devices, "timeout": timeout})
		}
		var actionID int64
		var params map[string]any

		t.Run("Install", func(t *testing.T) {
			// dev-old first gets bootloader 1.0.0, which it then records.
			r := update("1.0.0", 600, "dev-old").Want(t, 201)
			var a struct{ ID int64 }
			r.Decode(t, &a)
			p := installFirmware(t, devOld, devOld.Next(t))
			if p["version"] != "1.0.0" || p["bundle_file_name"] != old.FileName || p["file_name"] != nil {
				t.Fatalf("params = %v", p)
			}
			s.AwaitActionStatus(t, admin, "dev-old", a.ID, "Completed")
			var dev fleetdtest.Device
			s.Do(t, admin, "GET", "/api/v1/devices/dev-old", nil).Want(t, 200).Decode(t, &dev)
			if dev.Components["bootloader"] != "1.0.0" || len(dev.Components) != 1 {
				t.Fatalf("dev-old's components = %v", dev.Components)
			}
		})
		t.Run("DependencyFailsOneDevice", func(t *testing.T) {
			// An app alone, which needs a bootloader the bundle does not
			// bring: dev-old's recorded 1.0.0 is too old.
			s.MustUpload(t, admin, fleetdtest.MakeBundle(t, "3.1.0", fleetdtest.Part{Name: "app", Version: "3.1.0", Body: "app 3.1.0",
				Deps: []fleet.Dependency{{ComponentName: "bootloader", MinVersion: "1.1.0"}}}))
			r := update("3.1.0", 600, "dev-old", "dev-off").Want(t, 201)
			var a struct{ ID int64 }
			r.Decode(t, &a)
			da := s.DeviceAction(t, admin, "dev-old", a.ID)
			if da.ActionStatus != "Failed" || !strings.Contains(fmt.Sprint(da.Errors), "app 3.1.0 requires bootloader >= 1.1.0, but the device has bootloader 1.0.0") {
				t.Fatalf("dev-old = %+v", da)
			}
			devOld.Nothing(t)
			// dev-off has no recorded versions: not checked, it waits.
			if da := s.DeviceAction(t, admin, "dev-off", a.ID); da.ActionStatus != "Queued" {
				t.Fatalf("dev-off = %+v", da)
			}
		})
		t.Run("DeviceDownloadsAndCompletes", func(t *testing.T) {
			// A bundle that brings the bootloader too passes dev-old's
			// check: its own versions replace the recorded ones.
			r := update("2.3.0", 600, "dev-new", "dev-old").Want(t, 201)
			var a struct{ ID int64 }
			r.Decode(t, &a)
			actionID = a.ID
			if da := s.DeviceAction(t, admin, "dev-old", actionID); da.ActionStatus == "Failed" {
				t.Fatalf("dev-old = %+v", da)
			}
			m := devNew.Next(t)
			if m.Name != "update_firmware" || m.ID != fmt.Sprint(actionID) {
				t.Fatalf("message = %+v", m)
			}
			params = installFirmware(t, devNew, m)
			if params["version"] != "2.3.0" || params["checksum"] != fleetdtest.SHA256Hex(data) || params["content-length"] != float64(len(data)) ||
				params["uncompressed-size"] != float64(*bd.UncompressedSize) || params["bundle_file_name"] != "bundle.tar.gz" || len(params["components"].([]any)) != 2 {
				t.Fatalf("params = %v", params)
			}
			da := s.AwaitActionStatus(t, admin, "dev-new", actionID, "Completed")
			if da.Params != m.Payload {
				t.Fatalf("S7 params %s differ from what was sent %s", da.Params, m.Payload)
			}
			var dev fleetdtest.Device
			s.Do(t, admin, "GET", "/api/v1/devices/dev-new", nil).Want(t, 200).Decode(t, &dev)
			if dev.Components["bootloader"] != "1.2.0" || dev.Components["app"] != "2.3.0" {
				t.Fatalf("dev-new's components = %v", dev.Components)
			}
		})
		t.Run("SignedURL", func(t *testing.T) {
			raw := params["url"].(string)
			if !strings.HasPrefix(raw, s.URL+"/api/v1/firmware-bundles/id/"+bd.ID+"/artifact?") {
				t.Fatalf("url = %s", raw)
			}
			u, _ := neturl.Parse(raw)
			q := u.Query()
			fetch := func(path string, c fleetdtest.Creds) int {
				resp, _ := s.Get(t, c, path)
				return resp.StatusCode
			}
			if got := fetch(u.RequestURI(), fleetdtest.Creds{}); got != 200 {
				t.Fatalf("the signed URL: %d", got)
			}
			tamper := func(key, value string) string {
				q2 := neturl.Values{}
				for k, v := range q {
					q2[k] = v
				}
				q2.Set(key, value)
				return u.Path + "?" + q2.Encode()
			}
			sig := []byte(q.Get("signature"))
			sig[5] ^= 1
			other := s.NewTenant(t, "other")
			theirs := s.MustUpload(t, other, fleetdtest.MakeBundle(t, "7.0.0", fleetdtest.Part{Name: "x", Version: "1", Body: "x"}))
			for name, path := range map[string]string{
				"Signature":   tamper("signature", string(sig)),
				"Expiry":      tamper("expires", fmt.Sprint(time.Now().Add(365*24*time.Hour).Unix())),
				"Tenant":      tamper("tenant", "other"),
				"Bundle":      strings.Replace(u.Path, bd.ID, theirs.ID, 1) + "?" + u.RawQuery,
				"NoSignature": u.Path + "?tenant=default&expires=" + q.Get("expires"),
				"Expired":     tamper("expires", "1000000000"),
			} {
				if got := fetch(path, fleetdtest.Creds{}); got != 401 {
					t.Errorf("%s changed: %d, want 401", name, got)
				}
			}
			// Another tenant's key adds nothing to a bad signature, and takes
			// nothing from a good one.
			if got := fetch(tamper("tenant", "other"), other); got != 401 {
				t.Errorf("forged URL with another tenant's key: %d", got)
			}
			if got := fetch(u.RequestURI(), other); got != 200 {
				t.Errorf("good URL with another tenant's key: %d", got)
			}
			if logs := s.Output.String(); !strings.Contains(logs, "/artifact") || strings.Contains(logs, q.Get("signature")) {
				t.Error("downloads are not logged, or the signature is")
			}
		})
		t.Run("Refusals", func(t *testing.T) {
			wantError(t, update("9.9.9", 60, "dev-new"), 400, "params.version", "9.9.9")
			var p fleetdtest.Bundle
			s.Do(t, admin, "POST", "/api/v1/firmware-bundles", map[string]any{"version": "3.0.0", "file_name": "x.tar"}).Want(t, 201).Decode(t, &p)
			wantError(t, update("3.0.0", 60, "dev-new"), 400, "params.version", "pending")
			wantError(t, s.Do(t, admin, "POST", "/api/v1/actions", map[string]any{"action": "update_firmware",
				"params": map[string]any{"version": "2.3.0", "force": true}, "search_type": "all"}), 400, "params.force")
		})
		t.Run("DeactivationBlocksDispatch", func(t *testing.T) {
			// 2.4.0 shares bootloader 1.2.0 with 2.3.0.
			s.MustUpload(t, admin, fleetdtest.MakeBundle(t, "2.4.0", fleetdtest.Bootloader, fleetdtest.Part{Name: "app", Version: "2.4.0", Body: "app 2.4.0"}))
			s.Do(t, admin, "PUT", "/api/v1/firmwares/component/bootloader/1.2.0", map[string]any{"is_deactivated": true}).Want(t, 204)
			for _, v := range []string{"2.3.0", "2.4.0"} {
				wantError(t, update(v, 60, "dev-new"), 400, "params.version", "bootloader 1.2.0")
			}
			s.Do(t, admin, "PUT", "/api/v1/firmwares/component/bootloader/1.2.0", map[string]any{"is_deactivated": false}).Want(t, 204)
			update("2.4.0", 60, "dev-new").Want(t, 201)
		})
	})
}

// TestFirmwareUpdateWithSimulator dispatches update_firmware to devices of
// `fleetd sim`, which download the bundle from its signed URL, check it and
// report; a corrupted archive is caught by the devices, not installed.
func TestFirmwareUpdateWithSimulator(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		admin := s.Admin()
		noise := make([]byte, 1<<20) // incompressible, so the download takes many reads
		rand.NewChaCha8([32]byte{1}).Read(noise)
		s.MustUpload(t, admin, fleetdtest.MakeBundle(t, "2.3.0", fleetdtest.Bootloader, fleetdtest.Part{Name: "app", Version: "2.3.0", Body: string(noise)}))
		tokens := filepath.Join(t.TempDir(), "tokens.csv")
		sim := s.StartSim(t, "--devices", "3", "--provision", "--url", s.URL, "--api-key", admin.Key,
			"--tokens", tokens, "--prefix", "fw-", "--telemetry-interval", "0")
		sim.Connected(t, 3)

		id := s.Dispatch(t, admin, map[string]any{"action": "update_firmware", "params": map[string]any{"version": "2.3.0"},
			"search_type": "search", "search_query": "fw-"})
		fleetdtest.Eventually(t, "the simulated devices to install the bundle", func() bool {
			return s.Action(t, admin, id).Statuses["Completed"] == 3
		})
		var dev fleetdtest.Device
		s.Do(t, admin, "GET", "/api/v1/devices/fw-00002", nil).Want(t, 200).Decode(t, &dev)
		if dev.Components["bootloader"] != "1.2.0" || dev.Components["app"] != "2.3.0" {
			t.Fatalf("fw-00002's components = %v", dev.Components)
		}

		t.Run("CorruptArchive", func(t *testing.T) {
			bd := s.MustUpload(t, admin, fleetdtest.MakeBundle(t, "2.4.0", fleetdtest.Bootloader, fleetdtest.Part{Name: "app", Version: "2.4.0", Body: string(noise[:500_000])}))
			// Damage the stored archive behind the server's back: same
			// length, another checksum.
			paths, _ := filepath.Glob(filepath.Join(s.DataDir, "blobs", "bundles", "default", bd.ID, "*"))
			if len(paths) != 1 {
				t.Fatalf("archive files of %s: %v", bd.ID, paths)
			}
			data, _ := os.ReadFile(paths[0])
			data[len(data)/2] ^= 0xff
			if err := os.WriteFile(paths[0], data, 0o644); err != nil {
				t.Fatal(err)
			}
			id := s.Dispatch(t, admin, map[string]any{"action": "update_firmware", "params": map[string]any{"version": "2.4.0"},
				"search_type": "default", "device_ids": []string{"fw-00001"}})
			da := s.AwaitActionStatus(t, admin, "fw-00001", id, "Failed")
			// It failed after downloading it all, reporting its progress.
			if !strings.Contains(fmt.Sprint(da.Errors["Failed"]), "checksum mismatch") || da.Progress < 90 {
				t.Fatalf("fw-00001's record = %+v", da)
			}
			s.Do(t, admin, "GET", "/api/v1/devices/fw-00001", nil).Want(t, 200).Decode(t, &dev)
			if dev.Components["app"] != "2.3.0" {
				t.Fatalf("a failed update changed the components: %v", dev.Components)
			}
		})
	})
}

// TestFirmwareArtifactPresigned checks that with presign set, downloads are
// redirected to the bucket, which serves the archive and its ranges with
// no credentials: an API key's download, a device's signed URL and a
// hawkBit component alike.
func TestFirmwareArtifactPresigned(t *testing.T) {
	t.Parallel()
	s := fleetdtest.StartOn(t, sqlstoretest.Backends()[0], "s3+presign")
	admin := s.Admin()
	data := fleetdtest.MakeBundle(t, "5.0.0", fleetdtest.Bootloader, fleetdtest.App230)
	b := s.MustUpload(t, admin, data)
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(t *testing.T, path string, header ...string) string {
		t.Helper()
		hr, _ := http.NewRequest("GET", s.URL+path, nil)
		for i := 0; i+1 < len(header); i += 2 {
			hr.Header.Set(header[i], header[i+1])
		}
		resp, err := noFollow.Do(hr)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		loc := resp.Header.Get("Location")
		if resp.StatusCode != http.StatusTemporaryRedirect || !strings.HasPrefix(loc, s.S3.Endpoint+"/") || !strings.Contains(loc, "X-Amz-Signature=") {
			t.Fatalf("GET %s: %d, Location %q; want a 307 to a presigned URL of the bucket", path, resp.StatusCode, loc)
		}
		return loc
	}
	fetch := func(t *testing.T, loc string, want []byte) {
		t.Helper()
		hr, _ := http.NewRequest("GET", loc, nil)
		hr.Header.Set("Range", "bytes=10-")
		resp, err := http.DefaultClient.Do(hr)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		got, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 206 || !bytes.Equal(got, want[10:]) {
			t.Fatalf("the presigned URL with Range: %d, %d bytes, want 206 and %d", resp.StatusCode, len(got), len(want)-10)
		}
	}

	t.Run("APIKey", func(t *testing.T) {
		fetch(t, get(t, "/api/v1/firmware-bundles/id/"+b.ID+"/artifact", "x-service-tenant", admin.Tenant, "x-service-api-key", admin.Key), data)
	})
	t.Run("HawkBitComponent", func(t *testing.T) {
		dev := s.MustDevice(t, admin, "ecu-9", nil)
		id := s.Dispatch(t, admin, map[string]any{"action": "update_firmware", "params": map[string]any{"version": "5.0.0"},
			"search_type": "default", "device_ids": []string{"ecu-9"}})
		var dep struct {
			Deployment struct {
				Chunks []struct {
					Part      string
					Artifacts []struct {
						Links map[string]struct{ Href string } `json:"_links"`
					}
				}
			}
		}
		_, body := s.DDI(t, "GET", fmt.Sprintf("/default/controller/v1/ecu-9/deploymentBase/%d", id), "TargetToken "+dev.Token, nil)
		if err := json.Unmarshal(body, &dep); err != nil || len(dep.Deployment.Chunks) != 2 || dep.Deployment.Chunks[1].Part != "app" {
			t.Fatalf("deploymentBase: %v %s", err, body)
		}
		href := dep.Deployment.Chunks[1].Artifacts[0].Links["download"].Href
		fetch(t, get(t, strings.TrimPrefix(href, s.URL), "Authorization", "TargetToken "+dev.Token), []byte(fleetdtest.App230.Body))
	})
}
