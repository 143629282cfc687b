package mqtt

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"log/slog"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/pki"
)

// hook is where mochi calls into fleetd. What mochi does around each call,
// read from its v2.7.9 source, decides where each rule lives:
//
//   - A client's packets are read and processed one at a time on the client's
//     goroutine, and processPublish calls OnPublish before it writes the
//     PUBACK (or PUBREC). So the Handler runs in OnPublish and a PUBACK means
//     committed; returning ErrRejectPacket sends no acknowledgement at all.
//   - mochi silently drops publishes to $SYS or with wildcards before any ACL
//     check, so topics are checked in OnPacketRead, which sees every packet.
//   - Wills are published without an ACL check, so they are stripped at
//     CONNECT, and refused when they name a topic not the device's.
//   - OnQosComplete cannot tell the device's PUBACK for an action from the
//     broker's own PUBACK of a device's publish, so deliveries are matched in
//     OnPacketProcessed, which sees only packets read from the device.
type hook struct {
	mochi.HookBase
	s *Server
}

func (h *hook) ID() string { return "fleetd" }

func (h *hook) Provides(b byte) bool {
	switch b {
	case mochi.OnConnect, mochi.OnConnectAuthenticate, mochi.OnACLCheck,
		mochi.OnSessionEstablished, mochi.OnDisconnect,
		mochi.OnPacketRead, mochi.OnPacketEncode, mochi.OnPacketSent, mochi.OnPacketProcessed,
		mochi.OnSubscribed, mochi.OnUnsubscribed,
		mochi.OnPublish, mochi.OnPublishDropped, mochi.OnQosPublish, mochi.OnQosDropped:
		return true
	}
	return false
}

// OnPacketRead enforces the topic rules on every SUBSCRIBE and PUBLISH, and
// shapes CONNECT so that sessions end with their connection.
func (h *hook) OnPacketRead(cl *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	switch pk.FixedHeader.Type {
	case packets.Connect:
		pk.Connect.Clean = true
		// Outbound topic aliases would blank the topic of repeated actions;
		// the uplink agent compares it with its subscription.
		pk.Properties.TopicAliasMaximum = 0
	case packets.Publish:
		d := h.s.deviceOf(cl)
		if d == nil {
			return pk, packets.ErrRejectPacket
		}
		if _, ok := mayPublish(d.tenant, d.id, pk.TopicName); !ok {
			h.s.violation(d, "publish", pk.TopicName)
			return pk, packets.ErrRejectPacket
		}
		if cfg := h.s.cfg; cfg.PublishRate > 0 {
			if ok, _ := d.publishes.Take(cfg.Now(), cfg.PublishRate, cfg.PublishBurst); !ok {
				h.s.flood(d)
				return pk, packets.ErrRejectPacket
			}
		}
	case packets.Subscribe:
		d := h.s.deviceOf(cl)
		if d == nil {
			return pk, packets.ErrRejectPacket
		}
		for _, f := range pk.Filters {
			if !maySubscribe(d.tenant, d.id, f.Filter) {
				h.s.violation(d, "subscribe", f.Filter)
				return pk, packets.ErrRejectPacket
			}
		}
	}
	return pk, nil
}

// OnConnect enforces the longest keepalive, and refuses a will on a topic
// the device may not publish on: mochi would publish it to anyone, without
// an ACL check.
func (h *hook) OnConnect(cl *mochi.Client, pk packets.Packet) error {
	h.s.connectRead(cl)
	if max := uint16(h.s.cfg.MaxKeepalive / time.Second); cl.State.Keepalive == 0 || cl.State.Keepalive > max {
		// mochi sets the connection's deadline from this right after, and
		// tells an MQTT 5 device in CONNACK (Server Keep Alive).
		cl.State.Keepalive = max
		cl.State.ServerKeepalive = true
	}
	if !pk.Connect.WillFlag {
		return nil
	}
	tenant, device, ok := ParseUsername(string(pk.Connect.Username))
	if id, hasCert := certIdentity(cl); hasCert {
		tenant, device, ok = id.tenant, id.device, id.ok
	}
	if !ok {
		return nil // authentication refuses it
	}
	if _, ok := mayPublish(tenant, device, pk.Connect.WillTopic); ok {
		return nil
	}
	h.s.stats.authFailures.Add(1)
	h.s.log.Warn("mqtt: connection refused: will on a topic not the device's",
		"tenant", tenant, "device", device, "topic", pk.Connect.WillTopic, "remote", cl.Net.Remote)
	code := packets.ErrNotAuthorized
	if cl.Properties.ProtocolVersion < 5 {
		code = packets.ErrBadUsernameOrPassword // sent as 3.1.1's "not authorized"
	}
	_ = h.s.broker.SendConnack(cl, code, false, nil)
	return code
}

