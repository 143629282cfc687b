package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"html"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/pki"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// browser is an HTTP client that keeps cookies and follows no redirect,
// as a test's stand-in for a person's browser where no script is needed.
type browser struct {
	t      *testing.T
	base   string
	client *http.Client
}

func newBrowser(t *testing.T, base string) *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{t: t, base: base, client: &http.Client{Jar: jar, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// page is an answer of the console.
type page struct {
	Status int
	Header http.Header
	Body   string
}

func (b *browser) do(method, path string, form url.Values, header ...string) page {
	b.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	rq, err := http.NewRequest(method, b.base+path, body)
	if err != nil {
		b.t.Fatal(err)
	}
	if form != nil {
		rq.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for i := 0; i+1 < len(header); i += 2 {
		rq.Header.Set(header[i], header[i+1])
	}
	res, err := b.client.Do(rq)
	if err != nil {
		b.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	text, _ := io.ReadAll(res.Body)
	return page{res.StatusCode, res.Header, string(text)}
}

func (b *browser) get(path string) page { b.t.Helper(); return b.do("GET", path, nil) }

// copyTo is another browser, on base, with b's console cookies, as someone
// who copied them.
func (b *browser) copyTo(base string) *browser {
	c := newBrowser(b.t, base)
	from, _ := url.Parse(b.base + "/console/")
	to, _ := url.Parse(base + "/console/")
	c.client.Jar.SetCookies(to, b.client.Jar.Cookies(from))
	return c
}

func (p page) want(t *testing.T, status int) page {
	t.Helper()
	if p.Status != status {
		t.Fatalf("status %d, want %d; page:\n%s", p.Status, status, p.Body)
	}
	return p
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf returns the token of the page's forms.
func (p page) csrf(t *testing.T) string {
	t.Helper()
	m := csrfField.FindStringSubmatch(p.Body)
	if m == nil {
		t.Fatalf("no csrf field in the page:\n%s", p.Body)
	}
	return m[1]
}

// events opens an event stream of the console and returns what reads its
// next event's data; the stream closes when the test ends.
func (b *browser) events(t *testing.T, path string) func() string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	rq, _ := http.NewRequestWithContext(ctx, "GET", b.base+path, nil)
	res, err := b.client.Do(rq)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Body.Close() })
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("%s answered %d %s", path, res.StatusCode, res.Header.Get("Content-Type"))
	}
	events := bufio.NewScanner(res.Body)
	events.Buffer(nil, 1<<20)
	return func() string {
		t.Helper()
		for events.Scan() {
			if d, ok := strings.CutPrefix(events.Text(), "data: "); ok {
				return d
			}
		}
		t.Fatalf("the stream %s ended: %v", path, events.Err())
		return ""
	}
}

// signIn signs b in with a tenant and key and returns the overview.
func (b *browser) signIn(tenant, key string) page {
	b.t.Helper()
	tok := b.get("/console/signin").want(b.t, 200).csrf(b.t)
	res := b.do("POST", "/console/signin", url.Values{"csrf": {tok}, "tenant": {tenant}, "key": {key}})
	if res.Status != http.StatusSeeOther {
		b.t.Fatalf("sign-in answered %d:\n%s", res.Status, res.Body)
	}
	return b.get("/console/").want(b.t, 200)
}

// TestConsole covers what needs no script: sessions, CSRF, roles, tenant
// isolation, escaping, the security headers and the event stream.
func TestConsole(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, be sqlstoretest.Backend) {
		// MQTT over TLS, so that devices can be issued certificates.
		certFile, keyFile := writeServerCert(t, t.TempDir(), "fleetd test")
		s := startServer(t, be, "--tls-cert", certFile, "--tls-key", keyFile, "--http-tls=false", "--mqtts-addr", "127.0.0.1:0")
		admin := s.Admin()
		operator := s.NewKey(t, admin, "olivia", "operator")
		viewer := s.NewKey(t, admin, "victor", "viewer")
		device := s.NewKey(t, admin, "gateway", "device")
		s.Do(t, admin, "POST", "/api/v1/devices", map[string]any{"id": "dev-1", "metadata": map[string]any{"note": "<script>alert(1)</script>"}}).Want(t, 201)
		other := s.NewTenant(t, "other")
		s.Do(t, other, "POST", "/api/v1/devices", map[string]any{"id": "theirs"}).Want(t, 201)
		var theirs struct{ ID int64 }
		s.Do(t, other, "POST", "/api/v1/actions", map[string]any{"action": "reboot", "params": map[string]any{}, "search_type": "all"}).Want(t, 201).Decode(t, &theirs)

		t.Run("RootLeadsToSignIn", func(t *testing.T) {
			b := newBrowser(t, s.URL)
			if res := b.get("/"); res.Status != http.StatusSeeOther || res.Header.Get("Location") != "/console/" {
				t.Fatalf("GET / answered %d to %q", res.Status, res.Header.Get("Location"))
			}
			res := b.get("/console/devices?search=x")
			if loc := res.Header.Get("Location"); res.Status != http.StatusSeeOther || loc != "/console/signin?next="+url.QueryEscape("/console/devices?search=x") {
				t.Fatalf("an anonymous page answered %d to %q", res.Status, loc)
			}
			// The API keeps its own answers beside the console.
			s.Send(t, req{Method: "GET", Path: "/api/v1/nothing"}).Want(t, 404)
		})

		t.Run("SignIn", func(t *testing.T) {
			b := newBrowser(t, s.URL)
			res := b.get("/console/signin").want(t, 200)
			csp := res.Header.Get("Content-Security-Policy")
			if !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") || !strings.Contains(csp, "frame-ancestors 'none'") {
				t.Errorf("Content-Security-Policy %q", csp)
			}
			tok := res.csrf(t)
			for _, bad := range []url.Values{
				{"tenant": {"default"}, "key": {"fk_wrong"}},
				{"tenant": {"nobody"}, "key": {operator.Key}},
			} {
				// Each answer is a new form with a new token.
				bad.Set("csrf", tok)
				res := b.do("POST", "/console/signin", bad).want(t, 401)
				if !strings.Contains(res.Body, "do not match") || strings.Contains(res.Body, operator.Key) {
					t.Errorf("a refused sign-in says:\n%s", res.Body)
				}
				tok = res.csrf(t)
			}
			b.do("POST", "/console/signin", url.Values{"csrf": {"forged"}, "tenant": {"default"}, "key": {operator.Key}}).want(t, 403)
			newBrowser(t, s.URL).do("POST", "/console/signin", url.Values{"csrf": {tok}, "tenant": {"default"}, "key": {operator.Key}}).want(t, 403)
			b.do("POST", "/console/signin", url.Values{"csrf": {tok}, "tenant": {"default"}, "key": {device.Key}}).want(t, 403)
			tok = b.get("/console/signin").csrf(t)
			b.do("POST", "/console/signin", url.Values{"csrf": {tok}, "tenant": {"default"}, "key": {operator.Key}}, "Origin", "https://evil.example").want(t, 403)

			tok = b.get("/console/signin").csrf(t)
			res = b.do("POST", "/console/signin", url.Values{"csrf": {tok}, "tenant": {"default"}, "key": {operator.Key}, "next": {"//evil.example/"}})
			if res.Status != http.StatusSeeOther || res.Header.Get("Location") != "/console/" {
				t.Fatalf("sign-in answered %d to %q", res.Status, res.Header.Get("Location"))
			}
			ck := res.Header.Get("Set-Cookie")
			for _, want := range []string{"fleetd_console=", "HttpOnly", "SameSite=Lax", "Path=/console/", "Max-Age="} {
				if !strings.Contains(ck, want) {
					t.Errorf("session cookie %q lacks %s", ck, want)
				}
			}
			if strings.Contains(ck, operator.Key) {
				t.Errorf("the session cookie shows the key")
			}
			if body := b.get("/console/").want(t, 200).Body; !strings.Contains(body, "olivia") || strings.Contains(body, operator.Key) {
				t.Errorf("the overview does not show who signed in, or shows the key")
			}
		})

		t.Run("Escaping", func(t *testing.T) {
			b := newBrowser(t, s.URL)
			b.signIn("default", viewer.Key)
			for _, p := range []string{"/console/devices", "/console/devices/dev-1"} {
				body := b.get(p).want(t, 200).Body
				if strings.Contains(body, "<script>alert(1)") || !strings.Contains(body, html.EscapeString("<script>alert(1)</script>")) {
					t.Errorf("%s does not escape the metadata", p)
				}
			}
		})

		t.Run("CSRF", func(t *testing.T) {
			b := newBrowser(t, s.URL)
			tok := b.signIn("default", operator.Key).csrf(t)
			b.do("POST", "/console/devices/dev-1/token", url.Values{}).want(t, 403)
			b.do("POST", "/console/devices/dev-1/token", url.Values{"csrf": {"forged"}}).want(t, 403)
			b.do("POST", "/console/devices/dev-1/token", url.Values{"csrf": {tok}}, "Origin", "https://evil.example").want(t, 403)
			b.do("POST", "/console/devices/dev-1/token", url.Values{"csrf": {tok}}, "Sec-Fetch-Site", "cross-site").want(t, 403)
			// The same form from the console's own origin works, and shows
			// the new token once, on an answer that is not cached and whose
			// history entry becomes the device page's (console.js).
			res := b.do("POST", "/console/devices/dev-1/token", url.Values{"csrf": {tok}}, "Origin", s.URL).want(t, 200)
			if !strings.Contains(res.Body, "fdt_") {
				t.Errorf("the new token is not shown")
			}
			if cc := res.Header.Get("Cache-Control"); cc != "no-store" {
				t.Errorf("Cache-Control = %q, want no-store", cc)
			}
			if !strings.Contains(res.Body, `data-shown-once="/console/devices/dev-1"`) {
				t.Errorf("the token's answer does not replace its history entry with the device page's")
			}
			if strings.Contains(b.get("/console/devices/dev-1").Body, "fdt_") {
				t.Errorf("the token is shown again")
			}
		})

		t.Run("DevicePage", func(t *testing.T) {
			s.Do(t, device, "POST", "/api/v1/devices/dev-1/streams/env",
				[]map[string]any{{"timestamp": time.Now().UnixMilli(), "sequence": 1, "temp": 21.5, "label": "<b>warm</b>"}}).Want(t, 200)
			v := newBrowser(t, s.URL)
			v.signIn("default", viewer.Key)
			body := v.get("/console/devices/dev-1").want(t, 200).Body
			for _, want := range []string{"Latest stream values", "21.5", html.EscapeString(`"<b>warm</b>"`), "no client certificate"} {
				if !strings.Contains(body, want) {
					t.Errorf("a device page does not show %q", want)
				}
			}
			if strings.Contains(body, "<b>warm") || strings.Contains(body, "Issue a certificate") {
				t.Errorf("the device page shows a stream value unescaped or offers a viewer a certificate")
			}

			b := newBrowser(t, s.URL)
			tok := b.signIn("default", operator.Key).csrf(t)
			body = b.do("POST", "/console/devices/dev-1/certificate", url.Values{"csrf": {tok}}, "Origin", s.URL).want(t, 200).Body
			if !strings.Contains(body, "BEGIN PRIVATE KEY") {
				t.Fatalf("issuing a certificate does not show its key")
			}
			if !strings.Contains(body, `data-shown-once="/console/devices/dev-1"`) {
				t.Errorf("the private key's answer does not replace its history entry with the device page's")
			}
			// The page describes the certificate it just handed out.
			m := regexp.MustCompile(`(?s)id="device_certificate"[^>]*>(.*?)</textarea>`).FindStringSubmatch(body)
			if m == nil {
				t.Fatalf("no certificate on the page")
			}
			blk, _ := pem.Decode([]byte(html.UnescapeString(m[1])))
			if blk == nil {
				t.Fatalf("the certificate shown is not PEM")
			}
			cert, err := x509.ParseCertificate(blk.Bytes)
			if err != nil {
				t.Fatal(err)
			}
			sum := sha256.Sum256(cert.Raw)
			body = b.get("/console/devices/dev-1").want(t, 200).Body
			for _, want := range []string{hex.EncodeToString(sum[:]), pki.SerialHex(cert.SerialNumber), html.EscapeString(cert.Subject.String()), "Issue a new certificate"} {
				if !strings.Contains(body, want) {
					t.Errorf("the device page does not show the certificate's %q", want)
				}
			}
			if strings.Contains(body, "PRIVATE KEY") {
				t.Errorf("the private key is shown again")
			}
			b.do("POST", "/console/devices/dev-1/token", url.Values{"csrf": {tok}}, "Origin", s.URL).want(t, 200)
			if body := b.get("/console/devices/dev-1").Body; !strings.Contains(body, "no client certificate") {
				t.Errorf("a token rotation left the certificate on the page")
			}
			v.do("POST", "/console/devices/dev-1/certificate", url.Values{"csrf": {v.get("/console/").csrf(t)}}).want(t, 403)
		})

		t.Run("Roles", func(t *testing.T) {
			b := newBrowser(t, s.URL)
			tok := b.signIn("default", viewer.Key).csrf(t)
			if body := b.get("/console/devices/dev-1").want(t, 200).Body; strings.Contains(body, "Rotate token") {
				t.Errorf("a viewer is offered token rotation")
			}
			b.get("/console/actions/new").want(t, 403)
			b.do("POST", "/console/devices/dev-1/token", url.Values{"csrf": {tok}}).want(t, 403)
			b.do("POST", "/console/actions/new", url.Values{"csrf": {tok}, "action": {"reboot"}, "search_type": {"all"}, "params": {"{}"}}).want(t, 403)
		})

		t.Run("TenantIsolation", func(t *testing.T) {
			b := newBrowser(t, s.URL)
			b.signIn("default", admin.Key)
			b.get("/console/devices/theirs").want(t, 404)
			b.get(fmt.Sprintf("/console/actions/%d", theirs.ID)).want(t, 404)
			b.get(fmt.Sprintf("/console/actions/%d/events", theirs.ID)).want(t, 404)
			if body := b.get("/console/devices?search=theirs").Body; strings.Contains(body, `href="/console/devices/theirs"`) {
				t.Errorf("another tenant's device is listed")
			}
			tok := b.get("/console/").csrf(t)
			b.do("POST", fmt.Sprintf("/console/actions/%d/cancel", theirs.ID), url.Values{"csrf": {tok}}).want(t, 404)
		})

		t.Run("DispatchValidatesAsTheAPI", func(t *testing.T) {
			b := newBrowser(t, s.URL)
			tok := b.signIn("default", operator.Key).csrf(t)
			form := url.Values{"csrf": {tok}, "action": {"reboot"}, "params": {"{}"}, "search_type": {"default"}, "device_ids": {"dev-1 ghost"}, "timeout": {"30.5"}}
			res := b.do("POST", "/console/actions/new", form).want(t, 400)
			if !strings.Contains(res.Body, "timeout") {
				t.Errorf("the form does not name the bad field:\n%s", res.Body)
			}
			form.Set("timeout", "60")
			form.Set("preview", "1")
			if res := b.do("POST", "/console/actions/new", form).want(t, 200); !strings.Contains(res.Body, "<strong data-matches>1</strong>") {
				t.Errorf("the preview does not count the one device that exists:\n%s", res.Body)
			}
			form.Del("preview")
			res = b.do("POST", "/console/actions/new", form).want(t, 400)
			if !strings.Contains(res.Body, "ghost") {
				t.Errorf("the unknown device is not named:\n%s", res.Body)
			}
			form.Set("device_ids", "dev-1")
			res = b.do("POST", "/console/actions/new", form)
			if res.Status != http.StatusSeeOther || !strings.HasPrefix(res.Header.Get("Location"), "/console/actions/") {
				t.Fatalf("dispatch answered %d:\n%s", res.Status, res.Body)
			}
			body := b.get(res.Header.Get("Location")).want(t, 200).Body
			if !strings.Contains(body, "reboot") || !strings.Contains(body, "olivia") {
				t.Errorf("the action page does not show the action and who sent it")
			}
		})

		t.Run("LiveProgress", func(t *testing.T) {
			b := newBrowser(t, s.URL)
			b.signIn("default", operator.Key)
			var a struct{ ID int64 }
			s.Do(t, admin, "POST", "/api/v1/actions", map[string]any{"action": "blink", "params": map[string]any{}, "search_type": "default", "device_ids": []string{"dev-1"}}).Want(t, 201).Decode(t, &a)
			next := b.events(t, fmt.Sprintf("/console/actions/%d/events", a.ID))
			if first := next(); !strings.Contains(first, `"Queued":1`) {
				t.Fatalf("first event %s", first)
			}
			s.Do(t, admin, "POST", "/api/v1/devices/action/status", map[string]any{"device_id": "dev-1", "action_id": a.ID, "state": "Completed", "progress": 100}).Want(t, 204)
			if ev := next(); !strings.Contains(ev, `"Completed":1`) {
				t.Fatalf("after the report: %s", ev)
			}
		})

		t.Run("LiveOverview", func(t *testing.T) {
			// Two people watch the overview; both see a new action appear,
			// its progress and its failure, with the failure's text as sent.
			var watchers []func() string
			for range 2 {
				b := newBrowser(t, s.URL)
				b.signIn("default", viewer.Key)
				watchers = append(watchers, b.events(t, "/console/events"))
			}
			var first struct {
				Devices  int `json:"devices"`
				InFlight int `json:"in_flight"`
			}
			for _, next := range watchers {
				if err := json.Unmarshal([]byte(next()), &first); err != nil || first.Devices != 1 {
					t.Fatalf("first overview event: %+v, %v", first, err)
				}
			}
			var a struct{ ID int64 }
			s.Do(t, admin, "POST", "/api/v1/actions", map[string]any{"action": "locate", "params": map[string]any{}, "search_type": "default", "device_ids": []string{"dev-1"}}).Want(t, 201).Decode(t, &a)
			type overview struct {
				InFlight int `json:"in_flight"`
				Actions  []struct {
					ID       int64          `json:"id"`
					Action   string         `json:"action"`
					Statuses map[string]int `json:"statuses"`
				} `json:"actions"`
				Failures []struct {
					ActionID int64  `json:"action_id"`
					Device   string `json:"device"`
					Errors   string `json:"errors"`
				} `json:"failures"`
			}
			// until reads events until one is ok; the stream's 30 s bound fails
			// the test otherwise.
			until := func(next func() string, ok func(o overview) bool) {
				t.Helper()
				for {
					var o overview
					ev := next()
					if err := json.Unmarshal([]byte(ev), &o); err != nil {
						t.Fatalf("overview event %s: %v", ev, err)
					}
					if ok(o) {
						return
					}
				}
			}
			shows := func(o overview, status string) bool {
				for _, x := range o.Actions {
					if x.ID == a.ID && x.Action == "locate" && x.Statuses[status] == 1 {
						return true
					}
				}
				return false
			}
			for _, next := range watchers {
				until(next, func(o overview) bool { return o.InFlight == first.InFlight+1 && shows(o, "Queued") })
			}
			s.Do(t, admin, "POST", "/api/v1/devices/action/status", map[string]any{"device_id": "dev-1", "action_id": a.ID, "state": "Blinking", "progress": 50}).Want(t, 204)
			for _, next := range watchers {
				until(next, func(o overview) bool { return shows(o, "Progress") })
			}
			s.Do(t, admin, "POST", "/api/v1/devices/action/status", map[string]any{"device_id": "dev-1", "action_id": a.ID, "state": "Failed", "errors": []string{"<i>lamp</i> broken"}}).Want(t, 204)
			for _, next := range watchers {
				until(next, func(o overview) bool {
					return len(o.Failures) > 0 && o.Failures[0].ActionID == a.ID && o.Failures[0].Device == "dev-1" && strings.Contains(o.Failures[0].Errors, "<i>lamp</i> broken")
				})
			}
			body := newBrowser(t, s.URL)
			body.signIn("default", viewer.Key)
			page := body.get("/console/").want(t, 200).Body
			if !strings.Contains(page, "Last failures") || !strings.Contains(page, html.EscapeString("<i>lamp</i> broken")) || strings.Contains(page, "<i>lamp") {
				t.Errorf("the overview does not list the failure, escaped")
			}
		})

		t.Run("Firmware", func(t *testing.T) {
			b := newBrowser(t, s.URL)
			tok := b.signIn("default", operator.Key).csrf(t)
			archive := makeBundle(t, "4.2.0", part{name: "app", version: "4.2.0", body: "app firmware"})
			upload := func(fields ...string) page {
				var buf bytes.Buffer
				mw := multipart.NewWriter(&buf)
				for i := 0; i+1 < len(fields); i += 2 {
					if fields[i] == "file" {
						fw, _ := mw.CreateFormFile("file", "fw.tar.gz")
						fw.Write(archive)
					} else {
						mw.WriteField(fields[i], fields[i+1])
					}
				}
				mw.Close()
				rq, _ := http.NewRequest("POST", s.URL+"/console/firmware", &buf)
				rq.Header.Set("Content-Type", mw.FormDataContentType())
				res, err := b.client.Do(rq)
				if err != nil {
					t.Fatal(err)
				}
				defer res.Body.Close()
				text, _ := io.ReadAll(res.Body)
				return page{res.StatusCode, res.Header, string(text)}
			}
			upload("file", "", "csrf", tok).want(t, 403) // the token must come first
			upload("csrf", "forged", "file", "").want(t, 403)
			upload("csrf", tok).want(t, 400)
			res := upload("csrf", tok, "file", "")
			if res.Status != http.StatusSeeOther || !strings.HasPrefix(res.Header.Get("Location"), "/console/firmware/") {
				t.Fatalf("upload answered %d:\n%s", res.Status, res.Body)
			}
			bundle := res.Header.Get("Location")
			body := b.get(bundle).want(t, 200).Body
			if !strings.Contains(body, "4.2.0") || !strings.Contains(body, "Deactivate") {
				t.Fatalf("the bundle page:\n%s", body)
			}
			id := strings.TrimPrefix(bundle, "/console/firmware/")
			b.do("POST", "/console/firmware/components/app/4.2.0", url.Values{"csrf": {tok}, "state": {"deactivated"}, "bundle": {id}}).want(t, 303)
			var fw struct {
				Firmwares []struct {
					IsDeactivated bool `json:"is_deactivated"`
				} `json:"firmwares"`
			}
			s.Do(t, admin, "GET", "/api/v1/firmware-bundles/version/4.2.0", nil).Want(t, 200).Decode(t, &fw)
			if len(fw.Firmwares) != 1 || !fw.Firmwares[0].IsDeactivated {
				t.Fatalf("after Deactivate: %+v", fw)
			}
			b.do("POST", "/console/firmware/components/app/4.2.0", url.Values{"csrf": {tok}, "state": {"maybe"}}).want(t, 400)
			if body := b.get("/console/firmware").want(t, 200).Body; !strings.Contains(body, "4.2.0") {
				t.Errorf("the firmware list does not show the bundle")
			}
			// A viewer sees the list, not the upload form, and cannot upload.
			vb := newBrowser(t, s.URL)
			vtok := vb.signIn("default", viewer.Key).csrf(t)
			if body := vb.get("/console/firmware").want(t, 200).Body; strings.Contains(body, `type="file"`) {
				t.Errorf("a viewer is offered the upload")
			}
			b, tok = vb, vtok
			upload("csrf", tok, "file", "").want(t, 403)
			vb.get("/console/firmware/not-a-uuid").want(t, 404)
		})

		t.Run("Alerts", func(t *testing.T) {
			rule := s.mustAlertRule(t, admin, map[string]any{"name": "<b>hot</b>", "stream": "env", "condition": map[string]any{"field": "temp", "operator": ">", "value": 80}})
			b := newBrowser(t, s.URL)
			tok := b.signIn("default", operator.Key).csrf(t)
			for _, p := range []string{"/console/alerts/rules", "/console/alerts/rules/" + rule.ID, "/console/alerts?rule_id=" + rule.ID} {
				body := b.get(p).want(t, 200).Body
				if !strings.Contains(body, html.EscapeString("<b>hot</b>")) || strings.Contains(body, "<b>hot</b>") {
					t.Fatalf("%s does not show the rule, escaped", p)
				}
			}
			for path, status := range map[string]int{
				"/console/alerts?state=open":            400,
				"/console/alerts?rule_id=x":             400,
				"/console/alerts?device_id=a%20b":       400,
				"/console/alerts/rules/not-a-uuid":      404,
				"/console/alerts/rules?page=0":          400,
				"/console/alerts/rules/" + rule.ID[:35]: 404,
			} {
				if res := b.get(path); res.Status != status {
					t.Errorf("%s answered %d, want %d", path, res.Status, status)
				}
			}

			// The editor refuses what the API refuses, with the API's
			// message, and keeps what was typed.
			form := url.Values{"csrf": {tok}, "name": {"<script>alert(1)</script>"}, "stream": {"env"},
				"condition": {`{"all": [{"field": "temp", "operator": ">", "value": 80}, {"field": "temp", "operator": "=~", "value": 1}]}`}}
			var apiErr struct{ Fields map[string]string }
			var cond any
			if err := json.Unmarshal([]byte(form.Get("condition")), &cond); err != nil {
				t.Fatal(err)
			}
			s.Do(t, admin, "POST", "/api/v1/alert-rules", map[string]any{"name": "x", "stream": "env", "condition": cond}).Want(t, 400).Decode(t, &apiErr)
			want := apiErr.Fields["condition.all[1].operator"]
			res := b.do("POST", "/console/alerts/rules/new", form).want(t, 400)
			if want == "" || !strings.Contains(res.Body, html.EscapeString(want)) || !strings.Contains(res.Body, "condition.all[1].operator") {
				t.Errorf("the editor does not say what the API says (%q):\n%s", want, res.Body)
			}
			if !strings.Contains(res.Body, html.EscapeString(form.Get("condition"))) || !strings.Contains(res.Body, html.EscapeString("<script>alert(1)</script>")) {
				t.Errorf("the editor does not keep what was typed")
			}
			// The threshold builder is console.js's: without scripts its
			// controls, which send nothing, are not shown.
			if m := regexp.MustCompile(`(?s)<fieldset class="builder" data-condition-builder="condition" hidden>(.*?)</fieldset>`).FindStringSubmatch(res.Body); m == nil || strings.Contains(m[1], " name=") {
				t.Errorf("the condition builder is shown without its script, or its controls send fields")
			}
			for field, value := range map[string]string{"condition": "{not json", "activation_threshold_seconds": "soon", "metadata_filters": `{"site": 1}`} {
				bad := url.Values{"csrf": {tok}, "name": {"x"}, "stream": {"env"}, "condition": {`{"field": "t", "operator": "<", "value": 1}`}}
				bad.Set(field, value)
				if res := b.do("POST", "/console/alerts/rules/new", bad).want(t, 400); !strings.Contains(res.Body, `id="`+field+`-error"`) {
					t.Errorf("%s=%q: no problem shown beside the field:\n%s", field, value, res.Body)
				}
			}

			form.Set("condition", `{"field": "temp", "operator": ">", "value": 80}`)
			form.Set("metadata_filters", `{"site": ["harbour", "dock"]}`)
			form.Set("activation_threshold_seconds", "1.5")
			res = b.do("POST", "/console/alerts/rules/new", form).want(t, 303)
			page := b.get(res.Header.Get("Location")).want(t, 200).Body
			if strings.Contains(page, "<script>alert(1)") || !strings.Contains(page, html.EscapeString("<script>alert(1)</script>")) || !strings.Contains(page, "harbour") {
				t.Errorf("the new rule's page:\n%s", page)
			}
			id := strings.TrimPrefix(res.Header.Get("Location"), "/console/alerts/rules/")
			var got alertRule
			s.Do(t, admin, "GET", "/api/v1/alert-rules/"+id, nil).Want(t, 200).Decode(t, &got)
			if got.Name != "<script>alert(1)</script>" || got.ActivationThresholdSeconds != 1.5 || got.Condition["value"] != 80.0 {
				t.Fatalf("the API reads the console's rule as %+v", got)
			}
			form.Set("name", "<b>hot</b>")
			b.do("POST", "/console/alerts/rules/new", form).want(t, 409)

			// Edit: the form shows the rule; a stream cannot change.
			edit := b.get("/console/alerts/rules/"+id+"/edit").want(t, 200).Body
			if !strings.Contains(edit, "1.5") || !strings.Contains(edit, "harbour") {
				t.Errorf("the edit form does not show the rule:\n%s", edit)
			}
			form.Set("name", "renamed")
			form.Set("stream", "other")
			if res := b.do("POST", "/console/alerts/rules/"+id+"/edit", form).want(t, 400); !strings.Contains(res.Body, "cannot change") {
				t.Errorf("a changed stream is not refused by name:\n%s", res.Body)
			}
			form.Set("stream", "env")
			form.Set("condition", `{"field": "temp", "operator": ">=", "value": 90}`)
			b.do("POST", "/console/alerts/rules/"+id+"/edit", form).want(t, 303)
			s.Do(t, admin, "GET", "/api/v1/alert-rules/"+id, nil).Want(t, 200).Decode(t, &got)
			if got.Name != "renamed" || got.Condition["operator"] != ">=" {
				t.Fatalf("after the edit the API reads %+v", got)
			}

			// A viewer sees no write control, and is refused anyway.
			vb := newBrowser(t, s.URL)
			vtok := vb.signIn("default", viewer.Key).csrf(t)
			for _, p := range []string{"/console/alerts", "/console/alerts/rules", "/console/alerts/rules/" + id} {
				if body := vb.get(p).want(t, 200).Body; strings.Contains(body, "/edit") || strings.Contains(body, "/delete") || strings.Contains(body, "rules/new") {
					t.Errorf("a viewer is offered write controls on %s", p)
				}
			}
			vb.get("/console/alerts/rules/new").want(t, 403)
			vb.get("/console/alerts/rules/"+id+"/edit").want(t, 403)
			form.Set("csrf", vtok)
			vb.do("POST", "/console/alerts/rules/new", form).want(t, 403)
			vb.do("POST", "/console/alerts/rules/"+id+"/edit", form).want(t, 403)
			vb.do("POST", "/console/alerts/rules/"+id+"/delete", url.Values{"csrf": {vtok}}).want(t, 403)
			// Every form needs the session's token.
			form.Set("csrf", "forged")
			b.do("POST", "/console/alerts/rules/new", form).want(t, 403)
			b.do("POST", "/console/alerts/rules/"+id+"/delete", url.Values{}).want(t, 403)
			// Another tenant's rule is not found.
			theirRule := s.mustAlertRule(t, other, map[string]any{"name": "theirs", "stream": "env", "condition": map[string]any{"no_data_seconds": 60}})
			b.get("/console/alerts/rules/"+theirRule.ID).want(t, 404)
			b.do("POST", "/console/alerts/rules/"+theirRule.ID+"/delete", url.Values{"csrf": {tok}}).want(t, 404)

			b.do("POST", "/console/alerts/rules/"+rule.ID+"/delete", url.Values{"csrf": {tok}}).want(t, 303)
			s.Do(t, admin, "GET", "/api/v1/alert-rules/"+rule.ID, nil).Want(t, 404)
		})

		t.Run("NotificationRules", func(t *testing.T) {
			rule := s.mustAlertRule(t, admin, map[string]any{"name": "notify-me", "stream": "notif", "condition": map[string]any{"field": "temp", "operator": ">", "value": 80}})
			base := "/console/alerts/rules/" + rule.ID + "/notifications"
			b := newBrowser(t, s.URL)
			tok := b.signIn("default", operator.Key).csrf(t)
			form := url.Values{"csrf": {tok}, "channel_parameters.type": {"webhook"}, "channel_parameters.url": {"ftp://example.com/hook"},
				"channel_parameters.headers": {"Authorization: Bearer hunter2\nX-Team: <i>ops</i>"}, "channel_parameters.secret": {"s3cret-value"},
				"interval_seconds": {"0"}, "timezone": {"Mars/Olympus"}, "notification_template.subject": {"{{.Rule.Name"},
				"notification_template.body": {"<script>alert(1)</script> {{.Alert.DeviceID}}"}}
			// Refused as S3 refuses it, field by field, and the secret is
			// not sent back.
			var apiErr struct{ Fields map[string]string }
			s.Do(t, admin, "POST", "/api/v1/alert-rules/"+rule.ID+"/alert-notification-rules", map[string]any{
				"channel_parameters": map[string]any{"type": "webhook", "url": "ftp://example.com/hook"}, "timezone": "Mars/Olympus",
				"notification_template": map[string]any{"subject": "{{.Rule.Name"}}).Want(t, 400).Decode(t, &apiErr)
			res := b.do("POST", base+"/new", form).want(t, 400)
			for _, field := range []string{"channel_parameters.url", "timezone", "notification_template.subject"} {
				if apiErr.Fields[field] == "" || !strings.Contains(res.Body, `id="`+field+`-error"`) || !strings.Contains(res.Body, html.EscapeString(apiErr.Fields[field])) {
					t.Errorf("%s: the form does not say what the API says (%q)", field, apiErr.Fields[field])
				}
			}
			if strings.Contains(res.Body, "s3cret-value") || !strings.Contains(res.Body, "hunter2") {
				t.Errorf("a refused form shows the secret, or loses the headers typed")
			}
			form.Set("channel_parameters.url", "http://127.0.0.1:9/hook?token=qq-url-token-zz")
			form.Set("timezone", "Europe/Berlin")
			form.Set("notification_template.subject", "{{.Rule.Name}} {{.Event}}")
			res = b.do("POST", base+"/new", form).want(t, 303)
			page := res.Header.Get("Location")
			body := b.get(page).want(t, 200).Body
			for _, hidden := range []string{"s3cret-value", "hunter2", "qq-url-token-zz", "<script>alert(1)", "<i>ops"} {
				if strings.Contains(body, hidden) {
					t.Errorf("the notification rule's page shows %q", hidden)
				}
			}
			if !strings.Contains(body, html.EscapeString("<script>alert(1)</script>")) || !strings.Contains(body, "Europe/Berlin") {
				t.Errorf("the notification rule's page does not show its template, escaped:\n%s", body)
			}
			var list struct {
				Rules []struct {
					ID                string
					ChannelParameters struct {
						HasSecret bool `json:"has_secret"`
						Headers   map[string]string
					} `json:"channel_parameters"`
					IntervalSeconds int64 `json:"interval_seconds"`
				} `json:"alert_notification_rules"`
			}
			readBack := func() {
				t.Helper()
				list.Rules = nil
				s.Do(t, admin, "GET", "/api/v1/alert-rules/"+rule.ID+"/alert-notification-rules", nil).Want(t, 200).Decode(t, &list)
				if len(list.Rules) != 1 {
					t.Fatalf("the API lists %d notification rules", len(list.Rules))
				}
			}
			readBack()
			if r := list.Rules[0]; !r.ChannelParameters.HasSecret || r.ChannelParameters.Headers["X-Team"] != "<i>ops</i>" {
				t.Fatalf("the API reads the console's notification rule as %+v", r)
			}

			// Edit what the form shows, channel untouched: the secret, the
			// hidden query value and the credential header stay.
			edit := b.get(page+"/edit").want(t, 200).Body
			if strings.Contains(edit, "s3cret-value") || strings.Contains(edit, "hunter2") {
				t.Fatalf("the edit form shows a secret")
			}
			m := regexp.MustCompile(`name="channel_parameters.url" value="([^"]*)"`).FindStringSubmatch(edit)
			h := regexp.MustCompile(`(?s)name="channel_parameters.headers"[^>]*>(.*?)</textarea>`).FindStringSubmatch(edit)
			if m == nil || h == nil {
				t.Fatalf("the edit form:\n%s", edit)
			}
			form.Set("channel_parameters.url", html.UnescapeString(m[1]))
			form.Set("channel_parameters.headers", html.UnescapeString(h[1]))
			form.Set("channel_parameters.secret", "")
			form.Set("interval_seconds", "60")
			b.do("POST", page+"/edit", form).want(t, 303)
			readBack()
			if r := list.Rules[0]; !r.ChannelParameters.HasSecret || r.IntervalSeconds != 60 {
				t.Fatalf("after the edit %+v", r)
			}
			// A channel changed with its URL still hidden is refused; a
			// secret removed is gone.
			form.Set("channel_parameters.headers", "X-Team: dev")
			if res := b.do("POST", page+"/edit", form).want(t, 400); !strings.Contains(res.Body, `id="channel_parameters.url-error"`) {
				t.Errorf("a hidden URL is saved back:\n%s", res.Body)
			}
			form.Set("channel_parameters.url", "http://127.0.0.1:9/hook")
			form.Set("clear_secret", "on")
			b.do("POST", page+"/edit", form).want(t, 303)
			readBack()
			if r := list.Rules[0]; r.ChannelParameters.HasSecret || r.ChannelParameters.Headers["X-Team"] != "dev" {
				t.Fatalf("after removing the secret %+v", r)
			}

			// An alert opens: its notifications and their attempts show on
			// the page (fleetd may not reach 127.0.0.1 here: the attempt
			// records why).
			gw := s.NewKey(t, admin, "notif-gateway", "device")
			s.Do(t, admin, "POST", "/api/v1/devices", map[string]any{"id": "notif-dev"}).Want(t, 201)
			s.Do(t, gw, "POST", "/api/v1/devices/notif-dev/streams/notif", []map[string]any{{"timestamp": time.Now().UnixMilli(), "temp": 99}}).Want(t, 200)
			eventually(t, "an attempt shown on the notification rule's page", func() bool {
				body := b.get(page).want(t, 200).Body
				return strings.Contains(body, "notif-dev") && strings.Contains(body, "opened") && strings.Contains(body, `<ol class="attempts">`)
			})

			// A viewer sees the rule redacted, no write control, and is
			// refused anyway.
			vb := newBrowser(t, s.URL)
			vtok := vb.signIn("default", viewer.Key).csrf(t)
			for _, p := range []string{"/console/alerts/rules/" + rule.ID, page} {
				body := vb.get(p).want(t, 200).Body
				if strings.Contains(body, "/hook") || strings.Contains(body, "/edit") || strings.Contains(body, "/delete") || strings.Contains(body, "notifications/new") {
					t.Errorf("a viewer sees a URL's path or a write control on %s", p)
				}
			}
			vb.get(base+"/new").want(t, 403)
			vb.get(page+"/edit").want(t, 403)
			form.Set("csrf", vtok)
			vb.do("POST", base+"/new", form).want(t, 403)
			vb.do("POST", page+"/edit", form).want(t, 403)
			vb.do("POST", page+"/delete", url.Values{"csrf": {vtok}}).want(t, 403)
			b.do("POST", page+"/delete", url.Values{"csrf": {"forged"}}).want(t, 403)
			b.get(base+"/not-a-uuid").want(t, 404)
			b.get("/console/alerts/rules/00000000-0000-0000-0000-000000000001/notifications/"+strings.TrimPrefix(page, base+"/")).want(t, 404)

			b.do("POST", page+"/delete", url.Values{"csrf": {tok}}).want(t, 303)
			b.get(page).want(t, 404)
		})

		t.Run("RevokedKeyEndsSession", func(t *testing.T) {
			k := s.NewKey(t, admin, "temp", "operator")
			b := newBrowser(t, s.URL)
			b.signIn("default", k.Key)
			s.Do(t, admin, "DELETE", "/api/v1/apikeys/temp", nil).Want(t, 204)
			if res := b.get("/console/devices"); res.Status != http.StatusSeeOther || !strings.HasPrefix(res.Header.Get("Location"), "/console/signin") {
				t.Fatalf("a deleted key's session answered %d", res.Status)
			}
		})

		t.Run("SignOut", func(t *testing.T) {
			// A copy of the cookie taken before signing out (a stolen one)
			// is refused after it: sign-out ends the session on the server.
			b := newBrowser(t, s.URL)
			tok := b.signIn("default", operator.Key).csrf(t)
			thief := b.copyTo(b.base)
			thief.get("/console/devices").want(t, 200)
			b.do("POST", "/console/signout", url.Values{"csrf": {tok}}).want(t, 303)
			b.get("/console/devices").want(t, 303)
			if res := thief.get("/console/devices"); res.Status != http.StatusSeeOther || !strings.HasPrefix(res.Header.Get("Location"), "/console/signin") {
				t.Fatalf("the copied cookie answered %d after sign-out", res.Status)
			}
			thief = b.copyTo(b.base) // the copy again: the refusal deleted its cookie
			thief.do("POST", "/console/actions/1/pause", url.Values{"csrf": {tok}}).want(t, 401)
		})

		t.Run("BadInput", func(t *testing.T) {
			b := newBrowser(t, s.URL)
			b.signIn("default", viewer.Key)
			for path, status := range map[string]int{
				"/console/devices?page=0":        400,
				"/console/devices?page=x":        400,
				"/console/devices?metadata=nokv": 400,
				"/console/devices/no%20such":     404,
				"/console/actions/abc":           404,
				"/console/actions/999999":        404,
				"/console/actions/1?status=Nope": 400,
			} {
				if res := b.get(path); res.Status != status {
					t.Errorf("%s answered %d, want %d", path, res.Status, status)
				}
			}
			b.client.Jar.SetCookies(&url.URL{Scheme: "http", Host: strings.TrimPrefix(s.URL, "http://"), Path: "/console/"},
				[]*http.Cookie{{Name: "fleetd_console", Value: "garbage", Path: "/console/"}})
			b.get("/console/devices").want(t, 303)
		})
	})
}

