package broker_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/mqtt/broker"
	"github.com/fleetd/fleet/mqtt/mqtttest"
	"github.com/fleetd/fleet/pki"
)

// certHandler is a mqtttest.Handler that also admits devices by certificate:
// serials maps "tenant/device" to the serial it accepts.
type certHandler struct {
	*mqtttest.Handler
	mu      sync.Mutex
	serials map[string]string
}

func (h *certHandler) AuthenticateDeviceCertificate(ctx context.Context, tenant, device, serial string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if want, ok := h.serials[tenant+"/"+device]; !ok || want != serial {
		return fleet.Errorf(fleet.EUNAUTHENTICATED, "not the device's certificate")
	}
	return nil
}

func (h *certHandler) accept(tenant, device, serial string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.serials[tenant+"/"+device] = serial
}

// mtlsServer is a broker with a plain listener and a TLS listener that
// verifies client certificates of ca.
type mtlsServer struct {
	*broker.Server
	h      *certHandler
	ca     *pki.Authority
	caKey  tls.Certificate
	server *x509.CertPool // trusts the server's certificate
}

func openMTLS(t *testing.T) *mtlsServer {
	t.Helper()
	cert, pool := mqtttest.SelfSigned(t)
	ca, caKey := mustAuthority(t)
	h := &certHandler{Handler: mqtttest.NewHandler(), serials: map[string]string{}}
	s := MustOpenServer(t, h, func(c *broker.Config) {
		c.TLSAddr = "127.0.0.1:0"
		c.TLS = &tls.Config{
			Certificates: []tls.Certificate{cert},
			ClientAuth:   tls.VerifyClientCertIfGiven,
			ClientCAs:    ca.ClientCAs(),
		}
	})
	return &mtlsServer{Server: s, h: h, ca: ca, caKey: caKey, server: pool}
}

