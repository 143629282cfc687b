package console_test

import (
	"html"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// signedIn is a person signed in to the console whose forms carry the
// session's token from the console's origin.
type signedIn struct {
	t *testing.T
	*fleetdtest.Browser
	csrf string
}

func signInAs(t *testing.T, s *fleetdtest.Server, c fleetdtest.Creds) *signedIn {
	t.Helper()
	b := fleetdtest.NewBrowser(t, s.URL)
	return &signedIn{t, b, b.SignIn(c.Tenant, c.Key).CSRF(t)}
}

// answer is a console page with where it redirects to.
type answer struct {
	fleetdtest.Page
	Location string
}

func (b *signedIn) get(path string) answer {
	b.t.Helper()
	p := b.Get(path)
	return answer{p, p.Header.Get("Location")}
}

func (b *signedIn) post(path string, form url.Values) answer {
	b.t.Helper()
	form.Set("csrf", b.csrf)
	p := b.Do("POST", path, form, "Origin", b.Base)
	return answer{p, p.Header.Get("Location")}
}

// want fails t unless the page has status and says each of says.
func (a answer) want(t *testing.T, status int, says ...string) answer {
	t.Helper()
	a.Want(t, status)
	for _, s := range says {
		if !strings.Contains(a.Body, s) {
			t.Errorf("the page (%d) does not say %q:\n%s", a.Status, s, a.Body)
		}
	}
	return a
}

// shadowOf reads a device's shadow through the API.
func shadowOf(t *testing.T, s *fleetdtest.Server, c fleetdtest.Creds, id string) (desired map[string]any, version int64) {
	t.Helper()
	var sh struct {
		Desired map[string]any
		Version int64
	}
	s.Do(t, c, "GET", "/api/v1/devices/"+id+"/shadow", nil).Want(t, 200).Decode(t, &sh)
	return sh.Desired, sh.Version
}

// TestConsoleTwin covers the twin's and the groups' pages without a
// browser: the desired state's form (saved as a merge patch from the
// version shown; a stale version, bad JSON and the limits shown on the
// page with the API's words), roles, tenant isolation, the groups pages
// (live counts, paging, the selector's position in its error), the
// devices filter by group and twin state, the overview's counts, and a
// dispatch to a group.
func TestConsoleTwin(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, be sqlstoretest.Backend) {
		s := fleetdtest.Start(t, be)
		admin := s.Admin()
		operator := s.NewKey(t, admin, "olivia", "operator")
		viewer := s.NewKey(t, admin, "victor", "viewer")
		s.Do(t, admin, "POST", "/api/v1/devices", map[string]any{"id": "pump-1", "metadata": map[string]any{"site": "berlin"}}).Want(t, 201)
		s.Do(t, admin, "POST", "/api/v1/devices", map[string]any{"id": "pump-2", "metadata": map[string]any{"site": "paris"}}).Want(t, 201)
		other := s.NewTenant(t, "other")
		s.Do(t, other, "POST", "/api/v1/devices", map[string]any{"id": "theirs", "metadata": map[string]any{"site": "berlin"}}).Want(t, 201)
		s.Do(t, other, "POST", "/api/v1/groups", map[string]any{"name": "theirs", "selector": "site=berlin"}).Want(t, 201)
		op, vw, stranger := signInAs(t, s, operator), signInAs(t, s, viewer), signInAs(t, s, s.NewKey(t, other, "oscar", "operator"))

		t.Run("Desired", func(t *testing.T) {
			op.get("/console/devices/pump-1").want(t, 200, `id="twin"`, `name="version" value="0"`, "In sync")
			res := op.post("/console/devices/pump-1/shadow", url.Values{"version": {"0"}, "desired": {`{"interval": 30, "log": {"level": "info", "file": "/var/log/p"}}`}})
			if res.Status != http.StatusSeeOther || res.Location != "/console/devices/pump-1#twin" {
				t.Fatalf("saving answered %d to %q:\n%s", res.Status, res.Location, res.Body)
			}
			if d, v := shadowOf(t, s, admin, "pump-1"); v != 1 || d["interval"] != 30.0 {
				t.Fatalf("desired %v at version %d", d, v)
			}
			op.get("/console/devices/pump-1").want(t, 200, `name="version" value="1"`, "Out of sync", html.EscapeString(`"interval": 30`))

			// The whole state as typed: a key left out is removed, one
			// inside an object too.
			op.post("/console/devices/pump-1/shadow", url.Values{"version": {"1"}, "desired": {`{"log": {"level": "debug"}}`}}).want(t, http.StatusSeeOther)
			d, v := shadowOf(t, s, admin, "pump-1")
			if log, _ := d["log"].(map[string]any); v != 2 || len(d) != 1 || len(log) != 1 || log["level"] != "debug" {
				t.Fatalf("desired %v at version %d, want only log.level=debug at 2", d, v)
			}

			// A page read before the last change saves nothing, says so,
			// and keeps the text typed.
			res = op.post("/console/devices/pump-1/shadow", url.Values{"version": {"1"}, "desired": {`{"interval": 99}`}}).
				want(t, http.StatusConflict, "Someone changed the desired state since this page was read", html.EscapeString(`{"interval": 99}`), `name="version" value="2"`)
			if d, v := shadowOf(t, s, admin, "pump-1"); v != 2 || d["interval"] != nil {
				t.Fatalf("a stale form changed the desired state to %v (version %d)", d, v)
			}
			// What the API refuses, the page shows in the API's words.
			op.post("/console/devices/pump-1/shadow", url.Values{"version": {"2"}, "desired": {`{"interval": `}}).
				want(t, http.StatusBadRequest, "must be a JSON object")
			op.post("/console/devices/pump-1/shadow", url.Values{"version": {"2"}, "desired": {`[1]`}}).
				want(t, http.StatusBadRequest, "must be an object")
			op.post("/console/devices/pump-1/shadow", url.Values{"version": {"2"}, "desired": {`{"a":{"b":{"c":{"d":{"e":{"f":{"g":{"h":{"i":1}}}}}}}}}`}}).
				want(t, http.StatusBadRequest, "desired.a.b.c.d.e.f.g.h.i")
			op.post("/console/devices/pump-1/shadow", url.Values{"version": {"2"}, "desired": {`{"blob": "` + strings.Repeat("x", 33<<10) + `"}`}}).
				want(t, http.StatusRequestEntityTooLarge, "desired")
			if _, v := shadowOf(t, s, admin, "pump-1"); v != 2 {
				t.Fatalf("a refused form moved the version to %d", v)
			}
			op.post("/console/devices/pump-1/shadow", url.Values{"version": {"x"}, "desired": {`{}`}}).want(t, http.StatusBadRequest)
			op.post("/console/devices/nothing/shadow", url.Values{"version": {"0"}, "desired": {`{}`}}).want(t, http.StatusNotFound)
		})

		t.Run("Roles", func(t *testing.T) {
			page := vw.get("/console/devices/pump-1").want(t, 200, `data-twin="desired"`, "debug").Body
			if strings.Contains(page, `name="desired"`) {
				t.Errorf("a viewer is offered the desired state's form")
			}
			vw.post("/console/devices/pump-1/shadow", url.Values{"version": {"2"}, "desired": {`{}`}}).want(t, http.StatusForbidden)
			if strings.Contains(vw.get("/console/groups").want(t, 200).Body, "Create group") {
				t.Errorf("a viewer is offered a new group's form")
			}
			vw.post("/console/groups", url.Values{"name": {"mine"}, "selector": {"site"}}).want(t, http.StatusForbidden)
			if _, v := shadowOf(t, s, admin, "pump-1"); v != 2 {
				t.Fatalf("a viewer's form moved the version to %d", v)
			}
		})

		t.Run("Groups", func(t *testing.T) {
			res := op.post("/console/groups", url.Values{"name": {"berlin"}, "selector": {"site = berlin"}, "description": {"<b>north</b>"}})
			if res.Status != http.StatusSeeOther || res.Location != "/console/groups/berlin" {
				t.Fatalf("creating answered %d to %q:\n%s", res.Status, res.Location, res.Body)
			}
			page := op.get("/console/groups/berlin").want(t, 200, "site=berlin", "pump-1", html.EscapeString("<b>north</b>")).Body
			if strings.Contains(page, "pump-2") {
				t.Errorf("pump-2 (paris) is listed in berlin")
			}
			op.get("/console/groups").want(t, 200, `<a href="/console/devices?group=berlin">1</a>`)
			// A malformed selector is shown beside its field, with where.
			op.post("/console/groups", url.Values{"name": {"bad"}, "selector": {"site in (a,b"}}).
				want(t, http.StatusBadRequest, "at position", `id="selector-error"`, `value="site in (a,b"`)
			op.post("/console/groups", url.Values{"name": {"no way"}, "selector": {"site"}}).want(t, http.StatusBadRequest, "1 to 64 characters")
			op.post("/console/groups", url.Values{"name": {"berlin"}, "selector": {"site"}}).want(t, http.StatusConflict)
			op.post("/console/groups/berlin", url.Values{"selector": {"site notin (a"}}).want(t, http.StatusBadRequest, "at position")
			// Membership is live: a new selector, or a device's new
			// metadata, moves the count.
			op.post("/console/groups/berlin", url.Values{"selector": {"site"}, "description": {"all"}}).want(t, http.StatusSeeOther)
			op.get("/console/groups/berlin").want(t, 200, `data-group="count">2<`, "pump-2")
			s.Do(t, admin, "PATCH", "/api/v1/devices/pump-2", map[string]any{"metadata": map[string]any{"site": nil}}).Want(t, 204)
			op.get("/console/groups/berlin").want(t, 200, `data-group="count">1<`)

			// Paged: 60 devices more, 50 a page.
			s.ProvisionDevices(t, admin, "bulk-", 60, map[string]string{"site": "bulk"})
			op.get("/console/groups/berlin").want(t, 200, `data-group="count">61<`, "page 1 of 2", "?page=2")
			if p2 := op.get("/console/groups/berlin?page=2").want(t, 200, "page 2 of 2").Body; strings.Count(p2, `<a href="/console/devices/`) != 11 {
				t.Errorf("page 2 lists %d devices, want 11", strings.Count(p2, `<a href="/console/devices/`))
			}
		})

		t.Run("Isolation", func(t *testing.T) {
			stranger.get("/console/groups/berlin").want(t, http.StatusNotFound)
			stranger.post("/console/groups/berlin", url.Values{"selector": {"x"}}).want(t, http.StatusNotFound)
			stranger.post("/console/groups/berlin/delete", url.Values{}).want(t, http.StatusNotFound)
			stranger.post("/console/devices/pump-1/shadow", url.Values{"version": {"2"}, "desired": {`{}`}}).want(t, http.StatusNotFound)
			page := stranger.get("/console/groups").want(t, 200, "theirs").Body
			if strings.Contains(page, "/console/groups/berlin") {
				t.Errorf("another tenant's groups page lists berlin")
			}
			stranger.get("/console/devices?group=theirs").want(t, 200, `<p class="count">1 device</p>`, "theirs")
			op.get("/console/groups/theirs").want(t, http.StatusNotFound)
			op.get("/console/devices?group=theirs").want(t, http.StatusNotFound)
			if _, v := shadowOf(t, s, admin, "pump-1"); v != 2 {
				t.Fatalf("another tenant's form moved the version to %d", v)
			}
		})

		t.Run("Filters", func(t *testing.T) {
			// pump-1 is in berlin (site) and out of sync (it reports
			// nothing); the bulk devices are in sync, having no shadow.
			page := op.get("/console/devices?group=berlin&shadow=out_of_sync").want(t, 200, `<p class="count">1 device</p>`, "/console/devices/pump-1").Body
			if strings.Contains(page, "bulk-") {
				t.Errorf("in-sync devices are listed out of sync")
			}
			op.get("/console/devices?group=berlin&shadow=in_sync").want(t, 200, "60 devices")
			op.get("/console/devices?shadow=sideways").want(t, http.StatusBadRequest)
			op.get("/console/devices?group=no+such").want(t, http.StatusBadRequest)
			op.get("/console/").want(t, 200, `data-live="in_sync">61<`, `data-live="out_of_sync">1<`)
		})

		t.Run("Dispatch", func(t *testing.T) {
			op.get("/console/actions/new?group=berlin").want(t, 200, `value="berlin"`, `<option value="group" selected>`)
			form := url.Values{"action": {"reboot"}, "params": {"{}"}, "search_type": {"group"}, "group": {"berlin"}, "preview": {"1"}}
			op.post("/console/actions/new", form).want(t, 200, "<strong data-matches>61</strong>")
			form.Set("group", "nowhere")
			op.post("/console/actions/new", form).want(t, http.StatusBadRequest, html.EscapeString(`no group is named "nowhere"`))
			form.Del("preview")
			form.Set("group", "berlin")
			res := op.post("/console/actions/new", form).want(t, http.StatusSeeOther)
			var a struct{ Statuses map[string]int }
			s.Do(t, admin, "GET", "/api/v1/actions/"+strings.TrimPrefix(res.Location, "/console/actions/"), nil).Want(t, 200).Decode(t, &a)
			if n := a.Statuses["Queued"] + a.Statuses["Scheduled"]; n != 61 {
				t.Errorf("the dispatch to berlin targets %v, want 61 devices", a.Statuses)
			}
		})

		t.Run("DesiredRollout", func(t *testing.T) {
			// The group page's link opens the dispatch form as a desired
			// rollout to the group, with the patch to fill in.
			op.get("/console/groups/berlin").want(t, 200, `href="/console/actions/new?group=berlin&amp;action=desired_state"`)
			op.get("/console/actions/new?group=berlin&action=desired_state").want(t, 200, `value="desired_state"`,
				html.EscapeString(`{"desired": {}}`), `id="rollout" name="rollout" checked`)
			form := url.Values{"action": {"desired_state"}, "params": {`{"desired": {"mode": "eco"}}`}, "search_type": {"group"}, "group": {"berlin"},
				"rollout": {"on"}, "phases": {"2"},
				"phase0_name": {"first"}, "phase0_kind": {"fixed_list"}, "phase0_value": {"pump-1"}, "phase0_trigger": {"now"},
				"phase1_name": {"rest"}, "phase1_kind": {"percentage"}, "phase1_value": {"100"}, "phase1_trigger": {"manual"}}
			res := op.post("/console/actions/new", form).want(t, http.StatusSeeOther)
			var a struct{ Action string }
			s.Do(t, admin, "GET", "/api/v1/actions/"+strings.TrimPrefix(res.Location, "/console/actions/"), nil).Want(t, 200).Decode(t, &a)
			if a.Action != "desired_state" {
				t.Fatalf("the form dispatched %q", a.Action)
			}
			fleetdtest.Eventually(t, "pump-1's phase to change its desired state", func() bool {
				d, _ := shadowOf(t, s, admin, "pump-1")
				return d["mode"] == "eco"
			})
			if d, _ := shadowOf(t, s, admin, "bulk-00000"); d["mode"] != nil {
				t.Fatalf("bulk-00000, in the manual phase, has desired %v", d)
			}
		})

		t.Run("Delete", func(t *testing.T) {
			_, before := shadowOf(t, s, admin, "pump-1")
			op.post("/console/groups/berlin/delete", url.Values{}).want(t, http.StatusSeeOther)
			op.get("/console/groups/berlin").want(t, http.StatusNotFound)
			if _, v := shadowOf(t, s, admin, "pump-1"); v != before {
				t.Fatalf("deleting a group moved a device's shadow from version %d to %d", before, v)
			}
		})
	})
}
