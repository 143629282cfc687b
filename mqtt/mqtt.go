// Package mqtt is fleetd's device channel: the MQTT topics of DESIGN §8 and an
// MQTT broker embedded in fleetd that serves them. Devices connect with
// username "{tenant}/{device_id}" and their token, receive actions on their
// actions topic and publish status reports and stream data on theirs; a
// Handler decides what fleetd does with each.
//
// The broker is fleetd's own (server.go, conn.go, packet.go): it speaks
// MQTT 3.1, 3.1.1 and 5.0 to devices and does only what devices need, which
// keeps a connection in a few kilobytes. Client is the other side: fleetd as
// one client of an external broker, serving the same Handler.
package mqtt

import (
	"context"
	"crypto/tls"
	"log/slog"
	"time"

	"github.com/fleetd/fleet"
)

// Handler is what fleetd does with the device channel; cmd/fleetd implements
// it over the stores. Its methods are called concurrently for different
// devices; calls for one device's publishes come one at a time, in order.
type Handler interface {
	// AuthenticateDevice checks a device's token at CONNECT. An error refuses
	// the connection: with "bad username or password" (MQTT 3.1.1: return
	// code 5, not authorized), or with "server unavailable" when the error's
	// code is fleet.EUNAVAILABLE, so the device retries instead of giving up
	// on its credentials.
	AuthenticateDevice(ctx context.Context, tenant, device, token string) error

	// DeviceConnected is called after a device connected, before it can
	// publish or subscribe (to record last_seen_at).
	DeviceConnected(tenant, device string)

	// DeviceSubscribed is called when a device subscribed to its own actions
	// topic, after the broker acknowledged the subscription, on a goroutine of
	// its own: the device can be sent actions (SendAction). A device
	// subscribes again after every reconnection, so this can be called many
	// times. The broker then reads what is queued for the device with
	// PendingActions.
	DeviceSubscribed(tenant, device string)

	// PendingActions returns the messages of up to limit actions queued for
	// the device (sent, if ever, on no connection that still holds them)
	// whose ids are above after, oldest first. The broker reads them as the
	// device's window has room: after the device subscribed, and whenever
	// a dispatch found the connection's waiting line full. Acknowledgements
	// ActionDelivered was given before the call are taken into account.
	PendingActions(ctx context.Context, tenant, device string, after int64, limit int) ([]fleet.ActionMessage, error)

	// HandleStatus receives a payload published on the device's action/status
	// topic. It is called before the broker acknowledges a QoS 1 publish, so a
	// PUBACK means the report is committed; it may block (group commit). An
	// error other than fleet.EUNAVAILABLE is logged and the publish still
	// acknowledged, since a malformed report would otherwise be redelivered
	// forever; with fleet.EUNAVAILABLE the device is disconnected without an
	// acknowledgement, so it publishes again after reconnecting.
	HandleStatus(ctx context.Context, tenant, device string, payload []byte) error

	// HandleStream receives a payload published on
	// events/{stream}/jsonarray; the same acknowledgement rules apply.
	HandleStream(ctx context.Context, tenant, device, stream string, payload []byte) error

	// ActionDelivered is called when the device acknowledged an action
	// message fleetd sent (PUBACK; for a device that subscribed at QoS 0, when
	// the message was written to its connection). actionID is the id
	// SendAction was given. It runs on the device's connection (at QoS 0, on
	// SendAction's caller) and should not block for long.
	ActionDelivered(tenant, device string, actionID int64)

	// ActionFailed is called when an action cannot reach the device: it
	// refused the message in its PUBACK (MQTT 5 reason code 0x80 or
	// above), or the message is larger than the device's Maximum Packet
	// Size. reason says which, for the device action's errors; the broker
	// does not send the action again on this connection. It is called on a
	// goroutine of its own and may block.
	ActionFailed(tenant, device string, actionID int64, reason string)
}

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
	// handler timed out is treated like fleet.EUNAVAILABLE.
	HandlerTimeout time.Duration

	// ConnectTimeout is how long a new connection may take to send CONNECT;
	// default 10s.
	ConnectTimeout time.Duration

	// WriteTimeout bounds each write to a device; default 10s. A device
	// that has not read what its socket buffers hold by then is cut off
	// (what was written of the packet cannot be taken back); it gets its
	// actions again when it reconnects.
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

// CertificateAuthenticator is implemented by a Handler that admits devices
// by the client certificate they presented on the TLS listener. The
// certificate has been verified against TLS.ClientCAs; the Handler says
// whether it is still the device's (serial is its serial number in
// lowercase hex). Errors are as for AuthenticateDevice.
type CertificateAuthenticator interface {
	AuthenticateDeviceCertificate(ctx context.Context, tenant, device, serial string) error
}

// Defaults of Config.
const (
	DefaultAddr            = ":1883"
	DefaultMaxPacketSize   = 256 << 10
	DefaultMaxInflight     = 256
	DefaultHandlerTimeout  = 30 * time.Second
	DefaultConnectTimeout  = 10 * time.Second
	DefaultWriteTimeout    = 10 * time.Second
	DefaultShutdownTimeout = 10 * time.Second
	DefaultParkAfter       = 100 * time.Millisecond

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
		c.HandlerTimeout = DefaultHandlerTimeout
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
		c.ShutdownTimeout = DefaultShutdownTimeout
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

// Stats are the device channel's counters since Open, for the HTTP layer to
// publish. Connections is a gauge; the rest only grow.
type Stats struct {
	Connections      int    // devices connected now
	Parked           int    // of them, connections idle with no goroutine or read buffer
	Connects         uint64 // connections accepted after authentication
	AuthFailures     uint64 // connections refused at CONNECT
	Disconnects      uint64 // connections of authenticated devices that ended
	ACLViolations    uint64 // devices disconnected for touching a topic not theirs
	OversizedPackets uint64 // devices disconnected for a packet over MaxPacketSize
	MessagesIn       uint64 // publishes from devices handed to the Handler
	MessagesOut      uint64 // action messages sent: written to the device's connection, or handed to the external broker
	ActionsDelivered uint64 // action messages the device acknowledged
	HandlerErrors    uint64 // publishes the Handler rejected, acknowledged anyway
	Unacknowledged   uint64 // publishes left unacknowledged: Handler unavailable
	// LimitRefusals counts connections closed or refused for a limit:
	// MaxConnections, MaxPendingPerIP, MaxTenantConnections or the
	// throttle of failed CONNECTs.
	LimitRefusals uint64
	PublishFloods uint64 // devices disconnected for publishing faster than PublishRate
	// CredentialChecks counts connections whose credentials were checked
	// again after they changed (CredentialsChanged), Revoked those of them
	// that ended because the credentials no longer admitted the device.
	CredentialChecks uint64
	Revoked          uint64
	// ActionsFailed counts actions the device refused in its PUBACK, or
	// that were larger than it accepts.
	ActionsFailed uint64
	// UnackedActions counts devices disconnected for leaving an action
	// unacknowledged for WriteTimeout.
	UnackedActions uint64
}
