package fleet

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// RolloutEvents lists the kinds of rollout event, which a rollout
// notification rule may choose among.
var RolloutEvents = []string{RolloutEventTriggered, RolloutEventPaused, RolloutEventResumed, RolloutEventCompleted, RolloutEventAborted}

// RolloutNotificationRule sends the changes of state of a tenant's
// rollouts to one channel (docs/actions.md, "Rollouts").
type RolloutNotificationRule struct {
	ID                   string               `json:"id" codec:"uuid"`
	ChannelParameters    ChannelParameters    `json:"channel_parameters"`
	NotificationTemplate NotificationTemplate `json:"notification_template"`
	Timezone             string               `json:"timezone"`
	Events               []string             `json:"events" doc:"the events sent: phase_triggered, paused, resumed, completed, aborted"`
	CreatedAt            time.Time            `json:"created_at"`
	UpdatedAt            time.Time            `json:"updated_at"`
}

// ShownTo returns the rule as someone of the role sees it
// (ChannelParameters.ShownTo).
func (n *RolloutNotificationRule) ShownTo(role Role) *RolloutNotificationRule {
	r := *n
	r.ChannelParameters = n.ChannelParameters.ShownTo(role)
	return &r
}

// Wants reports whether the rule sends event.
func (n *RolloutNotificationRule) Wants(event string) bool { return slices.Contains(n.Events, event) }

// RolloutNotificationRuleUpdate is a partial update: nil fields stay.
type RolloutNotificationRuleUpdate struct {
	ChannelParameters    *ChannelParameters
	SecretGiven          bool
	NotificationTemplate *NotificationTemplate
	Timezone             *string
	Events               []string
}

// Apply merges u into n.
func (n *RolloutNotificationRule) Apply(u RolloutNotificationRuleUpdate) {
	if u.ChannelParameters != nil {
		n.ChannelParameters = n.ChannelParameters.Replaced(*u.ChannelParameters, u.SecretGiven)
	}
	if u.NotificationTemplate != nil {
		n.NotificationTemplate = *u.NotificationTemplate
	}
	if u.Timezone != nil {
		n.Timezone = *u.Timezone
	}
	if u.Events != nil {
		n.Events = u.Events
	}
}

// RolloutNotificationService keeps the rules that subscribe a tenant's
// channels to its rollouts' changes of state.
type RolloutNotificationService interface {
	CreateRolloutNotificationRule(ctx context.Context, tenant string, n *RolloutNotificationRule) error
	FindRolloutNotificationRule(ctx context.Context, tenant, id string) (*RolloutNotificationRule, error)
	FindRolloutNotificationRules(ctx context.Context, tenant string, p Page) ([]*RolloutNotificationRule, int, error)
	UpdateRolloutNotificationRule(ctx context.Context, tenant, id string, u RolloutNotificationRuleUpdate) (*RolloutNotificationRule, error)
	DeleteRolloutNotificationRule(ctx context.Context, tenant, id string) error
}

// RolloutNotificationData is what a rollout notification's template sees:
// {{.Event}}, {{.ActionID}}, {{.Action}}, {{.PhaseName}}, {{.Reason}}…
// At is in the rule's time zone.
type RolloutNotificationData struct {
	Event     string // phase_triggered, paused, resumed, completed or aborted
	ActionID  int64
	Action    string
	Phase     *int // the phase triggered, or held back by a gate
	PhaseName string
	Status    string // the rollout's, after the change
	Reason    string
	Released  int // device actions a trigger released
	At        time.Time
	Timezone  string
}

// NewRolloutNotificationData is the template data of ev, in loc.
func NewRolloutNotificationData(ev *RolloutEvent, loc *time.Location) RolloutNotificationData {
	return RolloutNotificationData{Event: ev.Event, ActionID: ev.ActionID, Action: ev.Action, Phase: ev.Phase, PhaseName: ev.PhaseName,
		Status: ev.Status, Reason: ev.Reason, Released: ev.Released, At: ev.At.In(loc), Timezone: loc.String()}
}

// DefaultRolloutTemplate is used for a rule without a template, and for a
// subject or body left empty.
var DefaultRolloutTemplate = NotificationTemplate{
	Subject: `[fleetd] rollout of {{.Action}} (action {{.ActionID}}): {{.Event}}`,
	Body: `Rollout of {{.Action}}, action {{.ActionID}}: {{.Event}}{{with .PhaseName}}, phase {{$.Phase}} ({{.}}){{end}}.
{{if eq .Event "phase_triggered"}}Released: {{.Released}} device actions.
{{end}}{{with .Reason}}{{.}}
{{end}}Status: {{.Status}}, at {{.At.Format "2006-01-02 15:04:05 MST"}}.`,
}

// RenderRolloutNotification renders a rollout notification's subject and
// body; an empty subject or body is the default's.
func RenderRolloutNotification(ctx context.Context, lim TemplateLimits, t NotificationTemplate, d RolloutNotificationData) (subject, body string, err error) {
	return renderNotification(ctx, lim, t, DefaultRolloutTemplate, d)
}

// CheckRolloutTemplate parses a template and renders it for a sample event
// of every kind, so that a rule whose template cannot work is refused when
// it is saved. Problems are keyed as CheckNotificationTemplate's.
func CheckRolloutTemplate(ctx context.Context, lim TemplateLimits, t NotificationTemplate) map[string]string {
	errs := map[string]string{}
	phase := 1
	for name, text := range map[string]string{"subject": t.Subject, "body": t.Body} {
		key := "notification_template." + name
		if len(text) > MaxTemplateLen {
			errs[key] = "must be at most 16 KiB"
			continue
		}
		if text == "" {
			continue
		}
		for _, event := range RolloutEvents {
			ev := &RolloutEvent{Event: event, ActionID: 42, Action: ActionUpdateFirmware, Phase: &phase, PhaseName: "quarter", Status: "running",
				Reason: "a reason", Released: 25, At: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
			if _, err := render(ctx, lim, name, text, NewRolloutNotificationData(ev, time.UTC)); err != nil {
				errs[key] = templateProblem(lim, err)
				break
			}
		}
	}
	return errs
}

// CheckRolloutEvents checks a rule's events: known kinds, each once.
func CheckRolloutEvents(events []string) string {
	if len(events) == 0 {
		return "must list at least one of " + strings.Join(RolloutEvents, ", ")
	}
	for i, e := range events {
		if !slices.Contains(RolloutEvents, e) {
			return fmt.Sprintf("%q is not one of %s", e, strings.Join(RolloutEvents, ", "))
		}
		if slices.Contains(events[:i], e) {
			return fmt.Sprintf("repeats %q", e)
		}
	}
	return ""
}
