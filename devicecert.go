package fleet

import (
	"context"
	"net/url"
	"strings"
	"time"
)

// DeviceCredentials is what a device needs to connect to fleetd's MQTT TLS
// listener with a client certificate instead of a token: exactly the
// "authentication" block of the uplink agent's configuration. The private
// key is made by fleetd, shown in this answer once and never stored.
type DeviceCredentials struct {
	CACertificate     string `json:"ca_certificate" doc:"PEM: the certificate(s) that verify fleetd's TLS server certificate"`
	DeviceCertificate string `json:"device_certificate" doc:"PEM: the device's client certificate, issued by fleetd's device CA"`
	DevicePrivateKey  string `json:"device_private_key" doc:"PEM (PKCS #8): the certificate's private key; shown this once"`
}

// UplinkConfig is a complete device file of the uplink agent
// (`uplink -a device.json`): where to connect and how to authenticate.
// project_id is the tenant, which uplink puts into every topic.
type UplinkConfig struct {
	ProjectID      string            `json:"project_id"`
	DeviceID       string            `json:"device_id"`
	Broker         string            `json:"broker"`
	Port           int               `json:"port"`
	Authentication DeviceCredentials `json:"authentication"`
}

// IssuedCertificate records the certificate a device holds: only the
// current one is accepted.
type IssuedCertificate struct {
	Serial      string // lowercase hex
	Subject     string // RFC 2253, as crypto/x509 prints it
	Fingerprint string // SHA-256 of the DER, lowercase hex
	NotBefore   time.Time
	NotAfter    time.Time
}

// DeviceCertificateService issues devices their client certificates and
// tells whether a presented one is still the device's.
type DeviceCertificateService interface {
	// IssueDeviceCertificate makes a key pair and a certificate for the
	// device. It replaces the device's previous certificate, which stops
	// being accepted for new connections.
	IssueDeviceCertificate(ctx context.Context, tenant, id string) (*DeviceCredentials, error)
	// AuthenticateDeviceCertificate is EUNAUTHENTICATED unless the device
	// exists and serial is its current certificate's.
	AuthenticateDeviceCertificate(ctx context.Context, tenant, id, serial string) error
	// FindDeviceCertificate is the device's current certificate, nil when
	// it has none; ENOTFOUND for an unknown device.
	FindDeviceCertificate(ctx context.Context, tenant, id string) (*IssuedCertificate, error)
}

// DeviceCertificateStore keeps the serial of each device's current
// certificate. A new token, or a new certificate, revokes the old one.
type DeviceCertificateStore interface {
	// SetDeviceCertificate records c as the device's certificate
	// (ENOTFOUND for an unknown device), with an audit entry.
	SetDeviceCertificate(ctx context.Context, tenant, id string, c IssuedCertificate) error
	// DeviceCertificateSerial is the serial of the device's current
	// certificate, "" when it has none; ENOTFOUND for an unknown device.
	DeviceCertificateSerial(ctx context.Context, tenant, id string) (string, error)
	// FindDeviceCertificate is what is recorded of the device's current
	// certificate, nil when it has none; ENOTFOUND for an unknown device.
	FindDeviceCertificate(ctx context.Context, tenant, id string) (*IssuedCertificate, error)
}

// deviceURIScheme names devices in the URI SAN of their certificates:
// fleetd://{tenant}/{device_id}. Tenant names and device ids need no
// escaping in it: a tenant name is 1 to 63 of a-z 0-9 - (ValidTenantName),
// a device id 1 to 128 of A-Z a-z 0-9 . _ : - (ValidDeviceID).
const deviceURIScheme = "fleetd"

// DeviceURI is the identity a device certificate carries.
func DeviceURI(tenant, id string) *url.URL {
	return &url.URL{Scheme: deviceURIScheme, Host: tenant, Path: "/" + id}
}

// ParseDeviceURI returns the tenant and device a certificate's URI names.
func ParseDeviceURI(u *url.URL) (tenant, id string, ok bool) {
	if u == nil || u.Scheme != deviceURIScheme || u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return "", "", false
	}
	id, ok = strings.CutPrefix(u.Path, "/")
	if !ok || !ValidTenantName(u.Host) || !ValidDeviceID(id) {
		return "", "", false
	}
	return u.Host, id, true
}
