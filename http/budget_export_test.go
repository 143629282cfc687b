package fleethttp

import (
	"io"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/fleetd/fleet"
)

// ServeBare serves the hello-world handler as Open serves the API: the
// same connection limit and server settings (deadlines of the request's
// header, idle connections), without ServeHTTP; for
// BenchmarkActionStatusBudget.
func (s *Server) ServeBare(ln net.Listener) *http.Server {
	s.Security = s.Security.withDefaults()
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			w.WriteHeader(http.StatusNoContent)
		}),
		ReadHeaderTimeout: s.Security.ReadHeaderTimeout,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    s.Security.MaxHeaderBytes,
	}
	go srv.Serve(&connLimit{Listener: ln, max: s.Security.MaxConnections, perAddr: s.Security.MaxConnectionsPerAddr, byAddr: map[netip.Addr]int{}})
	return srv
}

// AddBudgetRoutes adds to s the routes BenchmarkActionStatusBudget takes
// S10's CPU apart with, none of them in the product: one behind
// ServeHTTP alone, one behind the whole middleware of S10's route (wrap:
// deadlines, metrics, the device key's authentication, the rate limit),
// and one that reads S10's body as handleActionStatus does; each answers
// 204 and does nothing else.
func (s *Server) AddBudgetRoutes() {
	s.Handler()
	s.mux.Handle("POST /bench/servehttp", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	for _, rt := range []route{
		{pattern: "POST /bench/middleware", perm: fleet.PermDeviceData, handler: func(w http.ResponseWriter, r *http.Request) error {
			io.Copy(io.Discard, r.Body)
			w.WriteHeader(http.StatusNoContent)
			return nil
		}},
		{pattern: "POST /bench/decode", perm: fleet.PermDeviceData, handler: func(w http.ResponseWriter, r *http.Request) error {
			if _, err := s.readStatusReport(w, r); err != nil {
				return err
			}
			w.WriteHeader(http.StatusNoContent)
			return nil
		}},
	} {
		s.mux.Handle(rt.pattern, s.wrap(rt))
	}
}
