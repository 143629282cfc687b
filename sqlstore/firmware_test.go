package sqlstore_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
	"github.com/google/uuid"
)

// bundleFile is a parsed archive as the firmware package would make it.
func bundleFile(version string, comps ...*fleet.Firmware) *fleet.BundleFile {
	return &fleet.BundleFile{
		BlobKey:          "bundles/x/" + uuid.NewString(),
		ContentLength:    1000,
		UncompressedSize: 3000,
		Checksum:         strings.Repeat("ab", 32),
		Manifest:         fleet.Manifest{Version: version, Components: comps},
	}
}

func component(name, version, checksum string, deps ...fleet.Dependency) *fleet.Firmware {
	return &fleet.Firmware{ComponentName: name, VersionNumber: version, FileName: name + ".bin",
		Checksum: strings.Repeat(checksum, 64/len(checksum)), ContentLength: 10, UncompressedSize: 20, Dependencies: deps}
}

func mustCreateBundle(t *testing.T, db *sqlstore.DB, tenant string, f *fleet.BundleFile) *fleet.Bundle {
	t.Helper()
	b := &fleet.Bundle{ID: uuid.New(), Version: f.Manifest.Version, FileName: "b.tar.gz"}
	if err := db.CreateBundle(context.Background(), tenant, b, f); err != nil {
		t.Fatalf("CreateBundle %s: %v", f.Manifest.Version, err)
	}
	return b
}

