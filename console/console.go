// Package console is fleetd's web console: server-rendered html/template
// pages under /console/, a little plain JavaScript, and server-sent events
// for live progress. It reads and changes the fleet through the same
// services the API uses, as the signed-in API key or OIDC user, so roles,
// tenant isolation and the audit log apply as they do to API calls.
//
// Every asset is embedded in the binary: there is no front-end build step.
package console

import (
	"bytes"
	"embed"
	"errors"
	"html/template"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"runtime/debug"
	"strings"
	"time"

	"github.com/fleetd/fleet"
	fleethttp "github.com/fleetd/fleet/http"
	"github.com/fleetd/fleet/remote/relay"
)

// Prefix is where the console is served.
const Prefix = "/console/"

// Defaults of Console.
const (
	DefaultSessionTTL   = 12 * time.Hour
	DefaultLiveInterval = 250 * time.Millisecond
	// maxForm bounds any form but the firmware upload.
	maxForm = 1 << 20
)

//go:embed templates/*.html static/*
var assets embed.FS

// Presence says whether a device is connected to this replica's broker.
type Presence interface {
	Online(tenant, device string) bool
}

// OnlineCounter counts a tenant's devices connected to this replica's
// broker.
type OnlineCounter interface {
	OnlineCount(tenant string) int
}

// BodyReader reads a request's body, at most limit bytes.
type BodyReader interface {
	ReadBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error)
}

// Console serves the web console. Fill in the services, then call Open.
type Console struct {
	Tenants    fleet.TenantService
	TenantAuth fleet.TenantAuthService
	Devices    fleet.DeviceService
	Shadows    fleet.ShadowService
	Groups     fleet.GroupService
	Actions    fleet.ActionService
	Firmware   fleet.FirmwareService
	Alerts     fleet.AlertService
	Streams    fleet.StreamService
	// History reads stream history: the charts and the Logs tab.
	History fleet.HistoryService
	// Follows caps the Logs tabs and API log follows a tenant holds open
	// at once (the API server's); nil: no cap.
	Follows *fleethttp.Follows
	// Certificates issues device certificates; nil when fleetd has no MQTT
	// TLS listener to present them to.
	Certificates fleet.DeviceCertificateService
	Audit        fleet.AuditService
	// DDI keeps the tenant's hawkBit DDI settings.
	DDI      fleet.DDIService
	Sessions fleet.ConsoleSessionService
	// Remote opens and relays remote sessions (nil: none are served);
	// RemoteSessions lists and stops them, and keeps the tenant's choice
	// to record them.
	Remote         *relay.Hub
	RemoteSessions fleet.RemoteSessionService
	Secrets        SecretStore
	// Bodies reads a form's body within the budget of request bodies held
	// at once (fleethttp.Server.ReadBody).
	Bodies   BodyReader
	Targets  TargetCounter
	Presence Presence      // nil: online state unknown
	Online   OnlineCounter // nil: how many are online is unknown
	// OIDC signs people in with their tenant's identity provider; nil
	// offers API keys only.
	OIDC OIDC
	// PublicURL, when set, is where browsers reach fleetd: the OIDC
	// redirect URI is made on it.
	PublicURL string
	Logger    *slog.Logger
	Now       func() time.Time

	SessionTTL time.Duration
	// LiveInterval is how often a live page's event stream looks for
	// changes in the database (any replica may have applied a report).
	LiveInterval time.Duration
	// UploadLimit bounds a firmware upload from the console.
	UploadLimit int64
	// Templates bounds the sample render of a notification template, as
	// the API's (fleethttp.Server.Templates).
	Templates fleet.TemplateLimits

	seal   sealer
	feeds  feeds
	routes []consoleRoute
	mux    *http.ServeMux
	pages  map[string]*template.Template
}

