package broker

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/mqtt"
	"github.com/fleetd/fleet/pki"
	"github.com/fleetd/fleet/ratelimit"
)

// readBufferSize is each connection's read buffer: a status report or a
// batch of data points fits, so a publish is usually one read.
const readBufferSize = 1024

// device is one connection of a device, from its CONNECT to its end. A
// device has one connection at most, keyed by its username whatever client
// id it sent: a new connection replaces the old.
type device struct {
	s          *Server
	tenant, id string
	nc         net.Conn

	cred credential // what it authenticated with, checked again when the device's credentials change

	maxPacketSize int // the device's own limit on what it receives; 0: none
	inflightMax   int // action messages that may await its PUBACK

	subscribed atomic.Bool   // to its actions topic
	qos        atomic.Uint32 // of that subscription
	// deltaSubscribed: to its shadow delta topic.
	deltaSubscribed atomic.Bool

	// closed is set under wmu, and read without it: Online and Disconnect
	// must not wait behind a write to a device that does not read.
	closed atomic.Bool
	parked atomic.Bool // park.go

	wmu sync.Mutex // writes to nc, and the fields below
	// fd is the socket while parked (park.go), held apart from Go's
	// network poller: dup'd from the connection, which is closed; 0: the
	// connection has it. Changed under wmu.
	fd    atomic.Int32
	cause error // why the connection ended, as first said
	// writeBy is when the write deadline set on the connection passes, on
	// the monotonic clock (monoNow; writeLocked); 0: none known.
	writeBy int64

	// What the connection sends the device (delivery.go).
	inflight map[uint16]inflight   // by packet id, awaiting PUBACK; nil until the first
	queue    []fleet.ActionMessage // waiting for room in the window, by action id
	cursor   int64                 // the store was read up to this action id
	missed   int64                 // the lowest id left to the store while fetching; 0: none
	settled  []int64               // acknowledged while fetching: not to be sent again
	failing  []int64               // being failed: not to be sent again
	ackTimer *time.Timer           // watches the oldest action in flight
	retryIn  time.Duration         // the wait before reading the store again after a failure
	lastID   uint16                // the last packet id given
	more     bool                  // the store may hold actions above cursor for the device
	fetching bool                  // a read of the store is under way

	// Set at CONNECT. (The small fields are together: thousands of idle
	// devices are mostly this struct.)
	version   byte
	keepalive uint16 // seconds, never 0: MaxKeepalive applies

	publishes ratelimit.Bucket // PublishRate; only the connection's goroutine

	// Reading and parking (park.go); only the reading goroutine, but for
	// parked and parkKey (the poller's lock).
	done     func(error) // ends the connection's handling (the listener's part)
	deadline int64       // of the keepalive, on the monotonic clock (monoNow), for the packet awaited; 0: none yet
	parkKey  uint64
	// live is the connection rebuilt around the socket when it last woke
	// from parking; nil: nc. Changed under wmu.
	live atomic.Pointer[net.TCPConn]
}

// conn is the connection to read and write: nc, or the one the socket got
// when it last woke from parking. While parked it is closed.
func (d *device) conn() net.Conn {
	if c := d.live.Load(); c != nil {
		return c
	}
	return d.nc
}

// mayPark says whether the connection parks when idle: only plain TCP
// connections do (park.go).
func (d *device) mayPark() bool {
	_, tcp := d.nc.(*net.TCPConn)
	return tcp && d.s.poller != nil && d.s.cfg.ParkAfter > 0
}

// remote is the device's address, for the log.
func (d *device) remote() string { return d.nc.RemoteAddr().String() }

// serveConn serves one connection from its first byte; done ends its
// handling, once, when the connection is over (which, for a connection that
// parks, is on another goroutine).
func (s *Server) serveConn(nc net.Conn, ip string, connected func(), done func(error)) {
	r := getReader(nc)
	d, err := s.connect(nc, ip, r, connected)
	if d == nil {
		putReader(r)
		done(err)
		return
	}
	d.done = done
	s.h.DeviceConnected(d.tenant, d.id)
	d.serve(r)
}

