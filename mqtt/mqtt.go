// Package mqtt is fleetd's device channel: the MQTT topics of
// docs/device-protocol.md#topics, the Handler every way of running the
// channel serves, and Devices, the Handler that connects it to fleetd's
// services. Devices connect with username "{tenant}/{device_id}" and their
// token, receive actions on their actions topic and publish status reports
// and stream data on theirs; a Handler decides what fleetd does with each.
//
// The channel runs in one of two modes, each a package of its own: the
// broker embedded in fleetd (mqtt/broker), or fleetd as one client of an
// external broker, with the HTTP endpoints that broker calls to admit
// devices (mqtt/bridge). This package imports no third-party module.
package mqtt

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/fleetd/fleet"
)

// Handler is what fleetd does with the device channel; internal/server wires
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

	// HandleStream receives a payload published on one of the device's
	// stream topics (events/{stream}/jsonarray, compressed as the topic
	// says); the same acknowledgement rules apply.
	HandleStream(ctx context.Context, tenant, device, stream string, compression Compression, payload []byte) error

	// HandleReported receives a payload published on shadow/reported: a
	// JSON merge patch of the device's reported state. The same
	// acknowledgement rules apply.
	HandleReported(ctx context.Context, tenant, device string, payload []byte) error

	// DeltaSubscribed is called when a device subscribed to its shadow
	// delta topic, after the broker acknowledged the subscription, on a
	// goroutine of its own: the Handler sends the device its delta
	// (Channel.SendDelta) if there is one. The external broker's client
	// never calls it: there the delta waits as a retained message.
	DeltaSubscribed(tenant, device string)

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

// Defaults of the Handler calls, for the embedded broker and the client of
// an external broker alike.
const (
	DefaultHandlerTimeout  = 30 * time.Second
	DefaultShutdownTimeout = 10 * time.Second
)

// LogRejected logs a device's publish the Handler rejected. It is
// acknowledged all the same: a malformed report would otherwise come back
// forever.
func LogRejected(ctx context.Context, log *slog.Logger, err error, tenant, device, topic string, qos byte) {
	level := slog.LevelWarn
	if fleet.ErrorCode(err) == fleet.EINTERNAL {
		level = slog.LevelError
	}
	log.Log(ctx, level, "mqtt: device publish rejected",
		"tenant", tenant, "device", device, "topic", topic, "qos", qos, "err", err)
}

// Partly wraps a Handler's error about a publish of which it kept some
// (the usable data points of a batch): the publish is acknowledged as
// taken, and the error logged.
func Partly(err error) error { return &partly{err} }

type partly struct{ err error }

func (p *partly) Error() string { return p.err.Error() }
func (p *partly) Unwrap() error { return p.err }

// Taken reports whether a publish whose Handler returned err counts as
// taken: no error, or one Partly made.
func Taken(err error) bool {
	if err == nil {
		return true
	}
	var p *partly // on the heap (errors.As): only for an error
	return errors.As(err, &p)
}

// Unavailable reports whether a Handler error means "try again later".
func Unavailable(ctx context.Context, err error) bool {
	return fleet.ErrorCode(err) == fleet.EUNAVAILABLE || ctx.Err() != nil
}

// Truncate keeps what a client sent from flooding the log.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// CertificateAuthenticator is implemented by a Handler that admits devices
// by the client certificate they presented on the TLS listener. The
// certificate has been verified against the broker's TLS.ClientCAs; the Handler says
// whether it is still the device's (serial is its serial number in
// lowercase hex). Errors are as for AuthenticateDevice.
type CertificateAuthenticator interface {
	AuthenticateDeviceCertificate(ctx context.Context, tenant, device, serial string) error
}

// Stats are the device channel's counters since Open, for the HTTP layer to
// publish. Connections is a gauge; the rest only grow.
type Stats struct {
	Connections      int    // devices connected now
	Parked           int    // of them, connections idle with no goroutine or read buffer
	ParkedPings      uint64 // PINGREQs answered to parked connections, which stayed parked
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
