package console

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/fleetd/fleet"
	fleethttp "github.com/fleetd/fleet/http"
)

// The settings pages are the admin role's, as their API is: API keys, the
// tenant's sign-in (S9), its hawkBit DDI and remote-session settings and the audit log. Other roles get no link to
// them and a 403 from them.

// roles are the roles a key may have, in the order the form offers them.
var roles = []fleet.Role{fleet.RoleViewer, fleet.RoleOperator, fleet.RoleAdmin, fleet.RoleDevice}

// keysData is the API keys page's.
type keysData struct {
	Keys  []*fleet.APIKey
	Pager pager
	// Mine is the name of the key this session signed in with: deleting
	// it signs the person out.
	Mine string
	// New is the key just created, with its secret: only on the page that
	// answers the form, never again.
	New   *fleet.APIKey
	Form  keyForm
	Roles []fleet.Role
}

// keyForm is what the create form sends, shown again when it is refused.
type keyForm struct {
	Name, Role, UserEmail string
}

func (c *Console) handleSettings(w http.ResponseWriter, r *http.Request, v *view) error {
	http.Redirect(w, r, "/console/settings/keys", http.StatusSeeOther)
	return nil
}

func (c *Console) handleKeys(w http.ResponseWriter, r *http.Request, v *view) error {
	return c.renderKeys(w, r, v, http.StatusOK, keysData{Form: keyForm{Role: string(fleet.RoleViewer)}})
}

// renderKeys shows the keys page with d's form and new key.
func (c *Console) renderKeys(w http.ResponseWriter, r *http.Request, v *view, status int, d keysData) error {
	p, err := readPage(r)
	if err != nil {
		return err
	}
	if d.Keys, d.Pager.Count, err = c.Tenants.FindAPIKeys(r.Context(), v.Actor.Tenant, p); err != nil {
		return err
	}
	d.Pager = newPager(r, p, d.Pager.Count)
	d.Mine, d.Roles = v.Actor.KeyName, roles
	v.Title, v.Nav, v.Data = "API keys", "settings", d
	c.render(w, r, status, "keys", v)
	return nil
}

// handleCreateKey makes a key with the API's rules (fleet.ReadAPIKey) and
// shows its secret on this answer only: the page is not cached, and its
// script replaces the history entry with the list's, so a reload or Back
// shows the list without it.
func (c *Console) handleCreateKey(w http.ResponseWriter, r *http.Request, v *view) error {
	form := keyForm{
		Name:      strings.TrimSpace(r.PostForm.Get("name")),
		Role:      r.PostForm.Get("role"),
		UserEmail: strings.TrimSpace(r.PostForm.Get("user_email")),
	}
	body := map[string]any{"name": form.Name, "role": form.Role}
	if form.UserEmail != "" {
		body["user_email"] = form.UserEmail
	}
	f := fleet.NewFields(body)
	k := fleet.ReadAPIKey(f)
	err := f.Err()
	if err == nil {
		err = c.Tenants.CreateAPIKey(r.Context(), v.Actor.Tenant, k)
	}
	switch code := fleet.ErrorCode(err); code {
	case "":
	case fleet.EINVALID, fleet.ECONFLICT:
		v.Error, v.Fields = fleet.ErrorMessage(err), fieldsOf(err)
		if code == fleet.ECONFLICT {
			v.Fields = map[string]string{"name": "is taken: choose another name, or delete that key first"}
		}
		r.URL.RawQuery = ""
		return c.renderKeys(w, r, v, fleethttp.StatusOf(code), keysData{Form: form})
	default:
		return err
	}
	v.Flash = "API key " + k.Name + " created. Copy it now: it is shown only on this page, and never again."
	r.URL.RawQuery = ""
	return c.renderKeys(w, r, v, http.StatusOK, keysData{New: k, Form: keyForm{Role: string(fleet.RoleViewer)}})
}

// handleDeleteKey deletes a key as DELETE /api/v1/apikeys/{name} does: its
// holder is refused from the next request on, and so is every console
// session made with it, this one included.
func (c *Console) handleDeleteKey(w http.ResponseWriter, r *http.Request, v *view) error {
	name := r.PathValue("name")
	if !fleet.ValidAPIKeyName(name) {
		return fleet.Errorf(fleet.ENOTFOUND, "no API key named %q", name)
	}
	if err := c.Tenants.DeleteAPIKey(r.Context(), v.Actor.Tenant, name); err != nil {
		return err
	}
	http.Redirect(w, r, "/console/settings/keys", http.StatusSeeOther)
	return nil
}

// authData is the tenant sign-in page's.
type authData struct {
	// Configured says whether the tenant has S9 settings at all.
	Configured bool
	Form       authForm
	Roles      []fleet.Role
	// RedirectURI is what the provider must know as the console's.
	RedirectURI string
}

// authForm is the tenant's S9 settings as the form shows them: never the
// client secret, only whether there is one.
type authForm struct {
	Method, JWKSURL, Issuer, Audience, WebhookURL, DefaultRole string
	ClientID                                                   string
	HasSecret                                                  bool
}