// connect reads and answers the connection's CONNECT: the device it is, or
// nil (and why, if the connection broke the protocol).
func (s *Server) connect(nc net.Conn, ip string, r *bufio.Reader, connected func()) (*device, error) {
	header, body, err := readPacket(r, s.cfg.MaxPacketSize)
	if err != nil {
		return nil, err
	}
	if header != typeConnect<<4 {
		return nil, errors.New("the first packet is not CONNECT")
	}
	connected()
	c, err := decodeConnect(body)
	if err != nil {
		return nil, err
	}
	if c.unsupportedV {
		_, _ = nc.Write(appendConnack(nil, version311, codeUnsupportedVersion, nil))
		return nil, errors.New("unsupported protocol level")
	}
	return s.admit(nc, ip, c), nil
}

// admit checks a CONNECT and answers it: with a refusal (and nil), or with
// CONNACK and the device the connection now is.
func (s *Server) admit(nc net.Conn, ip string, c *connectPacket) *device {
	remote := nc.RemoteAddr().String()
	refuse := func(code reasonCode) *device {
		_ = nc.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = nc.Write(appendConnack(nil, c.version, code, nil))
		return nil
	}
	if c.props.authMethod != "" {
		s.stats.authFailures.Add(1)
		s.log.Info("mqtt: connection refused: enhanced authentication is not supported", "method", mqtt.Truncate(c.props.authMethod, 100), "remote", remote)
		return refuse(codeBadAuthenticationMethod)
	}
	if c.clientID == "" && (c.version == version31 || c.version == version311 && !c.cleanSession) {
		// MQTT-3.1.3-8: a 3.1.1 client without an id must ask for a clean
		// session, since there is none to resume; 3.1 requires an id.
		s.log.Info("mqtt: connection refused: an empty client id needs a clean session", "remote", remote)
		return refuse(codeClientIDNotValid)
	}
	if c.hasWill && c.willRetain && c.version == version5 {
		// MQTT-3.2.2-13: CONNACK says Retain Available 0.
		s.log.Info("mqtt: connection refused: a retained will, and retained messages are not supported", "remote", remote)
		return refuse(codeRetainNotSupported)
	}
	tenant, deviceID, ok := mqtt.ParseUsername(c.username)
	id, hasCert := certIdentity(nc)
	if c.hasWill {
		t, d, ok := tenant, deviceID, ok
		if hasCert {
			t, d, ok = id.tenant, id.device, id.ok
		}
		// Wills are never published here; one on a topic the device may not
		// publish on is a sign of a device that means harm.
		if _, may := mqtt.MayPublish(t, d, c.willTopic); ok && !may {
			s.stats.authFailures.Add(1)
			s.log.Warn("mqtt: connection refused: will on a topic not the device's",
				"tenant", t, "device", d, "topic", mqtt.Truncate(c.willTopic, 200), "remote", remote)
			return refuse(codeNotAuthorized)
		}
	}
	if !s.authFailures.Available(ip) {
		s.stats.limitRefusals.Add(1)
		s.log.Debug("mqtt: connection refused: too many failed CONNECTs from this address lately", "remote", remote)
		return refuse(codeConnectionRateExceeded)
	}
	switch {
	case hasCert && !id.ok:
		s.authFailed(ip)
		s.log.Info("mqtt: connection refused: the client certificate names no fleetd device", "remote", remote)
		return refuse(codeBadUsernameOrPassword)
	case hasCert && c.hasUsername && (!ok || tenant != id.tenant || deviceID != id.device):
		s.authFailed(ip)
		s.log.Info("mqtt: connection refused: the username is not the device of the client certificate",
			"username", mqtt.Truncate(c.username, 200), "tenant", id.tenant, "device", id.device, "remote", remote)
		return refuse(codeBadUsernameOrPassword)
	case hasCert:
		tenant, deviceID = id.tenant, id.device
	case !ok || !c.hasPassword:
		s.authFailed(ip)
		s.log.Info("mqtt: connection refused: username must be {tenant}/{device_id} and the password the device token",
			"username", mqtt.Truncate(c.username, 200), "remote", remote)
		return refuse(codeBadUsernameOrPassword)
	}
	if s.isClosing() {
		return refuse(codeServerUnavailable)
	}
	cred := credential{token: string(c.password)}
	if hasCert {
		cred = credential{serial: id.serial, byCert: true}
	}
	revocations := s.revocations.Load()
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.HandlerTimeout)
	defer cancel()
	if err := s.authenticate(ctx, tenant, deviceID, cred); err != nil {
		if mqtt.Unavailable(ctx, err) {
			s.log.Warn("mqtt: cannot authenticate device now", "tenant", tenant, "device", deviceID, "err", err)
			return refuse(codeServerUnavailable)
		}
		s.authFailed(ip)
		s.log.Info("mqtt: connection refused: bad credentials",
			"tenant", tenant, "device", deviceID, "remote", remote, "certificate", hasCert, "reason", fleet.ErrorMessage(err))
		return refuse(codeBadUsernameOrPassword)
	}

	d := &device{
		s: s, tenant: tenant, id: deviceID, nc: nc, version: c.version, cred: cred,
		maxPacketSize: int(c.props.maxPacketSize),
		inflightMax:   s.cfg.MaxInflight,
	}
	if c.props.receiveMaximum > 0 {
		d.inflightMax = min(d.inflightMax, int(c.props.receiveMaximum))
	}
	props := &connackProperties{
		maxPacketSize:  uint32(s.cfg.MaxPacketSize),
		receiveMaximum: uint16(s.cfg.MaxInflight),
		sessionExpiry:  c.props.sessionExpiry > 0, // sessions end with their connection
	}
	// A device that asks for no keepalive, or a longer one, gets the
	// longest, so an idle connection cannot stay open forever.
	keepalive := c.keepalive
	if max := uint16(s.cfg.MaxKeepalive / time.Second); keepalive == 0 || keepalive > max {
		keepalive = max
		props.serverKeepAlive = max
	}
	d.keepalive = keepalive
	if c.clientID == "" {
		props.assignedID = sessionID(tenant, deviceID) + "#" + strconv.FormatUint(s.connSeq.Add(1), 10)
	}
	// The connection takes its place before the device hears CONNACK, so
	// that whatever the device does next (connect another device of the
	// tenant, publish) finds it counted.
	if code := s.register(d); code != codeSuccess {
		return refuse(code)
	}
	// A change of credentials heard while this device was being checked
	// found no connection to end: the check may have read the credentials
	// before the change, so it is made again. A change heard from now on
	// finds the connection registered.
	if s.revocations.Load() != revocations && !s.stillAdmitted(d) {
		s.unregister(d)
		s.log.Info("mqtt: connection refused: the device's credentials changed while it connected",
			"tenant", tenant, "device", deviceID, "remote", remote)
		return refuse(codeBadUsernameOrPassword)
	}
	s.stats.connects.Add(1)
	_ = nc.SetDeadline(time.Time{})
	if d.write(appendConnack(nil, c.version, codeSuccess, props)) != nil {
		s.unregister(d)
		return nil
	}
	s.log.Debug("mqtt: device connected", "tenant", d.tenant, "device", d.id,
		"remote", remote, "protocol", d.version)
	return d
}

