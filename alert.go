package fleet

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
)

// AlertRule watches one stream of every device of a tenant (or those whose
// metadata matches MetadataFilters, and that are in DeviceGroup) for a
// condition (docs/alerts.md).
type AlertRule struct {
	Tenant string `json:"-"`
	ID     string `json:"id" codec:"uuid"`
	Name   string `json:"name"`
	Stream string `json:"stream"`
	Group  string `json:"group"`
	// DeviceGroup, when set, names a group (docs/twin.md): the rule
	// watches the devices in it at the moment each point is evaluated.
	DeviceGroup string `json:"device_group"`
	// Condition is the condition as the client sent it; Compiled is what
	// evaluation runs.
	Condition any `json:"condition"`
	// MetadataFilters is as the client sent it: each key maps to a string
	// or an array of strings. Filters is its compiled form.
	MetadataFilters              map[string]any `json:"metadata_filters"`
	ActivationThresholdSeconds   float64        `json:"activation_threshold_seconds"`
	DeactivationThresholdSeconds float64        `json:"deactivation_threshold_seconds"`
	CreatedAt                    time.Time      `json:"created_at"`

	Compiled *Condition          `json:"-"`
	Filters  map[string][]string `json:"-"`
}

// ReadRule is the typed decode of an alert rule as a client writes it (S2's
// body): every field's rules, and the condition and metadata filters
// compiled, with every problem recorded in f under its field's path. The
// API and the console both read rules here, so they accept the same rules
// and say the same of the others. compile is the alert service's
// CompileRule, which sets Compiled and Filters: its problems are reported
// with the others.
func ReadRule(f *Fields, compile func(*AlertRule) map[string]string) *AlertRule {
	rule := &AlertRule{
		Name:                         f.NonEmptyString("name", true, 256),
		Group:                        f.String("group", false),
		DeviceGroup:                  f.String("device_group", false),
		MetadataFilters:              f.Object("metadata_filters", false),
		ActivationThresholdSeconds:   f.Float("activation_threshold_seconds", false, 0, MaxThresholdSeconds),
		DeactivationThresholdSeconds: f.Float("deactivation_threshold_seconds", false, 0, MaxThresholdSeconds),
	}
	if rule.Stream = f.String("stream", true); f.Has("stream") && !ValidStreamName(rule.Stream) {
		f.Fail("stream", StreamNameRule)
	}
	if len(rule.Group) > 256 {
		f.Fail("group", "must be at most 256 characters")
	}
	if rule.DeviceGroup != "" && !ValidGroupName(rule.DeviceGroup) {
		f.Fail("device_group", GroupNameRule+", the name of a group of devices (or empty for none)")
	}
	rule.Condition, _ = f.Value("condition", true)
	if f.Has("condition") || f.Has("metadata_filters") {
		if rule.Condition == nil {
			rule.Condition = map[string]any{} // reported as required already; compile the filters
		}
		for k, v := range compile(rule) {
			if k != "condition" || f.Has("condition") {
				f.Fail(k, v)
			}
		}
	}
	return rule
}

// ActivationThreshold is how long the condition must hold before an alert
// opens.
func (r *AlertRule) ActivationThreshold() time.Duration {
	return secondsDuration(r.ActivationThresholdSeconds)
}

// DeactivationThreshold is how long the condition must be false before an
// open alert closes.
func (r *AlertRule) DeactivationThreshold() time.Duration {
	return secondsDuration(r.DeactivationThresholdSeconds)
}

func secondsDuration(s float64) time.Duration {
	return time.Duration(s * float64(time.Second)).Round(time.Millisecond)
}

