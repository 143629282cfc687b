package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pahov3 "github.com/eclipse/paho.mqtt.golang"

	"github.com/fleetd/fleet/action"
	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/mqtt"
	"github.com/fleetd/fleet/pki"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// credentials is the answer of the certificate endpoint: uplink's
// authentication block.
type credentials struct {
	CACertificate     string `json:"ca_certificate"`
	DeviceCertificate string `json:"device_certificate"`
	DevicePrivateKey  string `json:"device_private_key"`
}

// uplinkDevice connects as the uplink agent does: MQTT 3.1.1 over TLS, the
// device id as client id, no username or password, the ca_certificate as
// the only trusted root and the device certificate as client certificate.
func uplinkDevice(t *testing.T, addr, tenant, id string, c credentials) (*fleetdtest.MQTTDevice, error) {
	t.Helper()
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM([]byte(c.CACertificate)) {
		t.Fatalf("ca_certificate holds no certificate: %q", c.CACertificate)
	}
	pair, err := tls.X509KeyPair([]byte(c.DeviceCertificate), []byte(c.DevicePrivateKey))
	if err != nil {
		t.Fatalf("device_certificate and device_private_key: %v", err)
	}
	d := &fleetdtest.MQTTDevice{Tenant: tenant, ID: id, Actions: make(chan action.Message, 100)}
	opts := pahov3.NewClientOptions().
		AddBroker("ssl://" + addr).
		SetClientID(id).
		SetTLSConfig(&tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}}).
		SetProtocolVersion(4).
		SetCleanSession(true).
		SetAutoReconnect(false).
		SetConnectTimeout(fleetdtest.Bound)
	d.Client = pahov3.NewClient(opts)
	tok := d.Client.Connect()
	if !tok.WaitTimeout(fleetdtest.Bound) {
		t.Fatalf("connect %s over TLS: timed out", id)
	}
	if err := tok.Error(); err != nil {
		return nil, err
	}
	t.Cleanup(func() { d.Client.Disconnect(100) })
	sub := d.Client.Subscribe(mqtt.ActionsTopic(tenant, id), 1, func(_ pahov3.Client, m pahov3.Message) {
		var a action.Message
		if json.Unmarshal(m.Payload(), &a) == nil {
			if _, dup := d.Seen.LoadOrStore(a.ID, true); !dup {
				d.Actions <- a
			}
		}
	})
	if !sub.WaitTimeout(fleetdtest.Bound) || sub.Error() != nil {
		t.Fatalf("subscribe %s: %v", id, sub.Error())
	}
	return d, nil
}

