package notify_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/egress"
	"github.com/fleetd/fleet/internal/poll"
	"github.com/fleetd/fleet/internal/testclock"
	"github.com/fleetd/fleet/notify"
	"github.com/fleetd/fleet/notify/notifytest"
)

var t0 = time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)

// outbox is an in-memory notify.Store.
type outbox struct {
	mu       sync.Mutex
	clock    *testclock.Clock
	items    []*item
	attempts map[int64][]fleet.DeliveryAttempt
}

type item struct {
	d      fleet.Delivery
	status string
	due    time.Time
	lease  time.Time
}

func (o *outbox) add(d fleet.Delivery) {
	o.mu.Lock()
	defer o.mu.Unlock()
	d.ID = int64(len(o.items) + 1)
	o.items = append(o.items, &item{d: d, status: fleet.DeliveryPending, due: o.clock.Now()})
}

func (o *outbox) ClaimDeliveries(ctx context.Context, owner string, lease time.Duration, limit int) ([]*fleet.Delivery, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := o.clock.Now()
	var out []*fleet.Delivery
	for _, it := range o.items {
		if it.status == fleet.DeliveryPending && !it.due.After(now) && it.lease.Before(now) && len(out) < limit {
			it.lease = now.Add(lease)
			d := it.d
			d.AttemptCount = len(o.attempts[d.ID])
			out = append(out, &d)
		}
	}
	return out, nil
}

func (o *outbox) CompleteDelivery(ctx context.Context, id int64, owner string, at fleet.DeliveryAttempt, status string, next time.Time) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.attempts == nil {
		o.attempts = map[int64][]fleet.DeliveryAttempt{}
	}
	o.attempts[id] = append(o.attempts[id], at)
	it := o.items[id-1]
	it.status, it.due, it.lease = status, next, time.Time{}
	return nil
}

func (o *outbox) NextDeliveryDue(ctx context.Context) (time.Time, bool, error) {
	return time.Time{}, false, nil
}

func (o *outbox) state(id int64) (string, []fleet.DeliveryAttempt) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.items[id-1].status, o.attempts[id]
}

func delivery(event string, ch fleet.ChannelParameters, tmpl fleet.NotificationTemplate, tz string) fleet.Delivery {
	end := t0.Add(time.Hour)
	a := &fleet.Alert{ID: "a1", RuleID: "r1", RuleName: "hot", DeviceID: "d1", Stream: "env", State: fleet.AlertActive, StartedAt: t0,
		Value: &fleet.DataPoint{DeviceID: "d1", Stream: "env", Timestamp: t0, Data: map[string]any{"temp": int64(81)}}}
	if event == fleet.EventClosed {
		a.State, a.EndedAt = fleet.AlertEnded, &end
	}
	return fleet.Delivery{Tenant: "acme", AlertID: "a1", NotificationRuleID: "n1", Event: event, Alert: a,
		Rule:         &fleet.AlertRule{ID: "r1", Name: "hot", Group: "plant", Stream: "env"},
		Notification: &fleet.NotificationRule{ID: "n1", AlertRuleID: "r1", ChannelParameters: ch, NotificationTemplate: tmpl, Timezone: tz}}
}

// loopback is the egress policy of the tests, whose receivers listen on
// 127.0.0.1.
var loopback, _ = egress.Parse("127.0.0.0/8")

func newWorker(o *outbox) *notify.Worker {
	return &notify.Worker{Store: o, Now: o.clock.Now, Backoff: time.Second, MaxBackoff: 4 * time.Second, MaxAttempts: 5,
		HTTP: loopback.Client(10*time.Second, egress.NoRedirects)}
}

