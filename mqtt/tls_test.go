package mqtt_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/fleetd/fleet/mqtt"
)

// selfSigned returns a certificate for 127.0.0.1 and a pool that trusts it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "fleetd test"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pool
}

func TestTLS(t *testing.T) {
	cert, pool := selfSigned(t)
	h := newFakeHandler()
	s := MustOpenServer(t, h, func(c *mqtt.Config) {
		c.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	})
	conn, err := tls.Dial("tcp", s.Addr().String(), &tls.Config{RootCAs: pool})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	c := paho.NewClient(paho.ClientConfig{Conn: conn})
	ctx, cancel := contextWithWait()
	defer cancel()
	// Keepalive 0: paho.golang's pinger sends its first PINGREQ at once, on
	// another goroutine, and over TLS its packets are written in pieces that
	// can interleave with the PUBLISH.
	if _, err := c.Connect(ctx, &paho.Connect{
		KeepAlive: 0, ClientID: "dev-1", CleanStart: true,
		Username: "acme/dev-1", UsernameFlag: true, Password: []byte("tok-1"), PasswordFlag: true,
	}); err != nil {
		t.Fatalf("connect over TLS: %v", err)
	}
	defer func() { c.Disconnect(&paho.Disconnect{}); <-c.Done() }()
	if _, err := c.Publish(ctx, &paho.Publish{Topic: statusT, QoS: 1, Payload: status}); err != nil {
		t.Fatalf("publish over TLS: %v", err)
	}
	receive(t, h.statuses, "HandleStatus")

	// The listener speaks TLS only.
	if _, _, err := connect5(t, s, "acme/dev-1", "tok-1", false); err == nil {
		t.Error("plain MQTT accepted on a TLS listener")
	}
}
