package egress_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetd/fleet/egress"
)

func mustParse(t *testing.T, list string) *egress.Policy {
	t.Helper()
	p, err := egress.Parse(list)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestParse(t *testing.T) {
	for _, bad := range []string{"10.0.0.0/33", "http://x", "a b", "user@host"} {
		if _, err := egress.Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted it", bad)
		}
	}
	if _, err := egress.Parse(" 10.0.0.0/8, 192.168.1.5 ,hooks.internal., ,fd00::/8"); err != nil {
		t.Fatal(err)
	}
}

// TestPolicy: each kind of internal address is refused when connected to,
// whatever name led there, unless the policy names it.
func TestPolicy(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if r.URL.Path == "/to-ip" {
			u, _ := url.Parse("http://" + r.Host)
			http.Redirect(w, r, "http://127.0.0.1:"+u.Port()+"/", http.StatusFound)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	port := srv.URL[strings.LastIndex(srv.URL, ":")+1:]
	get := func(p *egress.Policy, redirects egress.Redirects, u string) (int, error) {
		resp, err := p.Client(5*time.Second, redirects).Get(u)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	denied := func(t *testing.T, err error, kind string) {
		t.Helper()
		var d *egress.DeniedError
		if !errors.As(err, &d) || d.Kind != kind {
			t.Fatalf("err %v, want a %s address denied", err, kind)
		}
		if r := egress.Reason(err); !strings.Contains(r, kind) || !strings.Contains(r, "--outbound-allow") {
			t.Fatalf("reason %q", r)
		}
	}
	t.Run("loopback by IP", func(t *testing.T) {
		_, err := get(nil, egress.FollowRedirects, srv.URL)
		denied(t, err, "loopback")
	})
	t.Run("loopback by name", func(t *testing.T) {
		// A name that resolves to an internal address is checked on the
		// address: the same path a rebinding DNS name takes.
		_, err := get(mustParse(t, ""), egress.FollowRedirects, "http://localhost:"+port)
		denied(t, err, "loopback")
	})
	for _, tc := range []struct{ addr, kind string }{
		{"10.255.255.1", "private"}, {"169.254.169.254", "link-local"}, {"0.0.0.0", "unspecified"}, {"100.64.0.1", "shared (carrier-grade NAT)"},
		{"[::ffff:127.0.0.1]", "loopback"}, {"[fe80::1]", "link-local"}, {"[fd00::1]", "private"},
	} {
		t.Run(tc.addr, func(t *testing.T) {
			_, err := get(nil, egress.FollowRedirects, "http://"+tc.addr+":9/")
			denied(t, err, tc.kind)
		})
	}
	t.Run("allowed by CIDR", func(t *testing.T) {
		if code, err := get(mustParse(t, "127.0.0.0/8"), egress.FollowRedirects, srv.URL); err != nil || code != 204 {
			t.Fatalf("%d, %v", code, err)
		}
	})
	t.Run("allowed by name, and only by that name", func(t *testing.T) {
		p := mustParse(t, "localhost")
		if code, err := get(p, egress.FollowRedirects, "http://localhost:"+port); err != nil || code != 204 {
			t.Fatalf("%d, %v", code, err)
		}
		// A redirect is checked again: to the same address by IP it is not
		// allowed.
		before := hits.Load()
		_, err := get(p, egress.FollowRedirects, "http://localhost:"+port+"/to-ip")
		denied(t, err, "loopback")
		if n := hits.Load() - before; n != 1 {
			t.Fatalf("%d requests, want the redirect's only", n)
		}
	})
	t.Run("no redirects", func(t *testing.T) {
		if code, err := get(mustParse(t, "127.0.0.1"), egress.NoRedirects, srv.URL+"/to-ip"); err != nil || code != http.StatusFound {
			t.Fatalf("%d, %v; want the 302 itself", code, err)
		}
	})
}
