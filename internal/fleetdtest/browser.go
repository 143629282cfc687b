package fleetdtest

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"
)

// Browser is an HTTP client that keeps cookies and follows no redirect,
// as a test's stand-in for a person's browser where no script is needed.
type Browser struct {
	t      *testing.T
	Base   string
	Client *http.Client
}

// NewBrowser is a Browser with no cookies yet, on base.
func NewBrowser(t *testing.T, base string) *Browser {
	jar, _ := cookiejar.New(nil)
	return &Browser{t: t, Base: base, Client: &http.Client{Jar: jar, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// Page is an answer of the console.
type Page struct {
	Status int
	Header http.Header
	Body   string
}

// Do sends a request, with form as its body when set, and header as
// name, value pairs.
func (b *Browser) Do(method, path string, form url.Values, header ...string) Page {
	b.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	rq, err := http.NewRequest(method, b.Base+path, body)
	if err != nil {
		b.t.Fatal(err)
	}
	if form != nil {
		rq.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for i := 0; i+1 < len(header); i += 2 {
		rq.Header.Set(header[i], header[i+1])
	}
	res, err := b.Client.Do(rq)
	if err != nil {
		b.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	text, _ := io.ReadAll(res.Body)
	return Page{res.StatusCode, res.Header, string(text)}
}

// Get is Do of a GET.
func (b *Browser) Get(path string) Page { b.t.Helper(); return b.Do("GET", path, nil) }

// CopyTo is another browser, on base, with b's console cookies, as someone
// who copied them.
func (b *Browser) CopyTo(base string) *Browser {
	c := NewBrowser(b.t, base)
	from, _ := url.Parse(b.Base + "/console/")
	to, _ := url.Parse(base + "/console/")
	c.Client.Jar.SetCookies(to, b.Client.Jar.Cookies(from))
	return c
}

// Want fails the test unless the page has status.
func (p Page) Want(t *testing.T, status int) Page {
	t.Helper()
	if p.Status != status {
		t.Fatalf("status %d, want %d; page:\n%s", p.Status, status, p.Body)
	}
	return p
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// CSRF returns the token of the page's forms.
func (p Page) CSRF(t *testing.T) string {
	t.Helper()
	m := csrfField.FindStringSubmatch(p.Body)
	if m == nil {
		t.Fatalf("no csrf field in the page:\n%s", p.Body)
	}
	return m[1]
}

// Events opens an event stream of the console and returns what reads its
// next event's data; the stream closes when the test ends.
func (b *Browser) Events(t *testing.T, path string) func() string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	rq, _ := http.NewRequestWithContext(ctx, "GET", b.Base+path, nil)
	res, err := b.Client.Do(rq)
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

// SignIn signs b in with a tenant and key and returns the overview.
func (b *Browser) SignIn(tenant, key string) Page {
	b.t.Helper()
	tok := b.Get("/console/signin").Want(b.t, 200).CSRF(b.t)
	res := b.Do("POST", "/console/signin", url.Values{"csrf": {tok}, "tenant": {tenant}, "key": {key}})
	if res.Status != http.StatusSeeOther {
		b.t.Fatalf("sign-in answered %d:\n%s", res.Status, res.Body)
	}
	return b.Get("/console/").Want(b.t, 200)
}

var loginID = regexp.MustCompile(`name="id" value="([^"]+)"`)

// SignInOIDC signs b in through op: it goes to the provider, signs in on
// its form and follows the redirects back to the console, and returns the
// overview, or the console's answer when it refused the sign-in.
func (b *Browser) SignInOIDC(t *testing.T, op *OIDCProvider) Page {
	t.Helper()
	res := b.Get("/console/signin/oidc?tenant=default").Want(t, 303)
	to := res.Header.Get("Location")
	if !strings.HasPrefix(to, op.Issuer) || !strings.Contains(to, "code_challenge_method=S256") || !strings.Contains(to, "nonce=") {
		t.Fatalf("sign-in goes to %s", to)
	}
	for !strings.Contains(to, "/login/username") {
		to = b.follow(t, to)
	}
	login := b.abs(t, to).Want(t, 200)
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
	return b.Get("/console/")
}

// follow GETs an absolute or console-relative URL and returns where it
// redirects.
func (b *Browser) follow(t *testing.T, to string) string {
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
func (b *Browser) abs(t *testing.T, to string) Page {
	t.Helper()
	if strings.HasPrefix(to, "/") {
		return b.Get(to)
	}
	saved := b.Base
	defer func() { b.Base = saved }()
	b.Base = ""
	return b.Get(to)
}

// post POSTs a form to a URL on another host.
func (b *Browser) post(t *testing.T, to string, form url.Values) Page {
	t.Helper()
	saved := b.Base
	defer func() { b.Base = saved }()
	b.Base = ""
	return b.Do("POST", to, form)
}