// mustAuthority returns a new device CA and its key pair, with which
// tests sign what the CA never would.
func mustAuthority(t *testing.T) (*pki.Authority, tls.Certificate) {
	t.Helper()
	p, err := pki.NewAuthorityPEM(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ca, err := pki.ParseAuthority([]byte(p), []byte(p))
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair([]byte(p), []byte(p))
	if err != nil {
		t.Fatal(err)
	}
	return ca, pair
}

// issue returns a client certificate of ca for the device, accepted by
// the handler unless told otherwise.
func (m *mtlsServer) issue(t *testing.T, tenant, device string, accept bool) tls.Certificate {
	t.Helper()
	certPEM, keyPEM, issued, err := m.ca.Issue(tenant, device, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if accept {
		m.h.accept(tenant, device, issued.Serial)
	}
	pair, err := tls.X509KeyPair([]byte(certPEM), []byte(keyPEM))
	if err != nil {
		t.Fatal(err)
	}
	return pair
}

// connectTLS connects an MQTT 5 device over TLS with an optional client
// certificate and username/password. The TLS handshake error, if any, is
// returned as is.
func (m *mtlsServer) connectTLS(t *testing.T, cert *tls.Certificate, username, password string) (*mqtttest.Device, *paho.Connack, error) {
	t.Helper()
	tc := &tls.Config{RootCAs: m.server}
	if cert != nil {
		tc.Certificates = []tls.Certificate{*cert}
	}
	conn, err := tls.Dial("tcp", m.TLSAddr().String(), tc)
	if err != nil {
		return nil, nil, err
	}
	// TLS 1.3 clients learn of a refused certificate only when they read.
	c := &mqtttest.Device{Received: make(chan *paho.Publish, 100), Disconnected: make(chan *paho.Disconnect, 1)}
	c.Client = paho.NewClient(paho.ClientConfig{
		Conn: conn,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){
			func(pr paho.PublishReceived) (bool, error) { c.Received <- pr.Packet; return true, nil },
		},
		OnServerDisconnect: func(d *paho.Disconnect) { c.Disconnected <- d },
	})
	cp := &paho.Connect{KeepAlive: 0, ClientID: "uplink-like", CleanStart: true}
	if username != "" {
		cp.Username, cp.UsernameFlag = username, true
	}
	if password != "" {
		cp.Password, cp.PasswordFlag = []byte(password), true
	}
	ctx, cancel := mqtttest.Context()
	defer cancel()
	ca, err := c.Connect(ctx, cp)
	if err != nil {
		conn.Close()
		return nil, ca, err
	}
	t.Cleanup(func() { c.Disconnect(&paho.Disconnect{}); <-c.Done() })
	return c, ca, nil
}

func TestMutualTLS(t *testing.T) {
	m := openMTLS(t)

	t.Run("certificate alone", func(t *testing.T) {
		cert := m.issue(t, "acme", "dev-1", true)
		c, ca, err := m.connectTLS(t, &cert, "", "")
		if err != nil {
			t.Fatalf("connect with the device's certificate: %v (connack %+v)", err, ca)
		}
		got := mqtttest.Receive(t, m.h.Connected, "DeviceConnected")
		if got.Tenant != "acme" || got.Device != "dev-1" {
			t.Fatalf("connected as %s/%s, want acme/dev-1", got.Tenant, got.Device)
		}
		if err := c.Send(statusT, status); err != nil {
			t.Fatalf("publish on its own topic: %v", err)
		}
		mqtttest.Receive(t, m.h.Statuses, "HandleStatus")
		// The certificate is the identity: another device's topic is a
		// violation like any other.
		if err := c.Send("/tenants/acme/devices/dev-2/action/status", status); err == nil {
			t.Fatal("a publish on another device's topic was acknowledged")
		}
		c.AwaitServerDisconnect(t, 0x87)
	})

	t.Run("certificate and its own username", func(t *testing.T) {
		cert := m.issue(t, "acme", "dev-2", true)
		if _, ca, err := m.connectTLS(t, &cert, "acme/dev-2", ""); err != nil {
			t.Fatalf("connect: %v (connack %+v)", err, ca)
		}
	})

	t.Run("token over TLS without a certificate", func(t *testing.T) {
		if _, ca, err := m.connectTLS(t, nil, "acme/dev-1", "tok-1"); err != nil {
			t.Fatalf("connect with a token over TLS: %v (connack %+v)", err, ca)
		}
		if _, ca, err := m.connectTLS(t, nil, "acme/dev-1", "wrong"); err == nil || ca == nil || ca.ReasonCode != 0x86 {
			t.Fatalf("wrong token over TLS: err %v, connack %+v; want 0x86", err, ca)
		}
	})

	refused := func(t *testing.T, cert tls.Certificate, username string, wantCode byte) {
		t.Helper()
		_, ca, err := m.connectTLS(t, &cert, username, "")
		if err == nil {
			t.Fatal("connection accepted")
		}
		if wantCode != 0 && (ca == nil || ca.ReasonCode != wantCode) {
			t.Fatalf("connack %+v (err %v), want reason code %#x", ca, err, wantCode)
		}
	}
	t.Run("revoked: no longer the device's serial", func(t *testing.T) {
		old := m.issue(t, "acme", "dev-1", true)
		m.issue(t, "acme", "dev-1", true) // replaces it
		refused(t, old, "", 0x86)
	})
	t.Run("username of another device", func(t *testing.T) {
		refused(t, m.issue(t, "acme", "dev-1", true), "acme/dev-2", 0x86)
	})
	t.Run("another CA", func(t *testing.T) {
		otherCA, _ := mustAuthority(t)
		other := &mtlsServer{ca: otherCA, h: m.h}
		refused(t, other.issue(t, "acme", "dev-1", true), "", 0)
	})
	t.Run("expired", func(t *testing.T) {
		certPEM, keyPEM, issued, err := m.ca.Issue("acme", "dev-1", time.Now().Add(-25*365*24*time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		m.h.accept("acme", "dev-1", issued.Serial)
		pair, _ := tls.X509KeyPair([]byte(certPEM), []byte(keyPEM))
		refused(t, pair, "", 0)
	})
	t.Run("a certificate of the CA that names no device", func(t *testing.T) {
		refused(t, signedBy(t, m.caKey, "acme"), "", 0x86)
	})
	t.Run("self-signed", func(t *testing.T) {
		cert, _ := mqtttest.SelfSigned(t)
		refused(t, cert, "", 0)
	})

	// The plain listener knows nothing of certificates and still works.
	mustConnect5(t, m.Server, "acme/dev-2", "tok-2", false)
}

// signedBy is a client certificate signed by the CA's key but without a
// device URI: the URI, not the CN or O, is what names the device.
func signedBy(t *testing.T, caKey tls.Certificate, org string) tls.Certificate {
	t.Helper()
	issuer, err := x509.ParseCertificate(caKey.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "dev-1", Organization: []string{org}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, issuer, &key.PublicKey, caKey.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