// credential is what a device authenticated with: its token, or the
// serial of the client certificate TLS verified.
type credential struct {
	token, serial string
	byCert        bool
}

// authenticate asks the Handler whether cred admits the device.
func (s *Server) authenticate(ctx context.Context, tenant, device string, cred credential) error {
	var err error
	offStack(func() {
		switch ca, ok := s.h.(mqtt.CertificateAuthenticator); {
		case !cred.byCert:
			err = s.h.AuthenticateDevice(ctx, tenant, device, cred.token)
		case ok:
			err = ca.AuthenticateDeviceCertificate(ctx, tenant, device, cred.serial)
		default:
			err = fleet.Errorf(fleet.EUNAUTHENTICATED, "this server does not admit devices by certificate")
		}
	})
	return err
}

// stillAdmitted checks again the credentials d connected with; an error,
// even "unavailable", counts as no: a revocation must not be outlived.
func (s *Server) stillAdmitted(d *device) bool {
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.HandlerTimeout)
	defer cancel()
	return s.authenticate(ctx, d.tenant, d.id, d.cred) == nil
}

// authFailed counts a failed CONNECT against its source address.
func (s *Server) authFailed(ip string) {
	s.stats.authFailures.Add(1)
	s.authFailures.Allow(ip)
}

// register makes d the device's connection and disconnects the
// connection it replaces, or says why it cannot: the server is shutting
// down, or the tenant has its maximum of connected devices (a device that
// replaces its own connection does not count twice). The count and the
// registration are one step, so devices connecting at once cannot
// overshoot the cap.
func (s *Server) register(d *device) reasonCode {
	sid := sessionID(d.tenant, d.id)
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return codeServerUnavailable
	}
	old := s.devices[sid]
	if old == nil && s.cfg.MaxTenantConnections > 0 && s.tenants[d.tenant] >= s.cfg.MaxTenantConnections {
		s.mu.Unlock()
		s.stats.limitRefusals.Add(1)
		s.log.Warn("mqtt: connection refused: the tenant has its maximum of connected devices",
			"tenant", d.tenant, "device", d.id, "max", s.cfg.MaxTenantConnections)
		return codeQuotaExceeded
	}
	s.devices[sid] = d
	if old == nil {
		s.tenants[d.tenant]++
	}
	s.mu.Unlock()
	if old != nil {
		s.log.Debug("mqtt: device connected again; closing its previous connection",
			"tenant", d.tenant, "device", d.id, "previous_remote", old.remote())
		old.close(codeSessionTakenOver, nil)
	}
	return codeSuccess
}

