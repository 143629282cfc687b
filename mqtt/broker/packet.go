package broker

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"unicode/utf8"

	"github.com/fleetd/fleet/mqtt"
)

// The wire format of MQTT 3.1, 3.1.1 and 5.0, as much of it as a broker for
// devices needs: the packets a device sends are decoded, the ones the broker
// sends are appended to a byte slice. Everything a device sends is checked
// as the specifications require; a fault is a *protocolError that names it
// and carries the reason code an MQTT 5 device is told.

// Packet types, the high nibble of the first byte.
const (
	typeConnect     = 1
	typeConnack     = 2
	typePublish     = 3
	typePuback      = 4
	typePubrec      = 5
	typePubrel      = 6
	typePubcomp     = 7
	typeSubscribe   = 8
	typeSuback      = 9
	typeUnsubscribe = 10
	typeUnsuback    = 11
	typePingreq     = 12
	typePingresp    = 13
	typeDisconnect  = 14
	typeAuth        = 15
)

// Protocol levels in CONNECT.
const (
	version31  = 3
	version311 = 4
	version5   = 5
)

// reasonCode is an MQTT 5 reason code.
type reasonCode byte

// The reason codes this broker sends.
const (
	codeSuccess                  reasonCode = 0x00
	codeNoSubscriptionExisted    reasonCode = 0x11
	codeUnspecified              reasonCode = 0x80
	codeMalformedPacket          reasonCode = 0x81
	codeProtocolError            reasonCode = 0x82
	codeUnsupportedVersion       reasonCode = 0x84
	codeClientIDNotValid         reasonCode = 0x85
	codeBadUsernameOrPassword    reasonCode = 0x86
	codeNotAuthorized            reasonCode = 0x87
	codeServerUnavailable        reasonCode = 0x88
	codeServerBusy               reasonCode = 0x89
	codeBadAuthenticationMethod  reasonCode = 0x8C
	codeServerShuttingDown       reasonCode = 0x8B
	codeKeepAliveTimeout         reasonCode = 0x8D
	codeSessionTakenOver         reasonCode = 0x8E
	codeTopicNameInvalid         reasonCode = 0x90
	codePayloadFormatInvalid     reasonCode = 0x99
	codeTopicAliasInvalid        reasonCode = 0x94
	codePacketTooLarge           reasonCode = 0x95
	codeMessageRateTooHigh       reasonCode = 0x96
	codeQuotaExceeded            reasonCode = 0x97
	codeRetainNotSupported       reasonCode = 0x9A
	codeConnectionRateExceeded   reasonCode = 0x9F
	codeSubscriptionIDsNotUsable reasonCode = 0xA1
)

// v3Connack is the MQTT 3.1.1 CONNACK return code for an MQTT 5 reason:
// 3.1.1 has five, and none for limits.
func v3Connack(c reasonCode) byte {
	switch c {
	case codeSuccess:
		return 0
	case codeUnsupportedVersion:
		return 1 // unacceptable protocol version
	case codeClientIDNotValid:
		return 2 // identifier rejected
	case codeBadUsernameOrPassword, codeNotAuthorized, codeBadAuthenticationMethod:
		return 5 // not authorized
	default:
		return 3 // server unavailable
	}
}

// protocolError is a packet that breaks the specification.
type protocolError struct {
	code reasonCode
	msg  string
}

func (e *protocolError) Error() string { return e.msg }

func malformed(format string, args ...any) error {
	return &protocolError{codeMalformedPacket, fmt.Sprintf(format, args...)}
}

// protocolErr is a packet that breaks a rule of the protocol or of this
// broker, which the device is told with code.
func protocolErr(code reasonCode, format string, args ...any) error {
	return &protocolError{code, fmt.Sprintf(format, args...)}
}

// errPacketTooLarge is a packet over the broker's maximum packet size.
var errPacketTooLarge = &protocolError{codePacketTooLarge, "packet larger than the maximum packet size"}