func TestDeviceCertificatesEndToEnd(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		certFile, keyFile := fleetdtest.WriteServerCert(t, t.TempDir(), "fleetd test")
		// The API stays plain (--http-tls=false: behind a balancer that
		// terminates TLS) so the harness validates every answer; devices
		// use MQTT over TLS.
		s := startServer(t, b, "--tls-cert", certFile, "--tls-key", keyFile, "--http-tls=false",
			"--mqtts-addr", "127.0.0.1:0", "--public-url", "https://fleet.example.com")
		mqtts := s.mqttsAddr(t)
		admin := s.Admin()
		s.MustDevice(t, admin, "pump-1", nil)

		var c credentials
		s.Do(t, admin, "POST", "/api/v1/devices/pump-1/certificate", nil).Want(t, 201).Decode(t, &c)
		dev, err := uplinkDevice(t, mqtts, "default", "pump-1", c)
		if err != nil {
			t.Fatalf("connect with the issued certificate: %v", err)
		}

		// It is a device like any other: actions reach it, reports land.
		id := s.Dispatch(t, admin, map[string]any{"action": "reboot", "params": map[string]any{}, "search_type": "default", "device_ids": []string{"pump-1"}})
		if got := dev.Next(t); got.ID != fmt.Sprint(id) {
			t.Fatalf("received action %s, want %d", got.ID, id)
		}
		dev.Report(t, map[string]any{"id": fmt.Sprint(id), "state": "Completed", "progress": 100})
		s.AwaitActionStatus(t, admin, "pump-1", id, "Completed")

		t.Run("mosquitto_pub with the certificate", func(t *testing.T) {
			// Another TLS stack (OpenSSL), a client written in C: what the
			// API hands out is ordinary PEM any client reads.
			if _, err := os.Stat("/usr/bin/mosquitto_pub"); err != nil {
				t.Skip("mosquitto_pub is not installed (Debian package mosquitto-clients; .ci/run installs it)")
			}
			dir := t.TempDir()
			files := map[string]string{"ca.pem": c.CACertificate, "dev.pem": c.DeviceCertificate, "dev.key": c.DevicePrivateKey}
			for name, content := range files {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			host, port, _ := net.SplitHostPort(mqtts)
			id2 := s.Dispatch(t, admin, map[string]any{"action": "ping", "params": map[string]any{}, "search_type": "default", "device_ids": []string{"pump-1"}})
			dev.Next(t)
			ctx, cancel := context.WithTimeout(context.Background(), fleetdtest.Bound)
			defer cancel()
			// Exits 0 once the report was acknowledged, that is committed.
			out, err := exec.CommandContext(ctx, "/usr/bin/mosquitto_pub", "-h", host, "-p", port, "-V", "mqttv311", "-q", "1", "-i", "pump-1",
				"--cafile", filepath.Join(dir, "ca.pem"), "--cert", filepath.Join(dir, "dev.pem"), "--key", filepath.Join(dir, "dev.key"),
				"-t", mqtt.ActionStatusTopic("default", "pump-1"), "-m", fmt.Sprintf(`{"id": "%d", "state": "Completed", "progress": 100}`, id2)).CombinedOutput()
			if err != nil {
				t.Fatalf("mosquitto_pub over mutual TLS: %v\n%s", err, out)
			}
			s.AwaitActionStatus(t, admin, "pump-1", id2, "Completed")
			// Without the certificate it has neither a password nor an
			// identity.
			out, err = exec.CommandContext(ctx, "/usr/bin/mosquitto_pub", "-h", host, "-p", port, "-V", "mqttv311", "-q", "1", "-i", "pump-1",
				"--cafile", filepath.Join(dir, "ca.pem"), "-t", mqtt.ActionStatusTopic("default", "pump-1"), "-m", "{}").CombinedOutput()
			if err == nil {
				t.Fatalf("mosquitto_pub without a certificate was accepted: %s", out)
			}
		})

		t.Run("uplink-config", func(t *testing.T) {
			var u struct {
				ProjectID      string      `json:"project_id"`
				DeviceID       string      `json:"device_id"`
				Broker         string      `json:"broker"`
				Port           int         `json:"port"`
				Authentication credentials `json:"authentication"`
			}
			s.Do(t, admin, "POST", "/api/v1/devices/pump-1/uplink-config", nil).Want(t, 201).Decode(t, &u)
			_, port, _ := net.SplitHostPort(mqtts)
			if u.ProjectID != "default" || u.DeviceID != "pump-1" || u.Broker != "fleet.example.com" || fmt.Sprint(u.Port) != port {
				t.Fatalf("uplink config %+v, want default, pump-1, fleet.example.com, %s", u, port)
			}
			// The new certificate replaced the first.
			if _, err := uplinkDevice(t, mqtts, "default", "pump-1", c); err == nil {
				t.Fatal("the replaced certificate was accepted")
			}
			if _, err := uplinkDevice(t, mqtts, "default", "pump-1", u.Authentication); err != nil {
				t.Fatalf("connect with the new certificate: %v", err)
			}
			c = u.Authentication
		})

		t.Run("revoked by a token rotation", func(t *testing.T) {
			s.Do(t, admin, "POST", "/api/v1/devices/pump-1/token", nil).Want(t, 201)
			if _, err := uplinkDevice(t, mqtts, "default", "pump-1", c); err == nil {
				t.Fatal("a certificate issued before the token rotation was accepted")
			}
		})

		t.Run("revoked by deleting the device", func(t *testing.T) {
			s.MustDevice(t, admin, "pump-2", nil)
			var c2 credentials
			s.Do(t, admin, "POST", "/api/v1/devices/pump-2/certificate", nil).Want(t, 201).Decode(t, &c2)
			s.Do(t, admin, "DELETE", "/api/v1/devices/pump-2", nil).Want(t, 204)
			s.MustDevice(t, admin, "pump-2", nil) // the same id again is another device
			if _, err := uplinkDevice(t, mqtts, "default", "pump-2", c2); err == nil {
				t.Fatal("the certificate of a deleted device was accepted")
			}
		})

		t.Run("another fleetd's certificate", func(t *testing.T) {
			p, err := pki.NewAuthorityPEM(time.Now())
			if err != nil {
				t.Fatal(err)
			}
			other, err := pki.ParseAuthority([]byte(p), []byte(p))
			if err != nil {
				t.Fatal(err)
			}
			cert, key, _, err := other.Issue("default", "pump-1", time.Now())
			if err != nil {
				t.Fatal(err)
			}
			forged := credentials{CACertificate: c.CACertificate, DeviceCertificate: cert, DevicePrivateKey: key}
			if _, err := uplinkDevice(t, mqtts, "default", "pump-1", forged); err == nil {
				t.Fatal("a certificate of another CA was accepted")
			}
		})

		t.Run("isolation and roles", func(t *testing.T) {
			other := s.NewTenant(t, "acme-certs")
			s.Do(t, other, "POST", "/api/v1/devices/pump-1/certificate", nil).Want(t, 404)
			viewer := s.NewKey(t, admin, "cert-viewer", "viewer")
			s.Do(t, viewer, "POST", "/api/v1/devices/pump-1/certificate", nil).Want(t, 403)
			s.Do(t, admin, "POST", "/api/v1/devices/no-such/certificate", nil).Want(t, 404)
			s.Do(t, admin, "POST", "/api/v1/devices/bad%20id/certificate", nil).Want(t, 400)
		})

		t.Run("private keys are not kept", func(t *testing.T) {
			var logs struct {
				AuditLogs []struct {
					Action  string          `json:"action"`
					Details json.RawMessage `json:"details"`
				} `json:"audit_logs"`
			}
			s.Do(t, admin, "GET", "/api/v1/audit-logs?limit=1000", nil).Want(t, 200).Decode(t, &logs)
			found := false
			for _, l := range logs.AuditLogs {
				if strings.Contains(string(l.Details), "PRIVATE KEY") {
					t.Fatalf("an audit log holds a private key: %s", l.Details)
				}
				found = found || l.Action == "device.issue_certificate"
			}
			if !found {
				t.Fatal("no device.issue_certificate in the audit log")
			}
			if strings.Contains(s.Output.String(), "PRIVATE KEY") {
				t.Fatal("the log holds a private key")
			}
		})
	})
}

