package sqlstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

func TestDeviceCertificates(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		db, _ := mustOpen(t, b)
		ctx := context.Background()
		mustTenant(t, db, "acme")
		mustTenant(t, db, "beta")
		if _, err := db.CreateDevices(ctx, "acme", []fleet.NewDevice{{ID: "d1"}}); err != nil {
			t.Fatal(err)
		}
		serial := func(tenant, id string) string {
			t.Helper()
			s, err := db.DeviceCertificateSerial(ctx, tenant, id)
			if err != nil {
				t.Fatalf("DeviceCertificateSerial(%s, %s): %v", tenant, id, err)
			}
			return s
		}
		if got := serial("acme", "d1"); got != "" {
			t.Fatalf("a new device has serial %q, want none", got)
		}
		if c, err := db.FindDeviceCertificate(ctx, "acme", "d1"); err != nil || c != nil {
			t.Fatalf("FindDeviceCertificate of a new device = %+v, %v; want none", c, err)
		}
		cert := fleet.IssuedCertificate{Serial: "4a01", Subject: "CN=d1,O=acme", Fingerprint: "ab12",
			NotBefore: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), NotAfter: time.Date(2046, 1, 1, 0, 0, 0, 0, time.UTC)}
		if err := db.SetDeviceCertificate(ctx, "acme", "d1", cert); err != nil {
			t.Fatal(err)
		}
		if got := serial("acme", "d1"); got != "4a01" {
			t.Fatalf("serial %q, want 4a01", got)
		}
		got, err := db.FindDeviceCertificate(ctx, "acme", "d1")
		if err != nil || got == nil || *got != cert {
			t.Fatalf("FindDeviceCertificate = %+v, %v; want %+v", got, err, cert)
		}
		t.Run("OtherTenant", func(t *testing.T) {
			wantCode(t, db.SetDeviceCertificate(ctx, "beta", "d1", cert), fleet.ENOTFOUND)
			_, err := db.DeviceCertificateSerial(ctx, "beta", "d1")
			wantCode(t, err, fleet.ENOTFOUND)
			_, err = db.FindDeviceCertificate(ctx, "beta", "d1")
			wantCode(t, err, fleet.ENOTFOUND)
		})
		t.Run("Audited", func(t *testing.T) {
			logs, _, err := db.FindAuditLogs(ctx, "acme", fleet.AuditFilter{Page: fleet.Page{Page: 1, Limit: 1}})
			if err != nil {
				t.Fatal(err)
			}
			if len(logs) != 1 || logs[0].Action != "device.issue_certificate" || logs[0].Target != "devices/d1" {
				t.Fatalf("latest audit log %+v, want device.issue_certificate of devices/d1", logs[0])
			}
		})
		t.Run("TokenRotationRevokes", func(t *testing.T) {
			if _, err := db.RotateDeviceToken(ctx, "acme", "d1"); err != nil {
				t.Fatal(err)
			}
			if got := serial("acme", "d1"); got != "" {
				t.Fatalf("serial %q after a token rotation, want none", got)
			}
			if c, err := db.FindDeviceCertificate(ctx, "acme", "d1"); err != nil || c != nil {
				t.Fatalf("FindDeviceCertificate after a token rotation = %+v, %v; want none", c, err)
			}
		})
		t.Run("ServerValue", func(t *testing.T) {
			made := 0
			mk := func() (string, error) { made++; return "v1", nil }
			for range 2 {
				v, err := db.ServerValue(ctx, "test_value", mk)
				if err != nil || v != "v1" {
					t.Fatalf("ServerValue = %q, %v", v, err)
				}
			}
			if made != 1 {
				t.Fatalf("made %d times, want once", made)
			}
			v, err := db.ServerValue(ctx, "test_value", func() (string, error) { return "v2", nil })
			if err != nil || v != "v1" {
				t.Fatalf("a later maker changed the value: %q, %v", v, err)
			}
		})
	})
}