// unregister forgets a connection that ended.
func (s *Server) unregister(d *device) {
	sid := sessionID(d.tenant, d.id)
	s.mu.Lock()
	if s.devices[sid] == d {
		delete(s.devices, sid)
		if s.tenants[d.tenant]--; s.tenants[d.tenant] <= 0 {
			delete(s.tenants, d.tenant)
		}
	}
	s.mu.Unlock()
	s.stats.disconnects.Add(1)
}

// errDisconnected ends a connection the device closed with DISCONNECT.
var errDisconnected = errors.New("the device disconnected")

// readLoop reads and handles the device's packets until the connection
// ends, and returns why it ended, or until it parks (errParked).
func (d *device) readLoop(r *bufio.Reader) error {
	for {
		if d.deadline == 0 {
			d.deadline = monoNow() + int64(time.Duration(d.keepalive)*time.Second*3/2)
		}
		if d.mayPark() && r.Buffered() == 0 {
			if err := d.idleWait(r); err != nil {
				return err
			}
		}
		if !packetBuffered(r) {
			// A packet already buffered is read without the socket, so no
			// deadline matters to it (idleWait's shorter one may be set):
			// the keepalive's is set for a read that can wait.
			_ = d.conn().SetReadDeadline(monoTime(d.deadline))
		}
		header, body, err := readPacket(r, d.s.cfg.MaxPacketSize)
		if err != nil {
			// Its own function: what errors.As looks into escapes, and is
			// allocated only when there is an error, not for every packet.
			if err = d.readFailed(r, header, err); err != nil {
				return err
			}
			d.deadline = 0
			continue
		}
		d.deadline = 0
		if err := d.handle(header, body); err != nil {
			return err
		}
	}
}

// readFailed deals with readPacket's error: nil if it was an oversized
// publish read past (oversizedPublish), the error otherwise.
func (d *device) readFailed(r *bufio.Reader, header byte, err error) error {
	var large *packetTooLarge
	if errors.As(err, &large) && d.version != version5 && header>>4 == typePublish && header&0x06 == 0x02 {
		return d.oversizedPublish(r, header, large.remaining)
	}
	return err
}

// oversizedPublish deals with a QoS 1 publish of an MQTT 3.1.1 device
// larger than MaxPacketSize, whose header is read and whose body of
// remaining bytes is not. MQTT 3.1.1 cannot refuse it but by closing the
// connection, so the first time it is: the device may be told nothing
// else, and a device that is broken sends no more. But a device replays an
// unacknowledged publish after it reconnects, and would be disconnected
// for it again and again, everything behind it stuck: the same publish
// (topic, packet id and length) coming again is read past, acknowledged
// and logged.
func (d *device) oversizedPublish(r *bufio.Reader, header byte, remaining int) error {
	var n [2]byte
	if remaining < 4 {
		return malformed("a PUBLISH too short for its topic and packet id")
	}
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return unexpectedEOF(err)
	}
	topicLen := int(binary.BigEndian.Uint16(n[:]))
	if remaining < 2+topicLen+2 {
		return malformed("a PUBLISH too short for its topic and packet id")
	}
	topic := make([]byte, topicLen)
	if _, err := io.ReadFull(r, topic); err != nil {
		return unexpectedEOF(err)
	}
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return unexpectedEOF(err)
	}
	id := binary.BigEndian.Uint16(n[:])
	key := mqtt.Username(d.tenant, d.id)
	this := fmt.Sprintf("%d %d %s", remaining, id, topic)
	if last, ok := d.s.oversized.Load(key); !ok || last != this {
		d.s.oversized.Store(key, this)
		return errPacketTooLarge
	}
	d.s.oversized.Delete(key)
	if _, err := io.CopyN(io.Discard, r, int64(remaining-2-topicLen-2)); err != nil {
		return unexpectedEOF(err)
	}
	d.s.stats.handlerErrors.Add(1)
	d.s.log.Warn("mqtt: device publish refused: larger than the maximum packet size; acknowledged this time, as the device published it again after its disconnection",
		"tenant", d.tenant, "device", d.id, "topic", mqtt.Truncate(string(topic), 200), "bytes", remaining, "max_packet_size", d.s.cfg.MaxPacketSize)
	return d.write(appendAck(nil, typePuback, id))
}

