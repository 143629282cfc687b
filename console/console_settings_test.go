package console_test

import (
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// shownKey finds a secret API key in a page.
var shownKey = regexp.MustCompile(`fk_[A-Za-z0-9_-]+`)

// TestConsoleSettings covers the admin's settings pages over HTTP: API
// keys (a new key shown once, deletion ending the key's sessions), the
// tenant's sign-in settings and the audit log, each refused to other
// roles, with CSRF and escaping.
func TestConsoleSettings(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, be sqlstoretest.Backend) {
		// The OpenID provider is on this machine: the egress policy must
		// allow it.
		s := fleetdtest.Start(t, be, "--outbound-allow", "127.0.0.1")
		admin := s.Admin()
		operator := s.NewKey(t, admin, "olivia", "operator")
		viewer := s.NewKey(t, admin, "victor", "viewer")

		t.Run("DDI", func(t *testing.T) {
			b := fleetdtest.NewBrowser(t, s.URL)
			b.SignIn("default", admin.Key)
			res := b.Get("/console/settings/ddi").Want(t, 200)
			for _, box := range []string{`id="require-confirmation" name="require_confirmation" aria`, `id="gateway-registration" name="gateway_registration" aria`} {
				if !strings.Contains(res.Body, box) {
					t.Fatalf("the page lacks the unchecked box %s:\n%s", box, res.Body)
				}
			}
			tok := res.CSRF(t)
			b.Do("POST", "/console/settings/ddi", url.Values{"require_confirmation": {"on"}}).Want(t, 403)
			b.Do("POST", "/console/settings/ddi", url.Values{"csrf": {tok}, "require_confirmation": {"on"}}).Want(t, 303)
			var set struct {
				RequireConfirmation bool `json:"require_confirmation"`
				GatewayRegistration bool `json:"gateway_registration"`
			}
			s.Do(t, admin, "GET", "/api/v1/tenants/default/ddi", nil).Want(t, 200).Decode(t, &set)
			if !set.RequireConfirmation || set.GatewayRegistration {
				t.Fatalf("after the form: %+v", set)
			}
			if body := b.Get("/console/settings/ddi?saved").Want(t, 200).Body; !strings.Contains(body, `name="require_confirmation" checked`) || !strings.Contains(body, "Saved.") {
				t.Fatalf("the page after saving:\n%s", body)
			}
			var logs struct {
				AuditLogs []struct{ Actor string } `json:"audit_logs"`
			}
			s.Do(t, admin, "GET", "/api/v1/audit-logs?action=tenant.ddi.update", nil).Want(t, 200).Decode(t, &logs)
			if len(logs.AuditLogs) != 1 || logs.AuditLogs[0].Actor != "admin" {
				t.Fatalf("audit: %+v", logs.AuditLogs)
			}
			// Unchecked boxes turn the settings off again.
			b.Do("POST", "/console/settings/ddi", url.Values{"csrf": {tok}}).Want(t, 303)
			s.Do(t, admin, "GET", "/api/v1/tenants/default/ddi", nil).Want(t, 200).Decode(t, &set)
			if set.RequireConfirmation {
				t.Fatalf("after unchecking: %+v", set)
			}
			ob := fleetdtest.NewBrowser(t, s.URL) // a key of its own: Sessions counts olivia's
			ob.SignIn("default", s.NewKey(t, admin, "ddi-operator", "operator").Key)
			ob.Get("/console/settings/ddi").Want(t, 403)
			ob.Do("POST", "/console/settings/ddi", url.Values{"csrf": {ob.Get("/console/").CSRF(t)}, "require_confirmation": {"on"}}).Want(t, 403)
		})

		t.Run("Keys", func(t *testing.T) {
			b := fleetdtest.NewBrowser(t, s.URL)
			b.SignIn("default", admin.Key)
			res := b.Get("/console/settings/keys").Want(t, 200)
			if cc := res.Header.Get("Cache-Control"); cc != "no-store" {
				t.Errorf("Cache-Control %q", cc)
			}
			if k := shownKey.FindString(res.Body); k != "" {
				t.Fatalf("the list shows a key: %s", k)
			}
			for _, name := range []string{"admin", "olivia", "victor"} {
				if !strings.Contains(res.Body, "Delete API key "+name) {
					t.Errorf("the list lacks %s", name)
				}
			}

			// The new key is on the page answering the form, once.
			tok := res.CSRF(t)
			res = b.Do("POST", "/console/settings/keys", url.Values{"csrf": {tok}, "name": {"ci-runner"}, "role": {"operator"},
				"user_email": {"<script>alert(1)</script>@example.com"}}).Want(t, 200)
			key := shownKey.FindString(res.Body)
			if key == "" || strings.Count(res.Body, key) != 1 {
				t.Fatalf("the answer does not show the new key once:\n%s", res.Body)
			}
			if cc := res.Header.Get("Cache-Control"); cc != "no-store" {
				t.Errorf("the key's page may be cached: Cache-Control %q", cc)
			}
			if strings.Contains(res.Body, "<script>alert(1)") || !strings.Contains(res.Body, html.EscapeString("<script>alert(1)</script>@example.com")) {
				t.Errorf("the holder's email is not escaped")
			}
			s.Do(t, fleetdtest.Creds{Tenant: "default", Key: key}, "GET", "/api/v1/devices", nil).Want(t, 200)
			if body := b.Get("/console/settings/keys").Want(t, 200).Body; strings.Contains(body, key) || shownKey.MatchString(body) {
				t.Errorf("the key is shown again")
			}

			// Refusals keep what was typed, escaped, and name the field.
			res = b.Do("POST", "/console/settings/keys", url.Values{"csrf": {tok}, "name": {"<script>alert(1)</script>"}, "role": {"chief"}}).Want(t, 400)
			if strings.Contains(res.Body, "<script>alert(1)") || !strings.Contains(res.Body, html.EscapeString("<script>alert(1)</script>")) ||
				!strings.Contains(res.Body, "<code>name</code>") || !strings.Contains(res.Body, "<code>role</code>") {
				t.Errorf("a refused key:\n%s", res.Body)
			}
			res = b.Do("POST", "/console/settings/keys", url.Values{"csrf": {tok}, "name": {"ci-runner"}, "role": {"viewer"}}).Want(t, 409)
			if shownKey.MatchString(res.Body) || !strings.Contains(res.Body, "exists already") {
				t.Errorf("a taken name:\n%s", res.Body)
			}
			b.Do("POST", "/console/settings/keys", url.Values{"name": {"x"}, "role": {"admin"}}).Want(t, 403)
			b.Do("POST", "/console/settings/keys", url.Values{"csrf": {tok}, "name": {"x"}, "role": {"admin"}}, "Origin", "https://evil.example").Want(t, 403)

			// Deleting a key ends the sessions made with it at their next
			// request.
			held := fleetdtest.NewBrowser(t, s.URL)
			held.SignIn("default", key)
			b.Do("POST", "/console/settings/keys/ci-runner/delete", url.Values{"csrf": {tok}}).Want(t, 303)
			if res := held.Get("/console/devices"); res.Status != http.StatusSeeOther || !strings.HasPrefix(res.Header.Get("Location"), "/console/signin") {
				t.Fatalf("the deleted key's session answered %d", res.Status)
			}
			s.Do(t, fleetdtest.Creds{Tenant: "default", Key: key}, "GET", "/api/v1/devices", nil).Want(t, 401)
			b.Do("POST", "/console/settings/keys/ci-runner/delete", url.Values{"csrf": {tok}}).Want(t, 404)
			b.Do("POST", "/console/settings/keys/no%20such/delete", url.Values{"csrf": {tok}}).Want(t, 404)

			// The tenant's last admin key stays, and says why.
			if res := b.Do("POST", "/console/settings/keys/admin/delete", url.Values{"csrf": {tok}}).Want(t, 409); !strings.Contains(res.Body, "last admin key") {
				t.Errorf("deleting the last admin key:\n%s", res.Body)
			}
		})

		t.Run("DeleteOwnKey", func(t *testing.T) {
			second := s.NewKey(t, admin, "admin-2", "admin")
			b := fleetdtest.NewBrowser(t, s.URL)
			tok := b.SignIn("default", second.Key).CSRF(t)
			if body := b.Get("/console/settings/keys").Want(t, 200).Body; !strings.Contains(body, "the key you signed in with") {
				t.Errorf("the page does not warn that admin-2 is this session's key")
			}
			res := b.Do("POST", "/console/settings/keys/admin-2/delete", url.Values{"csrf": {tok}}).Want(t, 303)
			if res := b.Get(res.Header.Get("Location")); res.Status != http.StatusSeeOther || !strings.HasPrefix(res.Header.Get("Location"), "/console/signin") {
				t.Fatalf("after deleting its own key the session answered %d", res.Status)
			}
		})

		t.Run("Sessions", func(t *testing.T) {
			b := fleetdtest.NewBrowser(t, s.URL)
			tok := b.SignIn("default", admin.Key).CSRF(t)
			first, second, other := fleetdtest.NewBrowser(t, s.URL), fleetdtest.NewBrowser(t, s.URL), fleetdtest.NewBrowser(t, s.URL)
			first.SignIn("default", viewer.Key)
			second.SignIn("default", viewer.Key)
			other.SignIn("default", operator.Key)
			res := b.Get("/console/settings/sessions").Want(t, 200)
			ids := sessionIDs(res.Body, "victor")
			if len(ids) != 2 || len(sessionIDs(res.Body, "olivia")) != 1 || !strings.Contains(res.Body, "this session") {
				t.Fatalf("the page lists victor's sessions %v:\n%s", ids, res.Body)
			}
			first.Get("/console/settings/sessions").Want(t, 403)
			first.Do("POST", "/console/settings/sessions/"+ids[0]+"/end", url.Values{"csrf": {first.Get("/console/").CSRF(t)}}).Want(t, 403)

			// Ending one session signs out that browser only.
			b.Do("POST", "/console/settings/sessions/"+ids[0]+"/end", url.Values{"csrf": {tok}}).Want(t, 303)
			if a, z := first.Get("/console/devices").Status, second.Get("/console/devices").Status; a+z != 200+303 {
				t.Fatalf("after ending one of two sessions, they answered %d and %d", a, z)
			}
			b.Do("POST", "/console/settings/sessions/"+ids[0]+"/end", url.Values{"csrf": {tok}}).Want(t, 404)

			// "End all of theirs" ends every session of the key's holder,
			// and no one else's; the key itself stays valid.
			b.Do("POST", "/console/settings/sessions/"+ids[1]+"/end", url.Values{"csrf": {tok}, "all": {"1"}}).Want(t, 303)
			first.Get("/console/devices").Want(t, 303)
			second.Get("/console/devices").Want(t, 303)
			other.Get("/console/devices").Want(t, 200)
			b.Get("/console/devices").Want(t, 200)
			s.Do(t, viewer, "GET", "/api/v1/devices", nil).Want(t, 200)
			if body := b.Get("/console/settings/sessions").Body; len(sessionIDs(body, "victor")) != 0 {
				t.Errorf("victor's sessions are still listed:\n%s", body)
			}
			if body := b.Get("/console/settings/audit?action=console.session.end").Want(t, 200).Body; !strings.Contains(body, "victor") {
				t.Errorf("the audit log lacks the ends:\n%s", body)
			}

			// Another tenant's admin neither sees nor ends them.
			them := s.NewTenant(t, "sessions-other")
			ob := fleetdtest.NewBrowser(t, s.URL)
			otok := ob.SignIn("sessions-other", them.Key).CSRF(t)
			if body := ob.Get("/console/settings/sessions").Want(t, 200).Body; strings.Contains(body, "olivia") {
				t.Errorf("another tenant's admin sees olivia's session")
			}
			olivia := sessionIDs(b.Get("/console/settings/sessions").Body, "olivia")
			ob.Do("POST", "/console/settings/sessions/"+olivia[0]+"/end", url.Values{"csrf": {otok}, "all": {"1"}}).Want(t, 404)
			other.Get("/console/devices").Want(t, 200)
		})

		t.Run("SignInSettings", func(t *testing.T) {
			op := fleetdtest.StartOIDCProvider(t, "fleetd-console", "console-secret", s.URL+"/console/oidc/callback")
			type settings struct {
				Method      string `json:"method"`
				Issuer      string `json:"issuer"`
				WebhookURL  string `json:"webhook_url"`
				DefaultRole string `json:"default_role"`
				OIDC        *struct {
					ClientID  string `json:"client_id"`
					SecretSet bool   `json:"client_secret_set"`
				} `json:"oidc"`
			}
			stored := func() settings {
				t.Helper()
				var a settings
				s.Do(t, admin, "GET", "/api/v1/tenants/default/auth", nil).Want(t, 200).Decode(t, &a)
				return a
			}
			b := fleetdtest.NewBrowser(t, s.URL)
			b.SignIn("default", admin.Key)
			res := b.Get("/console/settings/auth").Want(t, 200)
			if !strings.Contains(res.Body, "Not configured") {
				t.Errorf("the page does not say the tenant has no settings")
			}
			tok := res.CSRF(t)
			form := url.Values{"csrf": {tok}, "method": {"jwks"}, "jwks_url": {op.JWKSURL}, "issuer": {op.Issuer}, "audience": {"fleetd-api"},
				"default_role": {"operator"}, "oidc_client_id": {"fleetd-console"}, "oidc_client_secret": {"console-secret"},
				"webhook_url": {"https://not-this-method.example/"}}
			res = b.Do("POST", "/console/settings/auth", form).Want(t, 303)
			if a := stored(); a.Method != "jwks" || a.Issuer != op.Issuer || a.DefaultRole != "operator" || a.WebhookURL != "" ||
				a.OIDC == nil || a.OIDC.ClientID != "fleetd-console" || !a.OIDC.SecretSet {
				t.Fatalf("S9 after the form: %+v", a)
			}
			body := b.Get(res.Header.Get("Location")).Want(t, 200).Body
			if strings.Contains(body, "console-secret") || !strings.Contains(body, "A secret is set") || !strings.Contains(body, "Saved.") ||
				!strings.Contains(body, html.EscapeString(s.URL+"/console/oidc/callback")) {
				t.Errorf("the saved settings' page:\n%s", body)
			}

			// A blank secret keeps the stored one: the provider, which
			// checks it, still lets a person sign in.
			form.Set("oidc_client_secret", "")
			form.Set("default_role", "viewer")
			b.Do("POST", "/console/settings/auth", form).Want(t, 303)
			if body := fleetdtest.NewBrowser(t, s.URL).SignInOIDC(t, op).Want(t, 200).Body; !strings.Contains(body, "role-viewer") {
				t.Errorf("after a save with the secret left blank, the person is not a viewer:\n%s", body)
			}
			// Removed, the provider refuses the console's exchange.
			form.Set("oidc_remove_secret", "on")
			b.Do("POST", "/console/settings/auth", form).Want(t, 303)
			if a := stored(); a.OIDC == nil || a.OIDC.SecretSet {
				t.Fatalf("S9 after removing the secret: %+v", a.OIDC)
			}
			if res := fleetdtest.NewBrowser(t, s.URL).SignInOIDC(t, op); res.Status != 401 {
				t.Errorf("a sign-in without the secret answered %d", res.Status)
			}
			form.Del("oidc_remove_secret")

			// A refusal names the field, shows what was typed, escaped,
			// but never the secret, and changes nothing.
			bad := url.Values{"csrf": {tok}, "method": {"jwks"}, "jwks_url": {"not a url"}, "issuer": {"<script>alert(1)</script>"},
				"audience": {"a"}, "default_role": {"viewer"}, "oidc_client_id": {"c"}, "oidc_client_secret": {"typed-secret"}}
			res = b.Do("POST", "/console/settings/auth", bad).Want(t, 400)
			if !strings.Contains(res.Body, "<code>jwks_url</code>") || strings.Contains(res.Body, "typed-secret") ||
				strings.Contains(res.Body, "<script>alert(1)") || !strings.Contains(res.Body, html.EscapeString("<script>alert(1)</script>")) {
				t.Errorf("a refused form:\n%s", res.Body)
			}
			bad.Set("method", "ldap")
			if res := b.Do("POST", "/console/settings/auth", bad).Want(t, 400); !strings.Contains(res.Body, "<code>method</code>") {
				t.Errorf("an unknown method:\n%s", res.Body)
			}
			b.Do("POST", "/console/settings/auth", form, "Origin", "https://evil.example").Want(t, 403)
			if a := stored(); a.Issuer != op.Issuer || a.DefaultRole != "viewer" {
				t.Errorf("refused forms changed S9: %+v", a)
			}

			// Webhook: the jwks fields typed in the form are not sent.
			form.Set("method", "webhook")
			form.Set("webhook_url", "https://auth.example.com/fleetd")
			b.Do("POST", "/console/settings/auth", form).Want(t, 303)
			if a := stored(); a.Method != "webhook" || a.WebhookURL != "https://auth.example.com/fleetd" || a.Issuer != "" || a.OIDC != nil {
				t.Errorf("S9 after choosing webhook: %+v", a)
			}

			for _, c := range []fleetdtest.Creds{operator, viewer} {
				nb := fleetdtest.NewBrowser(t, s.URL)
				tok := nb.SignIn("default", c.Key).CSRF(t)
				nb.Get("/console/settings/auth").Want(t, 403)
				form.Set("csrf", tok)
				form.Set("webhook_url", "https://evil.example/")
				nb.Do("POST", "/console/settings/auth", form).Want(t, 403)
			}
			if a := stored(); a.WebhookURL != "https://auth.example.com/fleetd" {
				t.Errorf("a non-admin changed S9: %+v", a)
			}
		})

		t.Run("AuditLog", func(t *testing.T) {
			b := fleetdtest.NewBrowser(t, s.URL)
			b.SignIn("default", admin.Key)
			body := b.Get("/console/settings/audit").Want(t, 200).Body
			for _, want := range []string{"apikey.create", "apikeys/ci-runner", "apikey.delete", "tenant.auth.update",
				html.EscapeString("<script>alert(1)</script>@example.com")} {
				if !strings.Contains(body, want) {
					t.Errorf("the audit log lacks %s", want)
				}
			}
			if strings.Contains(body, "<script>alert(1)") {
				t.Errorf("the audit log does not escape what a person typed")
			}

			// 55 changes by one key fill two pages of its own filter; the
			// pager keeps the filter.
			bot := s.NewKey(t, admin, "pager-bot", "operator")
			for i := range 55 {
				s.Do(t, bot, "POST", "/api/v1/devices", map[string]any{"id": fmt.Sprintf("audit-%02d", i)}).Want(t, 201)
			}
			rows := func(body string) int { return strings.Count(body, `<td class="mono">`) }
			body = b.Get("/console/settings/audit?actor=pager-bot").Want(t, 200).Body
			if !strings.Contains(body, "55 entries") || rows(body) != 50 || !strings.Contains(body, "page 1 of 2") ||
				!strings.Contains(body, html.EscapeString("/console/settings/audit?actor=pager-bot&page=2")) {
				t.Fatalf("the first page of pager-bot's changes (%d rows):\n%s", rows(body), body)
			}
			if body := b.Get("/console/settings/audit?actor=pager-bot&page=2").Want(t, 200).Body; rows(body) != 5 || !strings.Contains(body, "device.create") {
				t.Errorf("the second page has %d rows", rows(body))
			}
			// An action, or every action of its kind, with the actor.
			body = b.Get("/console/settings/audit?action=apikey").Want(t, 200).Body
			if !strings.Contains(body, "apikey.create") || !strings.Contains(body, "apikey.delete") || strings.Contains(body, "device.create") ||
				!strings.Contains(body, `value="apikey"`) {
				t.Errorf("the apikey actions:\n%s", body)
			}
			body = b.Get("/console/settings/audit?action=device.create&actor=pager-bot&page=2").Want(t, 200).Body
			if rows(body) != 5 {
				t.Errorf("pager-bot's device.create, page 2: %d rows", rows(body))
			}
			if body := b.Get("/console/settings/audit?actor=nobody").Want(t, 200).Body; rows(body) != 0 || !strings.Contains(body, "matches these filters") {
				t.Errorf("an actor with no change:\n%s", body)
			}

			// The time range is [since, until) in UTC, as in the API.
			var newest struct {
				AuditLogs []struct {
					CreatedAt time.Time `json:"created_at"`
				} `json:"audit_logs"`
			}
			s.Do(t, admin, "GET", "/api/v1/audit-logs?actor=pager-bot&limit=1", nil).Want(t, 200).Decode(t, &newest)
			last := newest.AuditLogs[0].CreatedAt.UTC()
			after := last.Add(time.Millisecond).Format(time.RFC3339Nano)
			if body := b.Get("/console/settings/audit?actor=pager-bot&since="+url.QueryEscape(after)).Want(t, 200).Body; rows(body) != 0 {
				t.Errorf("%d changes since after the last one", rows(body))
			}
			since := last.Truncate(time.Second).Format("2006-01-02T15:04:05")
			body = b.Get("/console/settings/audit?actor=pager-bot&since="+since+"&until="+url.QueryEscape(after)).Want(t, 200).Body
			if rows(body) == 0 || !strings.Contains(body, `value="`+since+`"`) {
				t.Errorf("the last change is not in [%s, %s) or the form does not keep the time:\n%s", since, after, body)
			}
			res := b.Get("/console/settings/audit?since=yesterday&actor="+url.QueryEscape("<b>x</b>")).Want(t, 400)
			if !strings.Contains(res.Body, "<code>since</code>") || !strings.Contains(res.Body, `value="yesterday"`) ||
				!strings.Contains(res.Body, html.EscapeString("<b>x</b>")) || strings.Contains(res.Body, "<b>x</b>") {
				t.Errorf("a bad time:\n%s", res.Body)
			}
			b.Get("/console/settings/audit?page=0").Want(t, 400)
		})

		t.Run("OnlyAdmins", func(t *testing.T) {
			for _, c := range []fleetdtest.Creds{operator, viewer} {
				b := fleetdtest.NewBrowser(t, s.URL)
				overview := b.SignIn("default", c.Key)
				if strings.Contains(overview.Body, `href="/console/settings"`) {
					t.Errorf("a non-admin is offered the settings")
				}
				tok := overview.CSRF(t)
				for _, p := range []string{"/console/settings", "/console/settings/keys", "/console/settings/auth", "/console/settings/audit"} {
					b.Get(p).Want(t, 403)
				}
				b.Do("POST", "/console/settings/keys", url.Values{"csrf": {tok}, "name": {"sneaky"}, "role": {"admin"}}).Want(t, 403)
				b.Do("POST", "/console/settings/keys/admin/delete", url.Values{"csrf": {tok}}).Want(t, 403)
			}
			var list struct {
				APIKeys []struct{ Name string } `json:"apikeys"`
			}
			s.Do(t, admin, "GET", "/api/v1/apikeys", nil).Want(t, 200).Decode(t, &list)
			names := map[string]bool{}
			for _, k := range list.APIKeys {
				names[k.Name] = true
			}
			if names["sneaky"] || names["x"] || !names["admin"] {
				t.Errorf("refused and forged forms changed the keys: %v", names)
			}
			b := fleetdtest.NewBrowser(t, s.URL)
			if body := b.SignIn("default", admin.Key).Body; !strings.Contains(body, `href="/console/settings"`) {
				t.Errorf("an admin is not offered the settings")
			}
		})
	})
}

var sessionRow = regexp.MustCompile(`(?s)<tr>\s*<td>(.*?)</td>.*?/console/settings/sessions/([0-9a-f]{64})/end`)

// sessionIDs are the ids of the sessions on the sessions page whose person
// is user (a name or an email), in its order.
func sessionIDs(body, user string) []string {
	var ids []string
	for _, m := range sessionRow.FindAllStringSubmatch(body, -1) {
		if m[1] == user || strings.Contains(m[1], ">"+user+"<") {
			ids = append(ids, m[2])
		}
	}
	return ids
}