// Open builds the console's routes. The settings pages bind the methods
// of DDI and RemoteSessions as it does: set those before.
func (c *Console) Open() {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.SessionTTL <= 0 {
		c.SessionTTL = DefaultSessionTTL
	}
	if c.LiveInterval <= 0 {
		c.LiveInterval = DefaultLiveInterval
	}
	if c.UploadLimit <= 0 {
		c.UploadLimit = 2 << 30
	}
	c.seal.store = c.Secrets
	c.pages = parsePages()

	static, _ := fs.Sub(assets, "static") // the directory is embedded
	c.routes = []consoleRoute{
		{"GET /console/static/", http.StripPrefix("/console/static/", staticFiles(http.FileServerFS(static)))},
		{"GET /console/signin", c.public(c.handleSigninForm)},
		{"POST /console/signin", c.public(c.handleSignin)},
		{"GET /console/signin/oidc", c.public(c.handleOIDCStart)},
		{"GET /console/oidc/callback", c.public(c.handleOIDCCallback)},
		{"POST /console/signout", c.page(fleet.PermRead, c.handleSignout)},

		{"GET /console/{$}", c.page(fleet.PermRead, c.handleOverview)},
		{"GET /console/events", c.page(fleet.PermRead, c.handleOverviewEvents)},
		{"GET /console/devices", c.page(fleet.PermRead, c.handleDevices)},
		{"GET /console/devices/{id}", c.page(fleet.PermRead, c.handleDevice)},
		{"GET /console/devices/{id}/charts/events", c.page(fleet.PermRead, c.handleDeviceChartEvents)},
		{"GET /console/devices/{id}/logs", c.page(fleet.PermRead, c.handleDeviceLogs)},
		{"GET /console/devices/{id}/logs/events", c.page(fleet.PermRead, c.handleDeviceLogEvents)},
		{"POST /console/devices/{id}/shadow", c.page(fleet.PermOperate, c.handleSetDesired)},
		{"POST /console/devices/{id}/token", c.page(fleet.PermOperate, c.handleRotateToken)},
		{"POST /console/devices/{id}/certificate", c.page(fleet.PermOperate, c.handleIssueCertificate)},
		{"POST /console/devices/{id}/terminal", c.page(fleet.PermRemote, c.handleOpenTerminal)},
		{"GET /console/devices/{id}/remote-sessions", c.page(fleet.PermRead, c.handleRemoteSessions)},
		{"GET /console/remote-sessions", c.page(fleet.PermRead, c.handleRemoteSessions)},
		{"GET /console/remote-sessions/{id}/terminal", c.page(fleet.PermRemote, c.handleTerminal)},
		{"GET /console/remote-sessions/{id}/socket", c.page(fleet.PermRemote, c.handleTerminalSocket)},
		{"POST /console/remote-sessions/{id}/end", c.page(fleet.PermRemote, c.handleStopRemoteSession)},
		{"GET /console/groups", c.page(fleet.PermRead, c.handleGroups)},
		{"POST /console/groups", c.page(fleet.PermOperate, c.handleCreateGroup)},
		{"GET /console/groups/{name}", c.page(fleet.PermRead, c.handleGroup)},
		{"POST /console/groups/{name}", c.page(fleet.PermOperate, c.handleUpdateGroup)},
		{"POST /console/groups/{name}/delete", c.page(fleet.PermOperate, c.handleDeleteGroup)},
		{"GET /console/devices/{id}/remote-sessions/{sid}/recording", c.page(fleet.PermRemote, c.handleRemoteRecording)},
		{"GET /console/actions", c.page(fleet.PermRead, c.handleActions)},
		{"GET /console/actions/new", c.page(fleet.PermOperate, c.handleDispatchForm)},
		{"POST /console/actions/new", c.page(fleet.PermOperate, c.handleDispatch)},
		{"GET /console/actions/{id}", c.page(fleet.PermRead, c.handleAction)},
		{"GET /console/actions/{id}/events", c.page(fleet.PermRead, c.handleActionEvents)},
		{"POST /console/actions/{id}/retry", c.page(fleet.PermOperate, c.handleRetry)},
		{"POST /console/actions/{id}/{op}", c.page(fleet.PermOperate, c.handleActionOp)},
		{"GET /console/firmware", c.page(fleet.PermRead, c.handleFirmware)},
		{"POST /console/firmware", c.page(fleet.PermOperate, c.handleUpload)},
		{"GET /console/firmware/{id}", c.page(fleet.PermRead, c.handleBundle)},
		{"POST /console/firmware/components/{component}/{version}", c.page(fleet.PermOperate, c.handleFirmwareActive)},
		{"GET /console/alerts", c.page(fleet.PermRead, c.handleAlerts)},
		{"GET /console/alerts/rules", c.page(fleet.PermRead, c.handleAlertRules)},
		{"GET /console/alerts/{id}", c.page(fleet.PermRead, c.handleAlert)},
		{"GET /console/alerts/rules/new", c.page(fleet.PermOperate, c.handleNewAlertRule)},
		{"POST /console/alerts/rules/new", c.page(fleet.PermOperate, c.handleSaveAlertRule)},
		{"GET /console/alerts/rules/{id}", c.page(fleet.PermRead, c.handleAlertRule)},
		{"GET /console/alerts/rules/{id}/edit", c.page(fleet.PermOperate, c.handleEditAlertRule)},
		{"POST /console/alerts/rules/{id}/edit", c.page(fleet.PermOperate, c.handleSaveAlertRule)},
		{"POST /console/alerts/rules/{id}/delete", c.page(fleet.PermOperate, c.handleDeleteAlertRule)},

		{"GET /console/settings", c.page(fleet.PermAdmin, c.handleSettings)},
		{"GET /console/settings/keys", c.page(fleet.PermAdmin, c.handleKeys)},
		{"POST /console/settings/keys", c.page(fleet.PermAdmin, c.handleCreateKey)},
		{"POST /console/settings/keys/{name}/delete", c.page(fleet.PermAdmin, c.handleDeleteKey)},
		{"GET /console/settings/auth", c.page(fleet.PermAdmin, c.handleAuth)},
		{"POST /console/settings/auth", c.page(fleet.PermAdmin, c.handleSetAuth)},
		{"GET /console/settings/ddi", c.page(fleet.PermAdmin, c.ddiSettings().show(c))},
		{"POST /console/settings/ddi", c.page(fleet.PermAdmin, c.ddiSettings().save)},
		{"GET /console/settings/remote", c.page(fleet.PermAdmin, c.remoteSettings().show(c))},
		{"POST /console/settings/remote", c.page(fleet.PermAdmin, c.remoteSettings().save)},
		{"GET /console/settings/audit", c.page(fleet.PermAdmin, c.handleAudit)},
		{"GET /console/settings/sessions", c.page(fleet.PermAdmin, c.handleSessions)},
		{"POST /console/settings/sessions/{id}/end", c.page(fleet.PermAdmin, c.handleEndSession)},
		{"GET /console/alerts/rules/{id}/notifications/new", c.page(fleet.PermOperate, c.handleNewNotification)},
		{"POST /console/alerts/rules/{id}/notifications/new", c.page(fleet.PermOperate, c.handleSaveNotification)},
		{"GET /console/alerts/rules/{id}/notifications/{nid}", c.page(fleet.PermRead, c.handleNotification)},
		{"GET /console/alerts/rules/{id}/notifications/{nid}/edit", c.page(fleet.PermOperate, c.handleEditNotification)},
		{"POST /console/alerts/rules/{id}/notifications/{nid}/edit", c.page(fleet.PermOperate, c.handleSaveNotification)},
		{"POST /console/alerts/rules/{id}/notifications/{nid}/delete", c.page(fleet.PermOperate, c.handleDeleteNotification)},
	}
	c.mux = http.NewServeMux()
	for _, rt := range c.routes {
		c.mux.Handle(rt.pattern, rt.handler)
	}
}