// end closes the connection after readLoop returned err, telling an MQTT 5
// device why, and logs it.
func (d *device) end(err error) {
	s := d.s
	var pe *protocolError
	var ne net.Error
	switch {
	case errors.As(err, &pe):
		switch pe.code {
		case codePacketTooLarge:
			s.stats.oversized.Add(1)
			s.log.Warn("mqtt: device disconnected: packet too large",
				"tenant", d.tenant, "device", d.id, "max_packet_size", s.cfg.MaxPacketSize, "remote", d.remote())
		case codeNotAuthorized, codeMessageRateTooHigh, codeServerBusy, codeServerShuttingDown:
			// Logged where it was found.
		default:
			s.log.Info("mqtt: device disconnected: it broke the protocol",
				"tenant", d.tenant, "device", d.id, "err", pe.msg, "remote", d.remote())
		}
		d.close(pe.code, err)
	case errors.As(err, &ne) && ne.Timeout():
		d.close(codeKeepAliveTimeout, err)
	default:
		d.close(0, err)
	}
	d.wmu.Lock()
	cause := d.cause
	d.wmu.Unlock()
	s.log.Debug("mqtt: device disconnected", "tenant", d.tenant, "device", d.id, "reason", cause)
}

// handle handles one packet the device sent. An error ends the connection.
func (d *device) handle(header byte, body []byte) error {
	typ, flags := header>>4, header&0x0f
	if want := byte(0); typ != typePublish {
		if typ == typePubrel || typ == typeSubscribe || typ == typeUnsubscribe {
			want = 0x02
		}
		if flags != want {
			return malformed("packet type %d with flags %04b", typ, flags)
		}
	}
	switch typ {
	case typePublish:
		p, err := decodePublish(header, body, d.version)
		if err != nil {
			return err
		}
		return d.publish(p)
	case typePuback:
		a, err := decodeAck(body, d.version)
		if err != nil {
			return err
		}
		d.acknowledged(a.id, a.code, a.reason)
		return nil
	case typePubrel:
		a, err := decodeAck(body, d.version)
		if err != nil {
			return err
		}
		return d.write(appendAck(nil, typePubcomp, a.id))
	case typeSubscribe:
		sp, err := decodeSubscribe(body, d.version, false)
		if err != nil {
			return err
		}
		return d.subscribe(sp)
	case typeUnsubscribe:
		sp, err := decodeSubscribe(body, d.version, true)
		if err != nil {
			return err
		}
		codes := make([]byte, len(sp.filters))
		for i, f := range sp.filters {
			codes[i] = byte(codeNoSubscriptionExisted)
			switch mqtt.SubscriptionOf(d.tenant, d.id, f.filter) {
			case mqtt.TopicActions:
				if d.unsubscribe() {
					codes[i] = byte(codeSuccess)
				}
			case mqtt.TopicShadowDelta:
				if d.deltaSubscribed.Swap(false) {
					codes[i] = byte(codeSuccess)
				}
			}
		}
		return d.write(appendSuback(nil, typeUnsuback, d.version, sp.id, codes))
	case typePingreq:
		if len(body) > 0 {
			return malformed("PINGREQ with a body")
		}
		return d.write([]byte{typePingresp << 4, 0})
	case typeDisconnect:
		return errDisconnected
	case typeConnect:
		return protocolErr(codeProtocolError, "a second CONNECT")
	case typeAuth:
		return protocolErr(codeProtocolError, "AUTH without enhanced authentication")
	}
	return protocolErr(codeProtocolError, "a device may not send packet type %d", typ)
}