func TestBundles(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, _ := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustTenant(t, db, "beta")
		boot := component("bootloader", "1.2.0", "b")
		app := component("app", "2.3.0", "a", fleet.Dependency{ComponentName: "bootloader", MinVersion: "1.1.0"})
		first := mustCreateBundle(t, db, "acme", bundleFile("2.3.0", boot, app))

		t.Run("Created", func(t *testing.T) {
			if first.UploadStatus != fleet.UploadCompleted || *first.Checksum != strings.Repeat("ab", 32) || *first.ContentLength != 1000 {
				t.Fatalf("bundle = %+v", first)
			}
			if len(first.Firmwares) != 2 || first.Firmwares[0].ComponentName != "bootloader" || first.Firmwares[1].Dependencies[0].MinVersion != "1.1.0" {
				t.Fatalf("firmwares = %+v", first.Firmwares)
			}
		})
		t.Run("Find", func(t *testing.T) {
			got, err := db.FindBundle(ctx, "acme", first.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.Version != "2.3.0" || got.BlobKey == "" || len(got.Firmwares) != 2 {
				t.Fatalf("FindBundle = %+v", got)
			}
			byVersion, err := db.FindBundleByVersion(ctx, "acme", "2.3.0")
			if err != nil || byVersion.ID != first.ID {
				t.Fatalf("FindBundleByVersion = %+v, %v", byVersion, err)
			}
		})
		t.Run("VersionConflict", func(t *testing.T) {
			err := db.CreateBundle(ctx, "acme", &fleet.Bundle{ID: uuid.New(), Version: "2.3.0"}, bundleFile("2.3.0", component("other", "1.0.0", "c")))
			wantCode(t, err, fleet.ECONFLICT)
			err = db.CreatePendingBundle(ctx, "acme", &fleet.Bundle{ID: uuid.New(), Version: "2.3.0", FileName: "x.tar"})
			wantCode(t, err, fleet.ECONFLICT)
		})
		t.Run("ComponentConflict", func(t *testing.T) {
			err := db.CreateBundle(ctx, "acme", &fleet.Bundle{ID: uuid.New(), Version: "2.4.0"}, bundleFile("2.4.0", component("app", "2.3.0", "f")))
			wantCode(t, err, fleet.ECONFLICT)
			// Nothing of the refused bundle remains.
			if _, err := db.FindBundleByVersion(ctx, "acme", "2.4.0"); fleet.ErrorCode(err) != fleet.ENOTFOUND {
				t.Fatalf("the refused bundle exists: %v", err)
			}
		})
		t.Run("SharedFirmware", func(t *testing.T) {
			shared := mustCreateBundle(t, db, "acme", bundleFile("2.3.1", component("bootloader", "1.2.0", "b"), component("app", "2.3.1", "d")))
			if shared.Firmwares[0].ID != first.Firmwares[0].ID {
				t.Fatalf("bootloader 1.2.0 with the same checksum is not shared: %s vs %s", shared.Firmwares[0].ID, first.Firmwares[0].ID)
			}
		})
		t.Run("List", func(t *testing.T) {
			bs, n, err := db.FindBundles(ctx, "acme", fleet.BundleFilter{Page: fleet.Page{Page: 1, Limit: 1}})
			if err != nil {
				t.Fatal(err)
			}
			if n != 2 || len(bs) != 1 || len(bs[0].Firmwares) != 2 {
				t.Fatalf("list = %d, %+v", n, bs)
			}
			_, n, _ = db.FindBundles(ctx, "acme", fleet.BundleFilter{UploadStatus: fleet.UploadPending, Page: fleet.Page{Page: 1, Limit: 10}})
			if n != 0 {
				t.Fatalf("pending count = %d", n)
			}
		})
		t.Run("TenantIsolation", func(t *testing.T) {
			if _, err := db.FindBundle(ctx, "beta", first.ID); fleet.ErrorCode(err) != fleet.ENOTFOUND {
				t.Fatalf("FindBundle in another tenant: %v", err)
			}
			if _, err := db.FindBundleByVersion(ctx, "beta", "2.3.0"); fleet.ErrorCode(err) != fleet.ENOTFOUND {
				t.Fatalf("FindBundleByVersion in another tenant: %v", err)
			}
			if _, n, _ := db.FindBundles(ctx, "beta", fleet.BundleFilter{Page: fleet.Page{Page: 1, Limit: 10}}); n != 0 {
				t.Fatalf("another tenant lists %d bundles", n)
			}
			if _, _, err := db.FindFirmwares(ctx, "beta", "app", fleet.Page{Page: 1, Limit: 10}); fleet.ErrorCode(err) != fleet.ENOTFOUND {
				t.Fatalf("FindFirmwares in another tenant: %v", err)
			}
			if _, err := db.UpdateFirmware(ctx, "beta", "app", "2.3.0", fleet.FirmwareUpdate{IsDeactivated: new(true)}); fleet.ErrorCode(err) != fleet.ENOTFOUND {
				t.Fatalf("UpdateFirmware in another tenant: %v", err)
			}
			if _, err := db.DeclareBundle(ctx, "beta", first.ID, fleet.Declaration{}); fleet.ErrorCode(err) != fleet.ENOTFOUND {
				t.Fatalf("DeclareBundle in another tenant: %v", err)
			}
			// The same versions may exist in another tenant, independently.
			other := mustCreateBundle(t, db, "beta", bundleFile("2.3.0", component("app", "2.3.0", "e")))
			if other.Firmwares[0].ID == first.Firmwares[1].ID {
				t.Fatal("tenants share a firmware row")
			}
		})
		t.Run("Delete", func(t *testing.T) {
			gone := mustCreateBundle(t, db, "acme", bundleFile("9.0.0", component("app", "9.0.0", "9")))
			if _, err := db.DeleteBundle(ctx, "beta", gone.ID); fleet.ErrorCode(err) != fleet.ENOTFOUND {
				t.Fatalf("DeleteBundle in another tenant: %v", err)
			}
			got, err := db.DeleteBundle(ctx, "acme", gone.ID)
			if err != nil || got.BlobKey == "" {
				t.Fatalf("DeleteBundle = %+v, %v", got, err)
			}
			if _, err := db.FindBundle(ctx, "acme", gone.ID); fleet.ErrorCode(err) != fleet.ENOTFOUND {
				t.Fatalf("deleted bundle: %v", err)
			}
			if _, err := db.FindFirmware(ctx, "acme", "app", "9.0.0"); err != nil {
				t.Fatalf("the component version went with the bundle: %v", err)
			}
		})
	})
}