// OnConnectAuthenticate checks the device's token, or the client
// certificate it presented on the TLS listener, and binds the session to
// the device.
func (h *hook) OnConnectAuthenticate(cl *mochi.Client, pk packets.Packet) bool {
	s := h.s
	ip := remoteIPOf(cl)
	if !s.authFailures.Available(ip) {
		s.stats.limitRefusals.Add(1)
		s.log.Debug("mqtt: connection refused: too many failed CONNECTs from this address lately", "remote", cl.Net.Remote)
		s.refuse(cl, packets.ErrConnectionRateExceeded)
		return false
	}
	tenant, device, ok := ParseUsername(string(pk.Connect.Username))
	id, hasCert := certIdentity(cl)
	switch {
	case hasCert && !id.ok:
		s.authFailed(ip)
		s.log.Info("mqtt: connection refused: the client certificate names no fleetd device", "remote", cl.Net.Remote)
		return false
	case hasCert && len(pk.Connect.Username) > 0 && (!ok || tenant != id.tenant || device != id.device):
		s.authFailed(ip)
		s.log.Info("mqtt: connection refused: the username is not the device of the client certificate",
			"username", truncate(string(pk.Connect.Username), 200), "tenant", id.tenant, "device", id.device, "remote", cl.Net.Remote)
		return false
	case hasCert:
		tenant, device = id.tenant, id.device
	case !ok || !pk.Connect.PasswordFlag:
		s.authFailed(ip)
		s.log.Info("mqtt: connection refused: username must be {tenant}/{device_id} and the password the device token",
			"username", truncate(string(pk.Connect.Username), 200), "remote", cl.Net.Remote)
		return false
	}
	if s.isClosing() {
		s.refuseUnavailable(cl)
		return false
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.HandlerTimeout)
	defer cancel()
	var err error
	offStack(func() {
		if hasCert {
			if ca, ok := s.h.(CertificateAuthenticator); ok {
				err = ca.AuthenticateDeviceCertificate(ctx, tenant, device, id.serial)
			} else {
				err = fleet.Errorf(fleet.EUNAUTHENTICATED, "this server does not admit devices by certificate")
			}
		} else {
			err = s.h.AuthenticateDevice(ctx, tenant, device, string(pk.Connect.Password))
		}
	})
	if err != nil {
		if unavailable(ctx, err) {
			s.log.Warn("mqtt: cannot authenticate device now", "tenant", tenant, "device", device, "error", err)
			s.refuseUnavailable(cl)
			return false
		}
		s.authFailed(ip)
		s.log.Info("mqtt: connection refused: bad credentials",
			"tenant", tenant, "device", device, "remote", cl.Net.Remote, "certificate", hasCert, "reason", fleet.ErrorMessage(err))
		return false
	}
	if s.tenantFull(tenant, device) {
		s.stats.limitRefusals.Add(1)
		s.log.Warn("mqtt: connection refused: the tenant has its maximum of connected devices",
			"tenant", tenant, "device", device, "max", s.cfg.MaxTenantConnections)
		s.refuse(cl, packets.ErrQuotaExceeded)
		return false
	}
	// The session belongs to the device, not to the client id it chose: a
	// device cannot take over another's session, and its own second
	// connection replaces the first (in OnSessionEstablished).
	cl.ID = clientID(tenant, device, s.connSeq.Add(1))
	cl.Properties.Will = mochi.Will{}
	return true
}

// authFailed counts a failed CONNECT against its source address.
func (s *Server) authFailed(ip string) {
	s.stats.authFailures.Add(1)
	s.authFailures.Allow(ip)
}

