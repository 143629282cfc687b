package bridge

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/mqtt"
)

// BrokerAuth is the HTTP API an external broker calls to authenticate and
// authorise MQTT clients, in the two shapes common brokers speak: EMQX's
// HTTP authentication and authorisation, and the HTTP backend of
// mosquitto-go-auth (which also fits brokers with a similar plugin). The
// rules are the embedded broker's (docs/device-protocol.md#connecting and
// #topics): username "{tenant}/{device}", the device token as password, a
// device touches only its own topics. fleetd's own credentials (Username,
// Password) make a superuser.
//
// Every request must carry Secret: "Authorization: Bearer <secret>", or
// the header X-Fleetd-Broker-Secret, or, for brokers that cannot send
// headers (mosquitto-go-auth), the query parameter "secret". Without a
// Secret every request is refused.
//
// The calls also tell fleetd when a device arrives, which it cannot see
// otherwise: a successful authentication and the authorisation of the
// device's subscription to its actions topic go to Arrivals, so that what is
// queued for the device is sent once it has subscribed.
type BrokerAuth struct {
	Handler  mqtt.Handler // checks device tokens, records connections
	Arrivals Arrivals     // told of arriving devices; nil tells nobody
	Secret   string
	// Username and Password are fleetd's own credentials at the broker.
	// Empty Username: no superuser.
	Username string
	Password string
	// Timeout bounds a token check; default 4s, under the brokers' own
	// default of 5s.
	Timeout time.Duration
	Logger  *slog.Logger
}

// Arrivals is told when a device arrives at the external broker; *Client
// is one.
type Arrivals interface {
	DeviceArriving(ctx context.Context, tenant, device string, subscribing bool) error
}

// The paths of BrokerAuth, under BrokerAuthPrefix.
const (
	BrokerAuthPrefix    = "/broker/"
	EMQXAuthnPath       = "/broker/emqx/authn"
	EMQXAuthzPath       = "/broker/emqx/authz"
	GoAuthUserPath      = "/broker/mosquitto/user"
	GoAuthSuperuserPath = "/broker/mosquitto/superuser"
	GoAuthACLPath       = "/broker/mosquitto/acl"
)

// The access values mosquitto passes to ACL checks (mosquitto_plugin.h).
const (
	aclRead      = 1 // a message is delivered to the client
	aclWrite     = 2 // the client publishes
	aclSubscribe = 4 // the client subscribes
)

// maxAuthBody bounds a broker's request; theirs are a few hundred bytes.
const maxAuthBody = 64 << 10

func (b *BrokerAuth) logger() *slog.Logger {
	if b.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return b.Logger
}

// verdict is an answer in broker-neutral terms.
type verdict int

const (
	ignore     verdict = iota // not ours to decide: another authenticator may
	allow                     // a device, or fleetd
	deny                      // wrong credentials, or a topic not the device's
	retryLater                // fleetd cannot check now; the device retries
)

// ServeHTTP answers one broker request.
func (b *BrokerAuth) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !b.authorized(r) {
		b.logger().Warn("broker auth: request without the shared secret refused; check --broker-auth-secret and the broker's configuration",
			"path", r.URL.Path, "remote", r.RemoteAddr)
		http.Error(w, "a valid broker secret is required", http.StatusUnauthorized)
		return
	}
	f, err := readFields(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	switch r.URL.Path {
	case EMQXAuthnPath:
		v, super := b.authenticate(r.Context(), f.str("username"), f.str("password"), f.str("clientid"))
		writeEMQX(w, v, &super)
	case EMQXAuthzPath:
		v := b.authorizeAction(r.Context(), f.str("username"), f.str("topic"), f.str("action"))
		writeEMQX(w, v, nil)
	case GoAuthUserPath:
		v, _ := b.authenticate(r.Context(), f.str("username"), f.str("password"), f.str("clientid"))
		writeGoAuth(w, v)
	case GoAuthSuperuserPath:
		v := deny
		if b.isFleetd(f.str("username")) {
			v = allow
		}
		writeGoAuth(w, v)
	case GoAuthACLPath:
		acc, _ := strconv.Atoi(f.str("acc"))
		v := b.authorizeAccess(r.Context(), f.str("username"), f.str("topic"), acc)
		if v == ignore {
			v = deny
		}
		writeGoAuth(w, v)
	default:
		http.NotFound(w, r)
	}
}

// authorized checks the shared secret in constant time.
func (b *BrokerAuth) authorized(r *http.Request) bool {
	if b.Secret == "" {
		return false
	}
	got := r.Header.Get("X-Fleetd-Broker-Secret")
	if h, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && got == "" {
		got = h
	}
	if got == "" {
		got = r.URL.Query().Get("secret")
	}
	return subtle.ConstantTimeCompare([]byte(got), []byte(b.Secret)) == 1
}

func (b *BrokerAuth) isFleetd(username string) bool {
	return b.Username != "" && subtle.ConstantTimeCompare([]byte(username), []byte(b.Username)) == 1
}