func TestPendingBundles(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, _ := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		pending := func(version string) *fleet.Bundle {
			t.Helper()
			b := &fleet.Bundle{ID: uuid.New(), Version: version, FileName: "b.tar"}
			if err := db.CreatePendingBundle(ctx, "acme", b); err != nil {
				t.Fatal(err)
			}
			if b.UploadStatus != fleet.UploadPending || b.Checksum != nil || b.Declared != nil {
				t.Fatalf("pending = %+v", b)
			}
			return b
		}
		match := func(f *fleet.BundleFile) fleet.Declaration {
			return fleet.Declaration{ContentLength: f.ContentLength, UncompressedSize: f.UncompressedSize, Checksum: f.Checksum}
		}

		t.Run("FileThenDeclaration", func(t *testing.T) {
			p := pending("1.0.0")
			f := bundleFile("1.0.0", component("app", "1.0.0", "1"))
			got, err := db.AttachBundleFile(ctx, "acme", p.ID, f)
			if err != nil {
				t.Fatal(err)
			}
			if got.UploadStatus != fleet.UploadPending || *got.Checksum != f.Checksum || len(got.Firmwares) != 0 {
				t.Fatalf("after the file: %+v", got)
			}
			_, err = db.AttachBundleFile(ctx, "acme", p.ID, bundleFile("1.0.0", component("app", "1.0.0", "1")))
			wantCode(t, err, fleet.ECONFLICT)
			got, err = db.DeclareBundle(ctx, "acme", p.ID, match(f))
			if err != nil {
				t.Fatal(err)
			}
			if got.UploadStatus != fleet.UploadCompleted || len(got.Firmwares) != 1 || got.BlobKey != f.BlobKey {
				t.Fatalf("after the declaration: %+v", got)
			}
		})
		t.Run("DeclarationThenFile", func(t *testing.T) {
			p := pending("1.0.1")
			f := bundleFile("1.0.1", component("app", "1.0.1", "2"))
			got, err := db.DeclareBundle(ctx, "acme", p.ID, fleet.Declaration{ContentLength: 1, Checksum: strings.Repeat("0", 64)})
			if err != nil || got.UploadStatus != fleet.UploadPending {
				t.Fatalf("first declaration: %+v, %v", got, err)
			}
			// A pending bundle's declaration may be replaced.
			if _, err := db.DeclareBundle(ctx, "acme", p.ID, match(f)); err != nil {
				t.Fatal(err)
			}
			got, err = db.AttachBundleFile(ctx, "acme", p.ID, f)
			if err != nil || got.UploadStatus != fleet.UploadCompleted {
				t.Fatalf("after the file: %+v, %v", got, err)
			}
		})
		t.Run("Mismatch", func(t *testing.T) {
			p := pending("1.0.2")
			f := bundleFile("1.0.2", component("app", "1.0.2", "3"))
			if _, err := db.AttachBundleFile(ctx, "acme", p.ID, f); err != nil {
				t.Fatal(err)
			}
			d := match(f)
			d.ContentLength++
			got, err := db.DeclareBundle(ctx, "acme", p.ID, d)
			if err != nil {
				t.Fatal(err)
			}
			if got.UploadStatus != fleet.UploadFailed || !strings.Contains(got.UploadError, "content_length") || strings.Contains(got.UploadError, "checksum") {
				t.Fatalf("after a wrong content_length: %+v", got)
			}
			if got.BlobKey != f.BlobKey {
				t.Fatalf("the failed bundle's archive is not handed back for deletion: %q", got.BlobKey)
			}
			stored, _ := db.FindBundle(ctx, "acme", p.ID)
			if stored.BlobKey != "" || len(stored.Firmwares) != 0 {
				t.Fatalf("a failed bundle still references its archive or firmwares: %+v", stored)
			}
			if _, err := db.FindFirmware(ctx, "acme", "app", "1.0.2"); fleet.ErrorCode(err) != fleet.ENOTFOUND {
				t.Fatalf("a failed bundle made a firmware: %v", err)
			}
			// Failed is final: a declaration changes nothing.
			again, err := db.DeclareBundle(ctx, "acme", p.ID, match(f))
			if err != nil || again.UploadStatus != fleet.UploadFailed {
				t.Fatalf("declaration on a failed bundle: %+v, %v", again, err)
			}
			// A failed bundle does not hold its version.
			retry := pending("1.0.2")
			byVersion, _ := db.FindBundleByVersion(ctx, "acme", "1.0.2")
			if byVersion.ID != retry.ID {
				t.Fatalf("S6 returns %s, want the live record %s", byVersion.ID, retry.ID)
			}
		})
		t.Run("CompletedIsFinal", func(t *testing.T) {
			done := mustCreateBundle(t, db, "acme", bundleFile("3.0.0", component("app", "3.0.0", "4")))
			_, err := db.AttachBundleFile(ctx, "acme", done.ID, bundleFile("3.0.0", component("app", "3.0.0", "4")))
			wantCode(t, err, fleet.ECONFLICT)
			got, err := db.DeclareBundle(ctx, "acme", done.ID, fleet.Declaration{Checksum: strings.Repeat("0", 64)})
			if err != nil || got.UploadStatus != fleet.UploadCompleted || got.Declared != nil {
				t.Fatalf("declaration on a completed bundle: %+v, %v", got, err)
			}
		})
		t.Run("ComponentConflictAtFile", func(t *testing.T) {
			p := pending("4.0.0")
			_, err := db.AttachBundleFile(ctx, "acme", p.ID, bundleFile("4.0.0", component("app", "3.0.0", "5")))
			wantCode(t, err, fleet.ECONFLICT)
			got, _ := db.FindBundle(ctx, "acme", p.ID)
			if got.Checksum != nil {
				t.Fatal("a refused archive was recorded")
			}
		})
		t.Run("NotFound", func(t *testing.T) {
			_, err := db.AttachBundleFile(ctx, "acme", uuid.New(), bundleFile("1.0.0"))
			wantCode(t, err, fleet.ENOTFOUND)
			_, err = db.DeclareBundle(ctx, "acme", uuid.New(), fleet.Declaration{})
			wantCode(t, err, fleet.ENOTFOUND)
		})
	})
}