// tenantFull reports whether the tenant has its maximum of connected
// devices; a device that replaces its own connection does not count twice.
// Connections that authenticate at once can overshoot by a few.
func (s *Server) tenantFull(tenant, device string) bool {
	if s.cfg.MaxTenantConnections <= 0 {
		return false
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if _, again := s.devices[sessionID(tenant, device)]; again {
		return false
	}
	return s.tenants[tenant] >= s.cfg.MaxTenantConnections
}

// refuse answers CONNECT with code, which MQTT 3.1.1 devices hear as
// "server unavailable" (it has no code for limits), and closes the
// connection.
func (s *Server) refuse(cl *mochi.Client, code packets.Code) {
	if cl.Properties.ProtocolVersion < 5 {
		code = packets.ErrServerUnavailable
	}
	_ = s.broker.SendConnack(cl, code, false, nil)
	cl.Stop(code)
}

// flood disconnects a device that publishes faster than PublishRate.
func (s *Server) flood(d *device) {
	s.stats.publishFloods.Add(1)
	s.log.Warn("mqtt: device disconnected: it publishes faster than it may",
		"tenant", d.tenant, "device", d.id, "rate", s.cfg.PublishRate, "burst", s.cfg.PublishBurst, "remote", d.cl.Net.Remote)
	s.disconnect(d.cl, packets.ErrMessageRateTooHigh)
}

// tlsIdentity is the device a verified client certificate names.
type tlsIdentity struct {
	tenant, device, serial string
	ok                     bool // the certificate names a device
}

// certIdentity returns the identity of the client certificate TLS
// verified on cl's connection; hasCert is false for plain connections and
// TLS ones without a client certificate.
func certIdentity(cl *mochi.Client) (id tlsIdentity, hasCert bool) {
	tc, ok := cl.Net.Conn.(*tls.Conn)
	if !ok {
		return id, false
	}
	chains := tc.ConnectionState().VerifiedChains
	if len(chains) == 0 || len(chains[0]) == 0 {
		return id, false
	}
	id.tenant, id.device, id.serial, id.ok = pki.DeviceIdentity(chains[0][0])
	return id, true
}

func remoteIPOf(cl *mochi.Client) string {
	if cl.Net.Conn == nil {
		return cl.Net.Remote
	}
	return remoteIP(cl.Net.Conn)
}

// refuseUnavailable answers CONNECT with "server unavailable", which devices
// retry, unlike bad credentials. mochi's own refusal then finds the
// connection closed.
func (s *Server) refuseUnavailable(cl *mochi.Client) {
	_ = s.broker.SendConnack(cl, packets.ErrServerUnavailable, false, nil)
	cl.Stop(packets.ErrServerUnavailable)
}

// OnSessionEstablished registers the device after its CONNACK went out, and
// disconnects the connection it replaces.
func (h *hook) OnSessionEstablished(cl *mochi.Client, pk packets.Packet) {
	s := h.s
	tenant, id := splitClientID(cl.ID)
	d := &device{tenant: tenant, id: id, cl: cl, pending: make(map[uint16]string)}
	sid := sessionID(tenant, id)
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		s.disconnect(cl, packets.ErrServerShuttingDown)
		return
	}
	old := s.devices[sid]
	s.devices[sid] = d
	s.byClient[cl] = d
	if old == nil {
		s.tenants[tenant]++
	}
	s.mu.Unlock()
	if old != nil {
		s.log.Debug("mqtt: device connected again; closing its previous connection",
			"tenant", tenant, "device", id, "previous_remote", old.cl.Net.Remote)
		s.disconnect(old.cl, packets.ErrSessionTakenOver)
	}
	s.stats.connects.Add(1)
	s.log.Debug("mqtt: device connected", "tenant", tenant, "device", id,
		"remote", cl.Net.Remote, "protocol", cl.Properties.ProtocolVersion)
	s.h.DeviceConnected(tenant, id)
}

// OnDisconnect forgets the connection and says why it ended.
func (h *hook) OnDisconnect(cl *mochi.Client, err error, expire bool) {
	s := h.s
	s.mu.Lock()
	d := s.byClient[cl]
	delete(s.byClient, cl)
	if d != nil && s.devices[sessionID(d.tenant, d.id)] == d {
		delete(s.devices, sessionID(d.tenant, d.id))
		if s.tenants[d.tenant]--; s.tenants[d.tenant] <= 0 {
			delete(s.tenants, d.tenant)
		}
	}
	s.mu.Unlock()
	if d == nil {
		return
	}
	s.stats.disconnects.Add(1)
	cause := cl.StopCause() // the first reason given, such as ours
	if cause == nil {
		cause = err
	}
	if errors.Is(cause, packets.ErrPacketTooLarge) {
		s.stats.oversized.Add(1)
		s.log.Warn("mqtt: device disconnected: packet too large",
			"tenant", d.tenant, "device", d.id, "max_packet_size", s.cfg.MaxPacketSize, "remote", cl.Net.Remote)
		return
	}
	s.log.Debug("mqtt: device disconnected", "tenant", d.tenant, "device", d.id, "reason", cause)
}

// violation disconnects a device that touched a topic not its own.
func (s *Server) violation(d *device, op, topic string) {
	s.stats.aclViolations.Add(1)
	s.log.Warn("mqtt: device disconnected: it may subscribe only to its actions topic and publish only on its status and stream topics",
		"tenant", d.tenant, "device", d.id, "op", op, "topic", topic, "remote", d.cl.Net.Remote)
	s.disconnect(d.cl, packets.ErrNotAuthorized)
}