var loginID = regexp.MustCompile(`name="id" value="([^"]+)"`)

// TestConsoleOIDC signs in through a real OpenID provider: the
// authorization code flow with PKCE, the ID token verified against the
// tenant's JWKS, issuer, client id and nonce; the person gets the tenant's
// default role.
func TestConsoleOIDC(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, be sqlstoretest.Backend) {
		// The provider is on this machine: the egress policy must allow it.
		s := startServer(t, be, "--outbound-allow", "127.0.0.1")
		admin := s.Admin()
		op := startOIDCProvider(t, "fleetd-console", "console-secret", s.URL+"/console/oidc/callback")
		s.Do(t, admin, "PUT", "/api/v1/tenants/default/auth", op.tenantOIDC("fleetd-console", "console-secret", "operator")).Want(t, 204)
		var cfg map[string]any
		s.Do(t, admin, "GET", "/api/v1/tenants/default/auth", nil).Want(t, 200).Decode(t, &cfg)
		if o, _ := cfg["oidc"].(map[string]any); o["client_id"] != "fleetd-console" || o["client_secret_set"] != true || o["client_secret"] != nil {
			t.Fatalf("S9 shows oidc %v", cfg["oidc"])
		}

		t.Run("SignIn", func(t *testing.T) {
			b := newBrowser(t, s.URL)
			body := b.signInOIDC(t, op).want(t, 200).Body
			if !strings.Contains(body, op.Email) || !strings.Contains(body, "role-operator") {
				t.Fatalf("the overview after OIDC sign-in:\n%s", body)
			}
			// The person acts as themselves: a dispatch is theirs.
			tok := b.get("/console/actions/new").want(t, 200).csrf(t)
			s.Do(t, admin, "POST", "/api/v1/devices", map[string]any{"id": "oidc-dev"}).Want(t, 201)
			res := b.do("POST", "/console/actions/new", url.Values{"csrf": {tok}, "action": {"reboot"}, "params": {"{}"}, "search_type": {"default"}, "device_ids": {"oidc-dev"}}).want(t, 303)
			if body := b.get(res.Header.Get("Location")).Body; !strings.Contains(body, op.Email) {
				t.Errorf("the action does not name who dispatched it")
			}

			// A change of the tenant's sign-in settings ends the session.
			s.Do(t, admin, "PUT", "/api/v1/tenants/default/auth", op.tenantOIDC("fleetd-console", "console-secret", "viewer")).Want(t, 204)
			b.get("/console/").want(t, 303)
			if body := b.signInOIDC(t, op).want(t, 200).Body; !strings.Contains(body, "role-viewer") {
				t.Errorf("after the change, the person is not a viewer")
			}
		})

		t.Run("AdminEndsSession", func(t *testing.T) {
			// An admin ends a single sign-on user's sessions without
			// touching the tenant's sign-in settings: the person can sign
			// in again at once, and others stay signed in.
			var before, after map[string]any
			s.Do(t, admin, "GET", "/api/v1/tenants/default/auth", nil).Want(t, 200).Decode(t, &before)
			person, again := newBrowser(t, s.URL), newBrowser(t, s.URL)
			person.signInOIDC(t, op).want(t, 200)
			ab := newBrowser(t, s.URL)
			tok := ab.signIn("default", admin.Key).csrf(t)
			ids := sessionIDs(ab.get("/console/settings/sessions").want(t, 200).Body, op.Email)
			if len(ids) == 0 {
				t.Fatalf("the sessions page does not list %s", op.Email)
			}
			ab.do("POST", "/console/settings/sessions/"+ids[0]+"/end", url.Values{"csrf": {tok}, "all": {"1"}}).want(t, 303)
			person.get("/console/").want(t, 303)
			ab.get("/console/").want(t, 200)
			s.Do(t, admin, "GET", "/api/v1/tenants/default/auth", nil).Want(t, 200).Decode(t, &after)
			if before["updated_at"] != after["updated_at"] {
				t.Errorf("ending a session changed the sign-in settings: %v, then %v", before["updated_at"], after["updated_at"])
			}
			again.signInOIDC(t, op).want(t, 200)
		})

		t.Run("ForgedCallback", func(t *testing.T) {
			b := newBrowser(t, s.URL)
			b.get("/console/signin/oidc?tenant=default").want(t, 303)
			b.get("/console/oidc/callback?code=abc&state=forged").want(t, 403)
			newBrowser(t, s.URL).get("/console/oidc/callback?code=abc&state=x").want(t, 403)
			b.get("/console/").want(t, 303)
		})

		t.Run("WrongSecret", func(t *testing.T) {
			s.Do(t, admin, "PUT", "/api/v1/tenants/default/auth", op.tenantOIDC("fleetd-console", "not-the-secret", "operator")).Want(t, 204)
			defer func() {
				s.Do(t, admin, "PUT", "/api/v1/tenants/default/auth", op.tenantOIDC("fleetd-console", "console-secret", "operator")).Want(t, 204)
			}()
			b := newBrowser(t, s.URL)
			if res := b.signInOIDC(t, op); res.Status != 401 || !strings.Contains(res.Body, "could not be verified") && !strings.Contains(res.Body, "did not accept") {
				t.Fatalf("a sign-in the provider refused to exchange answered %d:\n%s", res.Status, res.Body)
			}
		})

		t.Run("NoSSO", func(t *testing.T) {
			s.NewTenant(t, "plain")
			b := newBrowser(t, s.URL)
			if res := b.get("/console/signin/oidc?tenant=plain").want(t, 404); !strings.Contains(res.Body, "no single sign-on") {
				t.Errorf("the answer does not say why:\n%s", res.Body)
			}
			b.get("/console/signin/oidc?tenant=Not_A_Tenant").want(t, 400)
		})

		t.Run("BadSettings", func(t *testing.T) {
			body := op.tenantOIDC("", "x", "viewer")
			s.Do(t, admin, "PUT", "/api/v1/tenants/default/auth", body).Want(t, 400)
			body["oidc"] = map[string]any{"client_id": "c", "surprise": 1}
			s.Do(t, admin, "PUT", "/api/v1/tenants/default/auth", body).Want(t, 400)
		})
	})
}

