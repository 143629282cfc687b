// Package notify delivers alert notifications from the durable outbox: a
// worker claims due notifications under a lease, sends each to its channel
// (webhook, Slack incoming webhook, email over SMTP), records every attempt,
// and retries failures with exponential backoff until delivered or dead.
// Several replicas may run workers on one database: leases keep them apart,
// and one that dies leaves its claims to the others when its lease runs out.
package notify

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/smtp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/codec"
	"github.com/fleetd/fleet/egress"
)

// Store is the outbox as the worker sees it; sqlstore.DB implements it.
type Store interface {
	ClaimDeliveries(ctx context.Context, owner string, lease time.Duration, limit int) ([]*fleet.Delivery, error)
	CompleteDelivery(ctx context.Context, id int64, owner string, at fleet.DeliveryAttempt, status string, next time.Time) error
	NextDeliveryDue(ctx context.Context) (time.Time, bool, error)
}

// SMTP is how email notifications leave: the server's flags.
type SMTP struct {
	Addr     string // host:port; empty disables email
	From     string
	Username string // with Password: PLAIN authentication, over TLS only
	Password string
	// TLS is "starttls" (required), "tls" (implicit, as on port 465),
	// "none" (plain text; for a relay on localhost), or "auto" (STARTTLS when
	// the server offers it): the default.
	TLS string
	// TLSConfig overrides the TLS settings (tests trust their own CA).
	TLSConfig *tls.Config
}

// SMTP TLS modes.
var SMTPTLSModes = []string{"auto", "starttls", "tls", "none"}

// Worker delivers notifications. Set the fields, then Run.
type Worker struct {
	Store  Store
	Logger *slog.Logger
	Now    func() time.Time
	// HTTP sends webhook and Slack notifications; the default refuses
	// internal addresses (egress) and follows no redirect, with a 10s timeout.
	HTTP *http.Client
	SMTP SMTP

	Owner       string        // lease owner; default a random id
	Lease       time.Duration // how long a claim lasts; default 2m
	MaxAttempts int           // then the notification is dead; default 10
	Backoff     time.Duration // after the first failure; doubles each time; default 5s
	MaxBackoff  time.Duration // default 1h
	Concurrency int           // deliveries at once; default 8
	Poll        time.Duration // longest sleep between looks at the outbox; default 1s
	// Timeout is one delivery's deadline, its render and its send; default 30s.
	Timeout time.Duration
	// Templates bounds each render of a subject or body; a render over it
	// fails its notification for good (fleet.ErrTemplateBudget).
	Templates fleet.TemplateLimits

	once  sync.Once
	wake  chan struct{}
	stats struct{ delivered, retried, dead atomic.Uint64 }
}

// Stats counts delivery outcomes since the worker started, for metrics.
type Stats struct {
	Delivered uint64 // notifications that arrived
	Retried   uint64 // failed attempts that will be retried
	Dead      uint64 // notifications given up on after MaxAttempts
}

// Stats returns the worker's counters.
func (w *Worker) Stats() Stats {
	return Stats{Delivered: w.stats.delivered.Load(), Retried: w.stats.retried.Load(), Dead: w.stats.dead.Load()}
}

func (w *Worker) init() {
	w.once.Do(func() {
		if w.Logger == nil {
			w.Logger = slog.New(slog.DiscardHandler)
		}
		if w.Now == nil {
			w.Now = time.Now
		}
		if w.HTTP == nil {
			w.HTTP = (*egress.Policy)(nil).Client(10*time.Second, egress.NoRedirects)
		}
		if w.Owner == "" {
			b := make([]byte, 8)
			rand.Read(b)
			w.Owner = hex.EncodeToString(b)
		}
		if w.Lease <= 0 {
			w.Lease = 2 * time.Minute
		}
		if w.MaxAttempts <= 0 {
			w.MaxAttempts = 10
		}
		if w.Backoff <= 0 {
			w.Backoff = 5 * time.Second
		}
		if w.MaxBackoff <= 0 {
			w.MaxBackoff = time.Hour
		}
		if w.Concurrency <= 0 {
			w.Concurrency = 8
		}
		if w.Poll <= 0 {
			w.Poll = time.Second
		}
		if w.Timeout <= 0 {
			w.Timeout = 30 * time.Second
		}
		w.wake = make(chan struct{}, 1)
	})
}

