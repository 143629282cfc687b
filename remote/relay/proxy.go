package relay

import (
	"net/http"
	"net/http/httputil"
	"net/url"

	"github.com/fleetd/fleet/remote"
)

// Several replicas (docs/agent.md, Several replicas): a session lives on
// the replica that opened it, which records its URL on the session. A leg
// (the operator's or the device's) that a load balancer hands to another
// replica is proxied there as it came, credentials and all, in one hop:
// the relaying replica authenticates it as if it had come straight, so the
// replicas need no trust of their own between them. A proxied request
// carries proxiedHeader, and is never proxied again. A stream leg passes
// byte for byte, spliced (remote.ProxyStream); a WebSocket through
// httputil.ReverseProxy.

// proxiedHeader marks a leg one replica proxied to another.
const proxiedHeader = "X-Fleetd-Remote-Proxied"

// Proxy sends r, a leg of session id in tenant, to the replica that
// relays the session when that is another one, and reports whether it
// did (then the proxy answered). A session this replica relays, one that
// is not open, or a leg already proxied once are left to the caller.
func (h *Hub) Proxy(w http.ResponseWriter, r *http.Request, tenant, id string) bool {
	if r.Header.Get(proxiedHeader) != "" || tenant == "" {
		return false
	}
	if _, ok := h.Waiting(id); ok {
		return false
	}
	s, err := h.Sessions.FindOpenRemoteSession(r.Context(), tenant, id)
	if err != nil || s.RelayURL == "" || s.RelayURL == h.RelayURL() {
		return false
	}
	u := s.RelayURL
	target, err := url.Parse(u)
	if err != nil {
		return false
	}
	unreachable := func(w http.ResponseWriter, r *http.Request, err error) {
		if h.Logger != nil {
			h.Logger.Warn("a remote session's leg could not reach the replica relaying it", "session", id, "replica", u, "err", err)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadGateway)
		w.Write([]byte(`{"error":"unavailable","message":"the replica relaying this remote session cannot be reached; open another session"}` + "\n"))
	}
	if remote.IsStream(r) {
		// A stream leg's bytes pass as they are, spliced.
		if err := remote.ProxyStream(w, r, target, http.Header{proxiedHeader: {"1"}}, nil); err != nil {
			unreachable(w, r, err)
		}
		return true
	}
	p := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = pr.In.Host // the Origin check compares with it
			pr.Out.Header.Set(proxiedHeader, "1")
		},
		ErrorHandler: unreachable,
	}
	p.ServeHTTP(w, r)
	return true
}