// ServeHTTP serves the console's routes.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) { c.mux.ServeHTTP(w, r) }

// consoleRoute is one console page or form.
type consoleRoute struct {
	pattern string
	handler http.Handler
}

// Patterns lists the console's routes, for the API server to send them
// here: the console has no catch-all, so it claims no path of the API's.
// Call it after Open.
func (c *Console) Patterns() []string {
	ps := make([]string, len(c.routes))
	for i, rt := range c.routes {
		ps[i] = rt.pattern
	}
	return ps
}

// securityHeaders are on every console answer: scripts only from the
// console's own files, no framing, no sniffing, no referrer leaving with a
// page's URL, nothing cached.
func securityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
		"object-src 'none'; base-uri 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
}

func staticFiles(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		securityHeaders(w.Header())
		w.Header().Set("Cache-Control", "no-cache")
		h.ServeHTTP(w, r)
	})
}

// view is what every page's template sees besides its own data.
type view struct {
	Actor *fleet.Actor
	// Session is the ID of the session (fleet.ConsoleSession.ID).
	Session string
	CSRF    string
	Title   string
	Nav     string
	Flash   string
	Error   string
	Fields  map[string]string
	Data    any
}

// Can reports whether the signed-in actor may do what perm names: the
// templates show write controls only to roles that may use them.
func (v *view) Can(perm string) bool {
	if v.Actor == nil {
		return false
	}
	switch perm {
	case "operate":
		return v.Actor.Role.Can(fleet.PermOperate)
	case "admin":
		return v.Actor.Role.Can(fleet.PermAdmin)
	case "remote":
		return v.Actor.Role.Can(fleet.PermRemote)
	}
	return v.Actor.Role.Can(fleet.PermRead)
}

