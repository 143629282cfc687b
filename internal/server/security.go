package server

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"time"

	"github.com/fleetd/fleet"
	fleethttp "github.com/fleetd/fleet/http"
	"github.com/fleetd/fleet/internal/cli"
	"github.com/fleetd/fleet/mqtt"
	"github.com/fleetd/fleet/mqtt/broker"
	"github.com/fleetd/fleet/pki"
	"github.com/fleetd/fleet/sqlstore"
)

// securityConfig is what protects fleetd from the network (docs/reliability.md):
// TLS for the API and the device channel, the device CA that lets devices
// connect with client certificates, timeouts and limits against abuse.
type securityConfig struct {
	tlsCert, tlsKey, tlsCA string
	httpTLS                bool
	mqttsAddr              string
	mqttPublicAddr         string
	deviceCACert           string
	deviceCAKey            string

	http         fleethttp.Security
	mqtt         broker.Config // only the limits
	mqttDecoding int64         // mqtt.Devices.MaxDecoding
	follows      int           // fleethttp.Follows.PerTenant
}

func (s *securityConfig) flags(fs *cli.FlagSet) {
	fs.StringVar(&s.tlsCert, "tls-cert", "", "`FILE` of fleetd's PEM TLS certificate (with its intermediates) for HTTPS and --mqtts-addr; reloaded when the file changes")
	fs.StringVar(&s.tlsKey, "tls-key", "", "`FILE` of the TLS certificate's PEM private key")
	fs.StringVar(&s.tlsCA, "tls-ca", "", "`FILE` of PEM CA certificates devices should trust for --tls-cert, handed to them as ca_certificate (default: the last certificate of --tls-cert)")
	fs.BoolVar(&s.httpTLS, "http-tls", true, "serve the API over HTTPS when --tls-cert is given; false keeps it plain, behind a load balancer that terminates TLS")
	fs.StringVar(&s.mqttsAddr, "mqtts-addr", "", "`ADDR` of an MQTT over TLS listener (such as :8883), beside --mqtt-addr; devices may connect there with a client certificate issued by fleetd (needs --tls-cert); --mqtt-addr off leaves only this one")
	fs.StringVar(&s.mqttPublicAddr, "mqtt-public-addr", "", "`HOST:PORT` devices reach --mqtts-addr at, written into uplink configurations (default: the host of --public-url or of the request, and the port of --mqtts-addr)")
	fs.StringVar(&s.deviceCACert, "device-ca-cert", "", "`FILE` of the PEM CA certificate that issues device certificates (default: one fleetd makes and keeps in its database, shared by replicas)")
	fs.StringVar(&s.deviceCAKey, "device-ca-key", "", "`FILE` of the device CA's PEM private key")

	fs.DurationVar(&s.http.ReadHeaderTimeout, "http-read-header-timeout", fleethttp.DefaultReadHeaderTimeout, "longest `DURATION` a client may take to send a request's headers")
	fs.DurationVar(&s.http.ReadTimeout, "http-read-timeout", fleethttp.DefaultReadTimeout, "longest `DURATION` a client may take to send a request body (uploads: the longest pause)")
	fs.DurationVar(&s.http.WriteTimeout, "http-write-timeout", fleethttp.DefaultWriteTimeout, "longest `DURATION` a response may take (downloads: the longest pause of a client that does not read)")
	fs.IntVar(&s.http.MaxHeaderBytes, "http-max-header-bytes", fleethttp.DefaultMaxHeaderBytes, "largest request headers in `BYTES`")
	fs.IntVar(&s.http.MaxConnections, "http-max-connections", fleethttp.DefaultMaxConnections, "most HTTP connections open at once, in `N`; 0 or less: no cap")
	fs.IntVar(&s.http.MaxConnectionsPerAddr, "http-max-connections-per-ip", fleethttp.DefaultMaxConnsPerAddr, "most HTTP connections open at once from one address, in `N`; 0 or less: no cap")
	fs.IntVar(&s.follows, "logs-follow-per-tenant", fleethttp.DefaultFollowsPerTenant, "most log streams (`N`: logs?follow=true, the console's Logs tab) one tenant may follow at once, per replica; more are 429; 0 or less: no cap")
	fs.StringVar(&s.http.MetricsToken, "metrics-token", "", "`TOKEN` GET /metrics requires as Authorization: Bearer; empty leaves /metrics open")
	fs.Float64Var(&s.http.Rate, "rate-limit", fleethttp.DefaultRate, "requests per second (`N`) each API key or end user may make on average, per replica, except device data; negative: no limit")
	fs.IntVar(&s.http.Burst, "rate-burst", fleethttp.DefaultBurst, "requests (`N`) an API key or end user may make at once beyond --rate-limit")
	fs.Float64Var(&s.http.DeviceDataRate, "device-data-rate-limit", fleethttp.DefaultDeviceDataRate, "status reports and stream ingest requests per second (`N`) each API key may make over HTTP, per replica; negative: no limit")
	fs.IntVar(&s.http.DeviceDataBurst, "device-data-rate-burst", fleethttp.DefaultDeviceDataBurst, "device data requests (`N`) a key may make at once beyond --device-data-rate-limit")
	fs.Float64Var(&s.http.DDIRegistrationRate, "ddi-registration-rate-limit", fleethttp.DefaultDDIRegistrationRate, "devices per second (`N`) a tenant's hawkBit gateways may register by polling for unknown controllers, per replica, when the tenant allows it")
	fs.IntVar(&s.http.DDIRegistrationBurst, "ddi-registration-rate-burst", fleethttp.DefaultDDIRegistrationBurst, "devices (`N`) a tenant's gateways may register at once beyond --ddi-registration-rate-limit")

	fs.DurationVar(&s.mqtt.ConnectTimeout, "mqtt-connect-timeout", broker.DefaultConnectTimeout, "longest `DURATION` a device may take to send CONNECT after connecting")
	fs.IntVar(&s.mqtt.MaxPacketSize, "mqtt-max-packet-size", broker.DefaultMaxPacketSize, "largest MQTT packet in `BYTES` a device may send (MQTT 5 devices are told in CONNACK); larger disconnects it")
	fs.Int64Var(&s.mqttDecoding, "mqtt-max-decoding", mqtt.DefaultMaxDecoding, "`BYTES` of device payloads decoded at once, over all devices; more wait their turn (decoding costs up to ~35 times a payload's size)")
	fs.DurationVar(&s.mqtt.WriteTimeout, "mqtt-write-timeout", broker.DefaultWriteTimeout, "longest `DURATION` a device may leave what fleetd writes unread, or an action unacknowledged, before it is disconnected")
	fs.IntVar(&s.mqtt.MaxInflight, "mqtt-max-inflight", broker.DefaultMaxInflight, "most actions (`N`) awaiting one device's PUBACK at once; more wait their turn (an MQTT 5 device's Receive Maximum may lower it)")
	fs.DurationVar(&s.mqtt.MaxKeepalive, "mqtt-max-keepalive", broker.DefaultMaxKeepalive, "longest keepalive (`DURATION`) a device may use; none or longer becomes this")
	fs.IntVar(&s.mqtt.MaxConnections, "mqtt-max-connections", broker.DefaultMaxConnections, "most MQTT connections (`N`) open at once")
	fs.IntVar(&s.mqtt.MaxPendingPerIP, "mqtt-max-pending-per-ip", broker.DefaultMaxPendingPerIP, "most connections (`N`) from one address that have not sent CONNECT yet")
	fs.IntVar(&s.mqtt.MaxTenantConnections, "mqtt-max-tenant-connections", 0, "most devices (`N`) of one tenant connected at once; 0: no cap")
	fs.Float64Var(&s.mqtt.PublishRate, "mqtt-publish-rate", broker.DefaultPublishRate, "publishes per second (`N`) a device connection may make on average; faster is disconnected; negative: no limit")
	fs.IntVar(&s.mqtt.PublishBurst, "mqtt-publish-burst", broker.DefaultPublishBurst, "publishes (`N`) a device connection may make at once beyond --mqtt-publish-rate")
	fs.Float64Var(&s.mqtt.AuthFailureRate, "mqtt-auth-failure-rate", broker.DefaultAuthFailureRate, "failed CONNECTs per second (`N`) one address may make after its burst; more are refused unchecked; negative: no limit")
	fs.IntVar(&s.mqtt.AuthFailureBurst, "mqtt-auth-failure-burst", broker.DefaultAuthFailureBurst, "failed CONNECTs (`N`) one address may make at once")
}

