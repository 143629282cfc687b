package fleethttp

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are the HTTP API's Prometheus series, labelled by route pattern
// (never by raw path, which would grow without bound).
type metrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	// ddiRegistrations counts gateways' registrations of unknown
	// controllers: created, or refused by the rate limit.
	ddiRegistrations *prometheus.CounterVec
	handler          http.Handler
	registry         *prometheus.Registry
}

func newMetrics(reg *prometheus.Registry) *metrics {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetd_http_requests_total",
			Help: "HTTP requests answered, by route pattern and status code.",
		}, []string{"route", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "fleetd_http_request_duration_seconds",
			Help:    "Time to answer HTTP requests, by route pattern.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10},
		}, []string{"route"}),
		ddiRegistrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetd_ddi_gateway_registrations_total",
			Help: "Devices hawkBit DDI gateways registered by polling for an unknown controller (outcome created), and registrations refused by --ddi-registration-rate-limit (outcome rate_limited).",
		}, []string{"outcome"}),
	}
	reg.MustRegister(m.requests, m.latency, m.ddiRegistrations)
	m.registry = reg
	m.handler = promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
	return m
}

func (m *metrics) observe(route string, status int, d time.Duration) {
	m.requests.WithLabelValues(route, strconv.Itoa(status)).Inc()
	m.latency.WithLabelValues(route).Observe(d.Seconds())
}
