package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetd/fleet/blob/s3test"
	"github.com/fleetd/fleet/ctl"
	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// The firmware tests that run fleetd's commands (bundle create, serve with
// a blob store it cannot use) through run; the rest are in firmware/.

// runCLI runs a fleetd command and returns its standard output.
func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := run(t.Context(), args, fleetdtest.NoEnv, strings.NewReader(""), &out, &errOut)
	return out.String(), err
}

func TestBundleCreate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	boot := write("boot.bin", "bootloader 1.2.0")
	app := write("app.bin.gz", gzipString(strings.Repeat("app ", 1000)))
	out := filepath.Join(dir, "fw-2.3.0.tar.gz")

	stdout, err := runCLI(t, "bundle", "create", "--version", "2.3.0", "--out", out,
		"bootloader=1.2.0:"+boot, "app=2.3.0:"+app, "--depends", "app:bootloader>=1.1.0")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	var decl struct {
		UncompressedSize int64  `json:"uncompressed_size"`
		Checksum         string `json:"checksum"`
		ContentLength    int64  `json:"content_length"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &decl); err != nil {
		t.Fatalf("last line %q is not the declaration: %v", lines[len(lines)-1], err)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if decl.Checksum != fleetdtest.SHA256Hex(data) || decl.ContentLength != int64(len(data)) {
		t.Fatalf("declaration %+v does not describe the archive", decl)
	}

	t.Run("SameAsFleetctl", func(t *testing.T) {
		// The same inputs make the same archive as fleetctl firmware bundle create.
		twin := filepath.Join(dir, "twin.tar.gz")
		var ctlOut, ctlErr bytes.Buffer
		code := ctl.Run(t.Context(), []string{"firmware", "bundle", "create", "--version", "2.3.0", "--out", twin,
			"bootloader=1.2.0:" + boot, "app=2.3.0:" + app, "--depends", "app:bootloader>=1.1.0"},
			ctl.Env{Getenv: fleetdtest.NoEnv, Stdin: strings.NewReader(""), Stdout: &ctlOut, Stderr: &ctlErr})
		if code != 0 {
			t.Fatalf("fleetctl firmware bundle create: exit %d\n%s", code, ctlErr.String())
		}
		if b, _ := os.ReadFile(twin); !bytes.Equal(data, b) {
			t.Fatal("fleetctl and fleetd built different archives of the same inputs")
		}
	})
	t.Run("TwoStepUpload", func(t *testing.T) {
		s := startServer(t, sqlstoretest.Backends()[0])
		admin := s.Admin()
		var p, got fleetdtest.Bundle
		s.Do(t, admin, "POST", "/api/v1/firmware-bundles", map[string]any{"version": "2.3.0", "file_name": "fw-2.3.0.tar.gz"}).Want(t, 201).Decode(t, &p)
		s.Send(t, fleetdtest.Req{Method: "PUT", Path: "/api/v1/firmware-bundles/id/" + p.ID, Creds: admin, Raw: []byte(lines[len(lines)-1]), ContentType: "application/json"}).Want(t, 204)
		s.PutFile(t, admin, p.ID, data).Want(t, 200).Decode(t, &got)
		if got.UploadStatus != "completed" || len(got.Firmwares) != 2 || got.Firmwares[1].UncompressedSize != 4000 ||
			len(got.Firmwares[1].Dependencies) != 1 || got.Firmwares[1].Dependencies[0].MinVersion != "1.1.0" {
			t.Fatalf("bundle = %+v", got)
		}
	})
	t.Run("Refused", func(t *testing.T) {
		for name, args := range map[string][]string{
			"BadComponent":  {"--version", "1.0.0", "--out", filepath.Join(dir, "x.tar.gz"), "app:" + boot},
			"BadDepends":    {"--version", "1.0.0", "--out", filepath.Join(dir, "x.tar.gz"), "app=1.0.0:" + boot, "--depends", "app>bootloader"},
			"UnknownDepend": {"--version", "1.0.0", "--out", filepath.Join(dir, "x.tar.gz"), "app=1.0.0:" + boot, "--depends", "ui:app>=1"},
			"BadVersion":    {"--version", "1.0-rc1", "--out", filepath.Join(dir, "x.tar.gz"), "app=1.0.0:" + boot},
			"MissingFile":   {"--version", "1.0.0", "--out", filepath.Join(dir, "x.tar.gz"), "app=1.0.0:" + filepath.Join(dir, "nope")},
			"Contradiction": {"--version", "1.0.0", "--out", filepath.Join(dir, "x.tar.gz"), "bootloader=1.0.0:" + boot, "app=1.0.0:" + app, "--depends", "app:bootloader>=1.1.0"},
			"NoComponents":  {"--version", "1.0.0", "--out", filepath.Join(dir, "x.tar.gz")},
		} {
			if _, err := runCLI(t, append([]string{"bundle", "create"}, args...)...); err == nil {
				t.Errorf("%s: no error", name)
			}
		}
		if _, err := os.Stat(filepath.Join(dir, "x.tar.gz")); err == nil {
			t.Fatal("a refused build left an archive")
		}
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), ".bundle-") {
				t.Fatalf("a refused build left %s", e.Name())
			}
		}
	})
}

func gzipString(s string) string {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write([]byte(s))
	zw.Close()
	return buf.String()
}

// TestBlobStoreRefused checks that a blob store fleetd cannot use stops it
// at its start, with a message that names the setting, whether it came by
// flag or by FLEETD_BLOB_STORE.
func TestBlobStoreRefused(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	for name, tc := range map[string]struct {
		flag, env string
		want      string
	}{
		"Scheme":        {flag: "ftp://host/x", want: "file://DIR or s3://"},
		"UnknownParam":  {flag: "s3://b/p?colour=blue", want: `unknown parameter "colour"`},
		"NoBucketByEnv": {env: "s3://missing/p?endpoint=" + srv.Endpoint + "&path_style=true", want: `bucket "missing" does not exist`},
		"WrongSecret":   {flag: srv.URL("p"), env: "wrong", want: "bucket"},
	} {
		t.Run(name, func(t *testing.T) {
			getenv := func(k string) string {
				switch {
				case k == "FLEETD_BLOB_STORE" && tc.flag == "":
					return tc.env
				case k == "AWS_SECRET_ACCESS_KEY" && tc.env == "wrong":
					return "not-the-secret"
				}
				return srv.Getenv(k)
			}
			args := []string{"serve", "--database", filepath.Join(t.TempDir(), "db"), "--http-addr", "127.0.0.1:0", "--mqtt-addr", "127.0.0.1:0", "--log-level", "warn"}
			if tc.flag != "" {
				args = append(args, "--blob-store", tc.flag)
			}
			var out bytes.Buffer
			err := run(context.Background(), args, getenv, strings.NewReader(""), &out, &out)
			if err == nil || !strings.Contains(err.Error(), "--blob-store") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("serve = %v; want an error naming --blob-store and saying %q", err, tc.want)
			}
		})
	}
}
