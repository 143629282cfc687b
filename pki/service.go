package pki

import (
	"context"
	"time"

	"github.com/fleetd/fleet"
)

// Service issues device certificates from an Authority and records them in
// a store, which also says whether a presented certificate is current.
type Service struct {
	Store     fleet.DeviceCertificateStore
	Authority *Authority
	// ServerTrust is the PEM devices verify fleetd's TLS certificate with,
	// handed out as ca_certificate; called for each issue, so a reloaded
	// certificate is reflected.
	ServerTrust func() []byte
	Now         func() time.Time
}

var _ fleet.DeviceCertificateService = (*Service)(nil)

func (s *Service) now() time.Time {
	if s.Now == nil {
		return time.Now()
	}
	return s.Now()
}

// IssueDeviceCertificate makes the device a new certificate and makes it
// the only one accepted.
func (s *Service) IssueDeviceCertificate(ctx context.Context, tenant, id string) (*fleet.DeviceCredentials, error) {
	certPEM, keyPEM, issued, err := s.Authority.Issue(tenant, id, s.now())
	if err != nil {
		return nil, err
	}
	if err := s.Store.SetDeviceCertificate(ctx, tenant, id, issued); err != nil {
		return nil, err
	}
	return &fleet.DeviceCredentials{
		CACertificate:     string(s.ServerTrust()),
		DeviceCertificate: certPEM,
		DevicePrivateKey:  keyPEM,
	}, nil
}

// AuthenticateDeviceCertificate accepts the device's current certificate
// only.
func (s *Service) AuthenticateDeviceCertificate(ctx context.Context, tenant, id, serial string) error {
	current, err := s.Store.DeviceCertificateSerial(ctx, tenant, id)
	if fleet.ErrorCode(err) == fleet.ENOTFOUND || (err == nil && (current == "" || current != serial)) {
		return fleet.Errorf(fleet.EUNAUTHENTICATED, "unknown device or a certificate that is no longer the device's")
	}
	return err
}

// FindDeviceCertificate is the device's current certificate, nil when it
// has none.
func (s *Service) FindDeviceCertificate(ctx context.Context, tenant, id string) (*fleet.IssuedCertificate, error) {
	return s.Store.FindDeviceCertificate(ctx, tenant, id)
}
