package pki_test

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/pki"
)

func mustAuthority(t *testing.T) *pki.Authority {
	t.Helper()
	p, err := pki.NewAuthorityPEM(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ca, err := pki.ParseAuthority([]byte(p), []byte(p))
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func TestIssue(t *testing.T) {
	ca := mustAuthority(t)
	now := time.Now()
	certPEM, keyPEM, issued, err := ca.Issue("acme", "pump-1", now)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(keyPEM, "BEGIN PRIVATE KEY") {
		t.Fatalf("key is not PKCS #8 PEM: %.40q", keyPEM)
	}
	pair, err := tls.X509KeyPair([]byte(certPEM), []byte(keyPEM))
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(pair.Certificate[0])
	if _, err := cert.Verify(x509.VerifyOptions{Roots: ca.ClientCAs(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("the certificate does not verify as a client certificate of the CA: %v", err)
	}
	tenant, id, serial, ok := pki.DeviceIdentity(cert)
	if !ok || tenant != "acme" || id != "pump-1" || serial != issued.Serial {
		t.Fatalf("DeviceIdentity = %q, %q, %q, %v; want acme, pump-1, %s", tenant, id, serial, ok, issued.Serial)
	}
	if cert.Subject.CommonName != "pump-1" || cert.Subject.Organization[0] != "acme" {
		t.Errorf("subject %v", cert.Subject)
	}
	sum := sha256.Sum256(cert.Raw)
	if issued.Fingerprint != hex.EncodeToString(sum[:]) || issued.Subject != cert.Subject.String() ||
		!issued.NotBefore.Equal(cert.NotBefore) || !issued.NotAfter.Equal(cert.NotAfter) {
		t.Errorf("issued %+v does not describe the certificate (subject %s, not before %v)", issued, cert.Subject, cert.NotBefore)
	}
	if !issued.NotAfter.After(now.Add(10 * 365 * 24 * time.Hour)) {
		t.Errorf("not after %v: device certificates live long", issued.NotAfter)
	}
	// Serials differ, so revoking one never revokes another.
	_, _, again, _ := ca.Issue("acme", "pump-1", now)
	if again.Serial == issued.Serial || len(again.Serial) != 32 {
		t.Errorf("serials %s then %s", issued.Serial, again.Serial)
	}
}

func TestDeviceIdentityRefuses(t *testing.T) {
	u := func(s string) *url.URL { v, _ := url.Parse(s); return v }
	for _, uris := range [][]*url.URL{
		nil,
		{u("https://acme/pump-1")},
		{u("fleetd://Acme/pump-1")},
		{u("fleetd://acme/pump 1")},
		{u("fleetd://acme/pump-1?x=1")},
		{u("fleetd://acme/pump-1"), u("fleetd://acme/pump-2")},
	} {
		if _, _, _, ok := pki.DeviceIdentity(&x509.Certificate{URIs: uris, SerialNumber: nil}); ok {
			t.Errorf("%v accepted", uris)
		}
	}
}

func TestParseAuthorityRefusesLeaf(t *testing.T) {
	ca := mustAuthority(t)
	cert, key, _, _ := ca.Issue("acme", "d", time.Now())
	if _, err := pki.ParseAuthority([]byte(cert), []byte(key)); err == nil {
		t.Fatal("a device certificate accepted as a CA")
	}
	if _, err := pki.ParseAuthority(ca.CertificatePEM(), []byte(key)); err == nil {
		t.Fatal("a CA certificate with another key accepted")
	}
	if b, _ := pem.Decode(ca.CertificatePEM()); b == nil || b.Type != "CERTIFICATE" {
		t.Fatal("CertificatePEM is not a PEM certificate")
	}
}
