package console_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestRolloutBuilderScheduleEnd: the rollout builder takes the schedule's
// end (the API's end_timestamp), as a UTC date and time, so that it builds
// every rollout the API can; the action's page shows it, and a time that
// does not read as one is refused naming the API's field, the form kept.
func TestRolloutBuilderScheduleEnd(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		admin := s.Admin()
		operator := s.NewKey(t, admin, "olivia", "operator")
		for _, id := range []string{"e-1", "e-2"} {
			s.Do(t, admin, "POST", "/api/v1/devices", map[string]any{"id": id}).Want(t, 201)
		}
		c := signIn(t, s.URL, operator)
		form := url.Values{"csrf": {c.csrf}, "action": {"reboot"}, "params": {"{}"}, "search_type": {"all"}, "rollout": {"on"}, "phases": {"2"},
			"phase0_name": {"canary"}, "phase0_kind": {"percentage"}, "phase0_value": {"50"}, "phase0_trigger": {"now"},
			"phase1_name": {"rest"}, "phase1_kind": {"percentage"}, "phase1_value": {"100"}, "phase1_trigger": {"manual"},
			"end": {"2099-01-02T03:04"}, "dispatch": {"1"}}

		bad := url.Values{}
		for k, v := range form {
			bad[k] = v
		}
		bad.Set("end", "next tuesday")
		status, body := c.post(t, "/console/actions/new", bad)
		if status != 400 || !strings.Contains(body, "schedule.end_timestamp") || !strings.Contains(body, "must be a date and time (UTC)") ||
			!strings.Contains(body, `name="end" type="datetime-local" value="next tuesday"`) {
			t.Fatalf("a bad end answered %d:\n%s", status, body)
		}

		status, _ = c.post(t, "/console/actions/new", form)
		if status != http.StatusSeeOther {
			t.Fatalf("the dispatch answered %d", status)
		}
		var id int64
		fmt.Sscanf(c.location, "/console/actions/%d", &id)
		var a struct {
			Schedule struct {
				EndTimestamp int64 `json:"end_timestamp"`
			}
		}
		s.Do(t, admin, "GET", fmt.Sprintf("/api/v1/actions/%d", id), nil).Want(t, 200).Decode(t, &a)
		if want := time.Date(2099, 1, 2, 3, 4, 0, 0, time.UTC).UnixMilli(); a.Schedule.EndTimestamp != want {
			t.Fatalf("end_timestamp %d, want %d", a.Schedule.EndTimestamp, want)
		}
		if status, body := c.get(t, fmt.Sprintf("/console/actions/%d", id)); status != 200 ||
			!strings.Contains(body, "<p data-schedule-end>No phase triggers after 2099-01-02 03:04:00 UTC</p>") {
			t.Fatalf("the action's page (%d) does not show the end:\n%s", status, body)
		}
	})
}

// console is a signed-in console session: cookies kept, no redirect
// followed, the session's CSRF token at hand.
type console struct {
	base     string
	client   *http.Client
	csrf     string
	location string // the last answer's Location
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// signIn signs in to the console at base with c's key, as the sign-in
// form does.
func signIn(t *testing.T, base string, c fleetdtest.Creds) *console {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	b := &console{base: base, client: &http.Client{Jar: jar, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	_, page := b.get(t, "/console/signin")
	b.csrf = b.token(t, page)
	if status, body := b.post(t, "/console/signin", url.Values{"csrf": {b.csrf}, "tenant": {c.Tenant}, "key": {c.Key}}); status != http.StatusSeeOther {
		t.Fatalf("sign-in answered %d:\n%s", status, body)
	}
	_, page = b.get(t, "/console/")
	b.csrf = b.token(t, page)
	return b
}

func (b *console) token(t *testing.T, page string) string {
	t.Helper()
	m := csrfField.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no csrf field in the page:\n%s", page)
	}
	return m[1]
}

func (b *console) get(t *testing.T, path string) (int, string) {
	t.Helper()
	return b.do(t, "GET", path, nil)
}

func (b *console) post(t *testing.T, path string, form url.Values) (int, string) {
	t.Helper()
	return b.do(t, "POST", path, form)
}

func (b *console) do(t *testing.T, method, path string, form url.Values) (int, string) {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	rq, err := http.NewRequest(method, b.base+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		rq.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	res, err := b.client.Do(rq)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	text, _ := io.ReadAll(res.Body)
	b.location = res.Header.Get("Location")
	return res.StatusCode, string(text)
}