func authFormOf(a *fleet.TenantAuth) authForm {
	f := authForm{Method: a.Method, JWKSURL: a.JWKSURL, Issuer: a.Issuer, Audience: a.Audience,
		WebhookURL: a.WebhookURL, DefaultRole: string(a.DefaultRole)}
	if a.OIDC != nil {
		f.ClientID, f.HasSecret = a.OIDC.ClientID, a.OIDC.HasSecret
	}
	return f
}

// findAuth is the tenant's S9 settings, nil while it has none.
func (c *Console) findAuth(r *http.Request, tenant string) (*fleet.TenantAuth, error) {
	a, err := c.TenantAuth.FindTenantAuth(r.Context(), tenant)
	if fleet.ErrorCode(err) == fleet.ENOTFOUND {
		return nil, nil
	}
	return a, err
}

func (c *Console) handleAuth(w http.ResponseWriter, r *http.Request, v *view) error {
	a, err := c.findAuth(r, v.Actor.Tenant)
	if err != nil {
		return err
	}
	d := authData{Form: authForm{Method: fleet.AuthJWKS, DefaultRole: string(fleet.RoleViewer)}, Roles: roles, RedirectURI: c.redirectURI(r)}
	if a != nil {
		d.Configured, d.Form = true, authFormOf(a)
	}
	if r.URL.Query().Has("saved") {
		v.Flash = "Saved. Tokens are checked with these settings from now on; people who signed in with single sign-on sign in again."
	}
	v.Title, v.Nav, v.Data = "Sign-in", "settings", d
	c.render(w, r, http.StatusOK, "auth", v)
	return nil
}

// handleSetAuth replaces the tenant's S9 settings with the form's, read by
// the API's rules (fleet.ReadTenantAuth): only the chosen method's fields
// are sent. The client secret is write-only: left blank, the stored one
// is kept while the client id stays the same; "remove" drops it.
func (c *Console) handleSetAuth(w http.ResponseWriter, r *http.Request, v *view) error {
	p := r.PostForm
	get := func(k string) string { return strings.TrimSpace(p.Get(k)) }
	form := authForm{Method: get("method"), JWKSURL: get("jwks_url"), Issuer: get("issuer"), Audience: get("audience"),
		WebhookURL: get("webhook_url"), DefaultRole: get("default_role"), ClientID: get("oidc_client_id")}
	old, err := c.findAuth(r, v.Actor.Tenant)
	if err != nil {
		return err
	}
	body := map[string]any{"method": form.Method, "default_role": form.DefaultRole}
	switch form.Method {
	case fleet.AuthJWKS:
		body["jwks_url"], body["issuer"], body["audience"] = form.JWKSURL, form.Issuer, form.Audience
		if form.ClientID != "" {
			oidc := map[string]any{"client_id": form.ClientID}
			switch secret := p.Get("oidc_client_secret"); {
			case secret != "":
				oidc["client_secret"] = secret
			case p.Get("oidc_remove_secret") == "on":
			case old != nil && old.OIDC != nil && old.OIDC.HasSecret && old.OIDC.ClientID == form.ClientID:
				oidc["client_secret"] = old.OIDC.ClientSecret
			}
			body["oidc"] = oidc
		}
	case fleet.AuthWebhook:
		body["webhook_url"] = form.WebhookURL
	}
	f := fleet.NewFields(body)
	a := fleet.ReadTenantAuth(f)
	if err = f.Err(); err == nil {
		err = c.TenantAuth.SetTenantAuth(r.Context(), v.Actor.Tenant, a)
	}
	if fleet.ErrorCode(err) == fleet.EINVALID {
		if old != nil {
			form.HasSecret = old.OIDC != nil && old.OIDC.HasSecret
		}
		v.Error, v.Fields = fleet.ErrorMessage(err), fieldsOf(err)
		v.Title, v.Nav, v.Data = "Sign-in", "settings", authData{Configured: old != nil, Form: form, Roles: roles, RedirectURI: c.redirectURI(r)}
		c.render(w, r, http.StatusBadRequest, "auth", v)
		return nil
	} else if err != nil {
		return err
	}
	http.Redirect(w, r, "/console/settings/auth?saved", http.StatusSeeOther)
	return nil
}

// checkboxSettings is a page of one kind of a tenant's settings whose
// every field is a checkbox (hawkBit DDI, remote sessions): show renders
// them, save replaces them with the boxes the form ticked and comes back
// to the page with the flash. read and write are a service's methods,
// bound when Open builds the routes.
type checkboxSettings[T any] struct {
	path, title, template, flash string
	read                         func(ctx context.Context, tenant string) (T, error)
	write                        func(ctx context.Context, tenant string, set T) error
	form                         func(ticked func(name string) bool) T
}

func (p checkboxSettings[T]) show(c *Console) func(http.ResponseWriter, *http.Request, *view) error {
	return func(w http.ResponseWriter, r *http.Request, v *view) error {
		set, err := p.read(r.Context(), v.Actor.Tenant)
		if err != nil {
			return err
		}
		if r.URL.Query().Has("saved") {
			v.Flash = p.flash
		}
		v.Title, v.Nav, v.Data = p.title, "settings", set
		c.render(w, r, http.StatusOK, p.template, v)
		return nil
	}
}