// security is what securityConfig built for serve.
type security struct {
	cert         *pki.ServerCertificate // nil without --tls-cert
	certs        fleet.DeviceCertificateService
	mqttTLS      *tls.Config
	http         fleethttp.Security
	mqttBase     broker.Config
	mqttDecoding int64
	follows      *fleethttp.Follows
}

// build checks the settings, loads the certificates and, when there is an
// MQTT TLS listener, the device CA (made on first use and kept in the
// database, so that every replica issues and accepts the same).
func (s *securityConfig) build(ctx context.Context, db *sqlstore.DB, mqttAddr string, external bool, log *slog.Logger) (*security, error) {
	switch {
	case external && s.mqttsAddr != "":
		return nil, fmt.Errorf("--mqtts-addr is the embedded broker's; with --mqtt-broker, devices connect to that broker")
	case (s.tlsCert == "") != (s.tlsKey == ""):
		return nil, fmt.Errorf("--tls-cert and --tls-key go together")
	case s.mqttsAddr != "" && s.tlsCert == "":
		return nil, fmt.Errorf("--mqtts-addr needs --tls-cert and --tls-key")
	case (s.deviceCACert == "") != (s.deviceCAKey == ""):
		return nil, fmt.Errorf("--device-ca-cert and --device-ca-key go together")
	case mqttAddr == broker.AddrOff && s.mqttsAddr == "":
		return nil, fmt.Errorf("--mqtt-addr off leaves devices nowhere to connect: give --mqtts-addr")
	}
	sec := &security{http: s.http, mqttBase: s.mqtt, mqttDecoding: s.mqttDecoding, follows: &fleethttp.Follows{PerTenant: s.follows}}
	sec.mqttBase.Addr = mqttAddr
	sec.mqttBase.Logger = log
	if s.tlsCert == "" {
		return sec, nil
	}
	sec.cert = &pki.ServerCertificate{CertFile: s.tlsCert, KeyFile: s.tlsKey, TrustFile: s.tlsCA, Logger: log}
	if err := sec.cert.Load(); err != nil {
		return nil, err
	}
	if s.httpTLS {
		sec.http.TLS = sec.cert.Config()
	}
	if s.mqttsAddr == "" {
		return sec, nil
	}
	ca, err := s.deviceCA(ctx, db)
	if err != nil {
		return nil, err
	}
	tc := sec.cert.Config()
	tc.ClientAuth = tls.VerifyClientCertIfGiven
	tc.ClientCAs = ca.ClientCAs()
	sec.mqttTLS = tc
	sec.mqttBase.TLS = tc
	sec.mqttBase.TLSAddr = s.mqttsAddr
	sec.certs = &pki.Service{Store: db, Authority: ca, ServerTrust: sec.cert.TrustPEM}
	return sec, nil
}