// mqttsAddr is the MQTT TLS listener of the startup line.
func (s *testServer) mqttsAddr(t *testing.T) string {
	t.Helper()
	for _, line := range strings.Split(s.Output.String(), "\n") {
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "mqtts="); ok && strings.HasPrefix(line, "fleetd: listening") {
				return v
			}
		}
	}
	t.Fatalf("no mqtts= in the startup line:\n%s", s.Output)
	return ""
}

func TestCertificatesNeedTLSListener(t *testing.T) {
	t.Parallel()
	s := startServer(t, sqlstoretest.Backends()[0])
	s.MustDevice(t, s.Admin(), "pump-1", nil)
	if code := s.Do(t, s.Admin(), "POST", "/api/v1/devices/pump-1/certificate", nil).Want(t, 409).ErrorCode(t); code != "conflict" {
		t.Fatalf("error %q, want conflict", code)
	}
}

func TestHTTPSAndCertificateReload(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certFile, keyFile := fleetdtest.WriteServerCert(t, dir, "first")
	s := startServer(t, sqlstoretest.Backends()[0], "--tls-cert", certFile, "--tls-key", keyFile,
		"--mqtts-addr", "127.0.0.1:0")
	host := strings.TrimPrefix(s.URL, "http://")

	// served returns the common name of the certificate a new connection
	// gets, and checks that the API answers over it.
	served := func(addr string) string {
		conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			t.Fatalf("TLS dial %s: %v", addr, err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].Subject.CommonName
	}
	if got := served(host); got != "first" {
		t.Fatalf("HTTPS serves %q, want first", got)
	}
	pool := x509.NewCertPool()
	pem, _ := os.ReadFile(certFile)
	pool.AppendCertsFromPEM(pem)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}}
	req, _ := http.NewRequest("GET", "https://"+host+"/api/v1/devices", nil)
	req.Header.Set("x-service-tenant", "default")
	req.Header.Set("x-service-api-key", s.Key)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("HTTPS request: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.ProtoMajor != 2 || !bytes.Contains(body, []byte(`"devices"`)) {
		t.Fatalf("HTTPS: %s %d %s", resp.Proto, resp.StatusCode, body)
	}
	// Plain HTTP on the HTTPS port is refused.
	if resp, err := http.Get(s.URL + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("plain HTTP on the TLS port: %d", resp.StatusCode)
		}
	}

	// A renewed certificate is served without a restart, on both
	// listeners; a broken pair keeps the previous one.
	os.WriteFile(certFile, []byte("not a certificate"), 0o600)
	time.Sleep(1100 * time.Millisecond) // past the check interval, so the broken files are seen
	if got := served(host); got != "first" {
		t.Fatalf("after a broken renewal HTTPS serves %q, want first still", got)
	}
	fleetdtest.WriteServerCert(t, dir, "second")
	fleetdtest.Eventually(t, "the renewed certificate on HTTPS", func() bool { return served(host) == "second" })
	fleetdtest.Eventually(t, "the renewed certificate on MQTT over TLS", func() bool { return served(s.mqttsAddr(t)) == "second" })
	if !strings.Contains(s.Output.String(), "do not load") {
		t.Errorf("the broken renewal was not logged:\n%s", s.Output)
	}
}