func TestFirmwares(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, clock := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		for _, v := range []string{"1.9.9", "1.10.0", "1.2.0", "0.1"} {
			mustCreateBundle(t, db, "acme", bundleFile(v, component("app", v, v[:1])))
		}
		t.Run("NumericOrder", func(t *testing.T) {
			fs, n, err := db.FindFirmwares(ctx, "acme", "app", fleet.Page{Page: 1, Limit: 3})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, f := range fs {
				got = append(got, f.VersionNumber)
			}
			if n != 4 || strings.Join(got, " ") != "1.10.0 1.9.9 1.2.0" {
				t.Fatalf("versions = %v (count %d), want 1.10.0 1.9.9 1.2.0 of 4", got, n)
			}
			fs, _, _ = db.FindFirmwares(ctx, "acme", "app", fleet.Page{Page: 2, Limit: 3})
			if len(fs) != 1 || fs[0].VersionNumber != "0.1" {
				t.Fatalf("page 2 = %+v", fs)
			}
		})
		t.Run("Update", func(t *testing.T) {
			clock.Add(time.Second)
			deps := []fleet.Dependency{{ComponentName: "bootloader", MinVersion: "2.0"}}
			f, err := db.UpdateFirmware(ctx, "acme", "app", "1.9.9", fleet.FirmwareUpdate{IsDeactivated: new(true), Dependencies: &deps})
			if err != nil {
				t.Fatal(err)
			}
			if !f.IsDeactivated || f.UncompressedSize != 20 || len(f.Dependencies) != 1 || !f.UpdatedAt.After(f.CreatedAt) {
				t.Fatalf("updated = %+v", f)
			}
			size := int64(77)
			f, err = db.UpdateFirmware(ctx, "acme", "app", "1.9.9", fleet.FirmwareUpdate{UncompressedSize: &size})
			if err != nil || !f.IsDeactivated || f.UncompressedSize != 77 || len(f.Dependencies) != 1 {
				t.Fatalf("second update = %+v, %v; fields not sent must stay", f, err)
			}
			stored, _ := db.FindFirmware(ctx, "acme", "app", "1.9.9")
			if !stored.IsDeactivated || stored.UncompressedSize != 77 {
				t.Fatalf("stored = %+v", stored)
			}
			b, _ := db.FindBundleByVersion(ctx, "acme", "1.9.9")
			if !b.Firmwares[0].IsDeactivated {
				t.Fatal("the bundle does not show its deactivated firmware")
			}
			_, err = db.UpdateFirmware(ctx, "acme", "app", "7.7.7", fleet.FirmwareUpdate{IsDeactivated: new(false)})
			wantCode(t, err, fleet.ENOTFOUND)
		})
		t.Run("Dependents", func(t *testing.T) {
			fs, err := db.FindDependentFirmwares(ctx, "acme")
			if err != nil {
				t.Fatal(err)
			}
			if len(fs) != 1 || fs[0].VersionNumber != "1.9.9" || fs[0].Dependencies[0].ComponentName != "bootloader" {
				t.Fatalf("dependents = %+v", fs)
			}
		})
		t.Run("UnknownComponent", func(t *testing.T) {
			_, _, err := db.FindFirmwares(ctx, "acme", "nothing", fleet.Page{Page: 1, Limit: 3})
			wantCode(t, err, fleet.ENOTFOUND)
		})
	})
}

func TestServerSecret(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, _ := mustOpen(t, b)
		ctx := context.Background()
		first, err := db.ServerSecret(ctx, "k")
		if err != nil || len(first) != 32 {
			t.Fatalf("ServerSecret = %x, %v", first, err)
		}
		again, err := db.ServerSecret(ctx, "k")
		if err != nil || !bytes.Equal(first, again) {
			t.Fatalf("the secret changed: %x then %x (%v)", first, again, err)
		}
		other, _ := db.ServerSecret(ctx, "other")
		if bytes.Equal(first, other) {
			t.Fatal("two secrets are the same")
		}
	})
}
