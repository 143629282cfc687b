package fleethttp

import (
	"net/http"

	"github.com/fleetd/fleet"
	"github.com/google/uuid"
)

// alertRuleCreate is the body of S2.
type alertRuleCreate struct {
	Name                         string         `json:"name" openapi:"required" doc:"1-256 characters, unique in the tenant"`
	Stream                       string         `json:"stream" openapi:"required" doc:"the stream watched: 1-128 characters from A-Z a-z 0-9 . _ -"`
	Group                        string         `json:"group,omitempty" doc:"a label, up to 256 characters"`
	DeviceGroup                  string         `json:"device_group,omitempty" doc:"the name of a group of devices (docs/twin.md): the rule watches the devices in the group when each point is evaluated"`
	Condition                    any            `json:"condition" openapi:"required" doc:"{\"field\", \"operator\", \"value\"} (with \"aggregate\": avg|min|max and \"window_seconds\" to compare a window's aggregate), {\"all\": [...]}, {\"any\": [...]}, {\"not\": {...}} or {\"no_data_seconds\": N}"`
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

// pathUUID is uuidParam of {id}.
func pathUUID(r *http.Request) (string, error) {
	return uuidParam(r, "id")
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
	rule := fleet.ReadRule(f, s.Alerts.CompileRule)
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
	return getOne(s, w, r, pathUUID, s.Alerts.FindAlertRule)
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
	rule := fleet.ReadRule(f, s.Alerts.CompileRule)
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
	n := fleet.ReadNotificationRule(r.Context(), f, s.Templates)
	if err := f.Err(); err != nil {
		return err
	}
	n.AlertRuleID = ruleID
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
	u := fleet.ReadNotificationRuleUpdate(r.Context(), f, s.Templates)
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
	return getOne(s, w, r, pathUUID, s.Alerts.FindAlert)
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
	ds, n, err := s.Alerts.FindDeliveries(r.Context(), tenantOf(r), fleet.DeliveryFilter{AlertID: id, Page: page})
	if err != nil {
		return err
	}
	s.respond(w, r, http.StatusOK, deliveryList{Notifications: ds, Count: n})
	return nil
}
