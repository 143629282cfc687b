package server

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/fleetd/fleet/internal/cli"
	"github.com/fleetd/fleet/mqtt"
	"github.com/fleetd/fleet/mqtt/bridge"
	"github.com/fleetd/fleet/mqtt/broker"
	"github.com/fleetd/fleet/sqlstore"
)

// scaleConfig is what running as one of many replicas takes
// (docs/operations.md#scaling-out): an external MQTT broker instead of the
// embedded one, the secret its broker-auth calls carry, and the leases of
// background work.
type scaleConfig struct {
	broker         string // mqtt:// or mqtts:// URL; empty: the embedded broker
	caFile         string
	clientCert     string
	clientKey      string
	username       string
	password       string // never logged
	clientID       string
	sessionExpiry  time.Duration
	authSecret     string // never logged
	notifyLease    time.Duration
	redeliverLease time.Duration
}

func (s *scaleConfig) flags(fs *cli.FlagSet) {
	fs.StringVar(&s.broker, "mqtt-broker", "", "`URL` of an external MQTT 5 broker (mqtt://host:port or mqtts://host:port) to use instead of the embedded one; see docs/operations.md")
	fs.StringVar(&s.caFile, "mqtt-ca-file", "", "`FILE` of PEM CA certificates to trust for mqtts:// (default: the system's)")
	fs.StringVar(&s.clientCert, "mqtt-client-cert", "", "`FILE` of fleetd's PEM client certificate for mqtts://")
	fs.StringVar(&s.clientKey, "mqtt-client-key", "", "`FILE` of the client certificate's PEM key")
	fs.StringVar(&s.username, "mqtt-username", "", "`NAME` fleetd connects to the external broker with; the broker-auth endpoints make it a superuser")
	fs.StringVar(&s.password, "mqtt-password", "", "`PASSWORD` fleetd connects to the external broker with")
	fs.StringVar(&s.clientID, "mqtt-client-id", "", "`ID` of fleetd's session at the external broker; give each replica a stable one (default: fleetd-{hostname}-{random})")
	fs.DurationVar(&s.sessionExpiry, "mqtt-session-expiry", bridge.DefaultSessionExpiry, "how long the external broker keeps fleetd's session across a lost connection (`DURATION`)")
	fs.StringVar(&s.authSecret, "broker-auth-secret", "", "`SECRET` the external broker sends to fleetd's /broker/ authentication endpoints; unset, they refuse every request")
	fs.DurationVar(&s.notifyLease, "notify-lease", 2*time.Minute, "`DURATION` a replica's claim on a notification lasts; another takes it over after")
	fs.DurationVar(&s.redeliverLease, "mqtt-redelivery-lease", bridge.DefaultRedeliveryLease, "`DURATION` a replica's claim on sending an arriving device its queued actions lasts; another takes it over after")
}

// check reports settings that cannot work.
func (s *scaleConfig) check() error {
	if s.notifyLease <= 0 || s.redeliverLease <= 0 {
		return fmt.Errorf("--notify-lease and --mqtt-redelivery-lease must be positive")
	}
	if s.broker == "" {
		return nil
	}
	if _, err := bridge.ParseBrokerURL(s.broker); err != nil {
		return fmt.Errorf("--mqtt-broker: %v", err)
	}
	if _, _, ok := mqtt.ParseUsername(s.username); ok {
		return fmt.Errorf("--mqtt-username %q has the shape of a device's username; choose one without '/'", s.username)
	}
	if (s.clientCert == "") != (s.clientKey == "") {
		return fmt.Errorf("--mqtt-client-cert and --mqtt-client-key go together")
	}
	if s.sessionExpiry < time.Second {
		return fmt.Errorf("--mqtt-session-expiry must be at least 1s")
	}
	return nil
}

// tls builds the TLS settings for mqtts://.
func (s *scaleConfig) tls() (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if s.caFile != "" {
		pem, err := os.ReadFile(s.caFile)
		if err != nil {
			return nil, fmt.Errorf("--mqtt-ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--mqtt-ca-file %s: no PEM certificate in it", s.caFile)
		}
		tc.RootCAs = pool
	}
	if s.clientCert != "" {
		cert, err := tls.LoadX509KeyPair(s.clientCert, s.clientKey)
		if err != nil {
			return nil, fmt.Errorf("--mqtt-client-cert, --mqtt-client-key: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// channel opens nothing: it builds the device channel, the embedded broker
// of embedded (its address, TLS and limits) or a client of the external
// one, and for the latter the broker-auth endpoints the API serves (nil
// while no secret is set).
func (s *scaleConfig) channel(embedded broker.Config, db *sqlstore.DB, h mqtt.Handler, log *slog.Logger) (mqtt.Channel, http.Handler, error) {
	if err := s.check(); err != nil {
		return nil, nil, err
	}
	if s.broker == "" {
		return broker.NewServer(embedded, h), nil, nil
	}
	tc, err := s.tls()
	if err != nil {
		return nil, nil, err
	}
	client, err := bridge.NewClient(bridge.ClientConfig{
		Broker:          s.broker,
		TLS:             tc,
		Username:        s.username,
		Password:        s.password,
		ClientID:        s.clientID,
		SessionExpiry:   s.sessionExpiry,
		Redeliveries:    db,
		RedeliveryLease: s.redeliverLease,
		Logger:          log,
	}, h)
	if err != nil {
		return nil, nil, err
	}
	if s.authSecret == "" {
		log.Warn("--broker-auth-secret is not set: the /broker/ authentication endpoints refuse every request, and fleetd learns of arriving devices only from their reports; see docs/operations.md")
		return client, nil, nil
	}
	return client, &bridge.BrokerAuth{
		Handler:  h,
		Arrivals: client,
		Secret:   s.authSecret,
		Username: s.username,
		Password: s.password,
		Logger:   log,
	}, nil
}

// channelAddr is where the device channel is, for the startup line: the
// embedded broker's address or the external broker's URL.
func channelAddr(ch mqtt.Channel) string {
	switch ch := ch.(type) {
	case *broker.Server:
		return ch.Addr().String()
	case *bridge.Client:
		return ch.Addr()
	}
	return ""
}

// replicaName names this process in leases, so an operator (or a test) can
// tell which replica holds a claim: host and process id.
func replicaName() string {
	host, err := os.Hostname()
	if err != nil {
		host = "host"
	}
	return fmt.Sprintf("%s-%d", host, os.Getpid())
}