// OnACLCheck answers mochi's own checks with the same rules OnPacketRead
// enforces; it is also asked before each action is delivered.
func (h *hook) OnACLCheck(cl *mochi.Client, topic string, write bool) bool {
	d := h.s.deviceOf(cl)
	if d == nil {
		return false
	}
	if write {
		_, ok := mayPublish(d.tenant, d.id, topic)
		return ok
	}
	return maySubscribe(d.tenant, d.id, topic)
}

// OnSubscribed notes a subscription to the device's actions topic; the
// Handler hears of it once the SUBACK is out, in OnPacketProcessed.
func (h *hook) OnSubscribed(cl *mochi.Client, pk packets.Packet, reasonCodes []byte) {
	d := h.s.deviceOf(cl)
	if d == nil {
		return
	}
	for i, f := range pk.Filters {
		if i < len(reasonCodes) && reasonCodes[i] < packets.ErrUnspecifiedError.Code && maySubscribe(d.tenant, d.id, f.Filter) {
			d.subscribed.Store(true)
			d.announced = true
		}
	}
}

// OnUnsubscribed notes that the device no longer receives actions.
func (h *hook) OnUnsubscribed(cl *mochi.Client, pk packets.Packet) {
	d := h.s.deviceOf(cl)
	if d == nil {
		return
	}
	for _, f := range pk.Filters {
		if maySubscribe(d.tenant, d.id, f.Filter) {
			d.subscribed.Store(false)
		}
	}
}

// OnPublish hands a device's publish to the Handler before mochi acknowledges
// it.
func (h *hook) OnPublish(cl *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	if cl.Net.Inline {
		return pk, nil // SendAction
	}
	s := h.s
	d := s.deviceOf(cl)
	if d == nil {
		return pk, packets.ErrRejectPacket
	}
	t, ok := mayPublish(d.tenant, d.id, pk.TopicName)
	if !ok {
		return pk, packets.ErrRejectPacket // OnPacketRead has disconnected it
	}

	s.mu.RLock()
	if s.closing {
		s.mu.RUnlock()
		s.disconnect(cl, packets.ErrServerShuttingDown)
		return pk, packets.ErrRejectPacket
	}
	s.busy.Add(1) // done in OnPacketProcessed, after the PUBACK is written
	s.mu.RUnlock()
	d.handling = true

	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.HandlerTimeout)
	defer cancel()
	var err error
	if t.Kind == TopicStream {
		err = s.h.HandleStream(ctx, d.tenant, d.id, t.Stream, pk.Payload)
	} else {
		err = s.h.HandleStatus(ctx, d.tenant, d.id, pk.Payload)
	}
	s.stats.messagesIn.Add(1)
	// CodeSuccessIgnore acknowledges without fanning out: in the embedded
	// broker nobody else may read a device's topics.
	if err == nil {
		return pk, packets.CodeSuccessIgnore
	}
	if unavailable(ctx, err) && pk.FixedHeader.Qos > 0 {
		s.stats.unacked.Add(1)
		s.log.Warn("mqtt: publish not acknowledged, fleetd cannot commit it now; disconnecting the device so it publishes again",
			"tenant", d.tenant, "device", d.id, "topic", pk.TopicName, "error", err)
		s.disconnect(cl, packets.ErrServerBusy)
		return pk, packets.ErrRejectPacket
	}
	s.stats.handlerErrors.Add(1)
	level := slog.LevelWarn
	if fleet.ErrorCode(err) == fleet.EINTERNAL {
		level = slog.LevelError
	}
	// Acknowledged all the same: a malformed report would otherwise come back
	// forever.
	s.log.Log(ctx, level, "mqtt: device publish rejected",
		"tenant", d.tenant, "device", d.id, "topic", pk.TopicName, "qos", pk.FixedHeader.Qos, "error", err)
	return pk, packets.CodeSuccessIgnore
}

// unavailable reports whether a Handler error means "try again later".
func unavailable(ctx context.Context, err error) bool {
	return fleet.ErrorCode(err) == fleet.EUNAVAILABLE || ctx.Err() != nil
}