func (p checkboxSettings[T]) save(w http.ResponseWriter, r *http.Request, v *view) error {
	set := p.form(func(name string) bool { return r.PostForm.Get(name) == "on" })
	if err := p.write(r.Context(), v.Actor.Tenant, set); err != nil {
		return err
	}
	http.Redirect(w, r, p.path+"?saved", http.StatusSeeOther)
	return nil
}

// ddiSettings is the page of the tenant's hawkBit DDI settings
// (docs/hawkbit.md).
func (c *Console) ddiSettings() checkboxSettings[fleet.DDISettings] {
	return checkboxSettings[fleet.DDISettings]{path: "/console/settings/ddi", title: "hawkBit", template: "ddi",
		flash: "Saved. Devices see the change at their next poll.",
		read:  c.DDI.DDISettings,
		write: c.DDI.SetDDISettings,
		form: func(ticked func(string) bool) fleet.DDISettings {
			return fleet.DDISettings{RequireConfirmation: ticked("require_confirmation"), GatewayRegistration: ticked("gateway_registration")}
		}}
}

// auditData is the audit log page's.
type auditData struct {
	Logs  []*fleet.AuditLog
	Pager pager
	// The filter, as the form shows it again: times in UTC.
	Actor, Action, Since, Until string
}

// formTime is how a datetime-local field writes a time; the page's times
// are UTC.
const formTime = "2006-01-02T15:04:05"

// handleAudit lists the audit log, newest first, a page at a time, with
// the API's filters: who (actor exactly), what (an action or its kind) and
// a time range [since, until).
func (c *Console) handleAudit(w http.ResponseWriter, r *http.Request, v *view) error {
	p, err := readPage(r)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	d := auditData{Actor: strings.TrimSpace(q.Get("actor")), Action: strings.TrimSpace(q.Get("action"))}
	f := fleet.AuditFilter{Actor: d.Actor, Action: d.Action, Page: p}
	problems := map[string]string{}
	for _, tf := range []struct {
		name string
		to   **time.Time
		text *string
	}{{"since", &f.Since, &d.Since}, {"until", &f.Until, &d.Until}} {
		s := strings.TrimSpace(q.Get(tf.name))
		if s == "" {
			continue
		}
		t, ok := readFormTime(s)
		if !ok {
			problems[tf.name] = "must be a date and time in UTC, such as 2026-11-25T18:30"
			*tf.text = s
			continue
		}
		*tf.to, *tf.text = &t, t.Format(formTime)
	}
	v.Title, v.Nav = "Audit log", "settings"
	if len(problems) > 0 {
		// The form again, with what was typed, rather than the error page.
		err := fleet.FieldErrors(problems)
		v.Error, v.Fields, v.Data = err.Message, err.Fields, d
		c.render(w, r, http.StatusBadRequest, "audit", v)
		return nil
	}
	if d.Logs, d.Pager.Count, err = c.Audit.FindAuditLogs(r.Context(), v.Actor.Tenant, f); err != nil {
		return err
	}
	d.Pager = newPager(r, p, d.Pager.Count)
	v.Data = d
	c.render(w, r, http.StatusOK, "audit", v)
	return nil
}

// readFormTime reads a datetime-local value (with or without seconds) as
// UTC, or an RFC 3339 time as the API takes it.
func readFormTime(s string) (time.Time, bool) {
	for _, layout := range []string{formTime, "2006-01-02T15:04", time.RFC3339Nano} {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC(), true
		}
	}
	return time.Time{}, false
}

// sessionsData is the open sessions page's.
type sessionsData struct {
	Sessions []*fleet.ConsoleSession
	Pager    pager
}

// handleSessions lists the tenant's open console sessions, newest first.
func (c *Console) handleSessions(w http.ResponseWriter, r *http.Request, v *view) error {
	p, err := readPage(r)
	if err != nil {
		return err
	}
	var d sessionsData
	if d.Sessions, d.Pager.Count, err = c.Sessions.FindConsoleSessions(r.Context(), v.Actor.Tenant, p); err != nil {
		return err
	}
	d.Pager = newPager(r, p, d.Pager.Count)
	v.Title, v.Nav, v.Data = "Sessions", "settings", d
	c.render(w, r, http.StatusOK, "sessions", v)
	return nil
}

// handleEndSession ends one session, or with the form's all=1 every
// session of the same person (key or single sign-on user), from their
// next request on, whichever replica serves it. The tenant's sign-in
// settings stay as they are.
func (c *Console) handleEndSession(w http.ResponseWriter, r *http.Request, v *view) error {
	if _, err := c.Sessions.EndConsoleSession(r.Context(), v.Actor.Tenant, r.PathValue("id"), r.PostForm.Get("all") == "1"); err != nil {
		return err
	}
	http.Redirect(w, r, "/console/settings/sessions", http.StatusSeeOther)
	return nil
}