func TestSecurityFlagsChecked(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certFile, keyFile := fleetdtest.WriteServerCert(t, dir, "x")
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--tls-cert", certFile}, "--tls-cert and --tls-key go together"},
		{[]string{"--mqtts-addr", "127.0.0.1:0"}, "--mqtts-addr needs --tls-cert"},
		{[]string{"--mqtt-addr", "off"}, "--mqtt-addr off"},
		{[]string{"--tls-cert", certFile, "--tls-key", certFile}, "--tls-cert"},
		{[]string{"--tls-cert", certFile, "--tls-key", keyFile, "--mqtts-addr", "127.0.0.1:0", "--device-ca-cert", certFile}, "--device-ca-cert and --device-ca-key go together"},
		{[]string{"--tls-cert", certFile, "--tls-key", keyFile, "--mqtts-addr", "127.0.0.1:0", "--device-ca-cert", certFile, "--device-ca-key", keyFile}, "not a CA"},
	} {
		args := append([]string{"serve", "--database", filepath.Join(t.TempDir(), "db"), "--data-dir", t.TempDir(),
			"--http-addr", "127.0.0.1:0", "--log-level", "error"}, tt.args...)
		var out, errOut bytes.Buffer
		err := run(t.Context(), args, fleetdtest.NoEnv, strings.NewReader(""), &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: got %v, want an error with %q", tt.args, err, tt.want)
		}
	}
}
