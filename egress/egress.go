// Package egress is fleetd's one policy for the HTTP requests it makes to
// addresses tenants choose: notification webhooks, Slack, JWKS and S9
// webhooks. Without it, anyone who may save such a URL can make fleetd
// reach its own loopback services, the cloud metadata endpoint and the
// private network, and read what they answer.
//
// By default a connection to a loopback, link-local, private, shared,
// multicast or unspecified address is refused. The check runs on the
// address being connected to, after name resolution, so a name that
// resolves to a public address when a URL is saved and to a private one
// later (DNS rebinding) is refused all the same, and so is every redirect.
// --outbound-allow names the CIDRs and host names a deployment's internal
// receivers need.
package egress

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"
)

// Policy says which addresses outbound requests may reach. The zero value
// refuses every internal address; Parse builds one with exceptions.
type Policy struct {
	nets  []netip.Prefix
	hosts map[string]bool // lower case, without a trailing dot
}

// Parse reads a comma-separated list of CIDRs, IP addresses and host
// names (the --outbound-allow flag); empty items are ignored.
func Parse(list string) (*Policy, error) {
	p := &Policy{hosts: map[string]bool{}}
	for _, item := range strings.Split(list, ",") {
		item = strings.TrimSpace(item)
		switch {
		case item == "":
		case strings.Contains(item, "/"):
			prefix, err := netip.ParsePrefix(item)
			if err != nil {
				return nil, fmt.Errorf("%q is not a CIDR such as 10.0.0.0/8", item)
			}
			p.nets = append(p.nets, prefix.Masked())
		default:
			if ip, err := netip.ParseAddr(item); err == nil {
				p.nets = append(p.nets, netip.PrefixFrom(ip.Unmap(), ip.Unmap().BitLen()))
				continue
			}
			host := strings.TrimSuffix(strings.ToLower(item), ".")
			if host == "" || strings.ContainsAny(host, ":/ @") {
				return nil, fmt.Errorf("%q is neither a CIDR, an IP address nor a host name", item)
			}
			p.hosts[host] = true
		}
	}
	return p, nil
}

// special ranges that are internal though netip has no predicate for them.
var special = []struct {
	prefix netip.Prefix
	kind   string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "unspecified"},
	{netip.MustParsePrefix("100.64.0.0/10"), "shared (carrier-grade NAT)"},
	{netip.MustParsePrefix("192.0.0.0/24"), "private"},
	{netip.MustParsePrefix("198.18.0.0/15"), "private"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"},
	{netip.MustParsePrefix("64:ff9b::/96"), "translated (NAT64)"},
}

// internal returns what kind of internal address ip is, or "".
func internal(ip netip.Addr) string {
	ip = ip.Unmap()
	switch {
	case ip.IsLoopback():
		return "loopback"
	case ip.IsLinkLocalUnicast(), ip.IsLinkLocalMulticast():
		return "link-local"
	case ip.IsPrivate():
		return "private"
	case ip.IsUnspecified():
		return "unspecified"
	case ip.IsMulticast(), ip.IsInterfaceLocalMulticast():
		return "multicast"
	}
	for _, s := range special {
		if s.prefix.Contains(ip) {
			return s.kind
		}
	}
	return ""
}

// DeniedError is a connection the policy refused.
type DeniedError struct {
	Host string // as the URL named it
	Kind string // loopback, private, …
}

func (e *DeniedError) Error() string {
	return fmt.Sprintf("%s resolves to a %s address, which fleetd does not connect to unless --outbound-allow names it", e.Host, e.Kind)
}

// check returns an error if host, connected at ip, is not allowed.
func (p *Policy) check(host string, ip netip.Addr) error {
	if p != nil && p.hosts[strings.TrimSuffix(strings.ToLower(host), ".")] {
		return nil
	}
	kind := internal(ip)
	if kind == "" {
		return nil
	}
	if p != nil {
		for _, n := range p.nets {
			if n.Contains(ip.Unmap()) {
				return nil
			}
		}
	}
	return &DeniedError{Host: host, Kind: kind}
}

// DialContext connects as a net.Dialer does, refusing addresses the policy
// does not allow. The check is made on each address the dialer tries, as
// it connects, so what the name resolved to is what is checked.
func (p *Policy) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return nil, err
	}
	d := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second,
		Control: func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return err
			}
			return p.check(host, ap.Addr())
		}}
	return d.DialContext(ctx, network, address)
}

// Redirects says whether a client follows redirects.
type Redirects bool

// Whether clients follow redirects.
const (
	NoRedirects     Redirects = false
	FollowRedirects Redirects = true
)

// ErrRedirect is the error of a request answered with a redirect by a
// client that does not follow them.
var ErrRedirect = errors.New("redirected")

// Client returns an HTTP client under the policy: no proxy (a proxy would
// connect on fleetd's behalf, unchecked), the timeout for each request,
// and redirects followed (up to 3, each connection checked again) or not
// at all, in which case a 3xx is the response.
func (p *Policy) Client(timeout time.Duration, redirects Redirects) *http.Client {
	tr := &http.Transport{
		Proxy:                 nil,
		DialContext:           p.DialContext,
		TLSClientConfig:       &tls.Config{MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: timeout,
		MaxIdleConns:          100,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
		ForceAttemptHTTP2:     true,
	}
	c := &http.Client{Transport: tr, Timeout: timeout}
	if redirects == NoRedirects {
		c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	} else {
		c.CheckRedirect = func(req *http.Request, via []*http.Request) error {
			if len(via) >= 3 {
				return errors.New("more than 3 redirects")
			}
			if req.URL.Scheme != "http" && req.URL.Scheme != "https" {
				return fmt.Errorf("a redirect to a %s URL", req.URL.Scheme)
			}
			return nil
		}
	}
	return c
}

// Reason is fleetd's own one-line account of a failed request, safe to
// store and show: never what the other end sent (a banner, a body), which
// would make fleetd a scanner of whatever it can reach.
func Reason(err error) string {
	var denied *DeniedError
	var dns *net.DNSError
	var ne net.Error
	var tlsErr *tls.CertificateVerificationError
	var recordErr tls.RecordHeaderError
	switch {
	case err == nil:
		return ""
	case errors.As(err, &denied):
		return denied.Error()
	case errors.Is(err, context.Canceled):
		return "cancelled: fleetd was stopping"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timed out"
	case errors.As(err, &dns):
		return "the host name could not be resolved"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.As(err, &tlsErr):
		return "the server's TLS certificate could not be verified"
	case errors.As(err, &recordErr):
		return "the server does not speak TLS"
	}
	var ue *url.Error
	if errors.As(err, &ue) && strings.Contains(ue.Err.Error(), "redirect") {
		return "too many redirects, or a redirect to something other than http or https"
	}
	return "the connection failed"
}

// StatusReason is the one line stored for an answer that is not a success:
// its status code and, for a redirect a client does not follow, why.
func StatusReason(code int) string {
	if code >= 300 && code < 400 {
		return fmt.Sprintf("answered %d, a redirect; fleetd does not follow redirects here", code)
	}
	return fmt.Sprintf("answered %d %s", code, http.StatusText(code))
}
