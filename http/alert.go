package fleethttp

import (
	"context"
	"fmt"
	"net/http"
	"net/mail"
	"net/url"
	"strings"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/alert"
	"github.com/google/uuid"
)

// alertRuleCreate is the body of S2.
type alertRuleCreate struct {
	Name                         string         `json:"name" openapi:"required" doc:"1-256 characters, unique in the tenant"`
	Stream                       string         `json:"stream" openapi:"required" doc:"the stream watched: 1-128 characters from A-Z a-z 0-9 . _ -"`
	Group                        string         `json:"group,omitempty" doc:"a label, up to 256 characters"`
	Condition                    any            `json:"condition" openapi:"required" doc:"{\"field\", \"operator\", \"value\"}, {\"all\": [...]}, {\"any\": [...]}, {\"not\": {...}} or {\"no_data_seconds\": N}"`
	MetadataFilters              map[string]any `json:"metadata_filters,omitempty" doc:"{\"key\": \"value\"} or {\"key\": [\"v1\", \"v2\"]}: every key must match the device's metadata"`
	ActivationThresholdSeconds   float64        `json:"activation_threshold_seconds,omitempty" doc:"how long the condition must hold before the alert opens; ≥ 0, default 0"`
	DeactivationThresholdSeconds float64        `json:"deactivation_threshold_seconds,omitempty" doc:"how long the condition must be false before the alert closes; ≥ 0, default 0"`
}

type alertRuleList struct {
	AlertRules []*fleet.AlertRule `json:"alert_rules"`
	Count      int                `json:"count"`
}

// channelParams is the channel_parameters of S3 and S4.
type channelParams struct {
	Type    string            `json:"type" openapi:"required" doc:"webhook, slack or email"`
	URL     string            `json:"url,omitempty" doc:"webhook and slack: an absolute http or https URL"`
	Headers map[string]string `json:"headers,omitempty" doc:"webhook: extra request headers"`
	Secret  string            `json:"secret,omitempty" doc:"webhook: the key of X-Fleet-Signature; never shown again"`
	To      []string          `json:"to,omitempty" doc:"email: 1-50 addresses"`
}

// notificationRuleCreate is the body of S3; S4 takes the same fields, each
// optional.
type notificationRuleCreate struct {
	ChannelParameters    channelParams               `json:"channel_parameters" openapi:"required"`
	IntervalSeconds      int64                       `json:"interval_seconds,omitempty" doc:"0: notify once per opening; N: remind every N seconds while open"`
	NotificationTemplate *fleet.NotificationTemplate `json:"notification_template,omitempty" doc:"Go text/template for subject and body"`
	Timezone             string                      `json:"timezone,omitempty" doc:"IANA name for times in templates; default UTC"`
}

type notificationRuleUpdate struct {
	ChannelParameters    *channelParams              `json:"channel_parameters,omitempty" doc:"replaces the channel; a webhook secret left out is kept, header values sent as *** keep theirs"`
	IntervalSeconds      int64                       `json:"interval_seconds,omitempty"`
	NotificationTemplate *fleet.NotificationTemplate `json:"notification_template,omitempty"`
	Timezone             string                      `json:"timezone,omitempty"`
}

type notificationRuleList struct {
	NotificationRules []*fleet.NotificationRule `json:"alert_notification_rules"`
	Count             int                       `json:"count"`
}

type alertList struct {
	Alerts []*fleet.Alert `json:"alerts"`
	Count  int            `json:"count"`
}

type deliveryList struct {
	Notifications []*fleet.Delivery `json:"notifications"`
	Count         int               `json:"count"`
}

// uuidParam returns the path parameter name, which must be a UUID, in its
// canonical form.
func uuidParam(r *http.Request, name string) (string, error) {
	u, err := uuid.Parse(r.PathValue(name))
	if err != nil {
		return "", pathError(name, name, "must be a UUID")
	}
	return u.String(), nil
}

