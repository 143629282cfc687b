package console_test

import (
	"bytes"
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
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/pki"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestConsole covers what needs no script: sessions, CSRF, roles, tenant
// isolation, escaping, the security headers and the event stream.
func TestConsole(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, be sqlstoretest.Backend) {
		// MQTT over TLS, so that devices can be issued certificates.
		certFile, keyFile := fleetdtest.WriteServerCert(t, t.TempDir(), "fleetd test")
		s := fleetdtest.Start(t, be, "--tls-cert", certFile, "--tls-key", keyFile, "--http-tls=false", "--mqtts-addr", "127.0.0.1:0")
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
			b := fleetdtest.NewBrowser(t, s.URL)
			if res := b.Get("/"); res.Status != http.StatusSeeOther || res.Header.Get("Location") != "/console/" {
				t.Fatalf("GET / answered %d to %q", res.Status, res.Header.Get("Location"))
			}
			res := b.Get("/console/devices?search=x")
			if loc := res.Header.Get("Location"); res.Status != http.StatusSeeOther || loc != "/console/signin?next="+url.QueryEscape("/console/devices?search=x") {
				t.Fatalf("an anonymous page answered %d to %q", res.Status, loc)
			}
			// The API keeps its own answers beside the console.
			s.Send(t, fleetdtest.Req{Method: "GET", Path: "/api/v1/nothing"}).Want(t, 404)
		})

		t.Run("SignIn", func(t *testing.T) {
			b := fleetdtest.NewBrowser(t, s.URL)
			res := b.Get("/console/signin").Want(t, 200)
			csp := res.Header.Get("Content-Security-Policy")
			if !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") || !strings.Contains(csp, "frame-ancestors 'none'") {
				t.Errorf("Content-Security-Policy %q", csp)
			}
			tok := res.CSRF(t)
			for _, bad := range []url.Values{
				{"tenant": {"default"}, "key": {"fk_wrong"}},
				{"tenant": {"nobody"}, "key": {operator.Key}},
			} {
				// Each answer is a new form with a new token.
				bad.Set("csrf", tok)
				res := b.Do("POST", "/console/signin", bad).Want(t, 401)
				if !strings.Contains(res.Body, "do not match") || strings.Contains(res.Body, operator.Key) {
					t.Errorf("a refused sign-in says:\n%s", res.Body)
				}
				tok = res.CSRF(t)
			}
			b.Do("POST", "/console/signin", url.Values{"csrf": {"forged"}, "tenant": {"default"}, "key": {operator.Key}}).Want(t, 403)
			fleetdtest.NewBrowser(t, s.URL).Do("POST", "/console/signin", url.Values{"csrf": {tok}, "tenant": {"default"}, "key": {operator.Key}}).Want(t, 403)
			b.Do("POST", "/console/signin", url.Values{"csrf": {tok}, "tenant": {"default"}, "key": {device.Key}}).Want(t, 403)
			tok = b.Get("/console/signin").CSRF(t)
			b.Do("POST", "/console/signin", url.Values{"csrf": {tok}, "tenant": {"default"}, "key": {operator.Key}}, "Origin", "https://evil.example").Want(t, 403)

			tok = b.Get("/console/signin").CSRF(t)
			res = b.Do("POST", "/console/signin", url.Values{"csrf": {tok}, "tenant": {"default"}, "key": {operator.Key}, "next": {"//evil.example/"}})
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
			if body := b.Get("/console/").Want(t, 200).Body; !strings.Contains(body, "olivia") || strings.Contains(body, operator.Key) {
				t.Errorf("the overview does not show who signed in, or shows the key")
			}
		})

		t.Run("Escaping", func(t *testing.T) {
			b := fleetdtest.NewBrowser(t, s.URL)
			b.SignIn("default", viewer.Key)
			for _, p := range []string{"/console/devices", "/console/devices/dev-1"} {
				body := b.Get(p).Want(t, 200).Body
				if strings.Contains(body, "<script>alert(1)") || !strings.Contains(body, html.EscapeString("<script>alert(1)</script>")) {
					t.Errorf("%s does not escape the metadata", p)
				}
			}
		})

		t.Run("CSRF", func(t *testing.T) {
			b := fleetdtest.NewBrowser(t, s.URL)
			tok := b.SignIn("default", operator.Key).CSRF(t)
			b.Do("POST", "/console/devices/dev-1/token", url.Values{}).Want(t, 403)
			b.Do("POST", "/console/devices/dev-1/token", url.Values{"csrf": {"forged"}}).Want(t, 403)
			b.Do("POST", "/console/devices/dev-1/token", url.Values{"csrf": {tok}}, "Origin", "https://evil.example").Want(t, 403)
			b.Do("POST", "/console/devices/dev-1/token", url.Values{"csrf": {tok}}, "Sec-Fetch-Site", "cross-site").Want(t, 403)
			// The same form from the console's own origin works, and shows
			// the new token once, on an answer that is not cached and whose
			// history entry becomes the device page's (console.js).
			res := b.Do("POST", "/console/devices/dev-1/token", url.Values{"csrf": {tok}}, "Origin", s.URL).Want(t, 200)
			if !strings.Contains(res.Body, "fdt_") {
				t.Errorf("the new token is not shown")
			}
			if cc := res.Header.Get("Cache-Control"); cc != "no-store" {
				t.Errorf("Cache-Control = %q, want no-store", cc)
			}
			if !strings.Contains(res.Body, `data-shown-once="/console/devices/dev-1"`) {
				t.Errorf("the token's answer does not replace its history entry with the device page's")
			}
			if strings.Contains(b.Get("/console/devices/dev-1").Body, "fdt_") {
				t.Errorf("the token is shown again")
			}
		})

		t.Run("DevicePage", func(t *testing.T) {
			s.Do(t, device, "POST", "/api/v1/devices/dev-1/streams/env",
				[]map[string]any{{"timestamp": time.Now().UnixMilli(), "sequence": 1, "temp": 21.5, "label": "<b>warm</b>"}}).Want(t, 200)
			v := fleetdtest.NewBrowser(t, s.URL)
			v.SignIn("default", viewer.Key)
			body := v.Get("/console/devices/dev-1").Want(t, 200).Body
			for _, want := range []string{"Latest stream values", "21.5", html.EscapeString(`"<b>warm</b>"`), "no client certificate"} {
				if !strings.Contains(body, want) {
					t.Errorf("a device page does not show %q", want)
				}
			}
			if strings.Contains(body, "<b>warm") || strings.Contains(body, "Issue a certificate") {
				t.Errorf("the device page shows a stream value unescaped or offers a viewer a certificate")
			}

			b := fleetdtest.NewBrowser(t, s.URL)
			tok := b.SignIn("default", operator.Key).CSRF(t)
			body = b.Do("POST", "/console/devices/dev-1/certificate", url.Values{"csrf": {tok}}, "Origin", s.URL).Want(t, 200).Body
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
			body = b.Get("/console/devices/dev-1").Want(t, 200).Body
			for _, want := range []string{hex.EncodeToString(sum[:]), pki.SerialHex(cert.SerialNumber), html.EscapeString(cert.Subject.String()), "Issue a new certificate"} {
				if !strings.Contains(body, want) {
					t.Errorf("the device page does not show the certificate's %q", want)
				}
			}
			if strings.Contains(body, "PRIVATE KEY") {
				t.Errorf("the private key is shown again")
			}
			b.Do("POST", "/console/devices/dev-1/token", url.Values{"csrf": {tok}}, "Origin", s.URL).Want(t, 200)
			if body := b.Get("/console/devices/dev-1").Body; !strings.Contains(body, "no client certificate") {
				t.Errorf("a token rotation left the certificate on the page")
			}
			v.Do("POST", "/console/devices/dev-1/certificate", url.Values{"csrf": {v.Get("/console/").CSRF(t)}}).Want(t, 403)
		})

		t.Run("Roles", func(t *testing.T) {
			b := fleetdtest.NewBrowser(t, s.URL)
			tok := b.SignIn("default", viewer.Key).CSRF(t)
			if body := b.Get("/console/devices/dev-1").Want(t, 200).Body; strings.Contains(body, "Rotate token") {
				t.Errorf("a viewer is offered token rotation")
			}
			b.Get("/console/actions/new").Want(t, 403)
			b.Do("POST", "/console/devices/dev-1/token", url.Values{"csrf": {tok}}).Want(t, 403)
			b.Do("POST", "/console/actions/new", url.Values{"csrf": {tok}, "action": {"reboot"}, "search_type": {"all"}, "params": {"{}"}}).Want(t, 403)
		})

		t.Run("TenantIsolation", func(t *testing.T) {
			b := fleetdtest.NewBrowser(t, s.URL)
			b.SignIn("default", admin.Key)
			b.Get("/console/devices/theirs").Want(t, 404)
			b.Get(fmt.Sprintf("/console/actions/%d", theirs.ID)).Want(t, 404)
			b.Get(fmt.Sprintf("/console/actions/%d/events", theirs.ID)).Want(t, 404)
			if body := b.Get("/console/devices?search=theirs").Body; strings.Contains(body, `href="/console/devices/theirs"`) {
				t.Errorf("another tenant's device is listed")
			}
			tok := b.Get("/console/").CSRF(t)
			b.Do("POST", fmt.Sprintf("/console/actions/%d/cancel", theirs.ID), url.Values{"csrf": {tok}}).Want(t, 404)
		})

		t.Run("DispatchValidatesAsTheAPI", func(t *testing.T) {
			b := fleetdtest.NewBrowser(t, s.URL)
			tok := b.SignIn("default", operator.Key).CSRF(t)
			form := url.Values{"csrf": {tok}, "action": {"reboot"}, "params": {"{}"}, "search_type": {"default"}, "device_ids": {"dev-1 ghost"}, "timeout": {"30.5"}}
			res := b.Do("POST", "/console/actions/new", form).Want(t, 400)
			if !strings.Contains(res.Body, "timeout") {
				t.Errorf("the form does not name the bad field:\n%s", res.Body)
			}
			form.Set("timeout", "60")
			form.Set("preview", "1")
			if res := b.Do("POST", "/console/actions/new", form).Want(t, 200); !strings.Contains(res.Body, "<strong data-matches>1</strong>") {
				t.Errorf("the preview does not count the one device that exists:\n%s", res.Body)
			}
			form.Del("preview")
			res = b.Do("POST", "/console/actions/new", form).Want(t, 400)
			if !strings.Contains(res.Body, "ghost") {
				t.Errorf("the unknown device is not named:\n%s", res.Body)
			}
			form.Set("device_ids", "dev-1")
			res = b.Do("POST", "/console/actions/new", form)
			if res.Status != http.StatusSeeOther || !strings.HasPrefix(res.Header.Get("Location"), "/console/actions/") {
				t.Fatalf("dispatch answered %d:\n%s", res.Status, res.Body)
			}
			body := b.Get(res.Header.Get("Location")).Want(t, 200).Body
			if !strings.Contains(body, "reboot") || !strings.Contains(body, "olivia") {
				t.Errorf("the action page does not show the action and who sent it")
			}
		})

		t.Run("LiveProgress", func(t *testing.T) {
			b := fleetdtest.NewBrowser(t, s.URL)
			b.SignIn("default", operator.Key)
			var a struct{ ID int64 }
			s.Do(t, admin, "POST", "/api/v1/actions", map[string]any{"action": "blink", "params": map[string]any{}, "search_type": "default", "device_ids": []string{"dev-1"}}).Want(t, 201).Decode(t, &a)
			next := b.Events(t, fmt.Sprintf("/console/actions/%d/events", a.ID))
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
				b := fleetdtest.NewBrowser(t, s.URL)
				b.SignIn("default", viewer.Key)
				watchers = append(watchers, b.Events(t, "/console/events"))
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
			body := fleetdtest.NewBrowser(t, s.URL)
			body.SignIn("default", viewer.Key)
			page := body.Get("/console/").Want(t, 200).Body
			if !strings.Contains(page, "Last failures") || !strings.Contains(page, html.EscapeString("<i>lamp</i> broken")) || strings.Contains(page, "<i>lamp") {
				t.Errorf("the overview does not list the failure, escaped")
			}
		})

		t.Run("Firmware", func(t *testing.T) {
			b := fleetdtest.NewBrowser(t, s.URL)
			tok := b.SignIn("default", operator.Key).CSRF(t)
			archive := fleetdtest.MakeBundle(t, "4.2.0", fleetdtest.Part{Name: "app", Version: "4.2.0", Body: "app firmware"})
			upload := func(fields ...string) fleetdtest.Page {
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
				res, err := b.Client.Do(rq)
				if err != nil {
					t.Fatal(err)
				}
				defer res.Body.Close()
				text, _ := io.ReadAll(res.Body)
				return fleetdtest.Page{Status: res.StatusCode, Header: res.Header, Body: string(text)}
			}
			upload("file", "", "csrf", tok).Want(t, 403) // the token must come first
			upload("csrf", "forged", "file", "").Want(t, 403)
			upload("csrf", tok).Want(t, 400)
			res := upload("csrf", tok, "file", "")
			if res.Status != http.StatusSeeOther || !strings.HasPrefix(res.Header.Get("Location"), "/console/firmware/") {
				t.Fatalf("upload answered %d:\n%s", res.Status, res.Body)
			}
			bundle := res.Header.Get("Location")
			body := b.Get(bundle).Want(t, 200).Body
			if !strings.Contains(body, "4.2.0") || !strings.Contains(body, "Deactivate") {
				t.Fatalf("the bundle page:\n%s", body)
			}
			id := strings.TrimPrefix(bundle, "/console/firmware/")
			b.Do("POST", "/console/firmware/components/app/4.2.0", url.Values{"csrf": {tok}, "state": {"deactivated"}, "bundle": {id}}).Want(t, 303)
			var fw struct {
				Firmwares []struct {
					IsDeactivated bool `json:"is_deactivated"`
				} `json:"firmwares"`
			}
			s.Do(t, admin, "GET", "/api/v1/firmware-bundles/version/4.2.0", nil).Want(t, 200).Decode(t, &fw)
			if len(fw.Firmwares) != 1 || !fw.Firmwares[0].IsDeactivated {
				t.Fatalf("after Deactivate: %+v", fw)
			}
			b.Do("POST", "/console/firmware/components/app/4.2.0", url.Values{"csrf": {tok}, "state": {"maybe"}}).Want(t, 400)
			if body := b.Get("/console/firmware").Want(t, 200).Body; !strings.Contains(body, "4.2.0") {
				t.Errorf("the firmware list does not show the bundle")
			}
			// A viewer sees the list, not the upload form, and cannot upload.
			vb := fleetdtest.NewBrowser(t, s.URL)
			vtok := vb.SignIn("default", viewer.Key).CSRF(t)
			if body := vb.Get("/console/firmware").Want(t, 200).Body; strings.Contains(body, `type="file"`) {
				t.Errorf("a viewer is offered the upload")
			}
			b, tok = vb, vtok
			upload("csrf", tok, "file", "").Want(t, 403)
			vb.Get("/console/firmware/not-a-uuid").Want(t, 404)
		})

		t.Run("Alerts", func(t *testing.T) {
			rule := s.MustAlertRule(t, admin, map[string]any{"name": "<b>hot</b>", "stream": "env", "condition": map[string]any{"field": "temp", "operator": ">", "value": 80}})
			b := fleetdtest.NewBrowser(t, s.URL)
			tok := b.SignIn("default", operator.Key).CSRF(t)
			for _, p := range []string{"/console/alerts/rules", "/console/alerts/rules/" + rule.ID, "/console/alerts?rule_id=" + rule.ID} {
				body := b.Get(p).Want(t, 200).Body
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
				if res := b.Get(path); res.Status != status {
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
			res := b.Do("POST", "/console/alerts/rules/new", form).Want(t, 400)
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
				if res := b.Do("POST", "/console/alerts/rules/new", bad).Want(t, 400); !strings.Contains(res.Body, `id="`+field+`-error"`) {
					t.Errorf("%s=%q: no problem shown beside the field:\n%s", field, value, res.Body)
				}
			}

			form.Set("condition", `{"field": "temp", "operator": ">", "value": 80}`)
			form.Set("metadata_filters", `{"site": ["harbour", "dock"]}`)
			form.Set("activation_threshold_seconds", "1.5")
			res = b.Do("POST", "/console/alerts/rules/new", form).Want(t, 303)
			page := b.Get(res.Header.Get("Location")).Want(t, 200).Body
			if strings.Contains(page, "<script>alert(1)") || !strings.Contains(page, html.EscapeString("<script>alert(1)</script>")) || !strings.Contains(page, "harbour") {
				t.Errorf("the new rule's page:\n%s", page)
			}
			id := strings.TrimPrefix(res.Header.Get("Location"), "/console/alerts/rules/")
			var got fleetdtest.AlertRule
			s.Do(t, admin, "GET", "/api/v1/alert-rules/"+id, nil).Want(t, 200).Decode(t, &got)
			if got.Name != "<script>alert(1)</script>" || got.ActivationThresholdSeconds != 1.5 || got.Condition["value"] != 80.0 {
				t.Fatalf("the API reads the console's rule as %+v", got)
			}
			form.Set("name", "<b>hot</b>")
			b.Do("POST", "/console/alerts/rules/new", form).Want(t, 409)

			// Edit: the form shows the rule; a stream cannot change.
			edit := b.Get("/console/alerts/rules/"+id+"/edit").Want(t, 200).Body
			if !strings.Contains(edit, "1.5") || !strings.Contains(edit, "harbour") {
				t.Errorf("the edit form does not show the rule:\n%s", edit)
			}
			form.Set("name", "renamed")
			form.Set("stream", "other")
			if res := b.Do("POST", "/console/alerts/rules/"+id+"/edit", form).Want(t, 400); !strings.Contains(res.Body, "cannot change") {
				t.Errorf("a changed stream is not refused by name:\n%s", res.Body)
			}
			form.Set("stream", "env")
			form.Set("condition", `{"field": "temp", "operator": ">=", "value": 90}`)
			b.Do("POST", "/console/alerts/rules/"+id+"/edit", form).Want(t, 303)
			s.Do(t, admin, "GET", "/api/v1/alert-rules/"+id, nil).Want(t, 200).Decode(t, &got)
			if got.Name != "renamed" || got.Condition["operator"] != ">=" {
				t.Fatalf("after the edit the API reads %+v", got)
			}

			// A viewer sees no write control, and is refused anyway.
			vb := fleetdtest.NewBrowser(t, s.URL)
			vtok := vb.SignIn("default", viewer.Key).CSRF(t)
			for _, p := range []string{"/console/alerts", "/console/alerts/rules", "/console/alerts/rules/" + id} {
				if body := vb.Get(p).Want(t, 200).Body; strings.Contains(body, "/edit") || strings.Contains(body, "/delete") || strings.Contains(body, "rules/new") {
					t.Errorf("a viewer is offered write controls on %s", p)
				}
			}
			vb.Get("/console/alerts/rules/new").Want(t, 403)
			vb.Get("/console/alerts/rules/"+id+"/edit").Want(t, 403)
			form.Set("csrf", vtok)
			vb.Do("POST", "/console/alerts/rules/new", form).Want(t, 403)
			vb.Do("POST", "/console/alerts/rules/"+id+"/edit", form).Want(t, 403)
			vb.Do("POST", "/console/alerts/rules/"+id+"/delete", url.Values{"csrf": {vtok}}).Want(t, 403)
			// Every form needs the session's token.
			form.Set("csrf", "forged")
			b.Do("POST", "/console/alerts/rules/new", form).Want(t, 403)
			b.Do("POST", "/console/alerts/rules/"+id+"/delete", url.Values{}).Want(t, 403)
			// Another tenant's rule is not found.
			theirRule := s.MustAlertRule(t, other, map[string]any{"name": "theirs", "stream": "env", "condition": map[string]any{"no_data_seconds": 60}})
			b.Get("/console/alerts/rules/"+theirRule.ID).Want(t, 404)
			b.Do("POST", "/console/alerts/rules/"+theirRule.ID+"/delete", url.Values{"csrf": {tok}}).Want(t, 404)

			b.Do("POST", "/console/alerts/rules/"+rule.ID+"/delete", url.Values{"csrf": {tok}}).Want(t, 303)
			s.Do(t, admin, "GET", "/api/v1/alert-rules/"+rule.ID, nil).Want(t, 404)
		})

		t.Run("NotificationRules", func(t *testing.T) {
			rule := s.MustAlertRule(t, admin, map[string]any{"name": "notify-me", "stream": "notif", "condition": map[string]any{"field": "temp", "operator": ">", "value": 80}})
			base := "/console/alerts/rules/" + rule.ID + "/notifications"
			b := fleetdtest.NewBrowser(t, s.URL)
			tok := b.SignIn("default", operator.Key).CSRF(t)
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
			res := b.Do("POST", base+"/new", form).Want(t, 400)
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
			res = b.Do("POST", base+"/new", form).Want(t, 303)
			page := res.Header.Get("Location")
			body := b.Get(page).Want(t, 200).Body
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
			edit := b.Get(page+"/edit").Want(t, 200).Body
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
			b.Do("POST", page+"/edit", form).Want(t, 303)
			readBack()
			if r := list.Rules[0]; !r.ChannelParameters.HasSecret || r.IntervalSeconds != 60 {
				t.Fatalf("after the edit %+v", r)
			}
			// A channel changed with its URL still hidden is refused; a
			// secret removed is gone.
			form.Set("channel_parameters.headers", "X-Team: dev")
			if res := b.Do("POST", page+"/edit", form).Want(t, 400); !strings.Contains(res.Body, `id="channel_parameters.url-error"`) {
				t.Errorf("a hidden URL is saved back:\n%s", res.Body)
			}
			form.Set("channel_parameters.url", "http://127.0.0.1:9/hook")
			form.Set("clear_secret", "on")
			b.Do("POST", page+"/edit", form).Want(t, 303)
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
			fleetdtest.Eventually(t, "an attempt shown on the notification rule's page", func() bool {
				body := b.Get(page).Want(t, 200).Body
				return strings.Contains(body, "notif-dev") && strings.Contains(body, "opened") && strings.Contains(body, `<ol class="attempts">`)
			})

			// A viewer sees the rule redacted, no write control, and is
			// refused anyway.
			vb := fleetdtest.NewBrowser(t, s.URL)
			vtok := vb.SignIn("default", viewer.Key).CSRF(t)
			for _, p := range []string{"/console/alerts/rules/" + rule.ID, page} {
				body := vb.Get(p).Want(t, 200).Body
				if strings.Contains(body, "/hook") || strings.Contains(body, "/edit") || strings.Contains(body, "/delete") || strings.Contains(body, "notifications/new") {
					t.Errorf("a viewer sees a URL's path or a write control on %s", p)
				}
			}
			vb.Get(base+"/new").Want(t, 403)
			vb.Get(page+"/edit").Want(t, 403)
			form.Set("csrf", vtok)
			vb.Do("POST", base+"/new", form).Want(t, 403)
			vb.Do("POST", page+"/edit", form).Want(t, 403)
			vb.Do("POST", page+"/delete", url.Values{"csrf": {vtok}}).Want(t, 403)
			b.Do("POST", page+"/delete", url.Values{"csrf": {"forged"}}).Want(t, 403)
			b.Get(base+"/not-a-uuid").Want(t, 404)
			b.Get("/console/alerts/rules/00000000-0000-0000-0000-000000000001/notifications/"+strings.TrimPrefix(page, base+"/")).Want(t, 404)

			b.Do("POST", page+"/delete", url.Values{"csrf": {tok}}).Want(t, 303)
			b.Get(page).Want(t, 404)
		})

		t.Run("RevokedKeyEndsSession", func(t *testing.T) {
			k := s.NewKey(t, admin, "temp", "operator")
			b := fleetdtest.NewBrowser(t, s.URL)
			b.SignIn("default", k.Key)
			s.Do(t, admin, "DELETE", "/api/v1/apikeys/temp", nil).Want(t, 204)
			if res := b.Get("/console/devices"); res.Status != http.StatusSeeOther || !strings.HasPrefix(res.Header.Get("Location"), "/console/signin") {
				t.Fatalf("a deleted key's session answered %d", res.Status)
			}
		})

		t.Run("SignOut", func(t *testing.T) {
			// A copy of the cookie taken before signing out (a stolen one)
			// is refused after it: sign-out ends the session on the server.
			b := fleetdtest.NewBrowser(t, s.URL)
			tok := b.SignIn("default", operator.Key).CSRF(t)
			thief := b.CopyTo(b.Base)
			thief.Get("/console/devices").Want(t, 200)
			b.Do("POST", "/console/signout", url.Values{"csrf": {tok}}).Want(t, 303)
			b.Get("/console/devices").Want(t, 303)
			if res := thief.Get("/console/devices"); res.Status != http.StatusSeeOther || !strings.HasPrefix(res.Header.Get("Location"), "/console/signin") {
				t.Fatalf("the copied cookie answered %d after sign-out", res.Status)
			}
			thief = b.CopyTo(b.Base) // the copy again: the refusal deleted its cookie
			thief.Do("POST", "/console/actions/1/pause", url.Values{"csrf": {tok}}).Want(t, 401)
		})

		t.Run("BadInput", func(t *testing.T) {
			b := fleetdtest.NewBrowser(t, s.URL)
			b.SignIn("default", viewer.Key)
			for path, status := range map[string]int{
				"/console/devices?page=0":        400,
				"/console/devices?page=x":        400,
				"/console/devices?metadata=nokv": 400,
				"/console/devices/no%20such":     404,
				"/console/actions/abc":           404,
				"/console/actions/999999":        404,
				"/console/actions/1?status=Nope": 400,
			} {
				if res := b.Get(path); res.Status != status {
					t.Errorf("%s answered %d, want %d", path, res.Status, status)
				}
			}
			b.Client.Jar.SetCookies(&url.URL{Scheme: "http", Host: strings.TrimPrefix(s.URL, "http://"), Path: "/console/"},
				[]*http.Cookie{{Name: "fleetd_console", Value: "garbage", Path: "/console/"}})
			b.Get("/console/devices").Want(t, 303)
		})
	})
}