// OnPacketProcessed runs after mochi handled a packet read from a device: the
// PUBACK of its publish is out, the SUBACK of its subscription is out, or its
// PUBACK of an action arrived.
func (h *hook) OnPacketProcessed(cl *mochi.Client, pk packets.Packet, err error) {
	if cl.Net.Inline {
		return
	}
	s := h.s
	d := s.deviceOf(cl)
	if d == nil {
		return
	}
	switch pk.FixedHeader.Type {
	case packets.Publish:
		if d.handling {
			d.handling = false
			s.busy.Done()
		}
	case packets.Subscribe:
		if d.announced {
			d.announced = false
			s.deviceSubscribed(d)
		}
	case packets.Puback:
		d.mu.Lock()
		id, ok := d.pending[pk.PacketID]
		delete(d.pending, pk.PacketID)
		d.mu.Unlock()
		if ok {
			s.stats.delivered.Add(1)
			s.h.ActionDelivered(d.tenant, d.id, id)
		}
	}
}

// deviceSubscribed calls the Handler on a goroutine of its own: it sends the
// device its queued actions, and the device's connection goroutine must stay
// free to read their PUBACKs.
func (s *Server) deviceSubscribed(d *device) {
	s.mu.RLock()
	if s.closing {
		s.mu.RUnlock()
		return
	}
	s.tasks.Add(1)
	s.mu.RUnlock()
	go func() {
		defer s.tasks.Done()
		s.h.DeviceSubscribed(d.tenant, d.id)
	}()
}

// OnQosPublish remembers which action a packet id carries until the device
// acknowledges it.
func (h *hook) OnQosPublish(cl *mochi.Client, pk packets.Packet, sent int64, resends int) {
	if pk.FixedHeader.Type != packets.Publish || cl.Net.Inline {
		return // the broker's own acknowledgement of a device's publish
	}
	d := h.s.deviceOf(cl)
	if d == nil {
		return
	}
	id := actionID(pk.Payload)
	d.mu.Lock()
	d.pending[pk.PacketID] = id
	d.mu.Unlock()
}

// OnQosDropped forgets an action the broker gave up on.
func (h *hook) OnQosDropped(cl *mochi.Client, pk packets.Packet) {
	if pk.FixedHeader.Type != packets.Publish {
		return
	}
	if d := h.s.deviceOf(cl); d != nil {
		d.mu.Lock()
		delete(d.pending, pk.PacketID)
		d.mu.Unlock()
	}
}

// OnPublishDropped tells SendAction that the device's queue was full.
func (h *hook) OnPublishDropped(cl *mochi.Client, pk packets.Packet) {
	if d := h.s.deviceOf(cl); d != nil {
		d.dropped.Store(true)
	}
}

// OnPacketSent reports an action delivered at QoS 0, to a device that
// subscribed so: it acknowledges nothing, so writing it is all there is.
func (h *hook) OnPacketSent(cl *mochi.Client, pk packets.Packet, b []byte) {
	if pk.FixedHeader.Type != packets.Publish || pk.FixedHeader.Qos != 0 || cl.Net.Inline {
		return
	}
	s := h.s
	if d := s.deviceOf(cl); d != nil {
		s.stats.delivered.Add(1)
		s.h.ActionDelivered(d.tenant, d.id, actionID(pk.Payload))
	}
}

// OnPacketEncode tells MQTT 5 devices in CONNACK what this broker does not
// do, so that their client libraries refuse it before sending.
func (h *hook) OnPacketEncode(cl *mochi.Client, pk packets.Packet) packets.Packet {
	if pk.FixedHeader.Type != packets.Connack || pk.ReasonCode != packets.CodeSuccess.Code {
		return pk
	}
	p := &pk.Properties
	p.MaximumPacketSize = uint32(h.s.cfg.MaxPacketSize)
	p.RetainAvailable, p.RetainAvailableFlag = 0, true
	p.WildcardSubAvailable, p.WildcardSubAvailableFlag = 0, true
	p.SharedSubAvailable, p.SharedSubAvailableFlag = 0, true
	return pk
}

// actionID returns the "id" member of an action message, a string in the
// uplink agent's shape; a number is returned as its JSON text.
func actionID(payload []byte) string {
	var m struct {
		ID json.RawMessage `json:"id"`
	}
	if json.Unmarshal(payload, &m) != nil || len(m.ID) == 0 {
		return ""
	}
	var s string
	if json.Unmarshal(m.ID, &s) == nil {
		return s
	}
	return string(m.ID)
}

// truncate keeps what a client sent from flooding the log.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// offStack runs f on a goroutine of its own and waits for it. A device's
// connection goroutine lives as long as the connection, and its stack
// stays as large as the deepest call it ever made until garbage
// collections shrink it, half at a time: a database read (SQLite's
// transpiled C has large frames) would leave every idle connection holding
// 32 KiB. The goroutine that makes the call ends with it, and its stack
// goes back to the runtime.
func offStack(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	<-done
}
