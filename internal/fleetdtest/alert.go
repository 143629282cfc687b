package fleetdtest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// AlertFlags make notification retries quick, so tests wait for
// milliseconds rather than the production backoff.
var AlertFlags = []string{"--notify-backoff", "20ms", "--notify-max-backoff", "100ms", "--alert-timer-interval", "50ms"}

// AlertRule is an alert rule as the API shows it.
type AlertRule struct {
	ID                           string         `json:"id"`
	Name                         string         `json:"name"`
	Stream                       string         `json:"stream"`
	Group                        string         `json:"group"`
	DeviceGroup                  string         `json:"device_group"`
	Condition                    map[string]any `json:"condition"`
	MetadataFilters              map[string]any `json:"metadata_filters"`
	ActivationThresholdSeconds   float64        `json:"activation_threshold_seconds"`
	DeactivationThresholdSeconds float64        `json:"deactivation_threshold_seconds"`
}

// AlertSession is one alert (a rule firing for a device) as the API shows it.
type AlertSession struct {
	ID        string  `json:"id"`
	RuleID    string  `json:"rule_id"`
	DeviceID  string  `json:"device_id"`
	State     string  `json:"state"`
	StartedAt string  `json:"started_at"`
	EndedAt   *string `json:"ended_at"`
	Value     *struct {
		Timestamp string         `json:"timestamp"`
		Data      map[string]any `json:"data"`
	} `json:"value"`
}

// MustAlertRule creates a rule with Prefer: return=representation.
func (s *Server) MustAlertRule(t *testing.T, c Creds, body map[string]any) AlertRule {
	t.Helper()
	var r AlertRule
	s.Send(t, Req{Method: "POST", Path: "/api/v1/alert-rules", Creds: c, Body: body,
		Header: http.Header{"Prefer": {"return=representation"}}}).Want(t, 201).Decode(t, &r)
	return r
}

// Alerts lists alerts as c with a query.
func (s *Server) Alerts(t *testing.T, c Creds, query string) []AlertSession {
	t.Helper()
	var out struct {
		Alerts []AlertSession
		Count  int
	}
	s.Do(t, c, "GET", "/api/v1/alerts"+query, nil).Want(t, 200).Decode(t, &out)
	return out.Alerts
}

// Receiver is a webhook endpoint that fails its first `fail` requests.
type Receiver struct {
	*httptest.Server
	mu       sync.Mutex
	fail     int
	requests []Received
}

// Received is one request a Receiver took.
type Received struct {
	Header http.Header
	Body   []byte
}

// NewReceiver starts a Receiver that fails its first fail requests with 503.
func NewReceiver(t *testing.T, fail int) *Receiver {
	r := &Receiver{fail: fail}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		defer r.mu.Unlock()
		r.requests = append(r.requests, Received{req.Header.Clone(), b})
		if len(r.requests) <= r.fail {
			http.Error(w, "try later", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(r.Close)
	return r
}

// Got returns the requests received so far.
func (r *Receiver) Got() []Received {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Received(nil), r.requests...)
}

// Points is an ingest body of one point per temperature, a second apart.
func Points(start time.Time, temps ...float64) []map[string]any {
	var out []map[string]any
	for i, temp := range temps {
		out = append(out, map[string]any{"timestamp": start.Add(time.Duration(i) * time.Second).UnixMilli(), "sequence": i, "temp": temp})
	}
	return out
}
