package fleethttp

import (
	"net"
	"net/http"
	"net/url"

	"github.com/fleetd/fleet"
)

// UplinkBroker is where devices reach fleetd's MQTT TLS listener, for the
// uplink configurations the API hands out. An empty Host means the host
// the client used for the API.
type UplinkBroker struct {
	Host string
	Port int
}

func (s *Server) handleIssueCertificate(w http.ResponseWriter, r *http.Request) error {
	id, creds, err := s.issueCertificate(r)
	if err != nil {
		return err
	}
	location(w, r, "/api/v1/devices/", url.PathEscape(id))
	s.respond(w, r, http.StatusCreated, creds)
	return nil
}

func (s *Server) handleUplinkConfig(w http.ResponseWriter, r *http.Request) error {
	id, creds, err := s.issueCertificate(r)
	if err != nil {
		return err
	}
	host := s.UplinkBroker.Host
	if host == "" {
		host = r.Host
		if h, _, err := net.SplitHostPort(r.Host); err == nil {
			host = h
		}
	}
	location(w, r, "/api/v1/devices/", url.PathEscape(id))
	s.respond(w, r, http.StatusCreated, fleet.UplinkConfig{
		ProjectID:      tenantOf(r),
		DeviceID:       id,
		Broker:         host,
		Port:           s.UplinkBroker.Port,
		Authentication: *creds,
	})
	return nil
}

// issueCertificate makes the device of the path a new certificate.
func (s *Server) issueCertificate(r *http.Request) (string, *fleet.DeviceCredentials, error) {
	id, err := deviceID(r)
	if err != nil {
		return "", nil, err
	}
	if s.DeviceCerts == nil {
		return "", nil, fleet.Errorf(fleet.ECONFLICT, "this fleetd has no MQTT TLS listener to present a certificate to; start it with --mqtts-addr, --tls-cert and --tls-key")
	}
	creds, err := s.DeviceCerts.IssueDeviceCertificate(r.Context(), tenantOf(r), id)
	return id, creds, err
}
