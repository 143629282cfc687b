package main

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
	_ "modernc.org/sqlite"
)

// secretSet is every secret a test made or configured, and where each may
// legitimately appear: the answers that hand it out once.
type secretSet struct {
	mu      sync.Mutex
	secrets map[string]string          // secret -> what it is
	allowed map[string]map[string]bool // secret -> "METHOD /path" of answers that may hold it
}

func newSecretSet() *secretSet {
	return &secretSet{secrets: map[string]string{}, allowed: map[string]map[string]bool{}}
}

// add records a secret; allowedIn are the requests whose answers show it.
func (ss *secretSet) add(t *testing.T, what, secret string, allowedIn ...string) {
	t.Helper()
	if len(secret) < 8 {
		t.Fatalf("%s %q is too short to grep for", what, secret)
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.secrets[secret] = what
	if ss.allowed[secret] == nil {
		ss.allowed[secret] = map[string]bool{}
	}
	for _, a := range allowedIn {
		ss.allowed[secret][a] = true
	}
}

// capture is every answer the workload received.
type capture struct {
	mu      sync.Mutex
	answers []capturedAnswer
}

type capturedAnswer struct {
	req  string
	body []byte
	hdr  http.Header
}

func (c *capture) add(req string, r *fleetdtest.Response) *fleetdtest.Response {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.answers = append(c.answers, capturedAnswer{req, r.Body, r.Header})
	return r
}

// TestSecretsNeverLeak runs a broad workload at debug level and greps every
// log line, every answer (but those that hand a secret out once) and every
// audit log for every secret the workload made or configured: API keys,
// device tokens, webhook secrets and credential headers, Slack URLs, the
// SMTP password, JWTs and S9 webhook tokens, signed URL signatures, TLS
// and device private keys, and the server's own signing keys.
func TestSecretsNeverLeak(t *testing.T) {
	t.Parallel()
	ss := newSecretSet()
	cp := &capture{}
	dir := t.TempDir()
	certFile, keyFile := fleetdtest.WriteServerCert(t, dir, "fleetd test")
	tlsKey, _ := os.ReadFile(keyFile)
	ss.add(t, "TLS private key", pemBody(string(tlsKey)))

	// Receivers of notifications: a webhook, a "Slack" whose URL is the
	// credential, one that always fails (so errors get logged), and SMTP
	// that is not there.
	var hookMu sync.Mutex
	var hookSigs []string
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hookMu.Lock()
		hookSigs = append(hookSigs, r.Header.Get("X-Fleet-Signature"))
		hookMu.Unlock()
		io.Copy(io.Discard, r.Body)
	}))
	defer hook.Close()
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no", http.StatusInternalServerError)
	}))
	defer failing.Close()
	const smtpPassword = "smtp-Pa55word-7f3a9"
	ss.add(t, "SMTP password", smtpPassword)

	s := startServer(t, sqlstoretest.Backends()[0], append([]string{
		"--log-level", "debug",
		"--tls-cert", certFile, "--tls-key", keyFile, "--http-tls=false", "--mqtts-addr", "127.0.0.1:0",
		"--smtp-addr", "127.0.0.1:1", "--smtp-from", "fleetd@example.com", "--smtp-username", "fleetd", "--smtp-password", smtpPassword,
		"--smtp-tls", "none",
	}, fleetdtest.AlertFlags...)...)
	ss.add(t, "bootstrap admin key", s.Key)
	admin := s.Admin()
	s.Observe = func(method, path string, r *fleetdtest.Response) { cp.add(method+" "+path, r) }
	do := func(c fleetdtest.Creds, method, path string, body any) *fleetdtest.Response {
		t.Helper()
		return s.Do(t, c, method, path, body)
	}
	send := func(r fleetdtest.Req) *fleetdtest.Response {
		t.Helper()
		return s.Send(t, r)
	}

	// Keys of every role, in two tenants.
	keys := map[string]fleetdtest.Creds{}
	for _, role := range []string{"viewer", "device", "operator", "admin"} {
		var k struct{ Key string }
		do(admin, "POST", "/api/v1/apikeys", map[string]any{"name": "k-" + role, "role": role, "user_email": role + "@example.com"}).Want(t, 201).Decode(t, &k)
		ss.add(t, role+" key", k.Key, "POST /api/v1/apikeys")
		keys[role] = fleetdtest.Creds{Tenant: "default", Key: k.Key}
	}
	beta := s.NewTenant(t, "beta")
	ss.add(t, "beta admin key", beta.Key)

	// Devices: one by one, in bulk, rotated; over MQTT with right and wrong
	// tokens; with a certificate over mutual TLS.
	var d fleetdtest.Device
	do(admin, "POST", "/api/v1/devices", map[string]any{"id": "pump-1", "metadata": map[string]string{"site": "berlin"}}).Want(t, 201).Decode(t, &d)
	ss.add(t, "device token", d.Token, "POST /api/v1/devices")
	var bulk struct{ Devices []struct{ ID, Token string } }
	do(admin, "POST", "/api/v1/devices/bulk", map[string]any{"devices": []any{map[string]any{"id": "pump-2"}, map[string]any{"id": "pump-3"}}}).Want(t, 201).Decode(t, &bulk)
	for _, b := range bulk.Devices {
		ss.add(t, "bulk device token", b.Token, "POST /api/v1/devices/bulk")
	}
	var rotated struct{ Token string }
	do(admin, "POST", "/api/v1/devices/pump-2/token", nil).Want(t, 201).Decode(t, &rotated)
	ss.add(t, "rotated device token", rotated.Token, "POST /api/v1/devices/pump-2/token")
	dev := s.ConnectDevice(t, "default", "pump-1", d.Token)
	if code := connectCode(t, s.MQTTAddr, "127.0.0.1", "default/pump-3", d.Token); code != 0x86 {
		t.Fatalf("another device's token: %#x", code)
	}
	var cert credentials
	do(keys["operator"], "POST", "/api/v1/devices/pump-3/certificate", nil).Want(t, 201).Decode(t, &cert)
	ss.add(t, "device private key", pemBody(cert.DevicePrivateKey), "POST /api/v1/devices/pump-3/certificate")
	if _, err := uplinkDevice(t, s.mqttsAddr(t), "default", "pump-3", cert); err != nil {
		t.Fatal(err)
	}

	// Actions, a firmware update with its signed URL, status reports.
	id := s.Dispatch(t, admin, map[string]any{"action": "reboot", "params": map[string]any{"delay": 1}, "search_type": "default", "device_ids": []string{"pump-1"}})
	dev.Next(t)
	dev.Report(t, map[string]any{"id": fmt.Sprint(id), "state": "Completed", "progress": 100})
	bundle := s.MustUpload(t, admin, fleetdtest.MakeBundle(t, "2.0.0", fleetdtest.Part{Name: "app", Version: "2.0.0", Body: "app"}))
	fw := s.Dispatch(t, keys["operator"], map[string]any{"action": "update_firmware", "params": map[string]any{"version": "2.0.0"}, "search_type": "default", "device_ids": []string{"pump-1"}})
	msg := dev.Next(t)
	var payload struct{ URL string }
	json.Unmarshal([]byte(msg.Payload), &payload)
	u, err := url.Parse(payload.URL)
	if err != nil || u.Query().Get("signature") == "" {
		t.Fatalf("update_firmware payload %s has no signed URL", msg.Payload)
	}
	sig := u.Query().Get("signature")
	// Viewers of the tenant see the params the devices got, URL included:
	// they may download the artifact anyway.
	ss.add(t, "artifact URL signature", sig, "GET /api/v1/devices/pump-1/actions?limit=1000", "GET /api/v1/actions/"+fmt.Sprint(fw), "GET /api/v1/actions")
	resp, err := http.Get(s.URL + u.RequestURI())
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("signed download: %v %v", err, resp)
	}
	resp.Body.Close()
	tampered := strings.Replace(u.RequestURI(), sig, strings.Repeat("A", len(sig)), 1)
	if resp, err := http.Get(s.URL + tampered); err != nil || resp.StatusCode != 401 {
		t.Fatalf("tampered signed download: %v %v", err, resp)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cp.add("GET artifact (tampered)", &fleetdtest.Response{Status: 401, Body: b, Header: resp.Header})
	}
	do(keys["device"], "POST", "/api/v1/devices/action/status", map[string]any{"device_id": "pump-1", "action_id": fw, "state": "Downloading", "progress": 10}).Want(t, 204)
	do(keys["viewer"], "GET", "/api/v1/devices/pump-1/actions?limit=1000", nil).Want(t, 200)
	do(keys["viewer"], "GET", "/api/v1/actions/"+fmt.Sprint(fw), nil).Want(t, 200)
	do(keys["viewer"], "GET", "/api/v1/actions", nil).Want(t, 200)
	do(keys["viewer"], "GET", "/api/v1/firmware-bundles/id/"+bundle.ID, nil).Want(t, 200)

	// Alerts with every channel; the webhook signs with its secret, the
	// headers carry credentials, the Slack URL is one.
	const hookSecret = "whsec-9c1e77aa0b"
	const hookHeader = "Bearer hook-header-tok-51d0"
	slackURL := hook.URL + "/services/T0000/B0000/slackSecretPart8f2"
	ss.add(t, "webhook secret", hookSecret)
	ss.add(t, "webhook credential header", hookHeader)
	ss.add(t, "Slack URL path", "slackSecretPart8f2")
	rule := s.MustAlertRule(t, admin, map[string]any{"name": "hot", "stream": "env", "condition": map[string]any{"field": "temp", "operator": ">", "value": 80}})
	for _, ch := range []map[string]any{
		{"type": "webhook", "url": hook.URL + "/hook?token=querySecret77a", "secret": hookSecret, "headers": map[string]string{"Authorization": hookHeader}},
		{"type": "slack", "url": slackURL},
		{"type": "webhook", "url": failing.URL + "/fail", "secret": hookSecret},
		{"type": "email", "to": []string{"ops@example.com"}},
	} {
		do(admin, "POST", "/api/v1/alert-rules/"+rule.ID+"/alert-notification-rules", map[string]any{"channel_parameters": ch}).Want(t, 201)
	}
	ss.add(t, "webhook URL query secret", "querySecret77a")
	do(keys["device"], "POST", "/api/v1/devices/pump-1/streams/env", fleetdtest.Points(time.Now(), 85)).Want(t, 200)
	var alertID string
	fleetdtest.Eventually(t, "the alert", func() bool {
		if as := s.Alerts(t, admin, "?state=active"); len(as) == 1 {
			alertID = as[0].ID
		}
		return alertID != ""
	})
	fleetdtest.Eventually(t, "the webhooks", func() bool { hookMu.Lock(); defer hookMu.Unlock(); return len(hookSigs) >= 2 })
	fleetdtest.Eventually(t, "failed attempts to be recorded", func() bool {
		r := do(admin, "GET", "/api/v1/alerts/"+alertID+"/notifications", nil).Want(t, 200)
		return strings.Count(string(r.Body), `"error"`) >= 2
	})
	do(keys["viewer"], "GET", "/api/v1/alert-rules/"+rule.ID+"/alert-notification-rules", nil).Want(t, 200)
	var nrs struct {
		NotificationRules []struct{ ID string } `json:"notification_rules"`
	}
	do(keys["viewer"], "GET", "/api/v1/alert-rules/"+rule.ID+"/alert-notification-rules", nil).Want(t, 200).Decode(t, &nrs)
	for _, nr := range nrs.NotificationRules {
		send(fleetdtest.Req{Method: "PUT", Path: "/api/v1/alert-rules/" + rule.ID + "/alert-notification-rules/" + nr.ID, Creds: admin,
			Body: map[string]any{"interval_seconds": 60}, Header: http.Header{"Prefer": {"return=representation"}}})
	}

	// End users: JWTs verified against a JWKS, and an S9 webhook's tokens.
	idp := fleetdtest.NewIdentityProvider(t)
	do(admin, "PUT", "/api/v1/tenants/default/auth", map[string]any{"method": "jwks", "jwks_url": idp.Server.URL, "issuer": "https://id.example.com", "audience": "fleetd"}).Want(t, 204)
	good := idp.Token(t, jwt.MapClaims{"role": "operator"})
	expired := idp.Token(t, jwt.MapClaims{"exp": time.Now().Add(-time.Hour).Unix()})
	ss.add(t, "JWT", good)
	ss.add(t, "expired JWT", expired)
	(s.bearer(t, "default", good, "POST", "/api/v1/devices", map[string]any{"id": "by-jwt"}).Want(t, 201))
	(s.bearer(t, "default", expired, "GET", "/api/v1/devices", nil).Want(t, 401))
	const betaToken = "beta-user-token-c0ffee"
	ss.add(t, "S9 webhook token", betaToken)
	authHook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct{ Token string }
		json.NewDecoder(r.Body).Decode(&body)
		if body.Token == betaToken {
			json.NewEncoder(w).Encode(map[string]string{"user_name": "Grace", "role": "viewer"})
			return
		}
		w.WriteHeader(http.StatusUnauthorized)
	}))
	defer authHook.Close()
	do(beta, "PUT", "/api/v1/tenants/beta/auth", map[string]any{"method": "webhook", "webhook_url": authHook.URL}).Want(t, 204)
	(s.bearer(t, "beta", betaToken, "GET", "/api/v1/devices", nil).Want(t, 200))
	(s.bearer(t, "beta", betaToken+"x", "GET", "/api/v1/devices", nil).Want(t, 401))

	// Secrets sent where they do not belong come back in no error.
	do(fleetdtest.Creds{Tenant: "default", Key: keys["viewer"].Key + "x"}, "GET", "/api/v1/devices", nil).Want(t, 401)
	do(fleetdtest.Creds{Tenant: "beta", Key: keys["viewer"].Key}, "GET", "/api/v1/devices", nil).Want(t, 401)
	do(admin, "POST", "/api/v1/devices", map[string]any{"id": "x", "token": d.Token}).Want(t, 400)
	do(admin, "POST", "/api/v1/devices?key="+url.QueryEscape(keys["admin"].Key), map[string]any{"id": "y"}).Want(t, 400)
	send(fleetdtest.Req{Method: "POST", Path: "/api/v1/devices", Creds: admin, Raw: []byte(`{"id": "` + d.Token + `"`), ContentType: "application/json"})
	send(fleetdtest.Req{Method: "PATCH", Path: "/api/v1/devices/pump-1", Creds: admin, Body: map[string]any{"metadata": map[string]any{"k": 1, "secret": keys["admin"].Key}}})
	do(admin, "DELETE", "/api/v1/apikeys/k-viewer", nil).Want(t, 204)
	do(keys["viewer"], "GET", "/api/v1/devices", nil).Want(t, 401)

	// Broker mode: the broker password and the broker-auth secret.
	brokerLog := brokerModeLogs(t, ss)

	// Server secrets kept in the database: the URL signing key and the
	// device CA's key.
	for name, value := range serverSecrets(t, s.DSN) {
		if strings.Contains(value, "PRIVATE KEY") {
			value = pemBody(value[strings.Index(value, "-----BEGIN PRIVATE KEY"):])
		}
		ss.add(t, "server secret "+name, value)
	}

	// Now look everywhere.
	var audit []string
	for _, c := range []fleetdtest.Creds{admin, beta} {
		r := s.Do(t, c, "GET", "/api/v1/audit-logs?limit=1000", nil).Want(t, 200)
		audit = append(audit, string(r.Body))
	}
	logs := s.Output.String() + brokerLog
	checked := 0
	for secret, what := range ss.secrets {
		for _, line := range strings.Split(logs, "\n") {
			if line == secret {
				continue // printed alone, once, by design: the bootstrap and CLI keys
			}
			if strings.Contains(line, secret) {
				t.Errorf("%s in a log line: %s", what, line)
			}
		}
		for _, a := range audit {
			if strings.Contains(a, secret) {
				t.Errorf("%s in the audit log", what)
			}
		}
		for _, a := range cp.answers {
			if ss.allowed[secret][a.req] {
				continue
			}
			if strings.Contains(string(a.body), secret) {
				t.Errorf("%s in the answer to %s: %s", what, a.req, a.body)
			}
			for k, vs := range a.hdr {
				if strings.Contains(strings.Join(vs, " "), secret) {
					t.Errorf("%s in header %s of the answer to %s", what, k, a.req)
				}
			}
		}
		checked++
	}
	if checked < 20 || len(cp.answers) < 40 || !strings.Contains(logs, "level=DEBUG") {
		t.Fatalf("the workload was too small to prove anything: %d secrets, %d answers", checked, len(cp.answers))
	}
	t.Logf("%d secrets, %d log lines, %d answers, %d bytes of audit log: none leaked",
		checked, strings.Count(logs, "\n"), len(cp.answers), len(strings.Join(audit, "")))
}

