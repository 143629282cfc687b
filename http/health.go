package fleethttp

import (
	"crypto/subtle"
	"net/http"

	"github.com/fleetd/fleet"
)

// statusBody is the answer of the health probes.
type statusBody struct {
	Status string `json:"status"`
}

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) error {
	s.respond(w, r, http.StatusOK, statusBody{Status: "ok"})
	return nil
}

func (s *Server) handleReady(w http.ResponseWriter, r *http.Request) error {
	for _, p := range s.Ready {
		if err := p.Ping(r.Context()); err != nil {
			s.logger(r).Warn("not ready", "err", err)
			return fleet.Errorf(fleet.EUNAVAILABLE, "not ready: %s", fleet.ErrorMessage(err))
		}
	}
	s.respond(w, r, http.StatusOK, statusBody{Status: "ready"})
	return nil
}

func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request) error {
	if want := s.Security.MetricsToken; want != "" {
		token, _ := bearerToken(r)
		if subtle.ConstantTimeCompare([]byte(token), []byte(want)) != 1 {
			return fleet.Errorf(fleet.EUNAUTHENTICATED, "/metrics needs Authorization: Bearer and the server's --metrics-token")
		}
	}
	s.metrics.handler.ServeHTTP(w, r)
	return nil
}