// Wake makes Run look at the outbox now: alerts just opened or closed.
func (w *Worker) Wake() {
	w.init()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Run delivers until ctx ends. It keeps up to Concurrency deliveries going
// at once, each on a goroutine of its own with its own deadline, and claims
// more as they finish, so a slow receiver or a template that runs out of
// time holds up its own delivery only, never another tenant's. With no free
// slot it waits for one; otherwise it sleeps until the next notification is
// due (at most Poll, so other replicas' work is seen) or Wake is called. It
// returns once the deliveries under way have recorded their outcome.
func (w *Worker) Run(ctx context.Context) {
	w.init()
	var wg sync.WaitGroup
	defer wg.Wait()
	busy := make(chan struct{}, w.Concurrency) // one token a delivery under way
	freed := make(chan struct{}, 1)
	for ctx.Err() == nil {
		free := w.Concurrency - len(busy)
		claimed := 0
		if free > 0 {
			ds, err := w.Store.ClaimDeliveries(ctx, w.Owner, w.Lease, free)
			if err != nil && ctx.Err() == nil {
				w.Logger.Warn("notifications: claim failed", "err", err)
			}
			for _, d := range ds {
				busy <- struct{}{}
				wg.Add(1)
				go func() {
					defer wg.Done()
					w.handle(ctx, d)
					<-busy
					select {
					case freed <- struct{}{}:
					default:
					}
				}()
			}
			claimed = len(ds)
		}
		if free == 0 || claimed == free {
			// More may be due: claim again as soon as a slot frees.
			select {
			case <-ctx.Done():
			case <-freed:
			}
			continue
		}
		wait := w.Poll
		if due, ok, err := w.Store.NextDeliveryDue(ctx); err == nil && ok {
			wait = min(wait, max(due.Sub(w.Now()), 0))
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-w.wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// RunOnce claims the notifications due now, delivers them, and returns how
// many it handled once all are done.
func (w *Worker) RunOnce(ctx context.Context) (int, error) {
	w.init()
	ds, err := w.Store.ClaimDeliveries(ctx, w.Owner, w.Lease, w.Concurrency)
	if err != nil || len(ds) == 0 {
		return 0, err
	}
	var wg sync.WaitGroup
	for _, d := range ds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.handle(ctx, d)
		}()
	}
	wg.Wait()
	return len(ds), nil
}

func (w *Worker) handle(ctx context.Context, d *fleet.Delivery) {
	start := w.Now()
	dctx, cancel := context.WithTimeout(ctx, w.Timeout)
	status, err := w.Deliver(dctx, d)
	cancel()
	at := fleet.DeliveryAttempt{At: start, StatusCode: status, DurationMS: w.Now().Sub(start).Milliseconds()}
	outcome, next := fleet.DeliveryDelivered, w.Now()
	log := w.Logger.With("tenant", d.Tenant, "alert", d.AlertID, "notification_rule", d.NotificationRuleID, "event", d.Event, "delivery", d.ID)
	var rerr *renderError
	switch {
	case err == nil:
	case errors.As(err, &rerr) && ctx.Err() == nil:
		// The same template over the same data fails the same way.
		at.Error = truncate(err.Error(), 500)
		outcome = fleet.DeliveryDead
		log.Warn("notification dead: its template cannot be rendered", "err", err)
	case d.AttemptCount+1 >= w.MaxAttempts:
		at.Error = truncate(err.Error(), 500)
		outcome = fleet.DeliveryDead
		log.Warn("notification dead: giving up", "attempts", d.AttemptCount+1, "err", err)
	default:
		at.Error = truncate(err.Error(), 500)
		attempts := d.AttemptCount + 1
		outcome, next = fleet.DeliveryPending, w.Now().Add(w.backoff(attempts))
		log.Warn("notification failed; will retry", "attempts", attempts, "retry_at", next, "err", err)
	}
	// The outcome must be recorded even when ctx ends mid-delivery.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := w.Store.CompleteDelivery(cctx, d.ID, w.Owner, at, outcome, next); err != nil {
		log.Error("notification outcome not recorded; it will be retried when the lease ends", "err", err)
		return
	}
	switch outcome {
	case fleet.DeliveryDelivered:
		w.stats.delivered.Add(1)
	case fleet.DeliveryDead:
		w.stats.dead.Add(1)
	default:
		w.stats.retried.Add(1)
	}
}

// renderError is a notification whose template failed over its data.
type renderError struct{ err error }

func (e *renderError) Error() string { return "render template: " + e.err.Error() }
func (e *renderError) Unwrap() error { return e.err }

// backoff is the wait after the n-th failed attempt.
func (w *Worker) backoff(n int) time.Duration {
	d := w.Backoff
	for i := 1; i < n && d < w.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, w.MaxBackoff)
}