// pemBody is the base64 of a PEM block without its armour lines, the part
// that would show if the key were logged in any form.
func pemBody(p string) string {
	var b strings.Builder
	for _, line := range strings.Split(p, "\n") {
		if !strings.HasPrefix(line, "-----") {
			b.WriteString(line)
		}
	}
	s := b.String()
	// Base64 lines are 64 characters; a key logged with its line breaks
	// would still hold its first line whole.
	return s[:min(len(s), 64)]
}

// serverSecrets reads the server's secrets from a SQLite database.
func serverSecrets(t *testing.T, dsn string) map[string]string {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+dsn+"?_pragma=query_only(1)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query("SELECT name, value FROM server_secrets")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var k, v string
		rows.Scan(&k, &v)
		out[k] = v
	}
	if len(out) < 2 {
		t.Fatalf("server secrets %v: want the URL signing key and the device CA", out)
	}
	return out
}

// brokerModeLogs runs fleetd as a client of an external broker that is not
// there, with a broker password and a broker-auth secret, calls the
// broker-auth endpoints with right and wrong secrets at debug level, and
// returns the log.
func brokerModeLogs(t *testing.T, ss *secretSet) string {
	t.Helper()
	const password, secret = "broker-Pa55-e1d2c3", "broker-auth-secret-4b5a"
	ss.add(t, "broker password", password)
	ss.add(t, "broker-auth secret", secret)
	s := startServer(t, sqlstoretest.Backends()[0], "--log-level", "debug",
		"--mqtt-broker", "mqtt://127.0.0.1:1", "--mqtt-username", "fleetd", "--mqtt-password", password, "--broker-auth-secret", secret)
	for _, sec := range []string{secret, secret + "x", ""} {
		body := strings.NewReader(`{"clientid": "c", "username": "default/d", "password": "fdt_nope"}`)
		hr, _ := http.NewRequest("POST", s.URL+"/broker/emqx/authn", body)
		hr.Header.Set("Content-Type", "application/json")
		if sec != "" {
			hr.Header.Set("Authorization", "Bearer "+sec)
		}
		resp, err := http.DefaultClient.Do(hr)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), secret) || strings.Contains(string(b), password) {
			t.Errorf("a broker-auth answer holds a secret: %s", b)
		}
		// mosquitto-go-auth sends the secret in the query.
		resp, err = http.PostForm(s.URL+"/broker/mosquitto/user?secret="+url.QueryEscape(sec), url.Values{"username": {"default/d"}, "password": {"fdt_nope"}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	s.Stop(t)
	return s.Output.String()
}