func uuidPathParams(names ...string) []param {
	var ps []param
	for _, n := range names {
		ps = append(ps, param{Name: n, In: "path", Format: "uuid"})
	}
	return ps
}

func (s *Server) handleCreateAlertRule(w http.ResponseWriter, r *http.Request) error {
	body, err := s.decode(w, r, s.Limits.Body, ordinaryElements)
	if err != nil {
		return err
	}
	f := fleet.NewFields(body)
	rule := alert.ReadRule(f)
	if err := f.Err(); err != nil {
		return err
	}
	if err := s.Alerts.CreateAlertRule(r.Context(), tenantOf(r), rule); err != nil {
		return err
	}
	location(w, r, "/api/v1/alert-rules/", rule.ID)
	return s.quiet(w, r, http.StatusCreated, func() (any, error) { return rule, nil })
}

func (s *Server) handleListAlertRules(w http.ResponseWriter, r *http.Request) error {
	q := newQuery(r)
	page := q.Page()
	if err := q.Err(); err != nil {
		return err
	}
	rules, n, err := s.Alerts.FindAlertRules(r.Context(), tenantOf(r), page)
	if err != nil {
		return err
	}
	s.respond(w, r, http.StatusOK, alertRuleList{AlertRules: rules, Count: n})
	return nil
}

func (s *Server) handleGetAlertRule(w http.ResponseWriter, r *http.Request) error {
	id, err := uuidParam(r, "id")
	if err != nil {
		return err
	}
	rule, err := s.Alerts.FindAlertRule(r.Context(), tenantOf(r), id)
	if err != nil {
		return err
	}
	s.respond(w, r, http.StatusOK, rule)
	return nil
}

func (s *Server) handleUpdateAlertRule(w http.ResponseWriter, r *http.Request) error {
	id, err := uuidParam(r, "id")
	if err != nil {
		return err
	}
	body, err := s.decode(w, r, s.Limits.Body, ordinaryElements)
	if err != nil {
		return err
	}
	f := fleet.NewFields(body)
	rule := alert.ReadRule(f)
	if err := f.Err(); err != nil {
		return err
	}
	if err := s.Alerts.UpdateAlertRule(r.Context(), tenantOf(r), id, rule); err != nil {
		return err
	}
	return s.quiet(w, r, http.StatusNoContent, func() (any, error) { return rule, nil })
}

func (s *Server) handleDeleteAlertRule(w http.ResponseWriter, r *http.Request) error {
	id, err := uuidParam(r, "id")
	if err != nil {
		return err
	}
	if err := s.Alerts.DeleteAlertRule(r.Context(), tenantOf(r), id); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// readChannel is the typed decode of channel_parameters. secretGiven says
// whether a secret was sent.
func readChannel(f *fleet.Fields) (c fleet.ChannelParameters, secretGiven bool) {
	c.Type = f.String("type", true)
	switch c.Type {
	case fleet.ChannelWebhook, fleet.ChannelSlack:
		c.URL = f.String("url", true)
		if f.Has("url") {
			if problem := checkURL(c.URL); problem != "" {
				f.Fail("url", problem)
			}
		}
	case fleet.ChannelEmail:
		c.To = f.Strings("to", true)
		if f.Has("to") {
			if len(c.To) == 0 || len(c.To) > 50 {
				f.Fail("to", "must list 1 to 50 email addresses")
			}
			for i, a := range c.To {
				if addr, err := mail.ParseAddress(a); err != nil || addr.Name != "" || len(a) > 254 {
					f.Fail(fmt.Sprintf("to[%d]", i), "must be an email address such as ops@example.com")
				}
			}
		}
	case "":
	default:
		f.Fail("type", "must be webhook, slack or email")
	}
	if c.Type == fleet.ChannelWebhook {
		c.Headers = f.StringMap("headers", false)
		if len(c.Headers) > 32 {
			f.Fail("headers", "must have at most 32 headers")
		}
		for k, v := range c.Headers {
			if problem := checkHeader(k, v); problem != "" {
				f.Fail("headers."+k, problem)
			}
		}
		secretGiven = f.Has("secret")
		if c.Secret = f.String("secret", false); len(c.Secret) > 256 {
			f.Fail("secret", "must be at most 256 characters")
		}
	}
	f.Unknown()
	return c, secretGiven
}

// checkURL returns the problem with a notification URL, or "".
func checkURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || len(s) > 2048 {
		return "must be an absolute http or https URL of at most 2048 characters"
	}
	return ""
}