func TestWebhookRetriesThenDelivers(t *testing.T) {
	var mu sync.Mutex
	var bodies [][]byte
	var headers []http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		bodies = append(bodies, b)
		headers = append(headers, r.Header.Clone())
		if len(bodies) <= 2 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	o := &outbox{clock: testclock.New(t0)}
	o.add(delivery(fleet.EventOpened, fleet.ChannelParameters{Type: "webhook", URL: srv.URL, Secret: "s3cret", Headers: map[string]string{"X-Env": "prod"}},
		fleet.NotificationTemplate{Subject: "{{.Rule.Name}} on {{.Alert.DeviceID}}", Body: "since {{.Alert.StartedAt.Format \"15:04 MST\"}} temp={{.Value.temp}}"}, "Europe/Berlin"))
	w := newWorker(o)
	ctx := context.Background()
	run := func() {
		t.Helper()
		if _, err := w.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	run() // 503
	if n, _ := w.RunOnce(ctx); n != 0 {
		t.Fatal("retried before the backoff ended")
	}
	o.clock.Add(time.Second)
	run() // 503
	o.clock.Add(time.Second)
	if n, _ := w.RunOnce(ctx); n != 0 {
		t.Fatal("the second backoff did not double")
	}
	o.clock.Add(time.Second)
	run() // 204
	status, attempts := o.state(1)
	if status != fleet.DeliveryDelivered || len(attempts) != 3 || attempts[0].StatusCode != 503 || attempts[0].Error != "answered 503 Service Unavailable" || attempts[2].StatusCode != 204 || attempts[2].Error != "" {
		t.Fatalf("status %s, attempts %+v", status, attempts)
	}
	last, h := bodies[2], headers[2]
	if got, want := h.Get("X-Fleet-Signature"), notify.Sign("s3cret", last); got != want || !strings.HasPrefix(got, "sha256=") {
		t.Fatalf("signature %q, want %q", got, want)
	}
	if h.Get("X-Env") != "prod" || h.Get("X-Fleet-Event") != "opened" || h.Get("Content-Type") != "application/json" {
		t.Fatalf("headers %v", h)
	}
	var p struct {
		Event        string
		Alert        fleet.Alert
		Rule         struct{ Name, Group string }
		Notification struct{ Subject, Body string }
	}
	if err := json.Unmarshal(last, &p); err != nil {
		t.Fatal(err)
	}
	if p.Event != "opened" || p.Alert.DeviceID != "d1" || p.Rule.Name != "hot" || p.Notification.Subject != "hot on d1" ||
		p.Notification.Body != "since 11:00 CET temp=81" {
		t.Fatalf("payload %s", last)
	}
}

func TestGivesUpAfterMaxAttempts(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no", http.StatusInternalServerError)
	}))
	defer srv.Close()
	o := &outbox{clock: testclock.New(t0)}
	o.add(delivery(fleet.EventOpened, fleet.ChannelParameters{Type: "slack", URL: srv.URL}, fleet.NotificationTemplate{}, "UTC"))
	w := newWorker(o)
	var waits []time.Duration
	for range 10 {
		w.RunOnce(context.Background())
		if s, _ := o.state(1); s != fleet.DeliveryPending {
			break
		}
		o.mu.Lock()
		waits = append(waits, o.items[0].due.Sub(o.clock.Now()))
		o.clock.Set(o.items[0].due)
		o.mu.Unlock()
	}
	status, attempts := o.state(1)
	if status != fleet.DeliveryDead || len(attempts) != 5 {
		t.Fatalf("status %s after %d attempts, want dead after 5", status, len(attempts))
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second}
	if len(waits) != len(want) {
		t.Fatalf("waits %v, want %v", waits, want)
	}
	for i := range want {
		if waits[i] != want[i] {
			t.Fatalf("waits %v, want %v (doubling, capped)", waits, want)
		}
	}
}

func TestSlack(t *testing.T) {
	got := make(chan map[string]string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var m map[string]string
		json.NewDecoder(r.Body).Decode(&m)
		got <- m
	}))
	defer srv.Close()
	o := &outbox{clock: testclock.New(t0)}
	o.add(delivery(fleet.EventClosed, fleet.ChannelParameters{Type: "slack", URL: srv.URL}, fleet.NotificationTemplate{}, "UTC"))
	newWorker(o).RunOnce(context.Background())
	m := <-got
	if !strings.Contains(m["text"], "*[fleetd] hot closed on d1*") || !strings.Contains(m["text"], "Ended: 2026-11-21 11:00:00 UTC") {
		t.Fatalf("slack text %q", m["text"])
	}
	if s, _ := o.state(1); s != fleet.DeliveryDelivered {
		t.Fatalf("status %s", s)
	}
}

