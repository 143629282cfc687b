package fleethttp

import (
	"context"
	"net/http"

	"github.com/fleetd/fleet"
)

// The operations on rollouts and the rules that send their changes of
// state to the tenant's channels (docs/actions.md, "Rollouts").

// rolloutRuleCreate is the body that makes a rollout notification rule;
// an update takes the same fields, each optional.
type rolloutRuleCreate struct {
	ChannelParameters    channelParams               `json:"channel_parameters" openapi:"required"`
	NotificationTemplate *fleet.NotificationTemplate `json:"notification_template,omitempty" doc:"Go text/template over the event: {{.Event}}, {{.ActionID}}, {{.Action}}, {{.Phase}}, {{.PhaseName}}, {{.Status}}, {{.Reason}}, {{.Released}}, {{.At}}"`
	Timezone             string                      `json:"timezone,omitempty" doc:"IANA name for times in templates; default UTC"`
	Events               []string                    `json:"events,omitempty" doc:"the events to send, of phase_triggered, paused, resumed, completed, aborted; default all"`
}

type rolloutRuleUpdate struct {
	ChannelParameters    *channelParams              `json:"channel_parameters,omitempty" doc:"replaces the channel; a webhook secret left out is kept, header values sent as *** keep theirs"`
	NotificationTemplate *fleet.NotificationTemplate `json:"notification_template,omitempty"`
	Timezone             string                      `json:"timezone,omitempty"`
	Events               []string                    `json:"events,omitempty"`
}

type rolloutRuleList struct {
	Rules []*fleet.RolloutNotificationRule `json:"rollout_notification_rules"`
	Count int                              `json:"count"`
}

// rolloutOperation answers one of a rollout's operations: 204, or the
// action with Prefer: return=representation.
func (s *Server) rolloutOperation(op func(rs fleet.RolloutService, ctx context.Context, tenant string, id int64) error) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		id, err := pathActionID(r)
		if err != nil {
			return err
		}
		if err := op(s.Actions, r.Context(), tenantOf(r), id); err != nil {
			return err
		}
		return s.quiet(w, r, http.StatusNoContent, func() (any, error) { return s.Actions.FindAction(r.Context(), tenantOf(r), id) })
	}
}

func (s *Server) handleAppendPhase(w http.ResponseWriter, r *http.Request) error {
	id, err := pathActionID(r)
	if err != nil {
		return err
	}
	body, err := s.decode(w, r, s.Limits.Bulk, bulkElements)
	if err != nil {
		return err
	}
	a, err := s.Actions.FindAction(r.Context(), tenantOf(r), id)
	if err != nil {
		return err
	}
	index := 0
	if a.Schedule != nil {
		index = len(a.Schedule.Phases)
	}
	f := fleet.NewFields(body)
	p := fleet.ReadAppendedPhase(f, index)
	if err := f.Err(); err != nil {
		return err
	}
	if err := s.Actions.AppendPhase(r.Context(), tenantOf(r), id, p); err != nil {
		return err
	}
	return s.quiet(w, r, http.StatusNoContent, func() (any, error) { return s.Actions.FindAction(r.Context(), tenantOf(r), id) })
}

// readRolloutTemplate reads notification_template, checked against
// rollout events.
func (s *Server) readRolloutTemplate(ctx context.Context, f *fleet.Fields) *fleet.NotificationTemplate {
	tf := f.Nested("notification_template", false)
	if tf == nil {
		return nil
	}
	t := &fleet.NotificationTemplate{Subject: tf.String("subject", false), Body: tf.String("body", false)}
	tf.Unknown()
	for k, v := range fleet.CheckRolloutTemplate(ctx, s.Templates, *t) {
		f.Fail(k, v)
	}
	return t
}

// readRolloutEvents reads events, nil when absent.
func readRolloutEvents(f *fleet.Fields) []string {
	if !f.Has("events") {
		return nil
	}
	events := f.Strings("events", false)
	if problem := fleet.CheckRolloutEvents(events); problem != "" {
		f.Fail("events", problem)
	}
	return events
}