// packetTooLarge is errPacketTooLarge with the length of the body left
// unread, for a caller that reads past it.
type packetTooLarge struct{ remaining int }

func (e *packetTooLarge) Error() string { return errPacketTooLarge.Error() }
func (e *packetTooLarge) Unwrap() error { return errPacketTooLarge }

// packetBuffered reports whether r's buffer holds a whole packet, which
// readPacket then reads without a read from the socket.
func packetBuffered(r *bufio.Reader) bool {
	b, _ := r.Peek(r.Buffered()) // what is buffered: no read
	n := 0
	for i := 1; i < len(b) && i <= 4; i++ {
		n |= int(b[i]&0x7f) << (7 * (i - 1))
		if b[i]&0x80 == 0 {
			return 1+i+n <= len(b)
		}
	}
	return false
}

// readPacket reads one packet: its first byte and its body. A packet over
// limit bytes in all is a *packetTooLarge (errPacketTooLarge), known from
// its length before its body is read; header is its first byte then.
func readPacket(r *bufio.Reader, limit int) (header byte, body []byte, err error) {
	header, err = r.ReadByte()
	if err != nil {
		return 0, nil, err
	}
	n, size := 0, 1
	for shift := 0; ; shift += 7 {
		if shift == 28 {
			return 0, nil, malformed("remaining length longer than four bytes")
		}
		b, err := r.ReadByte()
		if err != nil {
			return 0, nil, unexpectedEOF(err)
		}
		size++
		n |= int(b&0x7f) << shift
		if b&0x80 == 0 {
			break
		}
	}
	if size+n > limit {
		return header, nil, &packetTooLarge{n}
	}
	if n <= bodyChunk {
		body = make([]byte, n)
		if _, err := io.ReadFull(r, body); err != nil {
			return 0, nil, unexpectedEOF(err)
		}
		return header, body, nil
	}
	// A large body is read as it arrives, the buffer doubling as it
	// fills, so that a device announcing a megabyte and sending it slowly
	// holds at most twice what it has sent, not what it announced.
	body = make([]byte, 0, bodyChunk)
	for len(body) < n {
		chunk := min(n-len(body), max(len(body), bodyChunk))
		body = slices.Grow(body, chunk)
		got, err := io.ReadFull(r, body[len(body):len(body)+chunk])
		body = body[:len(body)+got]
		if err != nil {
			return 0, nil, unexpectedEOF(err)
		}
	}
	return header, body, nil
}

// bodyChunk is the size of the bodies readPacket reads at once, and the
// first buffer of a larger one.
const bodyChunk = 16 << 10

func unexpectedEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// decoder reads the fields of a packet's body. The first fault sticks:
// later reads return zero values, and err says what was wrong first.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = malformed(format, args...)
	}
}