// publish hands a device's publish to the Handler and acknowledges it once
// the Handler returned: a PUBACK means committed.
func (d *device) publish(p *publishPacket) error {
	s := d.s
	if p.retain && d.version == version5 {
		return protocolErr(codeRetainNotSupported, "retained messages are not supported")
	}
	if p.props.topicAlias != 0 {
		return protocolErr(codeTopicAliasInvalid, "topic aliases are not supported")
	}
	t, ok := mqtt.MayPublish(d.tenant, d.id, p.topic)
	if !ok && !mqtt.OwnTopic(d.tenant, d.id, p.topic) {
		return d.aclViolation("publish", p.topic)
	}
	if !ok {
		// One of the device's own topics fleetd does not know (an agent's
		// newer or older stream, say): refused, the connection kept, or
		// the device would publish it again on every reconnection.
		s.stats.handlerErrors.Add(1)
		s.log.Warn("mqtt: device publish refused: not a topic fleetd takes (action/status, events/{stream}/jsonarray, …/jsonarray/lz4)",
			"tenant", d.tenant, "device", d.id, "topic", mqtt.Truncate(p.topic, 200), "qos", p.qos)
		return d.acknowledge(p, codeTopicNameInvalid)
	}
	if cfg := s.cfg; cfg.PublishRate > 0 {
		if ok, _ := d.publishes.Take(cfg.Now(), cfg.PublishRate, cfg.PublishBurst); !ok {
			s.stats.publishFloods.Add(1)
			s.log.Warn("mqtt: device disconnected: it publishes faster than it may",
				"tenant", d.tenant, "device", d.id, "rate", cfg.PublishRate, "burst", cfg.PublishBurst, "remote", d.remote())
			return protocolErr(codeMessageRateTooHigh, "publishing faster than PublishRate")
		}
	}

	s.mu.RLock()
	if s.closing {
		s.mu.RUnlock()
		return protocolErr(codeServerShuttingDown, "the server is shutting down")
	}
	s.busy.Add(1)
	s.mu.RUnlock()
	defer s.busy.Done() // after the acknowledgement is written

	ctx := s.publishContext()
	var err error
	switch t.Kind {
	case mqtt.TopicStream:
		err = s.h.HandleStream(ctx, d.tenant, d.id, t.Stream, t.Compression, p.payload)
	case mqtt.TopicShadowReported:
		err = s.h.HandleReported(ctx, d.tenant, d.id, p.payload)
	default:
		err = s.h.HandleStatus(ctx, d.tenant, d.id, p.payload)
	}
	s.stats.messagesIn.Add(1)
	if err != nil && mqtt.Unavailable(ctx, err) && p.qos > 0 {
		s.stats.unacked.Add(1)
		s.log.Warn("mqtt: publish not acknowledged, fleetd cannot commit it now; disconnecting the device so it publishes again",
			"tenant", d.tenant, "device", d.id, "topic", p.topic, "err", err)
		return protocolErr(codeServerBusy, "cannot commit now")
	}
	code := codeSuccess
	if err != nil {
		s.stats.handlerErrors.Add(1)
		mqtt.LogRejected(ctx, s.log, err, d.tenant, d.id, p.topic, p.qos)
	}
	switch {
	case mqtt.Taken(err):
	case fleet.ErrorCode(err) == fleet.EINVALID:
		code = codePayloadFormatInvalid
	default:
		code = codeUnspecified
	}
	return d.acknowledge(p, code)
}

// sharedDeadline is a context with a deadline that publishes share while
// it is fresh.
type sharedDeadline struct {
	ctx    context.Context
	cancel context.CancelFunc // called by the deadline; kept for go vet
	fresh  time.Time          // until when it has HandlerTimeout left
}

// publishContext returns the context of a publish's Handler call: it ends
// with the server's, or HandlerTimeout from now, or up to a 32nd of it
// later. Publishes within that 32nd share one context: a context with a
// deadline of its own for each, and its timer, were 4% of fleetd's CPU on
// MQTT status reports (docs/benchmarks-notebook.md).
func (s *Server) publishContext() context.Context {
	now := time.Now()
	if c := s.publishCtx.Load(); c != nil && now.Before(c.fresh) {
		return c.ctx
	}
	slack := s.cfg.HandlerTimeout / 32
	ctx, cancel := context.WithDeadline(s.ctx, now.Add(s.cfg.HandlerTimeout+slack))
	// Two publishes may each make one at once; the one stored last is
	// shared, the other ends at its deadline like the rest.
	s.publishCtx.Store(&sharedDeadline{ctx: ctx, cancel: cancel, fresh: now.Add(slack)})
	return ctx
}

