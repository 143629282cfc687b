package bridge_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/mqtt/bridge"
	"github.com/fleetd/fleet/mqtt/mqtttest"
)

const brokerSecret = "s3cret"

// arrivals records what BrokerAuth tells of arriving devices.
type arrivals struct {
	mu  sync.Mutex
	got []string
}

func (a *arrivals) DeviceArriving(_ context.Context, tenant, device string, subscribing bool) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	kind := "connect"
	if subscribing {
		kind = "subscribe"
	}
	a.got = append(a.got, tenant+"/"+device+" "+kind)
	return nil
}

func (a *arrivals) take() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	got := a.got
	a.got = nil
	return got
}

func newBrokerAuth(t *testing.T) (*httptest.Server, *mqtttest.Handler, *arrivals) {
	t.Helper()
	h := mqtttest.NewHandler()
	a := &arrivals{}
	srv := httptest.NewServer(&bridge.BrokerAuth{Handler: h, Arrivals: a, Secret: brokerSecret, Username: "fleetd", Password: "fleetd-pw"})
	t.Cleanup(srv.Close)
	return srv, h, a
}

// emqx sends a request as EMQX 5 does with the configuration of
// docs/operations.md: POST, a JSON body from its template, the secret in a
// header, and returns the status and the decoded body.
func emqx(t *testing.T, srv *httptest.Server, path, secret string, body map[string]any) (int, map[string]any) {
	t.Helper()
	b, _ := json.Marshal(body)
	rq, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(string(b)))
	rq.Header.Set("Content-Type", "application/json")
	rq.Header.Set("Accept", "application/json")
	if secret != "" {
		rq.Header.Set("Authorization", "Bearer "+secret)
	}
	resp, err := http.DefaultClient.Do(rq)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if resp.StatusCode == http.StatusOK {
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Fatalf("%s: Content-Type %q, EMQX wants application/json", path, ct)
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
	}
	return resp.StatusCode, out
}