// TestConsoleOIDC signs in through a real OpenID provider: the
// authorization code flow with PKCE, the ID token verified against the
// tenant's JWKS, issuer, client id and nonce; the person gets the tenant's
// default role.
func TestConsoleOIDC(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, be sqlstoretest.Backend) {
		// The provider is on this machine: the egress policy must allow it.
		s := fleetdtest.Start(t, be, "--outbound-allow", "127.0.0.1")
		admin := s.Admin()
		op := fleetdtest.StartOIDCProvider(t, "fleetd-console", "console-secret", s.URL+"/console/oidc/callback")
		s.Do(t, admin, "PUT", "/api/v1/tenants/default/auth", op.TenantOIDC("fleetd-console", "console-secret", "operator")).Want(t, 204)
		var cfg map[string]any
		s.Do(t, admin, "GET", "/api/v1/tenants/default/auth", nil).Want(t, 200).Decode(t, &cfg)
		if o, _ := cfg["oidc"].(map[string]any); o["client_id"] != "fleetd-console" || o["client_secret_set"] != true || o["client_secret"] != nil {
			t.Fatalf("S9 shows oidc %v", cfg["oidc"])
		}

		t.Run("SignIn", func(t *testing.T) {
			b := fleetdtest.NewBrowser(t, s.URL)
			body := b.SignInOIDC(t, op).Want(t, 200).Body
			if !strings.Contains(body, op.Email) || !strings.Contains(body, "role-operator") {
				t.Fatalf("the overview after OIDC sign-in:\n%s", body)
			}
			// The person acts as themselves: a dispatch is theirs.
			tok := b.Get("/console/actions/new").Want(t, 200).CSRF(t)
			s.Do(t, admin, "POST", "/api/v1/devices", map[string]any{"id": "oidc-dev"}).Want(t, 201)
			res := b.Do("POST", "/console/actions/new", url.Values{"csrf": {tok}, "action": {"reboot"}, "params": {"{}"}, "search_type": {"default"}, "device_ids": {"oidc-dev"}}).Want(t, 303)
			if body := b.Get(res.Header.Get("Location")).Body; !strings.Contains(body, op.Email) {
				t.Errorf("the action does not name who dispatched it")
			}

			// A change of the tenant's sign-in settings ends the session.
			s.Do(t, admin, "PUT", "/api/v1/tenants/default/auth", op.TenantOIDC("fleetd-console", "console-secret", "viewer")).Want(t, 204)
			b.Get("/console/").Want(t, 303)
			if body := b.SignInOIDC(t, op).Want(t, 200).Body; !strings.Contains(body, "role-viewer") {
				t.Errorf("after the change, the person is not a viewer")
			}
		})

		t.Run("AdminEndsSession", func(t *testing.T) {
			// An admin ends a single sign-on user's sessions without
			// touching the tenant's sign-in settings: the person can sign
			// in again at once, and others stay signed in.
			var before, after map[string]any
			s.Do(t, admin, "GET", "/api/v1/tenants/default/auth", nil).Want(t, 200).Decode(t, &before)
			person, again := fleetdtest.NewBrowser(t, s.URL), fleetdtest.NewBrowser(t, s.URL)
			person.SignInOIDC(t, op).Want(t, 200)
			ab := fleetdtest.NewBrowser(t, s.URL)
			tok := ab.SignIn("default", admin.Key).CSRF(t)
			ids := sessionIDs(ab.Get("/console/settings/sessions").Want(t, 200).Body, op.Email)
			if len(ids) == 0 {
				t.Fatalf("the sessions page does not list %s", op.Email)
			}
			ab.Do("POST", "/console/settings/sessions/"+ids[0]+"/end", url.Values{"csrf": {tok}, "all": {"1"}}).Want(t, 303)
			person.Get("/console/").Want(t, 303)
			ab.Get("/console/").Want(t, 200)
			s.Do(t, admin, "GET", "/api/v1/tenants/default/auth", nil).Want(t, 200).Decode(t, &after)
			if before["updated_at"] != after["updated_at"] {
				t.Errorf("ending a session changed the sign-in settings: %v, then %v", before["updated_at"], after["updated_at"])
			}
			again.SignInOIDC(t, op).Want(t, 200)
		})

		t.Run("ForgedCallback", func(t *testing.T) {
			b := fleetdtest.NewBrowser(t, s.URL)
			b.Get("/console/signin/oidc?tenant=default").Want(t, 303)
			b.Get("/console/oidc/callback?code=abc&state=forged").Want(t, 403)
			fleetdtest.NewBrowser(t, s.URL).Get("/console/oidc/callback?code=abc&state=x").Want(t, 403)
			b.Get("/console/").Want(t, 303)
		})

		t.Run("WrongSecret", func(t *testing.T) {
			s.Do(t, admin, "PUT", "/api/v1/tenants/default/auth", op.TenantOIDC("fleetd-console", "not-the-secret", "operator")).Want(t, 204)
			defer func() {
				s.Do(t, admin, "PUT", "/api/v1/tenants/default/auth", op.TenantOIDC("fleetd-console", "console-secret", "operator")).Want(t, 204)
			}()
			b := fleetdtest.NewBrowser(t, s.URL)
			if res := b.SignInOIDC(t, op); res.Status != 401 || !strings.Contains(res.Body, "could not be verified") && !strings.Contains(res.Body, "did not accept") {
				t.Fatalf("a sign-in the provider refused to exchange answered %d:\n%s", res.Status, res.Body)
			}
		})

		t.Run("NoSSO", func(t *testing.T) {
			s.NewTenant(t, "plain")
			b := fleetdtest.NewBrowser(t, s.URL)
			if res := b.Get("/console/signin/oidc?tenant=plain").Want(t, 404); !strings.Contains(res.Body, "no single sign-on") {
				t.Errorf("the answer does not say why:\n%s", res.Body)
			}
			b.Get("/console/signin/oidc?tenant=Not_A_Tenant").Want(t, 400)
		})

		t.Run("BadSettings", func(t *testing.T) {
			body := op.TenantOIDC("", "x", "viewer")
			s.Do(t, admin, "PUT", "/api/v1/tenants/default/auth", body).Want(t, 400)
			body["oidc"] = map[string]any{"client_id": "c", "surprise": 1}
			s.Do(t, admin, "PUT", "/api/v1/tenants/default/auth", body).Want(t, 400)
		})
	})
}

// TestConsoleCookiesSecureBehindTLSProxy: fleetd serves plain HTTP behind
// a proxy that ends TLS, and --public-url says browsers use https: every
// console cookie it sets is Secure, so a browser never sends the session
// over plain HTTP. At f94a7fc they were Secure only when fleetd served TLS
// itself.
func TestConsoleCookiesSecureBehindTLSProxy(t *testing.T) {
	t.Parallel()
	s := fleetdtest.Start(t, sqlstoretest.Backends()[0], "--public-url", "https://fleet.example.com")
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
	tok := fleetdtest.Page{Body: string(body)}.CSRF(t)
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
