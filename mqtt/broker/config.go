package broker

import (
	"crypto/tls"
	"log/slog"
	"time"

	"github.com/fleetd/fleet/mqtt"
)

// Config configures a Server. Zero values mean the defaults.
type Config struct {
	// Addr is the TCP address to listen on; default ":1883". Use
	// "127.0.0.1:0" in tests and read Server.Addr.
	Addr string

	// TLS, when set, makes the listener accept TLS connections only; with
	// TLSAddr, it is the second listener's.
	TLS *tls.Config

	// TLSAddr, when set (with TLS), is a second listener that speaks MQTT
	// over TLS, beside the plain one on Addr; Addr "off" leaves TLS alone.
	// A device that presents a client certificate there which TLS verified
	// (TLS.ClientCAs) is the device its certificate names: see
	// CertificateAuthenticator.
	TLSAddr string

	// MaxPacketSize is the largest MQTT packet a device may send, in bytes;
	// default 256 KiB (a batch of 10,000 small data points fits). MQTT 5
	// devices are told in CONNACK; a device that sends a larger one is
	// disconnected, the packet unread.
	MaxPacketSize int

	// MaxInflight is how many action messages may await a device's PUBACK at
	// once, or fewer if the device's Receive Maximum says so; default 256.
	// More wait their turn (delivery.go).
	MaxInflight int

	// HandlerTimeout bounds each Handler call; default 30s. A publish whose
	// handler timed out is treated like fleet.EUNAVAILABLE. Publishes share
	// their context for a 32nd of it, so a publish's may end up to that
	// much later.
	HandlerTimeout time.Duration

	// ConnectTimeout is how long a new connection may take to send CONNECT;
	// default 10s.
	ConnectTimeout time.Duration

	// WriteTimeout bounds each write to a device; default 10s. A device
	// that has not read what its socket buffers hold by then is cut off
	// (what was written of the packet cannot be taken back); it gets its
	// actions again when it reconnects. A write's deadline may be up to
	// a 32nd of it later: it is set again only when less is left.
	WriteTimeout time.Duration

	// ParkAfter is how long a connection may be silent before it parks:
	// its goroutine and read buffer are released, and a poller wakes it
	// when the device sends again (Linux, plain TCP; park.go). Default
	// 2s; negative: connections never park.
	ParkAfter time.Duration

	// ShutdownTimeout is how long Close lets Handler calls in progress finish
	// before cancelling their contexts; default 10s.
	ShutdownTimeout time.Duration

	// Logger receives the broker's log; default none.
	Logger *slog.Logger

	// Limits that keep one device, tenant or source address from taking
	// what belongs to the others.

	// MaxConnections caps open connections, whether they have sent CONNECT
	// or not; beyond it a new connection is closed at once. Default 100,000.
	MaxConnections int
	// MaxPendingPerIP caps one source address's connections that have not
	// finished CONNECT yet; beyond it a new one is closed at once.
	// Default 1,024.
	MaxPendingPerIP int
	// MaxTenantConnections caps one tenant's connected devices; beyond it
	// CONNECT is refused ("quota exceeded"; MQTT 3.1.1: server
	// unavailable). Zero: no cap.
	MaxTenantConnections int
	// MaxKeepalive is the longest keepalive a device may use; one that asks
	// for none (0) or more gets this one (MQTT 5 devices are told so in
	// CONNACK), so an idle connection cannot stay open forever. Default 5
	// minutes; at least a second, as MQTT counts keepalives in seconds.
	MaxKeepalive time.Duration
	// PublishRate is how many publishes per second a connection may make on
	// average, with bursts of PublishBurst; a device that publishes faster
	// is disconnected ("message rate too high"). Defaults 1,000 and 2,000;
	// a negative rate lifts the limit.
	PublishRate  float64
	PublishBurst int
	// AuthFailureRate and AuthFailureBurst throttle failed CONNECTs per
	// source address: after a burst of failures, further CONNECTs from that
	// address are refused without looking at their credentials ("connection
	// rate exceeded"; MQTT 3.1.1: server unavailable) until the bucket
	// refills. Defaults 1 per second and 20; a negative rate lifts it.
	AuthFailureRate  float64
	AuthFailureBurst int
	// Now is the clock of the limits; default time.Now.
	Now func() time.Time
}

// Defaults of Config.
const (
	DefaultAddr           = ":1883"
	DefaultMaxPacketSize  = 256 << 10
	DefaultMaxInflight    = 256
	DefaultConnectTimeout = 10 * time.Second
	DefaultWriteTimeout   = 10 * time.Second
	DefaultParkAfter      = 100 * time.Millisecond

	DefaultMaxConnections   = 100_000
	DefaultMaxPendingPerIP  = 1024
	DefaultMaxKeepalive     = 5 * time.Minute
	DefaultPublishRate      = 1000
	DefaultPublishBurst     = 2000
	DefaultAuthFailureRate  = 1
	DefaultAuthFailureBurst = 20
)

// AddrOff as Config.Addr leaves the plain listener off (TLSAddr only).
const AddrOff = "off"

func (c Config) withDefaults() Config {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if c.MaxPacketSize <= 0 {
		c.MaxPacketSize = DefaultMaxPacketSize
	}
	if c.MaxInflight <= 0 {
		c.MaxInflight = DefaultMaxInflight
	}
	c.MaxInflight = min(c.MaxInflight, 65535) // packet ids are 16 bits
	if c.HandlerTimeout <= 0 {
		c.HandlerTimeout = mqtt.DefaultHandlerTimeout
	}
	if c.ConnectTimeout <= 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.ParkAfter == 0 {
		c.ParkAfter = DefaultParkAfter
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = mqtt.DefaultShutdownTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.MaxConnections <= 0 {
		c.MaxConnections = DefaultMaxConnections
	}
	if c.MaxPendingPerIP <= 0 {
		c.MaxPendingPerIP = DefaultMaxPendingPerIP
	}
	if c.MaxKeepalive <= 0 {
		c.MaxKeepalive = DefaultMaxKeepalive
	}
	// CONNECT and CONNACK count keepalives in whole seconds.
	c.MaxKeepalive = min(max(c.MaxKeepalive, time.Second), 65535*time.Second)
	if c.PublishRate == 0 {
		c.PublishRate = DefaultPublishRate
	}
	if c.PublishBurst <= 0 {
		c.PublishBurst = max(DefaultPublishBurst, int(c.PublishRate))
	}
	if c.AuthFailureRate == 0 {
		c.AuthFailureRate = DefaultAuthFailureRate
	}
	if c.AuthFailureBurst <= 0 {
		c.AuthFailureBurst = DefaultAuthFailureBurst
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}