// Deliver sends one notification to its channel. It returns the HTTP status
// of an HTTP channel (0 otherwise) and an error unless delivered.
func (w *Worker) Deliver(ctx context.Context, d *fleet.Delivery) (int, error) {
	w.init()
	n := d.Notification
	loc, err := time.LoadLocation(n.Timezone)
	if err != nil {
		loc = time.UTC
	}
	var subject, body string
	if d.Rollout != nil {
		subject, body, err = fleet.RenderRolloutNotification(ctx, w.Templates, n.NotificationTemplate, fleet.NewRolloutNotificationData(d.Rollout, loc))
	} else {
		subject, body, err = fleet.RenderNotification(ctx, w.Templates, n.NotificationTemplate, fleet.NewNotificationData(d.Event, d.Alert, d.Rule, loc, w.Now()))
	}
	if err != nil {
		if ctx.Err() != nil {
			return 0, err // a render cut short is no verdict on the template
		}
		return 0, &renderError{err}
	}
	switch n.ChannelParameters.Type {
	case fleet.ChannelWebhook:
		var v any = RolloutWebhookPayload{Event: d.Event, DeliveryID: d.ID, Rollout: d.Rollout, Notification: fleet.NotificationTemplate{Subject: subject, Body: body}}
		if d.Rollout == nil {
			v = WebhookPayload{
				Event: d.Event, DeliveryID: d.ID, Alert: d.Alert,
				Rule:         WebhookRule{ID: d.Rule.ID, Name: d.Rule.Name, Group: d.Rule.Group, Stream: d.Rule.Stream},
				Notification: fleet.NotificationTemplate{Subject: subject, Body: body},
			}
		}
		// As the API writes it: times keep their milliseconds.
		payload, err := codec.Marshal(codec.JSON, v)
		if err != nil {
			return 0, err
		}
		h := http.Header{}
		for k, v := range n.ChannelParameters.Headers {
			h.Set(k, v)
		}
		h.Set("X-Fleet-Event", d.Event)
		h.Set("X-Fleet-Delivery", fmt.Sprint(d.ID))
		if s := n.ChannelParameters.Secret; s != "" {
			h.Set("X-Fleet-Signature", Sign(s, payload))
		}
		return w.post(ctx, n.ChannelParameters.URL, h, payload)
	case fleet.ChannelSlack:
		payload, _ := json.Marshal(map[string]string{"text": "*" + subject + "*\n" + body}) // strings always encode
		return w.post(ctx, n.ChannelParameters.URL, http.Header{}, payload)
	case fleet.ChannelEmail:
		return 0, w.mail(ctx, n.ChannelParameters.To, subject, body)
	}
	return 0, fmt.Errorf("unknown channel type %q", n.ChannelParameters.Type)
}

// WebhookPayload is the body of a webhook notification.
type WebhookPayload struct {
	Event        string                     `json:"event"`
	DeliveryID   int64                      `json:"delivery_id"`
	Alert        *fleet.Alert               `json:"alert"`
	Rule         WebhookRule                `json:"rule"`
	Notification fleet.NotificationTemplate `json:"notification"` // rendered
}

// RolloutWebhookPayload is the body of a rollout notification's webhook:
// Event is "rollout." and the rollout event's kind.
type RolloutWebhookPayload struct {
	Event        string                     `json:"event"`
	DeliveryID   int64                      `json:"delivery_id"`
	Rollout      *fleet.RolloutEvent        `json:"rollout"`
	Notification fleet.NotificationTemplate `json:"notification"` // rendered
}

// WebhookRule is the alert rule as a webhook shows it.
type WebhookRule struct {
	ID     string `json:"id"`
	Name   string `json:"name"`
	Group  string `json:"group"`
	Stream string `json:"stream"`
}