// acknowledge acknowledges a publish: with code, a refusal, to an MQTT 5
// device; positively to a 3.1.1 device, which MQTT 3.1.1 leaves no way to
// tell (4.11: acknowledge, or close the connection, after which the device
// would publish it again). A refusal is logged by the caller.
func (d *device) acknowledge(p *publishPacket, code reasonCode) error {
	typ := byte(typePuback)
	switch p.qos {
	case 0:
		return nil
	case 2:
		typ = typePubrec
	}
	if code != codeSuccess && d.version == version5 {
		return d.write(appendRefusal(nil, typ, p.id, code))
	}
	return d.write(appendAck(nil, typ, p.id))
}

// subscribe accepts a subscription to the device's actions topic and to
// its shadow delta topic, and nothing else.
func (d *device) subscribe(sp *subscribePacket) error {
	if sp.props.subscriptionID {
		return protocolErr(codeSubscriptionIDsNotUsable, "subscription identifiers are not supported")
	}
	codes := make([]byte, len(sp.filters))
	qos, ok, delta := byte(0), false, false
	for i, f := range sp.filters {
		switch mqtt.SubscriptionOf(d.tenant, d.id, f.filter) {
		case mqtt.TopicActions:
			codes[i] = min(f.qos, 1) // actions go out at QoS 1 at most
			qos, ok = codes[i], true
		case mqtt.TopicShadowDelta:
			// Deltas go out at QoS 0: each is the whole delta, sent again
			// at every change and every subscription, so a lost one is
			// made good by the next (docs/device-protocol.md).
			codes[i], delta = 0, true
		default:
			// Refused, and the connection kept (as MQTT allows): a device
			// that reconnects at once would otherwise loop, and its log
			// says why.
			codes[i] = d.refuseSubscription(f.filter)
		}
	}
	if delta {
		// Before the SUBACK: a device that has it may be sent deltas.
		d.deltaSubscribed.Store(true)
	}
	d.wmu.Lock()
	err := d.writeLocked(appendSuback(nil, typeSuback, d.version, sp.id, codes))
	if err == nil && delta {
		defer d.s.goTask(func() { d.s.h.DeltaSubscribed(d.tenant, d.id) })
	}
	if err != nil || !ok {
		d.wmu.Unlock()
		return err
	}
	// The store is read from the start again: what is in flight or queued
	// is not sent twice.
	d.qos.Store(uint32(qos))
	d.subscribed.Store(true)
	d.more, d.cursor = true, 0
	d.wmu.Unlock()
	// The queued actions are read from the store on a goroutine of its own:
	// this one must stay free to read their PUBACKs.
	d.s.goTask(func() {
		d.s.h.DeviceSubscribed(d.tenant, d.id)
		d.kick()
	})
	return nil
}

// unsubscribe ends the subscription to the actions topic, if there was one:
// nothing more is sent, and what waited stays in the store.
func (d *device) unsubscribe() bool {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	d.queue, d.more = nil, false
	return d.subscribed.Swap(false)
}

// kick sends what the window has room for, reading the store if need be.
func (d *device) kick() {
	d.wmu.Lock()
	out := d.drainLocked()
	d.wmu.Unlock()
	d.settle(out)
}

// refuseSubscription answers a subscription to a filter the device may not
// use: SUBACK 0x80 (MQTT 5: 0x87 not authorized).
func (d *device) refuseSubscription(filter string) byte {
	d.s.stats.aclViolations.Add(1)
	d.s.log.Warn("mqtt: subscription refused: a device may subscribe only to its own actions and shadow delta topics",
		"tenant", d.tenant, "device", d.id, "filter", mqtt.Truncate(filter, 200), "actions_topic", mqtt.ActionsTopic(d.tenant, d.id), "remote", d.remote())
	if d.version == version5 {
		return byte(codeNotAuthorized)
	}
	return 0x80
}

// aclViolation ends the connection of a device that touched a topic not
// its own.
func (d *device) aclViolation(op, topic string) error {
	d.s.stats.aclViolations.Add(1)
	d.s.log.Warn("mqtt: device disconnected: it may subscribe only to its actions and shadow delta topics and publish only on its status, stream and reported-state topics",
		"tenant", d.tenant, "device", d.id, "op", op, "topic", mqtt.Truncate(topic, 200), "remote", d.remote())
	return protocolErr(codeNotAuthorized, "%s on %q, not the device's", op, mqtt.Truncate(topic, 200))
}