func TestEmail(t *testing.T) {
	smtpd := notifytest.NewSMTPServer(t)
	o := &outbox{clock: testclock.New(t0)}
	o.add(delivery(fleet.EventOpened, fleet.ChannelParameters{Type: "email", To: []string{"ops@example.com", "oncall@example.com"}},
		fleet.NotificationTemplate{Subject: "Température {{.Rule.Name}}\nsecond line", Body: "device {{.Alert.DeviceID}}\nat {{.Alert.StartedAt.Format \"15:04 MST\"}}"}, "America/New_York"))
	w := newWorker(o)
	w.SMTP = notify.SMTP{Addr: smtpd.Addr, From: "fleetd@example.com", TLS: "none"}
	w.RunOnce(context.Background())
	if s, at := o.state(1); s != fleet.DeliveryDelivered {
		t.Fatalf("status %s: %+v", s, at)
	}
	m := <-smtpd.Mail
	if m.From != "fleetd@example.com" || len(m.To) != 2 || m.To[1] != "oncall@example.com" {
		t.Fatalf("envelope %+v", m)
	}
	for _, want := range []string{"Subject: =?utf-8?q?Temp=C3=A9rature_hot_second_line?=", "device d1\r\nat 05:00 EST\r\n", "To: ops@example.com, oncall@example.com"} {
		if !strings.Contains(m.Data, want) {
			t.Fatalf("message lacks %q:\n%s", want, m.Data)
		}
	}
	t.Run("NotConfigured", func(t *testing.T) {
		o := &outbox{clock: testclock.New(t0)}
		o.add(delivery(fleet.EventOpened, fleet.ChannelParameters{Type: "email", To: []string{"a@example.com"}}, fleet.NotificationTemplate{}, "UTC"))
		newWorker(o).RunOnce(context.Background())
		if _, at := o.state(1); len(at) != 1 || !strings.Contains(at[0].Error, "--smtp-addr") {
			t.Fatalf("attempts %+v", at)
		}
	})
}

// run starts w.Run and returns a stop that cancels it and waits, failing
// if it does not return: SIGTERM must not hang on a delivery.
func run(t *testing.T, w *notify.Worker) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	return func() {
		t.Helper()
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return 10s after its context ended")
		}
	}
}

// okReceiver answers every request 204 and counts them.
func okReceiver(t *testing.T) (*httptest.Server, func() int) {
	var mu sync.Mutex
	n := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n++
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	return srv, func() int { mu.Lock(); defer mu.Unlock(); return n }
}

// TestTemplateOverBudget: a template that passed its check but loops over
// a value of the data is stopped within its budget: one failed attempt,
// dead at once (the same render would fail again), while another tenant's
// notification goes out; and the worker stops when told to.
func TestTemplateOverBudget(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		lim        fleet.TemplateLimits
		want       string
	}{
		{"silent loop", `{{range .Value.n}}{{end}}`, fleet.TemplateLimits{}, "took longer than 50ms"},
		// Time enough that the output cap is met first on a busy machine.
		{"output", `{{range .Value.n}}AAAA{{end}}`, fleet.TemplateLimits{Timeout: time.Minute}, "rendered more than 65536 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, got := okReceiver(t)
			o := &outbox{clock: testclock.New(t0)}
			bad := delivery(fleet.EventOpened, fleet.ChannelParameters{Type: "webhook", URL: srv.URL}, fleet.NotificationTemplate{Body: tc.body}, "UTC")
			bad.Alert.Value.Data = map[string]any{"n": int64(1e14)}
			o.add(bad)
			good := delivery(fleet.EventOpened, fleet.ChannelParameters{Type: "webhook", URL: srv.URL}, fleet.NotificationTemplate{}, "UTC")
			good.Tenant = "beta"
			o.add(good)
			w := newWorker(o)
			w.Templates = tc.lim
			stop := run(t, w)
			poll.Until(t, 15*time.Second, "the other tenant's notification", func() bool { s, _ := o.state(2); return s == fleet.DeliveryDelivered })
			poll.Until(t, 15*time.Second, "the over-budget notification to die", func() bool { s, _ := o.state(1); return s == fleet.DeliveryDead })
			stop()
			_, at := o.state(1)
			if len(at) != 1 || !strings.Contains(at[0].Error, tc.want) || at[0].StatusCode != 0 {
				t.Fatalf("attempts %+v, want one that says %q", at, tc.want)
			}
			if got() != 1 {
				t.Fatalf("%d webhook requests, want the other tenant's only", got())
			}
		})
	}
}