// goAuth sends a request as mosquitto-go-auth's HTTP backend does
// (backends/http.go): POST, in "json" params mode a JSON object with
// Content-Type application/json and its User-Agent, in "form" mode a form;
// the secret in the URI's query, the only place it can configure. It
// returns the status: 200 allows, anything else refuses.
func goAuth(t *testing.T, srv *httptest.Server, path string, form bool, params map[string]any) int {
	t.Helper()
	uri := srv.URL + path + "?secret=" + url.QueryEscape(brokerSecret)
	var resp *http.Response
	var err error
	if form {
		vals := url.Values{}
		for k, v := range params {
			vals.Set(k, strings.Trim(mustJSON(v), `"`))
		}
		resp, err = http.PostForm(uri, vals)
	} else {
		rq, _ := http.NewRequest(http.MethodPost, uri, strings.NewReader(mustJSON(params)))
		rq.Header.Set("Content-Type", "application/json")
		rq.Header.Set("User-Agent", "mosquitto-go-auth-2.1.0")
		resp, err = http.DefaultClient.Do(rq)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusOK && string(body) != "ok" {
		t.Fatalf("%s: 200 with body %q; go-auth's text mode wants ok", path, body)
	}
	return resp.StatusCode
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func TestBrokerAuthSecret(t *testing.T) {
	srv, h, _ := newBrokerAuth(t)
	login := map[string]any{"clientid": "dev-1", "username": "acme/dev-1", "password": "tok-1"}
	for _, secret := range []string{"", "wrong", brokerSecret + "x"} {
		if code, _ := emqx(t, srv, bridge.EMQXAuthnPath, secret, login); code != http.StatusUnauthorized {
			t.Errorf("secret %q: status %d, want 401", secret, code)
		}
	}
	// The header fleetd documents for brokers that name their own.
	rq, _ := http.NewRequest(http.MethodPost, srv.URL+bridge.EMQXAuthnPath, strings.NewReader(mustJSON(login)))
	rq.Header.Set("X-Fleetd-Broker-Secret", brokerSecret)
	resp, err := http.DefaultClient.Do(rq)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("X-Fleetd-Broker-Secret: status %d", resp.StatusCode)
	}
	if n := h.AuthCalls.Load(); n != 1 {
		t.Errorf("%d token checks; requests without the secret must not reach the store", n)
	}

	// No secret configured: everything is refused, whatever is sent.
	open := httptest.NewServer(&bridge.BrokerAuth{Handler: h})
	defer open.Close()
	if code, _ := emqx(t, open, bridge.EMQXAuthnPath, "", login); code != http.StatusUnauthorized {
		t.Errorf("no secret configured: status %d, want 401", code)
	}
}

func TestBrokerAuthEMQX(t *testing.T) {
	srv, h, arr := newBrokerAuth(t)
	authn := func(username, password string) (int, map[string]any) {
		// The body template of docs/operations.md.
		return emqx(t, srv, bridge.EMQXAuthnPath, brokerSecret, map[string]any{
			"clientid": "c-1", "username": username, "password": password, "peerhost": "10.0.0.7",
		})
	}
	for _, tc := range []struct {
		username, password string
		result             string
		super              bool
	}{
		{"acme/dev-1", "tok-1", "allow", false},
		{"acme/dev-1", "tok-2", "deny", false},
		{"acme/nobody", "tok-1", "deny", false},
		{"fleetd", "fleetd-pw", "allow", true},
		{"fleetd", "tok-1", "deny", false},
		{"dashboard", "x", "ignore", false}, // not fleetd's to decide
		{"", "", "ignore", false},
	} {
		code, body := authn(tc.username, tc.password)
		if code != http.StatusOK || body["result"] != tc.result || body["is_superuser"] != tc.super {
			t.Errorf("authn %q/%q: %d %v, want result %s, is_superuser %v", tc.username, tc.password, code, body, tc.result, tc.super)
		}
	}
	if got := arr.take(); len(got) != 1 || got[0] != "acme/dev-1 connect" {
		t.Errorf("arrivals %v, want the one device that authenticated", got)
	}
	if got := mqtttest.Receive(t, h.Connected, "DeviceConnected"); got.Device != "dev-1" {
		t.Errorf("DeviceConnected(%+v)", got)
	}

	authz := func(username, topic, action string) string {
		code, body := emqx(t, srv, bridge.EMQXAuthzPath, brokerSecret, map[string]any{
			"clientid": "c-1", "username": username, "topic": topic, "action": action, "qos": 1, "retain": false,
		})
		if code != http.StatusOK {
			t.Fatalf("authz: status %d", code)
		}
		return body["result"].(string)
	}
	for _, tc := range []struct{ username, topic, action, want string }{
		{"acme/dev-1", "/tenants/acme/devices/dev-1/actions", "subscribe", "allow"},
		{"acme/dev-1", "/tenants/acme/devices/dev-1/action/status", "publish", "allow"},
		{"acme/dev-1", "/tenants/acme/devices/dev-1/events/gps/jsonarray", "publish", "allow"},
		{"acme/dev-1", "/tenants/acme/devices/dev-1/actions", "publish", "deny"},
		{"acme/dev-1", "/tenants/acme/devices/dev-1/action/status", "subscribe", "deny"},
		{"acme/dev-1", "/tenants/acme/devices/dev-2/actions", "subscribe", "deny"},
		{"acme/dev-1", "/tenants/other/devices/dev-1/action/status", "publish", "deny"},
		{"acme/dev-1", "/tenants/acme/devices/+/actions", "subscribe", "deny"},
		{"acme/dev-1", "#", "subscribe", "deny"},
		{"acme/dev-1", "$SYS/#", "subscribe", "deny"},
		{"acme/dev-1", "$share/g//tenants/acme/devices/dev-1/actions", "subscribe", "deny"},
		{"acme/dev-1", "/tenants/acme/devices/dev-1/actions", "all", "deny"},
		{"fleetd", "$share/fleetd//tenants/+/devices/+/action/status", "subscribe", "allow"},
		{"fleetd", "/tenants/acme/devices/dev-1/actions", "publish", "allow"},
		{"dashboard", "anything", "subscribe", "ignore"},
	} {
		if got := authz(tc.username, tc.topic, tc.action); got != tc.want {
			t.Errorf("authz %s %s %s = %s, want %s", tc.username, tc.action, tc.topic, got, tc.want)
		}
	}
	if got := arr.take(); len(got) != 1 || got[0] != "acme/dev-1 subscribe" {
		t.Errorf("arrivals %v, want the subscription to the actions topic", got)
	}

	t.Run("Unavailable", func(t *testing.T) {
		h.AuthErr = fleet.Errorf(fleet.EUNAVAILABLE, "database down")
		defer func() { h.AuthErr = nil }()
		// 503: EMQX treats it as "ignore" and the device, refused, retries.
		if code, _ := authn("acme/dev-1", "tok-1"); code != http.StatusServiceUnavailable {
			t.Errorf("status %d, want 503", code)
		}
	})
}

func TestBrokerAuthMosquittoGoAuth(t *testing.T) {
	srv, h, arr := newBrokerAuth(t)
	for _, form := range []bool{false, true} {
		mode := map[bool]string{false: "json", true: "form"}[form]
		t.Run(mode, func(t *testing.T) {
			user := func(username, password string) int {
				return goAuth(t, srv, bridge.GoAuthUserPath, form, map[string]any{"username": username, "password": password, "clientid": "c-1"})
			}
			for _, tc := range []struct {
				username, password string
				want               int
			}{
				{"acme/dev-1", "tok-1", 200},
				{"acme/dev-1", "tok-2", 403},
				{"fleetd", "fleetd-pw", 200},
				{"fleetd", "", 403},
				{"dashboard", "x", 403},
			} {
				if got := user(tc.username, tc.password); got != tc.want {
					t.Errorf("user %q/%q: %d, want %d", tc.username, tc.password, got, tc.want)
				}
			}
			if got := arr.take(); len(got) != 1 || got[0] != "acme/dev-1 connect" {
				t.Errorf("arrivals %v", got)
			}
			mqtttest.Receive(t, h.Connected, "DeviceConnected")

			super := func(username string) int {
				return goAuth(t, srv, bridge.GoAuthSuperuserPath, form, map[string]any{"username": username})
			}
			if super("fleetd") != 200 || super("acme/dev-1") != 403 || super("") != 403 {
				t.Errorf("superuser: fleetd %d, device %d, empty %d", super("fleetd"), super("acme/dev-1"), super(""))
			}

			acl := func(username, topic string, acc int) int {
				return goAuth(t, srv, bridge.GoAuthACLPath, form, map[string]any{"username": username, "clientid": "c-1", "topic": topic, "acc": acc})
			}
			for _, tc := range []struct {
				username, topic string
				acc, want       int
			}{
				{"acme/dev-1", "/tenants/acme/devices/dev-1/actions", 4, 200},               // SUBSCRIBE
				{"acme/dev-1", "/tenants/acme/devices/dev-1/actions", 1, 200},               // each action delivered
				{"acme/dev-1", "/tenants/acme/devices/dev-1/action/status", 2, 200},         // publish
				{"acme/dev-1", "/tenants/acme/devices/dev-1/events/gps/jsonarray", 2, 200},  // publish
				{"acme/dev-1", "/tenants/acme/devices/dev-1/actions", 2, 403},               // publish to its own actions
				{"acme/dev-1", "/tenants/acme/devices/dev-1/action/status", 1, 403},         // read its own status
				{"acme/dev-1", "/tenants/acme/devices/dev-1/actions", 3, 403},               // read and write
				{"acme/dev-1", "/tenants/acme/devices/dev-2/actions", 4, 403},               // another device
				{"acme/dev-1", "/tenants/acme/devices/dev-2/events/gps/jsonarray", 2, 403},  // another device
				{"acme/dev-1", "/tenants/acme/devices/#", 4, 403},                           // wildcard
				{"fleetd", "$share/fleetd//tenants/+/devices/+/events/+/jsonarray", 4, 200}, // fleetd
				{"dashboard", "/tenants/acme/devices/dev-1/actions", 4, 403},                // not a device
			} {
				if got := acl(tc.username, tc.topic, tc.acc); got != tc.want {
					t.Errorf("acl %s %s acc %d: %d, want %d", tc.username, tc.topic, tc.acc, got, tc.want)
				}
			}
			if got := arr.take(); len(got) != 1 || got[0] != "acme/dev-1 subscribe" {
				t.Errorf("arrivals %v, want the subscription only", got)
			}
		})
	}
	t.Run("Unavailable", func(t *testing.T) {
		h.AuthErr = fleet.Errorf(fleet.EUNAVAILABLE, "database down")
		defer func() { h.AuthErr = nil }()
		// A 5xx is an error to go-auth: refused and logged by the broker.
		if got := goAuth(t, srv, bridge.GoAuthUserPath, false, map[string]any{"username": "acme/dev-1", "password": "tok-1", "clientid": "c"}); got != 503 {
			t.Errorf("status %d, want 503", got)
		}
	})
}
