// Package pki is fleetd's use of X.509: the server certificate it serves
// HTTPS and MQTT over TLS with, reloaded from its files when they change,
// and the device certificate authority that issues devices the client
// certificates they connect with over mutual TLS (as the uplink agent
// does, with no username or password).
package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"time"

	"github.com/fleetd/fleet"
)

// Validity of what the authority makes. Devices in the field cannot renew
// a certificate by themselves, so theirs last long; revocation is by the
// serial recorded on the device, not by expiry.
const (
	CAValidity     = 30 * 365 * 24 * time.Hour
	DeviceValidity = 20 * 365 * 24 * time.Hour
)

// Authority is the device CA: it issues device certificates and verifies
// them at the MQTT TLS listener.
type Authority struct {
	cert    *x509.Certificate
	key     crypto.Signer
	certPEM []byte
}

// NewAuthorityPEM makes a new CA key and self-signed certificate and
// returns them as PEM, certificate first, ready to store.
func NewAuthorityPEM(now time.Time) (string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          newSerial(),
		Subject:               pkix.Name{CommonName: "fleetd device CA", Organization: []string{"fleetd"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return "", err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return "", err
	}
	var b bytes.Buffer
	pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: der})
	pem.Encode(&b, &pem.Block{Type: "PRIVATE KEY", Bytes: kder})
	return b.String(), nil
}

// ParseAuthority reads a CA certificate and its private key from PEM (both
// may be in one text). The certificate must be a CA's.
func ParseAuthority(certPEM, keyPEM []byte) (*Authority, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("device CA: %w", err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("device CA: %w", err)
	}
	if !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, errors.New("device CA: the certificate is not a CA's (basic constraints CA:TRUE and key usage certSign)")
	}
	key, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, errors.New("device CA: the private key cannot sign")
	}
	return &Authority{cert: cert, key: key, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})}, nil
}

// CertificatePEM is the CA's certificate.
func (a *Authority) CertificatePEM() []byte { return a.certPEM }

// ClientCAs is the pool that verifies device certificates.
func (a *Authority) ClientCAs() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(a.cert)
	return pool
}

// Issue makes a key pair and a client certificate for the device: CN the
// device id, O the tenant, and the URI SAN fleetd://{tenant}/{device_id},
// which is what fleetd reads back. It returns the certificate and key as
// PEM (the key as PKCS #8, which every TLS stack reads, rustls included).
func (a *Authority) Issue(tenant, id string, now time.Time) (certPEM, keyPEM string, issued fleet.IssuedCertificate, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", issued, err
	}
	serial := newSerial()
	notAfter := now.Add(DeviceValidity)
	if notAfter.After(a.cert.NotAfter) {
		notAfter = a.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: id, Organization: []string{tenant}},
		URIs:         []*url.URL{fleet.DeviceURI(tenant, id)},
		NotBefore:    now.Add(-time.Hour), // a device clock a little behind
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		return "", "", issued, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return "", "", issued, err
	}
	certPEM = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	keyPEM = string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}))
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return "", "", issued, err
	}
	sum := sha256.Sum256(der)
	return certPEM, keyPEM, fleet.IssuedCertificate{Serial: SerialHex(serial), Subject: cert.Subject.String(),
		Fingerprint: hex.EncodeToString(sum[:]), NotBefore: cert.NotBefore, NotAfter: cert.NotAfter}, nil
}

// DeviceIdentity returns the device a verified client certificate names,
// and its serial. Certificates without exactly one fleetd URI are refused.
func DeviceIdentity(cert *x509.Certificate) (tenant, id, serial string, ok bool) {
	found := 0
	for _, u := range cert.URIs {
		if t, d, valid := fleet.ParseDeviceURI(u); valid {
			tenant, id = t, d
			found++
		}
	}
	if found != 1 {
		return "", "", "", false
	}
	return tenant, id, SerialHex(cert.SerialNumber), true
}

// SerialHex is how serials are recorded: lowercase hex, no leading zeros.
func SerialHex(n *big.Int) string { return hex.EncodeToString(n.Bytes()) }

// newSerial is a random positive 127-bit serial (RFC 5280 allows 20 bytes).
func newSerial() *big.Int {
	b := make([]byte, 16)
	rand.Read(b) // never fails (crypto/rand)
	b[0] &= 0x7f
	b[0] |= 0x40 // never leading zeros, so the hex form is stable
	return new(big.Int).SetBytes(b)
}
