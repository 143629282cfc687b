package firmware_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/firmware"
	"github.com/fleetd/fleet/firmware/bundle"
)

func TestPrepareUpdateFirmware(t *testing.T) {
	svc, _, clk := newService(t, "file")
	ctx := context.Background()
	upload := func(version string, srcs ...bundle.Source) *fleet.Bundle {
		t.Helper()
		var buf bytes.Buffer
		if err := bundle.Build(&buf, version, srcs, true); err != nil {
			t.Fatal(err)
		}
		b, _, err := svc.UploadBundle(ctx, "acme", "fw-"+version+".tar.gz", &buf)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	src := func(name, version, body string, deps ...fleet.Dependency) bundle.Source {
		return bundle.Source{ComponentName: name, VersionNumber: version, FileName: name + ".bin", Size: int64(len(body)), Body: strings.NewReader(body), Dependencies: deps}
	}
	needsBoot := fleet.Dependency{ComponentName: "bootloader", MinVersion: "1.1.0"}
	b := upload("2.3.0", src("app", "2.3.0", "app", needsBoot))
	upload("2.4.0", src("app", "2.4.0", "app 2.4"), src("ui", "1.0.0", "ui"))
	dispatch := func(params string) (*fleet.Dispatch, error) {
		d := &fleet.Dispatch{Action: fleet.ActionUpdateFirmware, Params: json.RawMessage(params), Timeout: 3600}
		return d, svc.PrepareDispatch(ctx, "acme", d)
	}

	t.Run("DeviceParams", func(t *testing.T) {
		d, err := dispatch(`{"version": "2.3.0"}`)
		if err != nil {
			t.Fatal(err)
		}
		var p map[string]any
		if err := json.Unmarshal(d.DeviceParams, &p); err != nil {
			t.Fatal(err)
		}
		// A stock uplink stores the download under the version and checks
		// its SHA-256.
		up, err := decodeAsUplink(d.DeviceParams)
		if err != nil {
			t.Fatalf("uplink refuses %s: %v", d.DeviceParams, err)
		}
		if up.URL != p["url"] || up.ContentLength != uint64(*b.ContentLength) || up.FileName != "2.3.0" ||
			up.Checksum == nil || *up.Checksum != *b.Checksum || up.DownloadPath != nil {
			t.Fatalf("uplink reads %+v", up)
		}
		if p["version"] != "2.3.0" || p["checksum"] != *b.Checksum || p["content-length"] != float64(*b.ContentLength) ||
			p["uncompressed-size"] != float64(*b.UncompressedSize) || p["bundle_file_name"] != "fw-2.3.0.tar.gz" {
			t.Fatalf("params = %v", p)
		}
		comps := p["components"].([]any)
		c := comps[0].(map[string]any)
		if len(comps) != 1 || c["component_name"] != "app" || c["version_number"] != "2.3.0" || c["checksum"] != b.Firmwares[0].Checksum {
			t.Fatalf("components = %v", comps)
		}
		if got := fleet.CompletedComponents(fleet.ActionUpdateFirmware, d.DeviceParams); got["app"] != "2.3.0" {
			t.Fatalf("a completed update would record %v", got)
		}
		if bytes.Contains(d.DeviceParams, []byte(`\u0026`)) {
			t.Fatalf("the URL is HTML-escaped: %s", d.DeviceParams)
		}
		u, err := url.Parse(p["url"].(string))
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		if u.Path != firmware.ArtifactPath(b.ID) || q.Get("tenant") != "acme" {
			t.Fatalf("url = %s", u)
		}
		exp, _ := strconv.ParseInt(q.Get("expires"), 10, 64)
		if want := clk.Now().Add(time.Hour + 24*time.Hour).Unix(); exp != want {
			t.Fatalf("expires = %d, want %d (the timeout and a day)", exp, want)
		}
		if err := svc.VerifyArtifactURL(ctx, "acme", b.ID, q.Get("expires"), q.Get("signature")); err != nil {
			t.Fatalf("the URL does not verify: %v", err)
		}
	})
	t.Run("CheckDevice", func(t *testing.T) {
		d, err := dispatch(`{"version": "2.3.0"}`)
		if err != nil {
			t.Fatal(err)
		}
		for installed, want := range map[string]string{
			"bootloader=1.0.0":         "app 2.3.0 requires bootloader >= 1.1.0, but the device has bootloader 1.0.0",
			"bootloader=1.1.0":         "",
			"bootloader=1.10.0":        "",
			"bootloader=1.9.9 app=1":   "",
			"modem=3.0.0":              "",
			"bootloader=0.9 app=2.2.0": "app 2.3.0 requires bootloader >= 1.1.0, but the device has bootloader 0.9",
		} {
			m := map[string]string{}
			for _, kv := range strings.Fields(installed) {
				k, v, _ := strings.Cut(kv, "=")
				m[k] = v
			}
			if got := d.CheckDevice(m); got != want {
				t.Errorf("device with %s: %q, want %q", installed, got, want)
			}
		}
	})
	t.Run("KeptComponentsStillHold", func(t *testing.T) {
		// ui 1.0.0 needs app >= 2.4.0; a device that keeps ui 1.0.0 cannot
		// go back to app 2.3.0.
		deps := []fleet.Dependency{{ComponentName: "app", MinVersion: "2.4.0"}}
		if _, err := svc.UpdateFirmware(ctx, "acme", "ui", "1.0.0", fleet.FirmwareUpdate{Dependencies: &deps}); err != nil {
			t.Fatal(err)
		}
		defer svc.UpdateFirmware(ctx, "acme", "ui", "1.0.0", fleet.FirmwareUpdate{Dependencies: &[]fleet.Dependency{}})
		d, err := dispatch(`{"version": "2.3.0"}`)
		if err != nil {
			t.Fatal(err)
		}
		want := "ui 1.0.0 on the device requires app >= 2.4.0, but the bundle installs app 2.3.0"
		if got := d.CheckDevice(map[string]string{"bootloader": "1.2.0", "ui": "1.0.0", "app": "2.4.0"}); got != want {
			t.Fatalf("downgrade under ui: %q, want %q", got, want)
		}
		if got := d.CheckDevice(map[string]string{"bootloader": "1.2.0", "ui": "0.9.0"}); got != "" {
			t.Fatalf("a ui version without that dependency: %q", got)
		}
	})
	t.Run("Refused", func(t *testing.T) {
		svc.CreatePendingBundle(ctx, "acme", "3.0.0", "x.tar")
		for name, tc := range map[string]struct{ params, field, words string }{
			"NoVersion":  {`{}`, "params.version", "version"},
			"NotAString": {`{"version": 2}`, "params.version", "version"},
			"Unknown":    {`{"version": "9.9.9"}`, "params.version", "no firmware bundle has version 9.9.9"},
			"Pending":    {`{"version": "3.0.0"}`, "params.version", "pending"},
			"ExtraParam": {`{"version": "2.3.0", "url": "http://evil"}`, "params.url", "url"},
		} {
			_, err := dispatch(tc.params)
			fe, ok := err.(*fleet.Error)
			if !ok || fe.Code != fleet.EINVALID || fe.Fields[tc.field] == "" || !strings.Contains(fe.Error(), tc.words) {
				t.Errorf("%s: %v", name, err)
			}
		}
	})
	t.Run("Deactivated", func(t *testing.T) {
		if _, err := svc.UpdateFirmware(ctx, "acme", "ui", "1.0.0", fleet.FirmwareUpdate{IsDeactivated: new(true)}); err != nil {
			t.Fatal(err)
		}
		_, err := dispatch(`{"version": "2.4.0"}`)
		if fleet.ErrorCode(err) != fleet.EINVALID || !strings.Contains(fleet.ErrorMessage(err), "ui 1.0.0") {
			t.Fatalf("dispatch of a bundle with deactivated firmware: %v", err)
		}
		svc.UpdateFirmware(ctx, "acme", "ui", "1.0.0", fleet.FirmwareUpdate{IsDeactivated: new(false)})
		if _, err := dispatch(`{"version": "2.4.0"}`); err != nil {
			t.Fatalf("after reactivation: %v", err)
		}
	})
	t.Run("ContradictionAfterS8", func(t *testing.T) {
		deps := []fleet.Dependency{{ComponentName: "ui", MinVersion: "2.0.0"}}
		svc.UpdateFirmware(ctx, "acme", "app", "2.4.0", fleet.FirmwareUpdate{Dependencies: &deps})
		_, err := dispatch(`{"version": "2.4.0"}`)
		if fleet.ErrorCode(err) != fleet.EINVALID || !strings.Contains(fleet.ErrorMessage(err), "ui >= 2.0.0") {
			t.Fatalf("dispatch of a bundle that contradicts itself: %v", err)
		}
	})
	t.Run("OtherTenant", func(t *testing.T) {
		d := &fleet.Dispatch{Action: fleet.ActionUpdateFirmware, Params: json.RawMessage(`{"version": "2.3.0"}`), Timeout: 60}
		if err := svc.PrepareDispatch(ctx, "beta", d); fleet.ErrorCode(err) != fleet.EINVALID {
			t.Fatalf("another tenant's bundle: %v", err)
		}
	})
}