func (d *decoder) take(n int, what string) []byte {
	if d.err != nil {
		return nil
	}
	if n > len(d.b) {
		d.fail("packet ends inside its %s", what)
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) byte(what string) byte {
	if b := d.take(1, what); b != nil {
		return b[0]
	}
	return 0
}

func (d *decoder) uint16(what string) uint16 {
	if b := d.take(2, what); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (d *decoder) uint32(what string) uint32 {
	if b := d.take(4, what); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

// varint reads a variable byte integer.
func (d *decoder) varint(what string) int {
	n := 0
	for shift := 0; shift < 28; shift += 7 {
		b := d.byte(what)
		n |= int(b&0x7f) << shift
		if b&0x80 == 0 {
			return n
		}
	}
	d.fail("%s longer than four bytes", what)
	return 0
}

// binary reads two bytes of length and that many bytes.
func (d *decoder) binary(what string) []byte {
	return d.take(int(d.uint16(what)), what)
}

// string reads a UTF-8 string, which MQTT forbids to hold U+0000.
func (d *decoder) string(what string) string {
	b := d.binary(what)
	if d.err == nil && !validString(b) {
		d.fail("%s is not valid UTF-8 without U+0000", what)
	}
	return string(b)
}

func validString(b []byte) bool {
	return bytes.IndexByte(b, 0) < 0 && utf8.Valid(b)
}

// properties are the MQTT 5 properties this broker reads; the others are
// checked for form and skipped.
type properties struct {
	sessionExpiry  uint32
	receiveMaximum uint16
	maxPacketSize  uint32
	topicAlias     uint16
	authMethod     string
	reasonString   string
	subscriptionID bool
}

// Property identifiers.
const (
	propPayloadFormat     = 0x01
	propMessageExpiry     = 0x02
	propContentType       = 0x03
	propResponseTopic     = 0x08
	propCorrelationData   = 0x09
	propSubscriptionID    = 0x0B
	propSessionExpiry     = 0x11
	propAssignedClientID  = 0x12
	propServerKeepAlive   = 0x13
	propAuthMethod        = 0x15
	propAuthData          = 0x16
	propRequestProblem    = 0x17
	propWillDelay         = 0x18
	propRequestResponse   = 0x19
	propReasonString      = 0x1F
	propReceiveMaximum    = 0x21
	propTopicAliasMaximum = 0x22
	propTopicAlias        = 0x23
	propRetainAvailable   = 0x25
	propUserProperty      = 0x26
	propMaximumPacketSize = 0x27
	propWildcardSubs      = 0x28
	propSubscriptionIDs   = 0x29
	propSharedSubs        = 0x2A
)

// properties reads a property list of the packet kind what: its length,
// then each property. A property that does not belong in that packet, or
// that appears twice where once is the rule, is a fault.
func (d *decoder) properties(what string, allowed ...byte) properties {
	var p properties
	// Constant names: one built from what would be allocated for every
	// packet, to be read only if it is malformed.
	n := d.varint("property length")
	list := &decoder{b: d.take(n, "properties")}
	var seen [64]bool
	for list.err == nil && len(list.b) > 0 {
		id := list.byte("property identifier")
		if !slices.Contains(allowed, id) {
			list.err = protocolErr(codeProtocolError, "property %#02x does not belong in %s", id, what)
			break
		}
		if id != propUserProperty && id != propSubscriptionID {
			if seen[id] {
				list.err = protocolErr(codeProtocolError, "property %#02x twice in %s", id, what)
				break
			}
			seen[id] = true
		}
		switch id {
		case propPayloadFormat, propRequestProblem, propRequestResponse:
			if b := list.byte("property"); b > 1 {
				list.err = protocolErr(codeProtocolError, "property %#02x must be 0 or 1", id)
			}
		case propMessageExpiry, propWillDelay:
			list.uint32("property")
		case propSessionExpiry:
			p.sessionExpiry = list.uint32("session expiry interval")
		case propMaximumPacketSize:
			if p.maxPacketSize = list.uint32("maximum packet size"); p.maxPacketSize == 0 && list.err == nil {
				list.err = protocolErr(codeProtocolError, "maximum packet size 0")
			}
		case propReceiveMaximum:
			if p.receiveMaximum = list.uint16("receive maximum"); p.receiveMaximum == 0 && list.err == nil {
				list.err = protocolErr(codeProtocolError, "receive maximum 0")
			}
		case propTopicAliasMaximum:
			list.uint16("topic alias maximum")
		case propTopicAlias:
			p.topicAlias = list.uint16("topic alias")
		case propSubscriptionID:
			list.varint("subscription identifier")
			p.subscriptionID = true
		case propContentType, propResponseTopic:
			list.string("property")
		case propReasonString:
			p.reasonString = list.string("reason string")
		case propAuthMethod:
			p.authMethod = list.string("authentication method")
		case propCorrelationData, propAuthData:
			list.binary("property")
		case propUserProperty:
			list.string("user property name")
			list.string("user property value")
		}
	}
	if d.err == nil {
		d.err = list.err
	}
	return p
}

// connectPacket is a decoded CONNECT.
type connectPacket struct {
	version      byte
	keepalive    uint16
	clientID     string
	username     string
	hasUsername  bool
	password     []byte
	hasPassword  bool
	cleanSession bool // Clean Start in MQTT 5
	hasWill      bool
	willRetain   bool
	willTopic    string
	props        properties
	unsupportedV bool // a protocol level this broker does not speak
}

// decodeConnect reads a CONNECT's body. A protocol level it does not know
// leaves unsupportedV set, so that the device can be told so.
func decodeConnect(body []byte) (*connectPacket, error) {
	d := &decoder{b: body}
	c := &connectPacket{}
	name := d.string("protocol name")
	c.version = d.byte("protocol level")
	if d.err != nil {
		return nil, d.err
	}
	switch {
	case name == "MQTT" && (c.version == version311 || c.version == version5):
	case name == "MQIsdp" && c.version == version31:
	case name == "MQTT" || name == "MQIsdp":
		c.unsupportedV = true
		return c, nil
	default:
		return nil, malformed("protocol name %q is not MQTT", mqtt.Truncate(name, 20))
	}
	flags := d.byte("connect flags")
	c.keepalive = d.uint16("keep alive")
	if d.err != nil {
		return nil, d.err
	}
	if flags&0x01 != 0 {
		return nil, malformed("the reserved connect flag is set")
	}
	c.cleanSession = flags&0x02 != 0
	c.hasWill = flags&0x04 != 0
	willQoS := flags >> 3 & 0x03
	willRetain := flags&0x20 != 0
	c.willRetain = willRetain
	c.hasPassword = flags&0x40 != 0
	c.hasUsername = flags&0x80 != 0
	if !c.hasWill && (willQoS != 0 || willRetain) {
		return nil, malformed("will QoS or retain set without a will")
	}
	if willQoS == 3 {
		return nil, malformed("will QoS 3")
	}
	if c.hasPassword && !c.hasUsername && c.version < version5 {
		return nil, malformed("a password without a username")
	}
	if c.version == version5 {
		c.props = d.properties("CONNECT", propSessionExpiry, propReceiveMaximum, propMaximumPacketSize,
			propTopicAliasMaximum, propRequestResponse, propRequestProblem, propUserProperty, propAuthMethod, propAuthData)
	}
	c.clientID = d.string("client identifier")
	if c.hasWill {
		if c.version == version5 {
			d.properties("will", propWillDelay, propPayloadFormat, propMessageExpiry, propContentType,
				propResponseTopic, propCorrelationData, propUserProperty)
		}
		c.willTopic = d.string("will topic")
		d.binary("will payload")
	}
	if c.hasUsername {
		c.username = d.string("user name")
	}
	if c.hasPassword {
		c.password = d.binary("password")
	}
	if d.err == nil && len(d.b) > 0 {
		d.fail("%d bytes after the end of CONNECT", len(d.b))
	}
	if d.err != nil {
		return nil, d.err
	}
	return c, nil
}

// publishPacket is a decoded PUBLISH.
type publishPacket struct {
	qos     byte
	retain  bool
	topic   string
	id      uint16
	props   properties
	payload []byte
}

func decodePublish(header byte, body []byte, version byte) (*publishPacket, error) {
	p := &publishPacket{qos: header >> 1 & 0x03, retain: header&0x01 != 0}
	if p.qos == 3 {
		return nil, malformed("PUBLISH at QoS 3")
	}
	if p.qos == 0 && header&0x08 != 0 {
		return nil, malformed("DUP set on a QoS 0 PUBLISH")
	}
	d := &decoder{b: body}
	p.topic = d.string("topic name")
	if p.qos > 0 {
		if p.id = d.uint16("packet identifier"); p.id == 0 && d.err == nil {
			return nil, malformed("packet identifier 0")
		}
	}
	if version == version5 {
		p.props = d.properties("PUBLISH", propPayloadFormat, propMessageExpiry, propTopicAlias, propResponseTopic,
			propCorrelationData, propUserProperty, propContentType)
	}
	if d.err != nil {
		return nil, d.err
	}
	p.payload = d.b
	return p, nil
}

// subscription is one topic filter of a SUBSCRIBE.
type subscription struct {
	filter string
	qos    byte
}

// subscribePacket is a decoded SUBSCRIBE or UNSUBSCRIBE (whose filters have
// no QoS).
type subscribePacket struct {
	id      uint16
	props   properties
	filters []subscription
}

// decodeSubscribe decodes a SUBSCRIBE or UNSUBSCRIBE body; handle has
// checked the fixed header's flags.
func decodeSubscribe(body []byte, version byte, unsubscribe bool) (*subscribePacket, error) {
	kind := "SUBSCRIBE"
	if unsubscribe {
		kind = "UNSUBSCRIBE"
	}
	d := &decoder{b: body}
	s := &subscribePacket{id: d.uint16("packet identifier")}
	if s.id == 0 && d.err == nil {
		return nil, malformed("packet identifier 0")
	}
	if version == version5 {
		allowed := []byte{propUserProperty, propSubscriptionID}
		if unsubscribe {
			allowed = allowed[:1]
		}
		s.props = d.properties(kind, allowed...)
	}
	for d.err == nil && len(d.b) > 0 {
		sub := subscription{filter: d.string("topic filter")}
		if !unsubscribe {
			opts := d.byte("subscription options")
			sub.qos = opts & 0x03
			switch {
			case version < version5 && opts&0xfc != 0, opts&0xc0 != 0:
				d.fail("reserved bits of the subscription options are set")
			case sub.qos == 3:
				d.fail("subscription at QoS 3")
			case opts>>4&0x03 == 3:
				d.fail("retain handling 3")
			}
		}
		s.filters = append(s.filters, sub)
	}
	if d.err == nil && len(s.filters) == 0 {
		d.fail("%s without a topic filter", kind)
	}
	if d.err != nil {
		return nil, d.err
	}
	return s, nil
}

// ack is a decoded PUBACK, PUBREC, PUBREL or PUBCOMP.
type ack struct {
	id     uint16
	code   byte   // MQTT 5 reason code; 0 (success) when absent and before MQTT 5
	reason string // MQTT 5 Reason String
}

// decodeAck reads a PUBACK, PUBREC, PUBREL or PUBCOMP: its packet
// identifier and, in MQTT 5, its reason code and Reason String.
func decodeAck(body []byte, version byte) (ack, error) {
	d := &decoder{b: body}
	a := ack{id: d.uint16("packet identifier")}
	if version == version5 && len(d.b) > 0 {
		a.code = d.byte("reason code")
		if len(d.b) > 0 {
			a.reason = d.properties("acknowledgement", propReasonString, propUserProperty).reasonString
		}
	}
	if d.err == nil && len(d.b) > 0 {
		d.fail("%d bytes after the end of an acknowledgement", len(d.b))
	}
	return a, d.err
}

// appendHeader appends a fixed header for a body of n bytes.
func appendHeader(b []byte, first byte, n int) []byte {
	return appendVarint(append(b, first), n)
}

// appendVarint appends n as a variable byte integer.
func appendVarint(b []byte, n int) []byte {
	return binary.AppendUvarint(b, uint64(n)) // MQTT's Variable Byte Integer is a uvarint
}

func appendString(b []byte, s string) []byte {
	return append(binary.BigEndian.AppendUint16(b, uint16(len(s))), s...)
}

// connackProperties are what CONNACK tells an MQTT 5 device.
type connackProperties struct {
	maxPacketSize   uint32
	receiveMaximum  uint16
	serverKeepAlive uint16 // 0: the device's own
	assignedID      string
	sessionExpiry   bool // tell the device its session ends with the connection
}

// appendConnack appends a CONNACK. Sessions never outlive connections here,
// so Session Present is always 0.
func appendConnack(b []byte, version byte, code reasonCode, p *connackProperties) []byte {
	if version < version5 {
		return append(b, typeConnack<<4, 2, 0, v3Connack(code))
	}
	var props []byte
	if p != nil {
		props = append(props, propRetainAvailable, 0, propWildcardSubs, 0, propSharedSubs, 0, propSubscriptionIDs, 0)
		props = binary.BigEndian.AppendUint32(append(props, propMaximumPacketSize), p.maxPacketSize)
		if p.receiveMaximum < 65535 {
			props = binary.BigEndian.AppendUint16(append(props, propReceiveMaximum), p.receiveMaximum)
		}
		if p.serverKeepAlive > 0 {
			props = binary.BigEndian.AppendUint16(append(props, propServerKeepAlive), p.serverKeepAlive)
		}
		if p.assignedID != "" {
			props = appendString(append(props, propAssignedClientID), p.assignedID)
		}
		if p.sessionExpiry {
			props = binary.BigEndian.AppendUint32(append(props, propSessionExpiry), 0)
		}
	}
	b = appendHeader(b, typeConnack<<4, 2+varintLen(len(props))+len(props))
	b = appendVarint(append(b, 0, byte(code)), len(props))
	return append(b, props...)
}

func varintLen(n int) int {
	l := 1
	for n >= 0x80 {
		n >>= 7
		l++
	}
	return l
}

// appendPublish appends a PUBLISH of payload on topic, at QoS 0 or 1 (id
// is then its packet identifier).
func appendPublish(b []byte, version byte, topic string, qos byte, id uint16, payload []byte) []byte {
	b = appendHeader(b, typePublish<<4|qos<<1, publishBodyLen(version, topic, qos, payload))
	b = appendString(b, topic)
	if qos > 0 {
		b = binary.BigEndian.AppendUint16(b, id)
	}
	if version == version5 {
		b = append(b, 0) // no properties
	}
	return append(b, payload...)
}

// publishBodyLen is the remaining length of the PUBLISH appendPublish
// makes.
func publishBodyLen(version byte, topic string, qos byte, payload []byte) int {
	n := 2 + len(topic) + len(payload)
	if qos > 0 {
		n += 2 // packet identifier
	}
	if version == version5 {
		n++ // property length
	}
	return n
}

// publishSize is the size of the PUBLISH appendPublish makes.
func publishSize(version byte, topic string, qos byte, payload []byte) int {
	n := publishBodyLen(version, topic, qos, payload)
	return 1 + varintLen(n) + n
}

// appendAck appends a PUBACK, PUBREC or PUBCOMP with success.
func appendAck(b []byte, typ byte, id uint16) []byte {
	return binary.BigEndian.AppendUint16(append(b, typ<<4, 2), id)
}

// appendRefusal appends a PUBACK or PUBREC that refuses a publish with
// code, for MQTT 5 (a 3.1.1 acknowledgement has no reason code).
func appendRefusal(b []byte, typ byte, id uint16, code reasonCode) []byte {
	return append(binary.BigEndian.AppendUint16(append(b, typ<<4, 3), id), byte(code))
}

// appendSuback appends a SUBACK (or UNSUBACK) with one return or reason
// code per filter. MQTT 3.1.1's UNSUBACK has none.
func appendSuback(b []byte, typ byte, version byte, id uint16, codes []byte) []byte {
	if typ == typeUnsuback && version < version5 {
		codes = nil
	}
	n := 2 + len(codes)
	if version == version5 {
		n++
	}
	b = binary.BigEndian.AppendUint16(appendHeader(b, typ<<4, n), id)
	if version == version5 {
		b = append(b, 0)
	}
	return append(b, codes...)
}

// appendDisconnect appends an MQTT 5 DISCONNECT with a reason.
func appendDisconnect(b []byte, code reasonCode) []byte {
	return append(b, typeDisconnect<<4, 1, byte(code))
}
