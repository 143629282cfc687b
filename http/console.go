package fleethttp

import (
	"net/http"
)

// Console is the web console (package console): its handler and the
// patterns it serves, which the server routes to it beside the API's.
type Console interface {
	http.Handler
	Patterns() []string
}

// addConsole routes the console's patterns to it, with the API's metrics,
// panic recovery and connection deadlines, and sends / to its overview.
func (s *Server) addConsole() {
	if s.Console == nil {
		return
	}
	for _, p := range s.Console.Patterns() {
		h := s.internal(p, s.Console)
		s.mux.Handle(p, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w, r = s.deadlines(w, r, nil)
			h.ServeHTTP(w, r)
		}))
	}
	s.mux.Handle("GET /{$}", http.RedirectHandler("/console/", http.StatusSeeOther))
}