// Sign returns the X-Fleet-Signature of a webhook body:
// "sha256=" and the hex HMAC-SHA256 of the body keyed with the secret.
func Sign(secret string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// post sends one notification. What the receiver answers is not kept
// beyond its status code, nor is a transport error's text, which can quote
// what the other end sent: an attempt's error is fleetd's own sentence
// (egress.Reason), so a receiver's URL cannot be used to read what lies
// behind it.
func (w *Worker) post(ctx context.Context, url string, h http.Header, payload []byte) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(payload))
	if err != nil {
		return 0, errors.New("the URL cannot be requested")
	}
	req.Header = h
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "fleetd-notifications")
	resp, err := w.HTTP.Do(req)
	if err != nil {
		return 0, errors.New(egress.Reason(err))
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // let the connection be reused
	if resp.StatusCode/100 != 2 {
		return resp.StatusCode, errors.New(egress.StatusReason(resp.StatusCode))
	}
	return resp.StatusCode, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// mail sends one message to every recipient over SMTP, giving up when ctx
// ends.
func (w *Worker) mail(ctx context.Context, to []string, subject, body string) error {
	c := w.SMTP
	if c.Addr == "" {
		return errors.New("email is not configured on this server (--smtp-addr)")
	}
	host, _, err := net.SplitHostPort(c.Addr)
	if err != nil {
		return fmt.Errorf("--smtp-addr %q: %w", c.Addr, err)
	}
	tlsConf := c.TLSConfig
	if tlsConf == nil {
		tlsConf = &tls.Config{ServerName: host}
	}
	dialer := &net.Dialer{Timeout: 10 * time.Second}
	var conn net.Conn
	if c.TLS == "tls" {
		conn, err = (&tls.Dialer{NetDialer: dialer, Config: tlsConf}).DialContext(ctx, "tcp", c.Addr)
	} else {
		conn, err = dialer.DialContext(ctx, "tcp", c.Addr)
	}
	if err != nil {
		return err
	}
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	defer context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })()
	cl, err := smtp.NewClient(conn, host)
	if err != nil {
		conn.Close()
		return err
	}
	defer cl.Close()
	if err := cl.Hello("fleetd"); err != nil {
		return err
	}
	switch c.TLS {
	case "starttls":
		if ok, _ := cl.Extension("STARTTLS"); !ok {
			return errors.New("the SMTP server does not offer STARTTLS, which --smtp-tls=starttls requires")
		}
		if err := cl.StartTLS(tlsConf); err != nil {
			return err
		}
	case "", "auto":
		if ok, _ := cl.Extension("STARTTLS"); ok {
			if err := cl.StartTLS(tlsConf); err != nil {
				return err
			}
		}
	}
	if c.Username != "" {
		if err := cl.Auth(smtp.PlainAuth("", c.Username, c.Password, host)); err != nil {
			return err
		}
	}
	if err := cl.Mail(c.From); err != nil {
		return err
	}
	for _, rcpt := range to {
		if err := cl.Rcpt(rcpt); err != nil {
			return err
		}
	}
	wc, err := cl.Data()
	if err != nil {
		return err
	}
	if _, err := wc.Write(message(c.From, to, subject, body, w.Now())); err != nil {
		return err
	}
	if err := wc.Close(); err != nil {
		return err
	}
	return cl.Quit()
}

// message is an RFC 5322 message in UTF-8 plain text.
func message(from string, to []string, subject, body string, now time.Time) []byte {
	var b bytes.Buffer
	id := make([]byte, 12)
	rand.Read(id)
	fmt.Fprintf(&b, "From: %s\r\n", from)
	fmt.Fprintf(&b, "To: %s\r\n", strings.Join(to, ", "))
	fmt.Fprintf(&b, "Subject: %s\r\n", mime.QEncoding.Encode("utf-8", oneLine(subject)))
	fmt.Fprintf(&b, "Date: %s\r\n", now.Format(time.RFC1123Z))
	fmt.Fprintf(&b, "Message-ID: <%s@fleetd>\r\n", hex.EncodeToString(id))
	b.WriteString("MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: 8bit\r\n\r\n")
	for _, line := range strings.Split(strings.ReplaceAll(body, "\r\n", "\n"), "\n") {
		b.WriteString(line + "\r\n")
	}
	return b.Bytes()
}

// oneLine keeps a header value on one line: a template may render newlines.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