// signInOIDC signs b in through op: it goes to the provider, signs in on
// its form and follows the redirects back to the console, and returns the
// overview, or the console's answer when it refused the sign-in.
func (b *browser) signInOIDC(t *testing.T, op *oidcProvider) page {
	t.Helper()
	res := b.get("/console/signin/oidc?tenant=default").want(t, 303)
	to := res.Header.Get("Location")
	if !strings.HasPrefix(to, op.Issuer) || !strings.Contains(to, "code_challenge_method=S256") || !strings.Contains(to, "nonce=") {
		t.Fatalf("sign-in goes to %s", to)
	}
	for !strings.Contains(to, "/login/username") {
		to = b.follow(t, to)
	}
	login := b.abs(t, to).want(t, 200)
	id := loginID.FindStringSubmatch(login.Body)
	if id == nil {
		t.Fatalf("the provider's login page:\n%s", login.Body)
	}
	res = b.post(t, op.Issuer+"/login/username", url.Values{"id": {id[1]}, "username": {op.Username}, "password": {op.Password}})
	to = res.Header.Get("Location")
	for !strings.Contains(to, "/console/oidc/callback") {
		to = b.follow(t, to)
	}
	if res := b.abs(t, to); res.Status != http.StatusSeeOther {
		return res // the console refused the sign-in
	}
	return b.get("/console/")
}