// MatchesMetadata reports whether a device's metadata passes the rule's
// filters: every key present with one of its values.
func (r *AlertRule) MatchesMetadata(meta map[string]string) bool {
	for k, vs := range r.Filters {
		v, ok := meta[k]
		if !ok {
			return false
		}
		found := false
		for _, want := range vs {
			if v == want {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// MaxThresholdSeconds bounds thresholds, no_data_seconds and intervals: a
// year.
const MaxThresholdSeconds = 31_536_000

// CondKind is the kind of a condition node.
type CondKind int

// The condition kinds (docs/alerts.md#conditions).
const (
	CondCompare CondKind = iota // {"field", "operator", "value"}
	CondAll                     // {"all": [...]}
	CondAny                     // {"any": [...]}
	CondNot                     // {"not": {...}}
	CondNoData                  // {"no_data_seconds": N}
)

// Operator is a comparison of a field with a value.
type Operator int

// The six operators. Numbers compare numerically; strings, booleans and null
// only with == and !=. A missing field or a value of another type makes every
// comparison false, != included.
const (
	OpGT Operator = iota
	OpGE
	OpLT
	OpLE
	OpEQ
	OpNE
)

// Operators maps each operator's spelling to it.
var Operators = map[string]Operator{">": OpGT, ">=": OpGE, "<": OpLT, "<=": OpLE, "==": OpEQ, "!=": OpNE}

// ValueKind is the type of the value a comparison compares with.
type ValueKind int

// Kinds of comparison values.
const (
	ValueNumber ValueKind = iota
	ValueString
	ValueBool
	ValueNull
)

// Condition is a compiled alert condition, checked once when the rule is
// saved or loaded and then evaluated for every data point.
type Condition struct {
	Kind CondKind

	// CondCompare: the field (Path is Field split on ".", for nested
	// objects when the point has no field named Field itself), the operator
	// and the value.
	Field string
	Path  []string
	Op    Operator
	Value ValueKind
	Num   float64
	Int   int64 // Num as an integer when IsInt, compared exactly with integers
	IsInt bool
	Str   string
	Bool  bool
	// A windowed CondCompare compares Aggregate (AggAvg, AggMin or
	// AggMax) of the field's numeric values over the last Window instead
	// of the point's value; WindowIndex numbers the windowed comparisons
	// of a condition from 0, each of which keeps a window per device.
	Aggregate   string
	Window      time.Duration
	WindowIndex int

	Children []*Condition // CondAll, CondAny: any number; CondNot: one

	NoData time.Duration // CondNoData
}

// NoDataDurations lists every no_data_seconds of the condition.
func (c *Condition) NoDataDurations() []time.Duration {
	var ds []time.Duration
	var walk func(*Condition)
	walk = func(c *Condition) {
		if c.Kind == CondNoData {
			ds = append(ds, c.NoData)
		}
		for _, ch := range c.Children {
			walk(ch)
		}
	}
	walk(c)
	return ds
}

// Windows lists the windowed comparisons of the condition, by WindowIndex.
func (c *Condition) Windows() []*Condition {
	var ws []*Condition
	var walk func(*Condition)
	walk = func(c *Condition) {
		if c.Aggregate != "" {
			ws = append(ws, c)
		}
		for _, ch := range c.Children {
			walk(ch)
		}
	}
	walk(c)
	return ws
}

// Alert is one alert session: a rule's condition held for a device from
// StartedAt until EndedAt (nil while it is active).
type Alert struct {
	ID        string     `json:"id" codec:"uuid"`
	RuleID    string     `json:"rule_id" codec:"uuid"`
	RuleName  string     `json:"rule_name"`
	DeviceID  string     `json:"device_id"`
	Stream    string     `json:"stream"`
	State     string     `json:"state"` // AlertActive or AlertEnded
	StartedAt time.Time  `json:"started_at"`
	EndedAt   *time.Time `json:"ended_at"`
	// Value is the data point that opened the alert: for a no_data alert,
	// the last point before the silence, or nil when none is known.
	Value *DataPoint `json:"value"`
}

// Alert states.
const (
	AlertActive = "active"
	AlertEnded  = "ended"
)

// Phases of a rule's evaluation for one device
// (docs/alerts.md#evaluation-and-thresholds): PhaseNormal has no alert and
// the condition false; PhaseActivating has the condition true but not yet
// for the activation threshold; PhaseActive has an open alert;
// PhaseDeactivating has an open alert whose condition has been false, but
// not yet for the deactivation threshold.
const (
	PhaseNormal       = ""
	PhaseActivating   = "activating"
	PhaseActive       = "active"
	PhaseDeactivating = "deactivating"
)

// AlertState is the evaluation state of one rule for one device, as kept
// across restarts. SinceData and SinceClock are when the phase began, by the
// data's timestamps and by the server's clock; SinceData is zero when the
// clock alone began it.
type AlertState struct {
	Tenant     string
	RuleID     string
	DeviceID   string
	Phase      string
	SinceData  time.Time
	SinceClock time.Time
	AlertID    string // of the open alert: PhaseActive and PhaseDeactivating
}

// AlertChange is one transition the evaluation commits: the new state, and
// the alert it opens or closes. The store writes all of a batch's changes,
// their notifications and the stream's latest point in one transaction.
type AlertChange struct {
	Stream string
	State  AlertState
	Open   *Alert      // insert this alert; notify "opened"
	Close  *AlertClose // end this alert; notify "closed"
}

// AlertClose ends an alert.
type AlertClose struct {
	ID      string
	EndedAt time.Time
}

// AlertFilter selects alerts; empty fields select all.
type AlertFilter struct {
	State    string
	RuleID   string
	DeviceID string
	Page
}

// Channel types of notification rules.
const (
	ChannelWebhook = "webhook"
	ChannelSlack   = "slack"
	ChannelEmail   = "email"
)

// ChannelParameters says where a notification goes. Secret is never shown:
// responses carry HasSecret instead.
type ChannelParameters struct {
	Type      string            `json:"type"`
	URL       string            `json:"url,omitempty"`
	Headers   map[string]string `json:"headers,omitempty"`
	Secret    string            `json:"-"`
	HasSecret bool              `json:"has_secret,omitempty"`
	To        []string          `json:"to,omitempty"`
}

// Redacted returns the parameters as viewers and the audit log see them:
// no secret, no header value, and of the URL only its scheme and host (a
// path or query may be a credential: /api/webhooks/123/SECRET).
func (c ChannelParameters) Redacted() ChannelParameters {
	r := c.shown()
	for k := range r.Headers {
		r.Headers[k] = Masked
	}
	r.URL = RedactURL(c.URL, true)
	return r
}

// ShownTo returns the parameters as someone of the role sees them. Those
// who may change the rule (operators, admins) see the URL's path and the
// names in its query, and the values of headers whose names do not look like credentials, so
// that they can check and round-trip what they set; never the secret, a
// header that looks like a credential, a URL's password or query values,
// nor a Slack URL's path (itself a credential). Everyone else sees Redacted's.
func (c ChannelParameters) ShownTo(role Role) ChannelParameters {
	if !role.Can(PermOperate) {
		return c.Redacted()
	}
	r := c.shown()
	r.URL = RedactURL(c.URL, c.Type == ChannelSlack)
	return r
}

// shown is c without its secret and the values of headers that look like
// credentials.
func (c ChannelParameters) shown() ChannelParameters {
	r := c
	r.HasSecret = c.Secret != ""
	r.Secret = ""
	if c.Headers != nil {
		r.Headers = make(map[string]string, len(c.Headers))
		for k, v := range c.Headers {
			if SensitiveHeader(k) {
				v = Masked
			}
			r.Headers[k] = v
		}
	}
	return r
}

// Replaced returns next, the parameters that replace c in an update,
// keeping what a client cannot send back: the secret when next names none
// (secretGiven false) and keeps the channel type, and the stored value of a
// header sent back as "***" (as responses show credentials).
func (c ChannelParameters) Replaced(next ChannelParameters, secretGiven bool) ChannelParameters {
	if !secretGiven && next.Type == c.Type {
		next.Secret = c.Secret
	}
	for k, v := range next.Headers {
		if v == Masked {
			if ov, ok := c.Headers[k]; ok {
				next.Headers[k] = ov
			}
		}
	}
	next.HasSecret = next.Secret != ""
	return next
}

// Masked stands for a value that is not shown.
const Masked = "***"

// SensitiveHeader reports whether a header's value is likely a credential.
func SensitiveHeader(name string) bool {
	n := strings.ToLower(name)
	for _, s := range []string{"authorization", "token", "key", "secret", "password", "cookie", "signature", "credential", "auth"} {
		if strings.Contains(n, s) {
			return true
		}
	}
	return false
}

// RedactURL hides a URL's password and query values, and with pathToo its
// path as well.
func RedactURL(s string, pathToo bool) string {
	u, err := url.Parse(s)
	if err != nil || s == "" {
		return s
	}
	if u.User != nil {
		u.User = url.User(u.User.Username())
	}
	if u.RawQuery != "" {
		q := u.Query()
		for k := range q {
			q[k] = []string{Masked}
		}
		u.RawQuery = q.Encode()
	}
	if pathToo && (u.Path != "" && u.Path != "/" || u.RawQuery != "" || u.Fragment != "") {
		u.Path, u.RawPath, u.RawQuery, u.Fragment = "/"+Masked, "", "", ""
	}
	return strings.Replace(u.String(), "%2A%2A%2A", Masked, -1)
}

// NotificationTemplate is the text of a notification: Go text/template over
// NotificationData.
type NotificationTemplate struct {
	Subject string `json:"subject"`
	Body    string `json:"body"`
}

// NotificationRule sends a rule's alert openings and closings (and, with
// IntervalSeconds, reminders while open) to one channel.
type NotificationRule struct {
	ID                   string               `json:"id" codec:"uuid"`
	AlertRuleID          string               `json:"alert_rule_id" codec:"uuid"`
	ChannelParameters    ChannelParameters    `json:"channel_parameters"`
	IntervalSeconds      int64                `json:"interval_seconds"`
	NotificationTemplate NotificationTemplate `json:"notification_template"`
	Timezone             string               `json:"timezone"`
	CreatedAt            time.Time            `json:"created_at"`
	UpdatedAt            time.Time            `json:"updated_at"`
}

// ShownTo returns the rule as someone of the role sees it
// (ChannelParameters.ShownTo).
func (n *NotificationRule) ShownTo(role Role) *NotificationRule {
	r := *n
	r.ChannelParameters = n.ChannelParameters.ShownTo(role)
	return &r
}

// NotificationRuleUpdate is a partial update (S4): nil fields stay.
// SecretGiven says whether ChannelParameters named a secret at all: one left
// out keeps the stored secret when the channel type stays the same.
type NotificationRuleUpdate struct {
	ChannelParameters    *ChannelParameters
	SecretGiven          bool
	IntervalSeconds      *int64
	NotificationTemplate *NotificationTemplate
	Timezone             *string
}

// Apply merges u into n.
func (n *NotificationRule) Apply(u NotificationRuleUpdate) {
	if c := u.ChannelParameters; c != nil {
		n.ChannelParameters = n.ChannelParameters.Replaced(*c, u.SecretGiven)
	}
	if u.IntervalSeconds != nil {
		n.IntervalSeconds = *u.IntervalSeconds
	}
	if u.NotificationTemplate != nil {
		n.NotificationTemplate = *u.NotificationTemplate
	}
	if u.Timezone != nil {
		n.Timezone = *u.Timezone
	}
}

// Notification events: what happened to the alert.
const (
	EventOpened = "opened"
	EventClosed = "closed"
	EventRepeat = "repeat"
)

// Delivery statuses.
const (
	DeliveryPending   = "pending"
	DeliveryDelivered = "delivered"
	DeliveryDead      = "dead"      // gave up after the last attempt
	DeliveryCancelled = "cancelled" // a reminder for an alert that closed
)

// Delivery is one notification in the outbox: an event of an alert for one
// notification rule, with every attempt to deliver it.
type Delivery struct {
	ID                 int64             `json:"id"`
	AlertID            string            `json:"alert_id" codec:"uuid"`
	NotificationRuleID string            `json:"notification_rule_id" codec:"uuid"`
	Event              string            `json:"event"`
	Status             string            `json:"status"`
	DueAt              time.Time         `json:"due_at"`
	CreatedAt          time.Time         `json:"created_at"`
	DeliveredAt        *time.Time        `json:"delivered_at"`
	Attempts           []DeliveryAttempt `json:"attempts"`

	// Filled in for the worker that delivers it.
	Tenant       string            `json:"-"`
	AttemptCount int               `json:"-"`
	Alert        *Alert            `json:"-"`
	Rule         *AlertRule        `json:"-"`
	Notification *NotificationRule `json:"-"`
	// Rollout, instead of Alert and Rule, is the rollout event of a
	// rollout notification rule (whose channel, template and time zone
	// Notification carries).
	Rollout *RolloutEvent `json:"-"`
}

// DeliveryFilter selects notifications: an alert's (AlertID), oldest
// first, or a notification rule's (AlertRuleID and NotificationRuleID),
// newest first, since its latest attempts are the ones to look at.
type DeliveryFilter struct {
	AlertID                         string
	AlertRuleID, NotificationRuleID string
	Page
}

// DeliveryAttempt is one try to deliver a notification.
type DeliveryAttempt struct {
	At         time.Time `json:"at"`
	StatusCode int       `json:"status_code,omitempty"` // HTTP channels
	Error      string    `json:"error,omitempty"`
	DurationMS int64     `json:"duration_ms"`
}

// AlertService manages alert rules, their notification rules, and reads the
// alerts they raise.
type AlertService interface {
	AlertStore
	// CompileRule checks and compiles r's condition and metadata filters
	// into Compiled and Filters; problems are keyed by field (ReadRule).
	CompileRule(r *AlertRule) map[string]string
}

// AlertStore is what AlertService keeps: rules, notification rules, alerts
// and deliveries. The store implements it; the alert service adds the
// compiler and evaluation.
type AlertStore interface {
	// CreateAlertRule stores a compiled rule and starts evaluating it. A
	// name taken in the tenant is ECONFLICT.
	CreateAlertRule(ctx context.Context, tenant string, r *AlertRule) error
	FindAlertRule(ctx context.Context, tenant, id string) (*AlertRule, error)
	FindAlertRules(ctx context.Context, tenant string, p Page) ([]*AlertRule, int, error)
	// UpdateAlertRule replaces every field of rule id with r's, but its
	// stream, which cannot change (EINVALID). Devices keep their phases and
	// open alerts, which their next points move by the new rule.
	UpdateAlertRule(ctx context.Context, tenant, id string, r *AlertRule) error
	// DeleteAlertRule removes a rule with its notification rules, alerts
	// and pending notifications.
	DeleteAlertRule(ctx context.Context, tenant, id string) error

	CreateNotificationRule(ctx context.Context, tenant string, n *NotificationRule) error
	// UpdateNotificationRule applies u to the notification rule id of alert
	// rule ruleID; a pair that does not match is ENOTFOUND.
	UpdateNotificationRule(ctx context.Context, tenant, ruleID, id string, u NotificationRuleUpdate) (*NotificationRule, error)
	FindNotificationRules(ctx context.Context, tenant, ruleID string, p Page) ([]*NotificationRule, int, error)
	DeleteNotificationRule(ctx context.Context, tenant, ruleID, id string) error

	FindAlerts(ctx context.Context, tenant string, f AlertFilter) ([]*Alert, int, error)
	FindAlert(ctx context.Context, tenant, id string) (*Alert, error)
	// FindNotificationRule reads notification rule id of alert rule
	// ruleID, its secret included: callers show it with ShownTo.
	FindNotificationRule(ctx context.Context, tenant, ruleID, id string) (*NotificationRule, error)
	// FindDeliveries lists the notifications f selects with their
	// attempts; an alert or notification rule of another tenant is
	// ENOTFOUND.
	FindDeliveries(ctx context.Context, tenant string, f DeliveryFilter) ([]*Delivery, int, error)
}

// NotificationData is what a notification template sees: {{.Event}},
// {{.Rule.Name}}, {{.Alert.DeviceID}}, {{.Alert.StartedAt}}, {{.Value.temp}}…
// Times are in the notification rule's timezone.
type NotificationData struct {
	Event    string         // opened, closed or repeat
	Alert    Alert          // Alert.EndedAt is nil while it is active
	Rule     AlertRule      // ID, Name, Group, Stream, thresholds
	Value    map[string]any // the data of the point that opened the alert; empty for none
	Timezone string
	Now      time.Time
}

// DefaultNotificationTemplate is used for a notification rule without one,
// and for a subject or body left empty.
var DefaultNotificationTemplate = NotificationTemplate{
	Subject: `[fleetd] {{.Rule.Name}} {{.Event}} on {{.Alert.DeviceID}}`,
	Body: `Alert "{{.Rule.Name}}" {{.Event}} for device {{.Alert.DeviceID}} on stream {{.Alert.Stream}}.
Started: {{.Alert.StartedAt.Format "2006-01-02 15:04:05 MST"}}{{with .Alert.EndedAt}}
Ended: {{.Format "2006-01-02 15:04:05 MST"}}{{end}}{{if .Value}}
Value: {{range $k, $v := .Value}}{{$k}}={{$v}} {{end}}{{end}}`,
}

// MaxTemplateLen bounds a subject or body template.
const MaxTemplateLen = 16 << 10

// NewNotificationData builds the template data of an event, with every time
// in the location loc.
func NewNotificationData(event string, a *Alert, r *AlertRule, loc *time.Location, now time.Time) NotificationData {
	d := NotificationData{Event: event, Alert: *a, Rule: *r, Value: map[string]any{}, Timezone: loc.String(), Now: now.In(loc)}
	d.Alert.StartedAt = a.StartedAt.In(loc)
	if a.EndedAt != nil {
		t := a.EndedAt.In(loc)
		d.Alert.EndedAt = &t
	}
	if a.Value != nil {
		v := *a.Value
		v.Timestamp, v.ReceivedAt = v.Timestamp.In(loc), v.ReceivedAt.In(loc)
		d.Alert.Value = &v
		if v.Data != nil {
			d.Value = v.Data
		}
	}
	return d
}

// RenderNotification renders a notification's subject and body, each
// within lim (ErrTemplateBudget when over it).
func RenderNotification(ctx context.Context, lim TemplateLimits, t NotificationTemplate, d NotificationData) (subject, body string, err error) {
	return renderNotification(ctx, lim, t, DefaultNotificationTemplate, d)
}

// renderNotification renders t's subject and body over d; an empty one is
// def's.
func renderNotification(ctx context.Context, lim TemplateLimits, t, def NotificationTemplate, d any) (subject, body string, err error) {
	if t.Subject == "" {
		t.Subject = def.Subject
	}
	if t.Body == "" {
		t.Body = def.Body
	}
	if subject, err = render(ctx, lim, "subject", t.Subject, d); err != nil {
		return "", "", fmt.Errorf("subject: %w", err)
	}
	if body, err = render(ctx, lim, "body", t.Body, d); err != nil {
		return "", "", fmt.Errorf("body: %w", err)
	}
	return subject, body, nil
}

// templateProblem is what a client is told of a template that fails on a
// sample.
func templateProblem(lim TemplateLimits, err error) string {
	if errors.Is(err, ErrTemplateBudget) {
		lim = lim.WithDefaults()
		return fmt.Sprintf("must render within %v and %d bytes (a loop over a large range cannot): %v", lim.Timeout, lim.MaxOutput, err)
	}
	return "is not a usable Go text/template: " + err.Error()
}

// CheckNotificationTemplate parses a template and renders it for a sample
// alert within lim, so that a rule with a template that cannot work is
// refused when it is saved. Problems are keyed
// "notification_template.subject" and "notification_template.body".
func CheckNotificationTemplate(ctx context.Context, lim TemplateLimits, t NotificationTemplate) map[string]string {
	errs := map[string]string{}
	end := time.Date(2026, 1, 2, 3, 5, 0, 0, time.UTC)
	a := &Alert{ID: "00000000-0000-0000-0000-000000000000", RuleID: "00000000-0000-0000-0000-000000000000", RuleName: "sample",
		DeviceID: "device-1", Stream: "telemetry", State: AlertEnded, StartedAt: end.Add(-time.Minute), EndedAt: &end,
		Value: &DataPoint{DeviceID: "device-1", Stream: "telemetry", Timestamp: end, Data: map[string]any{"temperature": int64(81)}}}
	r := &AlertRule{ID: a.RuleID, Name: "sample", Stream: "telemetry"}
	d := NewNotificationData(EventOpened, a, r, time.UTC, end)
	for name, text := range map[string]string{"subject": t.Subject, "body": t.Body} {
		if len(text) > MaxTemplateLen {
			errs["notification_template."+name] = "must be at most 16 KiB"
			continue
		}
		if text == "" {
			continue
		}
		if _, err := render(ctx, lim, name, text, d); err != nil {
			errs["notification_template."+name] = templateProblem(lim, err)
		}
	}
	return errs
}