// deviceCAName is the device CA's row in server_secrets.
const deviceCAName = "device_ca_pem"

func (s *securityConfig) deviceCA(ctx context.Context, db *sqlstore.DB) (*pki.Authority, error) {
	if s.deviceCACert != "" {
		cert, err := os.ReadFile(s.deviceCACert)
		if err != nil {
			return nil, fmt.Errorf("--device-ca-cert: %w", err)
		}
		key, err := os.ReadFile(s.deviceCAKey)
		if err != nil {
			return nil, fmt.Errorf("--device-ca-key: %w", err)
		}
		ca, err := pki.ParseAuthority(cert, key)
		if err != nil {
			return nil, fmt.Errorf("--device-ca-cert, --device-ca-key: %w", err)
		}
		return ca, nil
	}
	p, err := db.ServerValue(ctx, deviceCAName, func() (string, error) { return pki.NewAuthorityPEM(time.Now()) })
	if err != nil {
		return nil, fmt.Errorf("device CA: %w", err)
	}
	return pki.ParseAuthority([]byte(p), []byte(p))
}

// uplinkBroker is where uplink configurations tell devices to connect:
// --mqtt-public-addr, else the host of --public-url (or of the request)
// and the port of the MQTT TLS listener.
func (s *securityConfig) uplinkBroker(publicURL string, tlsAddr net.Addr) (fleethttp.UplinkBroker, error) {
	var b fleethttp.UplinkBroker
	if tlsAddr == nil {
		return b, nil
	}
	if ta, ok := tlsAddr.(*net.TCPAddr); ok {
		b.Port = ta.Port
	}
	if publicURL != "" {
		if u, err := url.Parse(publicURL); err == nil {
			b.Host = u.Hostname()
		}
	}
	if s.mqttPublicAddr != "" {
		host, port, err := net.SplitHostPort(s.mqttPublicAddr)
		n, perr := strconv.Atoi(port)
		if err != nil || perr != nil || host == "" || n < 1 || n > 65535 {
			return b, fmt.Errorf("--mqtt-public-addr %q: want HOST:PORT", s.mqttPublicAddr)
		}
		b.Host, b.Port = host, n
	}
	return b, nil
}

// tlsAddr is the MQTT TLS listener's address, "" when there is none.
func tlsAddr(ch mqtt.Channel) string {
	if ms, ok := ch.(*broker.Server); ok && ms.TLSAddr() != nil {
		return ms.TLSAddr().String()
	}
	return ""
}

// tlsAddrs adds the MQTT TLS listener to the startup line.
func tlsAddrs(ch mqtt.Channel) string {
	if a := tlsAddr(ch); a != "" {
		return " mqtts=" + a
	}
	return ""
}