// follow GETs an absolute or console-relative URL and returns where it
// redirects.
func (b *browser) follow(t *testing.T, to string) string {
	t.Helper()
	res := b.abs(t, to)
	loc := res.Header.Get("Location")
	if res.Status/100 != 3 || loc == "" {
		t.Fatalf("GET %s answered %d, not a redirect:\n%s", to, res.Status, res.Body)
	}
	u, _ := url.Parse(to)
	next, _ := u.Parse(loc)
	return next.String()
}

// abs GETs a URL that may be on another host.
func (b *browser) abs(t *testing.T, to string) page {
	t.Helper()
	if strings.HasPrefix(to, "/") {
		return b.get(to)
	}
	saved := b.base
	defer func() { b.base = saved }()
	b.base = ""
	return b.get(to)
}

// post POSTs a form to a URL on another host.
func (b *browser) post(t *testing.T, to string, form url.Values) page {
	t.Helper()
	saved := b.base
	defer func() { b.base = saved }()
	b.base = ""
	return b.do("POST", to, form)
}

// TestConsoleCookiesSecureBehindTLSProxy: fleetd serves plain HTTP behind
// a proxy that ends TLS, and --public-url says browsers use https: every
// console cookie it sets is Secure, so a browser never sends the session
// over plain HTTP. At f94a7fc they were Secure only when fleetd served TLS
// itself.
func TestConsoleCookiesSecureBehindTLSProxy(t *testing.T) {
	s := startServer(t, sqlstoretest.Backends()[0], "--public-url", "https://fleet.example.com")
	admin := s.Admin()
	// No cookie jar: one would keep Secure cookies from plain HTTP.
	client := &http.Client{Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	check := func(res *http.Response) {
		t.Helper()
		if len(res.Cookies()) == 0 {
			t.Fatalf("%s %s set no cookie", res.Request.Method, res.Request.URL.Path)
		}
		for _, c := range res.Cookies() {
			if !c.Secure || !c.HttpOnly {
				t.Errorf("%s %s set %s without Secure or HttpOnly: %s", res.Request.Method, res.Request.URL.Path, c.Name, c.String())
			}
		}
	}
	res, err := client.Get(s.URL + "/console/signin")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	check(res)
	tok := page{Body: string(body)}.csrf(t)
	rq, _ := http.NewRequest("POST", s.URL+"/console/signin", strings.NewReader(url.Values{"csrf": {tok}, "tenant": {"default"}, "key": {admin.Key}}.Encode()))
	rq.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for _, c := range res.Cookies() {
		rq.AddCookie(c)
	}
	if res, err = client.Do(rq); err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign-in answered %d", res.StatusCode)
	}
	check(res) // the session, and the sign-in cookie's deletion
}