// checkHeader returns the problem with a webhook header, or "". Headers that
// fleetd sets itself cannot be replaced.
func checkHeader(name, value string) string {
	if name == "" || len(name) > 128 || strings.ContainsFunc(name, func(r rune) bool {
		return r <= ' ' || r >= 0x7f || strings.ContainsRune(`()<>@,;:\"/[]?={}`, r)
	}) {
		return "is not a valid header name"
	}
	switch strings.ToLower(name) {
	case "host", "content-length", "content-type", "transfer-encoding", "connection":
		return "is set by fleetd"
	}
	if strings.HasPrefix(strings.ToLower(name), "x-fleet-") {
		return "is set by fleetd"
	}
	if len(value) > 4096 || strings.ContainsAny(value, "\r\n\x00") {
		return "must be at most 4096 characters on one line"
	}
	return ""
}

// readTemplate reads notification_template, rendered for a sample alert
// within the server's template limits.
func (s *Server) readTemplate(ctx context.Context, f *fleet.Fields) *fleet.NotificationTemplate {
	tf := f.Nested("notification_template", false)
	if tf == nil {
		return nil
	}
	t := &fleet.NotificationTemplate{Subject: tf.String("subject", false), Body: tf.String("body", false)}
	tf.Unknown()
	for k, v := range fleet.CheckNotificationTemplate(ctx, s.Templates, *t) {
		f.Fail(k, v)
	}
	return t
}

// readTimezone reads timezone, an IANA name.
func readTimezone(f *fleet.Fields) *string {
	if !f.Has("timezone") {
		return nil
	}
	tz := f.String("timezone", false)
	if _, err := time.LoadLocation(tz); err != nil || tz == "" || tz == "Local" {
		f.Fail("timezone", "must be an IANA time zone name such as UTC or Europe/Berlin")
	}
	return &tz
}

func (s *Server) handleCreateNotificationRule(w http.ResponseWriter, r *http.Request) error {
	ruleID, err := uuidParam(r, "id")
	if err != nil {
		return err
	}
	body, err := s.decode(w, r, s.Limits.Body, ordinaryElements)
	if err != nil {
		return err
	}
	f := fleet.NewFields(body)
	n := &fleet.NotificationRule{AlertRuleID: ruleID, Timezone: "UTC", NotificationTemplate: fleet.DefaultNotificationTemplate}
	if cf := f.Nested("channel_parameters", true); cf != nil {
		n.ChannelParameters, _ = readChannel(cf)
	}
	n.IntervalSeconds = f.Int("interval_seconds", false, 0, fleet.MaxThresholdSeconds)
	if t := s.readTemplate(r.Context(), f); t != nil {
		n.NotificationTemplate = *t
	}
	if tz := readTimezone(f); tz != nil {
		n.Timezone = *tz
	}
	if err := f.Err(); err != nil {
		return err
	}
	if err := s.Alerts.CreateNotificationRule(r.Context(), tenantOf(r), n); err != nil {
		return err
	}
	location(w, r, "/api/v1/alert-rules/", ruleID, "/alert-notification-rules/", n.ID)
	return s.quiet(w, r, http.StatusCreated, func() (any, error) { return n.ShownTo(roleOf(r)), nil })
}

