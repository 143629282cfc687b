// Package mqtttest holds what the tests of fleetd's device channel share:
// a Handler that records its calls, and a device that speaks MQTT 5.
package mqtttest

import (
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"math/big"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/mqtt"
)

// Wait bounds every wait in the tests; nothing there takes a tenth of it.
const Wait = 10 * time.Second

// Call is one call to a Handler.
type Call struct {
	Tenant, Device, Stream string
	Compression            mqtt.Compression
	ActionID               int64
	Payload                []byte
}

// Handler is an mqtt.Handler that records its calls on channels, for tests
// of the broker and of the external-broker client. Set its fields before the
// server opens.
type Handler struct {
	Mu      sync.Mutex
	Tokens  map[string]string // "tenant/device" -> token; SetToken once the server is open
	AuthErr error             // when set, AuthenticateDevice returns it
	PubErr  error             // when set, HandleStatus, HandleStream and HandleReported return it
	Gate    chan struct{}     // when set, HandleStatus, HandleStream and HandleReported wait for it to close
	// AuthGate, when set, holds AuthenticateDevice until it is closed;
	// AuthHold holds it likewise, but after the token was checked.
	AuthGate, AuthHold chan struct{}

	AuthCalls  atomic.Int64
	Connected  chan Call
	Subscribed chan Call
	Statuses   chan Call
	Streams    chan Call
	Reported   chan Call // HandleReported
	Deltas     chan Call // DeltaSubscribed
	Delivered  chan Call
	Failed     chan Call // ActionFailed; Stream holds the reason

	// Backlog is what the store would hold Queued for each device
	// ("tenant/device"), in action id order; ActionDelivered and
	// ActionFailed take actions out of it, and PendingActions reads it.
	Backlog     map[string][]fleet.ActionMessage
	PendingErr  error         // when set, PendingActions returns it; under Mu
	PendingGate chan struct{} // when set, PendingActions waits for it to close
	Reads       atomic.Int64  // PendingActions calls begun
	ReadsDone   atomic.Int64  // PendingActions calls that have read the backlog
}

// NewHandler returns a Handler that admits acme/dev-1 (token "tok-1"),
// acme/dev-2 ("tok-2") and other/dev-1 ("tok-3").
func NewHandler() *Handler {
	return &Handler{
		Tokens: map[string]string{
			"acme/dev-1":  "tok-1",
			"acme/dev-2":  "tok-2",
			"other/dev-1": "tok-3",
		},
		Connected:  make(chan Call, 100),
		Subscribed: make(chan Call, 100),
		Statuses:   make(chan Call, 100),
		Streams:    make(chan Call, 100),
		Reported:   make(chan Call, 100),
		Deltas:     make(chan Call, 100),
		Delivered:  make(chan Call, 1000),
		Failed:     make(chan Call, 100),
		Backlog:    map[string][]fleet.ActionMessage{},
	}
}

// Queue adds an action to a device's backlog, as a dispatch to a device
// that is offline does.
func (h *Handler) Queue(device string, id int64, payload []byte) {
	h.Mu.Lock()
	defer h.Mu.Unlock()
	b := append(h.Backlog[device], fleet.ActionMessage{ActionID: id, Payload: payload})
	slices.SortFunc(b, func(x, y fleet.ActionMessage) int { return cmp.Compare(x.ActionID, y.ActionID) })
	h.Backlog[device] = b
}

// Settled takes an action out of the backlog.
func (h *Handler) Settled(tenant, device string, id int64) {
	h.Mu.Lock()
	defer h.Mu.Unlock()
	k := tenant + "/" + device
	h.Backlog[k] = slices.DeleteFunc(h.Backlog[k], func(m fleet.ActionMessage) bool { return m.ActionID == id })
}