// write writes a packet to the device.
func (d *device) write(b []byte) error {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	return d.writeLocked(b)
}

// writeLocked writes a packet with wmu held. A write that fails or times out
// ends the connection: what it wrote of the packet cannot be taken back.
func (d *device) writeLocked(b []byte) error {
	if d.closed.Load() {
		return net.ErrClosed
	}
	if d.fd.Load() != 0 {
		// Parked: the socket gets its connection back, and a goroutine
		// to read what the device answers; it parks again once idle.
		d.attachLocked()
		if d.closed.Load() {
			return net.ErrClosed
		}
		d.wake()
	}
	c := d.conn()
	// Each write has WriteTimeout at least, and up to a 32nd of it more:
	// the deadline is set again only when less than WriteTimeout is left,
	// not for every PUBACK (1.5% of fleetd's CPU on MQTT status reports,
	// docs/benchmarks-notebook.md).
	if now, wt := monoNow(), d.s.cfg.WriteTimeout; d.writeBy-now < int64(wt) {
		d.writeBy = now + int64(wt+wt/32)
		_ = c.SetWriteDeadline(monoTime(d.writeBy))
	}
	if _, err := c.Write(b); err != nil {
		d.closeLocked(0, err)
		return err
	}
	return nil
}

// The broker's deadlines (a keepalive's, a write's) are kept as
// nanoseconds since monoBase: differences of times read from time.Now are
// on the monotonic clock, their Unix times are not, and a wall clock set
// forward would cut every parked device off at once, set back would keep
// deadlines that have passed.
var monoBase = time.Now()

// monoNow is now on the broker's clock.
func monoNow() int64 { return int64(time.Since(monoBase)) }

// monoTime is the time of t on the broker's clock, for a connection's
// deadline (it keeps the monotonic reading).
func monoTime(t int64) time.Time { return monoBase.Add(time.Duration(t)) }

// close ends the connection, first telling an MQTT 5 device the reason
// (code 0: none); MQTT 3.1.1 has no DISCONNECT from the server, so there
// closing the connection is the signal. cause is logged.
func (d *device) close(code reasonCode, cause error) {
	if !d.wmu.TryLock() {
		// A write is under way. To a device that does not read it would
		// hold wmu until its deadline (WriteTimeout): give it a moment,
		// then cut it short.
		cut := time.AfterFunc(100*time.Millisecond, func() { _ = d.conn().SetWriteDeadline(time.Now()) })
		d.wmu.Lock()
		cut.Stop()
	}
	defer d.wmu.Unlock()
	d.closeLocked(code, cause)
}

func (d *device) closeLocked(code reasonCode, cause error) {
	if d.closed.Load() {
		return
	}
	d.closed.Store(true)
	if d.ackTimer != nil {
		d.ackTimer.Stop()
	}
	d.queue = nil
	d.cause = cause
	defer d.wake() // a parked connection has no goroutine to see it closed
	if cause == nil {
		d.cause = &protocolError{code: code, msg: "closed by the server"}
	}
	var disconnect []byte
	if code != 0 && d.version == version5 {
		disconnect = appendDisconnect(nil, code)
	}
	if d.fd.Load() != 0 {
		d.closeApartLocked(disconnect)
		return
	}
	c := d.conn()
	if disconnect != nil {
		// A device that does not read must not hold this up.
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = c.Write(disconnect)
	}
	_ = c.Close()
}

func (d *device) isClosed() bool { return d.closed.Load() }

// packetID returns a packet identifier no action in flight has; wmu is
// held, and fewer than 65,535 are in flight.
func (d *device) packetID() uint16 {
	for {
		d.lastID++
		if _, taken := d.inflight[d.lastID]; d.lastID != 0 && !taken {
			return d.lastID
		}
	}
}

// tlsIdentity is the device a verified client certificate names.
type tlsIdentity struct {
	tenant, device, serial string
	ok                     bool // the certificate names a device
}

// certIdentity returns the identity of the client certificate TLS
// verified on the connection; hasCert is false for plain connections and
// TLS ones without a client certificate.
func certIdentity(nc net.Conn) (id tlsIdentity, hasCert bool) {
	tc, ok := nc.(*tls.Conn)
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