// TestSlowReceiverHoldsUpNoOne: while one delivery waits on a receiver
// that does not answer, a notification that falls due is delivered.
func TestSlowReceiverHoldsUpNoOne(t *testing.T) {
	arrived, release := make(chan struct{}), make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-release
	}))
	defer slow.Close()
	defer close(release)
	fast, got := okReceiver(t)
	o := &outbox{clock: testclock.New(t0)}
	o.add(delivery(fleet.EventOpened, fleet.ChannelParameters{Type: "webhook", URL: slow.URL}, fleet.NotificationTemplate{}, "UTC"))
	w := newWorker(o)
	stop := run(t, w)
	defer stop()
	<-arrived
	other := delivery(fleet.EventOpened, fleet.ChannelParameters{Type: "slack", URL: fast.URL}, fleet.NotificationTemplate{}, "UTC")
	other.Tenant = "beta"
	o.add(other)
	w.Wake()
	poll.Until(t, 15*time.Second, "the second notification, while the first waits", func() bool { s, _ := o.state(2); return s == fleet.DeliveryDelivered })
	if got() != 1 {
		t.Fatalf("the receiver got %d requests, want 1", got())
	}
	if _, at := o.state(1); len(at) != 0 {
		t.Fatalf("the second notification went out only after the first gave up: %+v", at)
	}
}

// TestOutboundPolicy: by default a notification reaches no internal address,
// follows no redirect, and an attempt records the status code and fleetd's
// own words, never what the receiver sent
// (docs/reliability.md#outbound-requests).
func TestOutboundPolicy(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		switch r.URL.Path {
		case "/redirect":
			http.Redirect(w, r, "/elsewhere", http.StatusTemporaryRedirect)
		case "/banner":
			http.Error(w, "SSH-2.0-OpenSSH_9.6 secret-banner", http.StatusBadRequest)
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	}))
	defer srv.Close()
	for _, tc := range []struct {
		name, path string
		policy     *notify.Worker
		want       string
		hits       int32
	}{
		{"loopback refused by default", "/", &notify.Worker{}, "resolves to a loopback address", 0},
		{"redirect not followed", "/redirect", nil, "answered 307, a redirect", 1},
		{"answer not kept", "/banner", nil, "answered 400 Bad Request", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hits.Store(0)
			o := &outbox{clock: testclock.New(t0)}
			o.add(delivery(fleet.EventOpened, fleet.ChannelParameters{Type: "webhook", URL: srv.URL + tc.path}, fleet.NotificationTemplate{}, "UTC"))
			w := newWorker(o)
			if tc.policy != nil {
				w.HTTP = nil // the default
			}
			w.RunOnce(context.Background())
			_, at := o.state(1)
			if len(at) != 1 || !strings.Contains(at[0].Error, tc.want) || strings.Contains(at[0].Error, "banner") || strings.Contains(at[0].Error, "127.0.0.1:") {
				t.Fatalf("attempts %+v, want one saying %q and nothing the receiver sent", at, tc.want)
			}
			if n := hits.Load(); n != tc.hits {
				t.Fatalf("%d requests reached the receiver, want %d", n, tc.hits)
			}
		})
	}
}

// records is a slog handler that keeps what is logged.
type records struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec)
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

// TestWebhookBodyAsTheAPIWritesIt: a failed delivery is a warning an
// operator sees at the default level, and the body's times keep their
// milliseconds, as the API writes them (…00.570Z, not …00.57Z).
func TestWebhookBodyAsTheAPIWritesIt(t *testing.T) {
	var mu sync.Mutex
	var bodies [][]byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		bodies = append(bodies, b)
		if len(bodies) == 1 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	o := &outbox{clock: testclock.New(t0)}
	d := delivery(fleet.EventOpened, fleet.ChannelParameters{Type: "webhook", URL: srv.URL}, fleet.NotificationTemplate{Subject: "s", Body: "b"}, "UTC")
	at := t0.Add(570 * time.Millisecond)
	d.Alert.StartedAt, d.Alert.Value.Timestamp = at, at
	o.add(d)
	logs := &records{}
	w := newWorker(o)
	w.Logger = slog.New(logs)
	if _, err := w.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	logs.mu.Lock()
	var warned bool
	for _, r := range logs.recs {
		warned = warned || (r.Level == slog.LevelWarn && strings.Contains(r.Message, "notification failed"))
	}
	logs.mu.Unlock()
	if !warned {
		t.Errorf("a failed delivery was not logged at WARN: %+v", logs.recs)
	}
	o.clock.Add(time.Second)
	if _, err := w.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bodies) != 2 {
		t.Fatalf("%d deliveries, want 2", len(bodies))
	}
	for _, want := range []string{`"started_at":"2026-11-21T10:00:00.570Z"`, `"timestamp":"2026-11-21T10:00:00.570Z"`, `"ended_at":null`} {
		if !strings.Contains(string(bodies[1]), want) {
			t.Errorf("body lacks %s: %s", want, bodies[1])
		}
	}
}