func (s *Server) handleCreateRolloutRule(w http.ResponseWriter, r *http.Request) error {
	body, err := s.decode(w, r, s.Limits.Body, ordinaryElements)
	if err != nil {
		return err
	}
	f := fleet.NewFields(body)
	n := &fleet.RolloutNotificationRule{Timezone: "UTC", NotificationTemplate: fleet.DefaultRolloutTemplate, Events: fleet.RolloutEvents}
	if cf := f.Nested("channel_parameters", true); cf != nil {
		n.ChannelParameters, _ = fleet.ReadChannel(cf)
	}
	if t := s.readRolloutTemplate(r.Context(), f); t != nil {
		n.NotificationTemplate = *t
	}
	if tz := fleet.ReadTimezone(f); tz != nil {
		n.Timezone = *tz
	}
	if events := readRolloutEvents(f); events != nil {
		n.Events = events
	}
	if err := f.Err(); err != nil {
		return err
	}
	if err := s.RolloutNotifications.CreateRolloutNotificationRule(r.Context(), tenantOf(r), n); err != nil {
		return err
	}
	location(w, r, "/api/v1/rollout-notification-rules/", n.ID)
	s.respond(w, r, http.StatusCreated, n.ShownTo(roleOf(r)))
	return nil
}

func (s *Server) handleUpdateRolloutRule(w http.ResponseWriter, r *http.Request) error {
	id, err := uuidParam(r, "id")
	if err != nil {
		return err
	}
	body, err := s.decode(w, r, s.Limits.Body, ordinaryElements)
	if err != nil {
		return err
	}
	f := fleet.NewFields(body)
	var u fleet.RolloutNotificationRuleUpdate
	if cf := f.Nested("channel_parameters", false); cf != nil {
		c, given := fleet.ReadChannel(cf)
		u.ChannelParameters, u.SecretGiven = &c, given
	}
	u.NotificationTemplate = s.readRolloutTemplate(r.Context(), f)
	u.Timezone = fleet.ReadTimezone(f)
	u.Events = readRolloutEvents(f)
	if err := f.Err(); err != nil {
		return err
	}
	n, err := s.RolloutNotifications.UpdateRolloutNotificationRule(r.Context(), tenantOf(r), id, u)
	if err != nil {
		return err
	}
	return s.quiet(w, r, http.StatusNoContent, func() (any, error) { return n.ShownTo(roleOf(r)), nil })
}

func (s *Server) handleListRolloutRules(w http.ResponseWriter, r *http.Request) error {
	q := newQuery(r)
	page := q.Page()
	if err := q.Err(); err != nil {
		return err
	}
	rules, n, err := s.RolloutNotifications.FindRolloutNotificationRules(r.Context(), tenantOf(r), page)
	if err != nil {
		return err
	}
	for i, rule := range rules {
		rules[i] = rule.ShownTo(roleOf(r))
	}
	s.respond(w, r, http.StatusOK, rolloutRuleList{Rules: rules, Count: n})
	return nil
}

func (s *Server) handleGetRolloutRule(w http.ResponseWriter, r *http.Request) error {
	id, err := uuidParam(r, "id")
	if err != nil {
		return err
	}
	n, err := s.RolloutNotifications.FindRolloutNotificationRule(r.Context(), tenantOf(r), id)
	if err != nil {
		return err
	}
	s.respond(w, r, http.StatusOK, n.ShownTo(roleOf(r)))
	return nil
}

func (s *Server) handleDeleteRolloutRule(w http.ResponseWriter, r *http.Request) error {
	id, err := uuidParam(r, "id")
	if err != nil {
		return err
	}
	if err := s.RolloutNotifications.DeleteRolloutNotificationRule(r.Context(), tenantOf(r), id); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
