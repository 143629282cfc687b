package pki

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// ServerCertificate is fleetd's TLS server certificate, read from a PEM
// certificate file (the leaf first, then intermediates) and a PEM key file.
// Replaced files are picked up without a restart: at most once per
// CheckEvery, a handshake looks at the files' size and modification time,
// and reads them again when either changed. A pair that does not load
// (half-written, key and certificate not matching) is logged and the
// previous certificate kept, so a renewal in progress never takes TLS
// down.
type ServerCertificate struct {
	CertFile, KeyFile string
	// TrustFile, when set, holds the CA certificates devices should trust
	// for this certificate (handed out as ca_certificate). Default: the
	// last certificate of CertFile's chain, which is the certificate itself
	// when it is self-signed.
	TrustFile  string
	CheckEvery time.Duration // default 1s
	Logger     *slog.Logger
	Now        func() time.Time

	mu        sync.Mutex
	cert      *tls.Certificate
	trust     []byte
	stamp     [2]fileStamp
	checkedAt time.Time
}

type fileStamp struct {
	size int64
	mod  time.Time
}

// Load reads the files for the first time; a problem is an error that
// names them.
func (c *ServerCertificate) Load() error {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.CheckEvery <= 0 {
		c.CheckEvery = time.Second
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.load()
}

func (c *ServerCertificate) load() error {
	stamps := [2]fileStamp{stat(c.CertFile), stat(c.KeyFile)}
	pair, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		return fmt.Errorf("--tls-cert %s, --tls-key %s: %w", c.CertFile, c.KeyFile, err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return fmt.Errorf("--tls-cert %s: %w", c.CertFile, err)
	}
	pair.Leaf = leaf
	trust := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: pair.Certificate[len(pair.Certificate)-1]})
	if c.TrustFile != "" {
		b, err := os.ReadFile(c.TrustFile)
		if err != nil {
			return fmt.Errorf("--tls-ca: %w", err)
		}
		if block, _ := pem.Decode(b); block == nil || block.Type != "CERTIFICATE" {
			return fmt.Errorf("--tls-ca %s: no PEM certificate in it", c.TrustFile)
		}
		trust = b
	}
	c.cert, c.trust, c.stamp = &pair, trust, stamps
	c.checkedAt = c.Now()
	return nil
}

func stat(name string) fileStamp {
	fi, err := os.Stat(name)
	if err != nil {
		return fileStamp{size: -1}
	}
	return fileStamp{size: fi.Size(), mod: fi.ModTime()}
}

// current returns the certificate, reloading it first if its files
// changed.
func (c *ServerCertificate) current() *tls.Certificate {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.Now()
	if now.Sub(c.checkedAt) < c.CheckEvery {
		return c.cert
	}
	c.checkedAt = now
	if [2]fileStamp{stat(c.CertFile), stat(c.KeyFile)} == c.stamp {
		return c.cert
	}
	old := c.cert
	if err := c.load(); err != nil {
		c.cert = old
		c.Logger.Error("TLS certificate files changed but do not load; still serving the previous certificate", "err", err)
		return c.cert
	}
	c.Logger.Info("TLS certificate reloaded", "cert", c.CertFile, "not_after", c.cert.Leaf.NotAfter)
	return c.cert
}

// GetCertificate is for tls.Config.GetCertificate.
func (c *ServerCertificate) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if cert := c.current(); cert != nil {
		return cert, nil
	}
	return nil, errors.New("no TLS certificate loaded")
}

// TrustPEM is what devices should trust for this certificate.
func (c *ServerCertificate) TrustPEM() []byte {
	c.current()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.trust
}

// Config returns TLS settings that serve this certificate: TLS 1.2 or later.
func (c *ServerCertificate) Config() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: c.GetCertificate}
}