func (s *Server) handleUpdateNotificationRule(w http.ResponseWriter, r *http.Request) error {
	ruleID, err := uuidParam(r, "alert_id")
	if err != nil {
		return err
	}
	id, err := uuidParam(r, "notification_id")
	if err != nil {
		return err
	}
	body, err := s.decode(w, r, s.Limits.Body, ordinaryElements)
	if err != nil {
		return err
	}
	f := fleet.NewFields(body)
	var u fleet.NotificationRuleUpdate
	if cf := f.Nested("channel_parameters", false); cf != nil {
		c, given := readChannel(cf)
		u.ChannelParameters, u.SecretGiven = &c, given
	}
	if f.Has("interval_seconds") {
		n := f.Int("interval_seconds", false, 0, fleet.MaxThresholdSeconds)
		u.IntervalSeconds = &n
	}
	u.NotificationTemplate = s.readTemplate(r.Context(), f)
	u.Timezone = readTimezone(f)
	if err := f.Err(); err != nil {
		return err
	}
	n, err := s.Alerts.UpdateNotificationRule(r.Context(), tenantOf(r), ruleID, id, u)
	if err != nil {
		return err
	}
	return s.quiet(w, r, http.StatusNoContent, func() (any, error) { return n.ShownTo(roleOf(r)), nil })
}

func (s *Server) handleListNotificationRules(w http.ResponseWriter, r *http.Request) error {
	ruleID, err := uuidParam(r, "id")
	if err != nil {
		return err
	}
	q := newQuery(r)
	page := q.Page()
	if err := q.Err(); err != nil {
		return err
	}
	ns, n, err := s.Alerts.FindNotificationRules(r.Context(), tenantOf(r), ruleID, page)
	if err != nil {
		return err
	}
	out := make([]*fleet.NotificationRule, len(ns))
	for i, x := range ns {
		out[i] = x.ShownTo(roleOf(r))
	}
	s.respond(w, r, http.StatusOK, notificationRuleList{NotificationRules: out, Count: n})
	return nil
}

func (s *Server) handleDeleteNotificationRule(w http.ResponseWriter, r *http.Request) error {
	ruleID, err := uuidParam(r, "alert_id")
	if err != nil {
		return err
	}
	id, err := uuidParam(r, "notification_id")
	if err != nil {
		return err
	}
	if err := s.Alerts.DeleteNotificationRule(r.Context(), tenantOf(r), ruleID, id); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) handleListAlerts(w http.ResponseWriter, r *http.Request) error {
	q := newQuery(r)
	f := fleet.AlertFilter{State: q.Enum("state", "", fleet.AlertActive, fleet.AlertEnded), DeviceID: q.String("device_id"), Page: q.Page()}
	if id := q.String("rule_id"); id != "" {
		if u, err := uuid.Parse(id); err != nil {
			q.fail("rule_id", "must be a UUID")
		} else {
			f.RuleID = u.String()
		}
	}
	if f.DeviceID != "" && !fleet.ValidDeviceID(f.DeviceID) {
		q.fail("device_id", fleet.DeviceIDRule)
	}
	if err := q.Err(); err != nil {
		return err
	}
	alerts, n, err := s.Alerts.FindAlerts(r.Context(), tenantOf(r), f)
	if err != nil {
		return err
	}
	s.respond(w, r, http.StatusOK, alertList{Alerts: alerts, Count: n})
	return nil
}

func (s *Server) handleGetAlert(w http.ResponseWriter, r *http.Request) error {
	id, err := uuidParam(r, "id")
	if err != nil {
		return err
	}
	a, err := s.Alerts.FindAlert(r.Context(), tenantOf(r), id)
	if err != nil {
		return err
	}
	s.respond(w, r, http.StatusOK, a)
	return nil
}

func (s *Server) handleListDeliveries(w http.ResponseWriter, r *http.Request) error {
	id, err := uuidParam(r, "id")
	if err != nil {
		return err
	}
	q := newQuery(r)
	page := q.Page()
	if err := q.Err(); err != nil {
		return err
	}
	ds, n, err := s.Alerts.FindDeliveries(r.Context(), tenantOf(r), id, page)
	if err != nil {
		return err
	}
	s.respond(w, r, http.StatusOK, deliveryList{Notifications: ds, Count: n})
	return nil
}
