package fleethttp

import (
	"log/slog"
	"net/http"
	"runtime/debug"
	"time"
)

// brokerAuthPattern is where BrokerAuth is served: an external MQTT
// broker's calls, not part of the API nor of its document.
const brokerAuthPattern = "/broker/"

// internal serves a handler outside the route table, with the metrics,
// panic recovery and the access log (at debug level: a broker calls for
// every connection and, with Mosquitto, every message) of the API's routes.
// The log shows the path only: mosquitto-go-auth puts the secret in the
// query.
func (s *Server) internal(pattern string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &recorder{ResponseWriter: w, status: http.StatusOK}
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				s.logger(r).Error("panic", slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
				if !rec.wrote {
					http.Error(rec, "internal error", http.StatusInternalServerError)
				}
			}
			elapsed := time.Since(start)
			s.metrics.observe(pattern, rec.status, elapsed)
			s.logger(r).Debug("request", slog.String("method", r.Method), slog.String("path", r.URL.Path),
				slog.Int("status", rec.status), slog.Duration("duration", elapsed))
		}()
		h.ServeHTTP(rec, r)
	})
}
