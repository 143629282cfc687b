package main

import (
	"bufio"
	"crypto/rand"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestMultiRangeCap: an artifact request with more ranges than
// fleethttp.MaxRanges gets the whole archive once (at 10129e9, 1,800
// one-byte ranges were each answered with a part of their own;
// docs/reliability.md#smaller-bounds).
func TestMultiRangeCap(t *testing.T) {
	t.Parallel()
	s := startServer(t, sqlstoretest.Backends()[0])
	admin := s.Admin()
	noise := make([]byte, 8192) // incompressible: ranges must fit the archive
	rand.Read(noise)
	data := fleetdtest.MakeBundle(t, "1.0.0", fleetdtest.Part{Name: "app", Version: "1.0.0", Body: string(noise)})
	if len(data) < 3600 {
		t.Fatalf("archive of %d bytes", len(data))
	}
	b := s.MustUpload(t, admin, data)
	path := "/api/v1/firmware-bundles/id/" + b.ID + "/artifact"
	ranges := func(n int) string {
		var rs []string
		for i := range n {
			rs = append(rs, fmt.Sprintf("%d-%d", 2*i, 2*i))
		}
		return "bytes=" + strings.Join(rs, ",")
	}
	resp, _ := s.Get(t, admin, path, "Range", ranges(3))
	if resp.StatusCode != http.StatusPartialContent || !strings.HasPrefix(resp.Header.Get("Content-Type"), "multipart/byteranges") {
		t.Fatalf("3 ranges: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	resp, body := s.Get(t, admin, path, "Range", ranges(1800))
	if resp.StatusCode != http.StatusOK || len(body) != len(data) {
		t.Fatalf("1,800 ranges: %d with %d bytes; want 200 with the whole archive (%d bytes)", resp.StatusCode, len(body), len(data))
	}
}

// TestMetricsToken: with --metrics-token, /metrics answers only to that
// bearer token (it was public, with every tenant's counts;
// docs/reliability.md#smaller-bounds).
func TestMetricsToken(t *testing.T) {
	t.Parallel()
	s := startServer(t, sqlstoretest.Backends()[0], "--metrics-token", "scrape-me")
	for _, tc := range []struct {
		auth string
		want int
	}{{"", 401}, {"Bearer wrong", 401}, {"Bearer scrape-me", 200}} {
		hr, _ := http.NewRequest("GET", s.URL+"/metrics", nil)
		if tc.auth != "" {
			hr.Header.Set("Authorization", tc.auth)
		}
		resp, err := http.DefaultClient.Do(hr)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("Authorization %q: %d, want %d", tc.auth, resp.StatusCode, tc.want)
		}
	}
}

// TestHTTPConnectionCap: beyond --http-max-connections-per-ip, a new
// connection is closed at once, and its place is free again when one closes
// (~20,000 keep-alive connections from one client reached the descriptor
// limit before; docs/reliability.md#smaller-bounds).
func TestHTTPConnectionCap(t *testing.T) {
	t.Parallel()
	s := startServer(t, sqlstoretest.Backends()[0], "--http-max-connections-per-ip", "10")
	addr := strings.TrimPrefix(s.URL, "http://")
	var held []net.Conn
	for range 10 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	// The listener accepts connections in order: once a request on the
	// tenth is answered, the first ten are counted.
	ask := func(c net.Conn) (string, error) {
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
			return "", err
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		return line, err
	}
	if line, err := ask(held[9]); err != nil || !strings.Contains(line, "200") {
		t.Fatalf("the tenth connection: %q, %v", line, err)
	}
	extra, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	if line, err := ask(extra); err == nil {
		t.Fatalf("the eleventh connection was answered %q", line)
	}
	held[0].Close()
	fleetdtest.Eventually(t, "a place after one closed", func() bool {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return false
		}
		defer c.Close()
		line, err := ask(c)
		return err == nil && strings.Contains(line, "200")
	})
}

// TestChannelShownByRole: viewers and the audit log see a webhook URL's
// scheme and host and no header value; operators see what they may change (a
// viewer read /api/webhooks/123/SECRET and the value of a header named
// X-Team before; docs/reliability.md#smaller-bounds).
func TestChannelShownByRole(t *testing.T) {
	t.Parallel()
	s := startServer(t, sqlstoretest.Backends()[0])
	admin := s.Admin()
	viewer := s.NewKey(t, admin, "watcher", "viewer")
	operator := s.NewKey(t, admin, "ops", "operator")
	rule := s.MustAlertRule(t, admin, map[string]any{"name": "hot", "stream": "env",
		"condition": map[string]any{"field": "temp", "operator": ">", "value": 80}})
	base := "/api/v1/alert-rules/" + rule.ID + "/alert-notification-rules"
	s.Do(t, operator, "POST", base, map[string]any{"channel_parameters": map[string]any{"type": "webhook",
		"url": "https://hooks.example.com/api/webhooks/123/PATHSECRET?sig=QUERYSECRET", "headers": map[string]string{"X-Team": "HEADERSECRET"}}}).Want(t, 201)
	type list struct {
		NotificationRules []struct {
			ChannelParameters struct {
				URL     string
				Headers map[string]string
			} `json:"channel_parameters"`
		} `json:"alert_notification_rules"`
	}
	var l list
	s.Do(t, viewer, "GET", base, nil).Want(t, 200).Decode(t, &l)
	if c := l.NotificationRules[0].ChannelParameters; c.URL != "https://hooks.example.com/***" || c.Headers["X-Team"] != "***" {
		t.Fatalf("a viewer sees %+v", c)
	}
	s.Do(t, operator, "GET", base, nil).Want(t, 200).Decode(t, &l)
	if c := l.NotificationRules[0].ChannelParameters; c.URL != "https://hooks.example.com/api/webhooks/123/PATHSECRET?sig=***" || c.Headers["X-Team"] != "HEADERSECRET" {
		t.Fatalf("an operator sees %+v", c)
	}
	audit := s.Do(t, admin, "GET", "/api/v1/audit-logs?limit=1000", nil).Want(t, 200)
	for _, secret := range []string{"PATHSECRET", "QUERYSECRET", "HEADERSECRET"} {
		if strings.Contains(string(audit.Body), secret) {
			t.Errorf("the audit log shows %s", secret)
		}
	}
}