func (h *Handler) PendingActions(ctx context.Context, tenant, device string, after int64, limit int) ([]fleet.ActionMessage, error) {
	h.Reads.Add(1)
	if h.PendingGate != nil {
		select {
		case <-h.PendingGate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	h.Mu.Lock()
	defer h.Mu.Unlock()
	defer h.ReadsDone.Add(1)
	if h.PendingErr != nil {
		return nil, h.PendingErr
	}
	var out []fleet.ActionMessage
	for _, m := range h.Backlog[tenant+"/"+device] {
		if m.ActionID > after && len(out) < limit {
			out = append(out, m)
		}
	}
	return out, nil
}

func (h *Handler) ActionFailed(tenant, device string, actionID int64, reason string) {
	h.Settled(tenant, device, actionID)
	h.Failed <- Call{Tenant: tenant, Device: device, ActionID: actionID, Stream: reason}
}

func (h *Handler) AuthenticateDevice(ctx context.Context, tenant, device, token string) error {
	h.AuthCalls.Add(1)
	if h.AuthGate != nil {
		select {
		case <-h.AuthGate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if h.AuthErr != nil {
		return h.AuthErr
	}
	h.Mu.Lock()
	want, ok := h.Tokens[tenant+"/"+device]
	h.Mu.Unlock()
	if h.AuthHold != nil {
		select {
		case <-h.AuthHold:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if !ok || want != token {
		return fleet.Errorf(fleet.EUNAUTHENTICATED, "bad device token")
	}
	return nil
}

// SetToken gives a device a new token, or none ("").
func (h *Handler) SetToken(device, token string) {
	h.Mu.Lock()
	defer h.Mu.Unlock()
	if token == "" {
		delete(h.Tokens, device)
		return
	}
	h.Tokens[device] = token
}

func (h *Handler) DeviceConnected(tenant, device string) {
	h.Connected <- Call{Tenant: tenant, Device: device}
}

func (h *Handler) DeviceSubscribed(tenant, device string) {
	h.Subscribed <- Call{Tenant: tenant, Device: device}
}

func (h *Handler) HandleStatus(ctx context.Context, tenant, device string, payload []byte) error {
	h.Statuses <- Call{Tenant: tenant, Device: device, Payload: payload}
	return h.publish(ctx)
}

func (h *Handler) HandleStream(ctx context.Context, tenant, device, stream string, compression mqtt.Compression, payload []byte) error {
	h.Streams <- Call{Tenant: tenant, Device: device, Stream: stream, Compression: compression, Payload: payload}
	return h.publish(ctx)
}

func (h *Handler) HandleReported(ctx context.Context, tenant, device string, payload []byte) error {
	h.Reported <- Call{Tenant: tenant, Device: device, Payload: payload}
	return h.publish(ctx)
}

func (h *Handler) DeltaSubscribed(tenant, device string) {
	h.Deltas <- Call{Tenant: tenant, Device: device}
}

func (h *Handler) publish(ctx context.Context) error {
	if h.Gate != nil {
		select {
		case <-h.Gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return h.PubErr
}

func (h *Handler) ActionDelivered(tenant, device string, actionID int64) {
	h.Settled(tenant, device, actionID)
	h.Delivered <- Call{Tenant: tenant, Device: device, ActionID: actionID}
}

// Context returns a context that ends after Wait.
func Context() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), Wait)
}

// Receive returns the next value from ch, failing the test if none comes.
func Receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(Wait):
		t.Fatalf("timed out waiting for %s", what)
	}
	panic("unreachable")
}

// Quiet asserts that nothing arrives on ch for a moment: the absence of an
// event cannot be awaited, only given time to show. Only the external
// broker's tests (mqtt/bridge) use it, where no event of fleetd's orders
// what the broker does.
func Quiet[T any](t *testing.T, ch <-chan T, what string) {
	t.Helper()
	select {
	case v := <-ch:
		t.Fatalf("got %s too early: %+v", what, v)
	case <-time.After(200 * time.Millisecond):
	}
}

// Device is a device speaking MQTT 5 through paho.golang.
type Device struct {
	*paho.Client
	Received     chan *paho.Publish
	Disconnected chan *paho.Disconnect // DISCONNECT from the server
}

// NewDevice returns a Device on conn, not yet connected (Connect); with
// manualAck the test sends the PUBACKs of actions itself, with Ack.
func NewDevice(conn net.Conn, manualAck bool) *Device {
	c := &Device{
		Received:     make(chan *paho.Publish, 100),
		Disconnected: make(chan *paho.Disconnect, 1),
	}
	c.Client = paho.NewClient(paho.ClientConfig{
		Conn: conn,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){
			func(pr paho.PublishReceived) (bool, error) {
				c.Received <- pr.Packet
				return true, nil
			},
		},
		OnServerDisconnect:         func(d *paho.Disconnect) { c.Disconnected <- d },
		EnableManualAcknowledgment: manualAck,
		SendAcksInterval:           time.Millisecond, // paho's default, 50 ms, would pace the tests that acknowledge one by one
	})
	return c
}

// MustSubscribe subscribes to topic, failing the test if it cannot.
func (c *Device) MustSubscribe(t *testing.T, topic string, qos byte) *paho.Suback {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Wait)
	defer cancel()
	sa, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: topic, QoS: qos}}})
	if err != nil {
		t.Fatalf("subscribe %s: %v", topic, err)
	}
	return sa
}

// Send publishes at QoS 1 and returns when the PUBACK arrived, or the
// error.
func (c *Device) Send(topic string, payload []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), Wait)
	defer cancel()
	// paho keeps an unacknowledged message for a next connection; here the
	// test wants to know that this one got no PUBACK.
	go func() {
		select {
		case <-c.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	pr, err := c.Publish(ctx, &paho.Publish{Topic: topic, QoS: 1, Payload: payload})
	if pr != nil && pr.ReasonCode >= 0x80 {
		return &RefusedError{Code: pr.ReasonCode}
	}
	return err
}

// RefusedError is Send's error when the broker refused the publish in its
// PUBACK.
type RefusedError struct{ Code byte }

func (e *RefusedError) Error() string { return fmt.Sprintf("puback reason code %#x", e.Code) }

// AwaitServerDisconnect waits until the server closed the connection with
// the reason code want.
func (c *Device) AwaitServerDisconnect(t *testing.T, want byte) {
	t.Helper()
	d := Receive(t, c.Disconnected, "DISCONNECT from the server")
	if d.ReasonCode != want {
		t.Errorf("DISCONNECT reason code: got %#x, want %#x", d.ReasonCode, want)
	}
	Receive(t, c.Done(), "connection closed")
}

// message is the payload of action id in these tests.
func Message(id int64) []byte {
	return fmt.Appendf(nil, `{"id": "%d", "name": "x", "payload": "{}"}`, id)
}

// MessageID reads the id back from a payload.
func MessageID(t *testing.T, payload []byte) int64 {
	t.Helper()
	var m struct{ ID string }
	if err := json.Unmarshal(payload, &m); err != nil {
		t.Fatalf("action message %q: %v", payload, err)
	}
	id, err := strconv.ParseInt(m.ID, 10, 64)
	if err != nil {
		t.Fatalf("action message %q: %v", payload, err)
	}
	return id
}

// SelfSigned returns a certificate for 127.0.0.1 and a pool that trusts it.
func SelfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
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