// handler is a console handler: it renders its page or returns an error
// for the error page.
type handler func(w http.ResponseWriter, r *http.Request, v *view) error

// public serves a page that needs no session.
func (c *Console) public(h func(w http.ResponseWriter, r *http.Request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		securityHeaders(w.Header())
		w.Header().Set("Cache-Control", "no-store")
		defer c.recover(w, r)
		if err := h(w, r); err != nil {
			c.renderError(w, r, &view{}, err)
		}
	}
}

// page serves a page to a signed-in actor whose role grants perm. A
// request that changes anything must come from the console's own form: the
// same origin, and the session's CSRF token in its csrf field.
func (c *Console) page(perm fleet.Permission, h handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		securityHeaders(w.Header())
		w.Header().Set("Cache-Control", "no-store")
		defer c.recover(w, r)
		v := &view{}
		sess, actor, err := c.session(r)
		if err != nil {
			if fleet.ErrorCode(err) != fleet.EUNAUTHENTICATED {
				c.renderError(w, r, v, err)
				return
			}
			c.setCookie(w, r, sessionCookie, "", 0)
			if r.Method == http.MethodGet && !strings.HasSuffix(r.URL.Path, "/events") {
				http.Redirect(w, r, "/console/signin?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			c.renderError(w, r, v, fleet.Errorf(fleet.EUNAUTHENTICATED, "your session has ended; sign in again"))
			return
		}
		v.Actor, v.CSRF, v.Session = actor, sess.CSRF, fleet.HashSecret(sess.ID)
		// The actor before the form is read: its body takes from the
		// session's tenant's share of the body budget, not from the one
		// every request without a tenant shares.
		r = r.WithContext(fleet.NewContextWithActor(r.Context(), actor))
		if r.Method != http.MethodGet {
			if err := c.checkForm(w, r, sess.CSRF); err != nil {
				c.renderError(w, r, v, err)
				return
			}
		}
		if !actor.Role.Can(perm) {
			c.renderError(w, r, v, fleet.Errorf(fleet.EFORBIDDEN, "the %s role may not do this", actor.Role))
			return
		}
		if err := h(w, r, v); err != nil {
			c.renderError(w, r, v, err)
		}
	}
}

// checkForm refuses a state-changing request that did not come from a
// console form: another origin (Origin or Sec-Fetch-Site says so) or a
// csrf field that is not the session's token. Multipart forms (uploads)
// check their token themselves, as their first part.
func (c *Console) checkForm(w http.ResponseWriter, r *http.Request, token string) error {
	if !sameOrigin(r) {
		return fleet.Errorf(fleet.EFORBIDDEN, "this form was sent from another site")
	}
	if strings.HasPrefix(r.Header.Get("Content-Type"), "multipart/form-data") {
		return nil
	}
	if err := c.parseForm(w, r); err != nil {
		return err
	}
	if !tokensEqual(r.PostForm.Get("csrf"), token) {
		return fleet.Errorf(fleet.EFORBIDDEN, "this form is out of date or was not sent by the console; reload the page and try again")
	}
	return nil
}

// parseForm reads a form of at most maxForm bytes, within the budget of
// request bodies held (Bodies).
func (c *Console) parseForm(w http.ResponseWriter, r *http.Request) error {
	body, err := c.Bodies.ReadBody(w, r, maxForm)
	if err != nil {
		return err
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	if err := r.ParseForm(); err != nil {
		return fleet.Errorf(fleet.EINVALID, "the form could not be read: %v", err)
	}
	return nil
}

// crossOrigin is the standard library's check, with no origin trusted and
// nothing exempt: it is never changed, so one serves every request.
var crossOrigin = http.NewCrossOriginProtection()

// sameOrigin reports whether a request's browser says it comes from this
// site: its Sec-Fetch-Site, where browsers send it, else its Origin
// against Host (http.CrossOriginProtection). A request with neither is not
// a browser's, and the form's csrf token still has to match.
func sameOrigin(r *http.Request) bool {
	return crossOrigin.Check(r) == nil
}

// session reads and authenticates the session cookie: any problem is
// EUNAUTHENTICATED, but for a store that cannot answer.
func (c *Console) session(r *http.Request) (*session, *fleet.Actor, error) {
	unauth := fleet.Errorf(fleet.EUNAUTHENTICATED, "not signed in")
	ck, err := r.Cookie(sessionCookie)
	if err != nil {
		return nil, nil, unauth
	}
	var s session
	if err := c.seal.open(r.Context(), sessionCookie, ck.Value, &s); err != nil {
		if errors.Is(err, errBadCookie) {
			return nil, nil, unauth
		}
		return nil, nil, err
	}
	if c.Now().Unix() >= s.Expires || s.CSRF == "" || s.ID == "" {
		return nil, nil, unauth
	}
	if ok, err := c.Sessions.ConsoleSessionValid(r.Context(), s.Tenant, s.ID); err != nil {
		return nil, nil, err
	} else if !ok {
		return nil, nil, unauth
	}
	switch {
	case s.Key != "":
		a, err := c.Tenants.AuthenticateAPIKey(r.Context(), s.Tenant, s.Key)
		if err != nil {
			return nil, nil, err
		}
		return &s, a, nil
	case s.User != nil:
		if err := c.checkOIDCSession(r.Context(), &s); err != nil {
			return nil, nil, err
		}
		return &s, &fleet.Actor{Tenant: s.Tenant, Role: s.User.Role, UserName: s.User.Name, UserEmail: s.User.Email}, nil
	}
	return nil, nil, unauth
}

// startSession stores a session of a and gives the browser its cookie.
func (c *Console) startSession(w http.ResponseWriter, r *http.Request, s *session, a *fleet.Actor) error {
	s.CSRF = randomToken()
	s.Expires = c.Now().Add(c.SessionTTL).Unix()
	stored := &fleet.ConsoleSession{Tenant: s.Tenant, KeyName: a.KeyName, UserName: a.UserName, UserEmail: a.UserEmail,
		Role: a.Role, ExpiresAt: time.Unix(s.Expires, 0)}
	var err error
	// The start is audited as the person who signed in.
	if s.ID, err = c.Sessions.CreateConsoleSession(fleet.NewContextWithActor(r.Context(), a), stored); err != nil {
		return err
	}
	v, err := c.seal.seal(r.Context(), sessionCookie, s)
	if err != nil {
		return err
	}
	c.setCookie(w, r, sessionCookie, v, c.SessionTTL)
	c.setCookie(w, r, signinCookie, "", 0)
	return nil
}

func (c *Console) recover(w http.ResponseWriter, r *http.Request) {
	if p := recover(); p != nil {
		if p == http.ErrAbortHandler {
			panic(p)
		}
		c.Logger.Error("console panic", "panic", p, "stack", string(debug.Stack()),
			"request_id", fleet.RequestIDFromContext(r.Context()))
		http.Error(w, "internal error", http.StatusInternalServerError)
	}
}

// renderError shows err on the error page: its message when it is a
// fleet.Error, "internal error" (and a log line) when it is not.
func (c *Console) renderError(w http.ResponseWriter, r *http.Request, v *view, err error) {
	code := fleet.ErrorCode(err)
	status, msg := fleethttp.StatusOf(code), fleet.ErrorMessage(err)
	if code == fleet.EINTERNAL {
		msg = "internal error"
		c.Logger.Error("console", "err", err, "path", r.URL.Path, "request_id", fleet.RequestIDFromContext(r.Context()))
	}
	var fe *fleet.Error
	if errors.As(err, &fe) {
		v.Fields = fe.Fields
	}
	v.Title, v.Error = http.StatusText(status), msg
	c.render(w, r, status, "error", v)
}

// render executes a page's template; the page is written only once it
// executed whole, so a template error cannot leave half a page.
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, name string, v *view) {
	t := c.pages[name]
	var b strings.Builder
	if err := t.ExecuteTemplate(&b, "layout", v); err != nil {
		c.Logger.Error("console template", "page", name, "err", err, "request_id", fleet.RequestIDFromContext(r.Context()))
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(b.String()))
}