// authenticate checks a client's credentials at CONNECT and reports
// whether it is a superuser (fleetd).
func (b *BrokerAuth) authenticate(ctx context.Context, username, password, clientID string) (verdict, bool) {
	if b.isFleetd(username) {
		if b.Password != "" && subtle.ConstantTimeCompare([]byte(password), []byte(b.Password)) == 1 {
			return allow, true
		}
		b.logger().Warn("broker auth: fleetd's username with a wrong password refused", "client_id", mqtt.Truncate(clientID, 200))
		return deny, false
	}
	tenant, device, ok := mqtt.ParseUsername(username)
	if !ok {
		b.logger().Debug("broker auth: not a device's username; left to the broker", "username", mqtt.Truncate(username, 200))
		return ignore, false
	}
	timeout := b.Timeout
	if timeout <= 0 {
		timeout = 4 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := b.Handler.AuthenticateDevice(ctx, tenant, device, password); err != nil {
		if mqtt.Unavailable(ctx, err) {
			b.logger().Warn("broker auth: cannot authenticate device now", "tenant", tenant, "device", device, "err", err)
			return retryLater, false
		}
		b.logger().Info("broker auth: device refused: bad credentials", "tenant", tenant, "device", device,
			"client_id", mqtt.Truncate(clientID, 200), "reason", fleet.ErrorMessage(err))
		return deny, false
	}
	b.Handler.DeviceConnected(tenant, device)
	b.arriving(ctx, tenant, device, false)
	return allow, false
}

// authorizeAction answers EMQX: action is "publish" or "subscribe".
func (b *BrokerAuth) authorizeAction(ctx context.Context, username, topic, action string) verdict {
	switch action {
	case "publish":
		return b.authorizeAccess(ctx, username, topic, aclWrite)
	case "subscribe":
		return b.authorizeAccess(ctx, username, topic, aclSubscribe)
	}
	if b.isFleetd(username) {
		return allow
	}
	if _, _, ok := mqtt.ParseUsername(username); ok {
		return deny
	}
	return ignore
}

// authorizeAccess applies the topic rules of docs/device-protocol.md#topics
// to one access.
func (b *BrokerAuth) authorizeAccess(ctx context.Context, username, topic string, acc int) verdict {
	if b.isFleetd(username) {
		return allow
	}
	tenant, device, ok := mqtt.ParseUsername(username)
	if !ok {
		return ignore
	}
	v := deny
	switch acc {
	case aclRead:
		if mqtt.MaySubscribe(tenant, device, topic) {
			v = allow
		}
	case aclWrite:
		if _, ok := mqtt.MayPublish(tenant, device, topic); ok {
			v = allow
		}
	case aclSubscribe:
		switch mqtt.SubscriptionOf(tenant, device, topic) {
		case mqtt.TopicActions:
			v = allow
			b.arriving(ctx, tenant, device, true)
		case mqtt.TopicShadowDelta:
			// The delta waits for the device as a retained message: its
			// subscription needs nothing of fleetd (docs/device-protocol.md).
			v = allow
		}
	}
	if v == deny {
		b.logger().Warn("broker auth: device refused a topic: it may subscribe only to its actions and shadow delta topics and publish only on its status, stream and reported-state topics",
			"tenant", tenant, "device", device, "topic", mqtt.Truncate(topic, 200), "access", acc)
	}
	return v
}

// arriving tells Arrivals of a device; a failure is logged, not refused:
// the device is who it says, it only waits for its next arrival.
func (b *BrokerAuth) arriving(ctx context.Context, tenant, device string, subscribing bool) {
	if b.Arrivals == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := b.Arrivals.DeviceArriving(ctx, tenant, device, subscribing); err != nil {
		b.logger().Warn("broker auth: record a device's arrival; its queued actions wait for its next one", "tenant", tenant, "device", device, "err", err)
	}
}

// writeEMQX answers in EMQX 5's shape: 200 with a JSON result. super is
// set for authentication only. retryLater is a 503, which EMQX treats as
// ignore: the next authenticator, else a refusal the device retries.
func writeEMQX(w http.ResponseWriter, v verdict, super *bool) {
	if v == retryLater {
		http.Error(w, "fleetd cannot check credentials now", http.StatusServiceUnavailable)
		return
	}
	body := map[string]any{"result": map[verdict]string{allow: "allow", deny: "deny", ignore: "ignore"}[v]}
	if super != nil {
		body["is_superuser"] = *super
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	json.NewEncoder(w).Encode(body)
}

// writeGoAuth answers mosquitto-go-auth, whose HTTP backend reads the
// status: 200 allows, another 4xx denies, a 5xx is an error (also a
// refusal, logged by the broker). The body "ok" also satisfies its "text"
// response mode.
func writeGoAuth(w http.ResponseWriter, v verdict) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	switch v {
	case allow:
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "ok")
	case retryLater:
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, "unavailable")
	default:
		w.WriteHeader(http.StatusForbidden)
		io.WriteString(w, "denied")
	}
}

// fields are a broker request's parameters: a JSON object (both brokers'
// default), a form (mosquitto-go-auth's "form" mode), or the query string
// (a GET). Unknown parameters are ignored: brokers add their own.
type fields map[string]string

func (f fields) str(k string) string { return f[k] }

func readFields(r *http.Request) (fields, error) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxAuthBody+1))
	if err != nil {
		return nil, err
	}
	if len(body) > maxAuthBody {
		return nil, errTooLarge
	}
	f := fields{}
	for k, v := range r.URL.Query() {
		if k != "secret" && len(v) > 0 {
			f[k] = v[0]
		}
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		return f, nil
	}
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if mt == "application/x-www-form-urlencoded" {
		vals, err := url.ParseQuery(string(body))
		if err != nil {
			return nil, err
		}
		for k, v := range vals {
			if len(v) > 0 {
				f[k] = v[0]
			}
		}
		return f, nil
	}
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, errNotJSON
	}
	for k, v := range m {
		switch v := v.(type) {
		case string:
			f[k] = v
		case float64:
			f[k] = strconv.FormatFloat(v, 'f', -1, 64)
		case bool:
			f[k] = strconv.FormatBool(v)
		}
	}
	return f, nil
}

type authError string

func (e authError) Error() string { return string(e) }

const (
	errTooLarge authError = "request body too large"
	errNotJSON  authError = "the body must be a JSON object or a form"
)
