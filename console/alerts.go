package console

import (
	"encoding/json"
	"net/http"
	"sort"
	"strconv"
	"strings"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/codec"
	"github.com/google/uuid"
)

// alertsData is the alerts page's: alert sessions, filtered as GET
// /api/v1/alerts filters them.
type alertsData struct {
	State, DeviceID, RuleID string
	Rule                    *fleet.AlertRule // the rule filtered on
	Alerts                  []*fleet.Alert
	Pager                   pager
}

func (c *Console) handleAlerts(w http.ResponseWriter, r *http.Request, v *view) error {
	ctx, tenant := r.Context(), v.Actor.Tenant
	p, err := readPage(r)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	d := alertsData{State: q.Get("state"), DeviceID: strings.TrimSpace(q.Get("device_id")), RuleID: q.Get("rule_id")}
	problems := map[string]string{}
	if d.State != "" && d.State != fleet.AlertActive && d.State != fleet.AlertEnded {
		problems["state"] = "must be one of active, ended"
	}
	if d.DeviceID != "" && !fleet.ValidDeviceID(d.DeviceID) {
		problems["device_id"] = fleet.DeviceIDRule
	}
	if d.RuleID != "" {
		if u, err := uuid.Parse(d.RuleID); err != nil {
			problems["rule_id"] = "must be a UUID"
		} else {
			d.RuleID = u.String()
		}
	}
	if len(problems) > 0 {
		return fleet.FieldErrors(problems)
	}
	if d.RuleID != "" {
		if d.Rule, err = c.Alerts.FindAlertRule(ctx, tenant, d.RuleID); err != nil {
			return err
		}
	}
	alerts, n, err := c.Alerts.FindAlerts(ctx, tenant, fleet.AlertFilter{State: d.State, RuleID: d.RuleID, DeviceID: d.DeviceID, Page: p})
	if err != nil {
		return err
	}
	d.Alerts, d.Pager = alerts, newPager(r, p, n)
	v.Title, v.Nav, v.Data = "Alerts", "alerts", d
	c.render(w, r, http.StatusOK, "alerts", v)
	return nil
}

// alertRulesData is the rules list's.
type alertRulesData struct {
	Rules []*fleet.AlertRule
	Pager pager
}

func (c *Console) handleAlertRules(w http.ResponseWriter, r *http.Request, v *view) error {
	p, err := readPage(r)
	if err != nil {
		return err
	}
	rules, n, err := c.Alerts.FindAlertRules(r.Context(), v.Actor.Tenant, p)
	if err != nil {
		return err
	}
	v.Title, v.Nav, v.Data = "Alert rules", "alerts", alertRulesData{Rules: rules, Pager: newPager(r, p, n)}
	c.render(w, r, http.StatusOK, "alertrules", v)
	return nil
}

// alertRuleData is a rule's page: the rule, its latest alerts, and its
// notification rules as the role sees them, a page at a time.
type alertRuleData struct {
	Rule          *fleet.AlertRule
	Alerts        []*fleet.Alert
	AlertsN       int
	Notifications []*fleet.NotificationRule
	Pager         pager
}

// ruleAlerts is how many of a rule's latest alerts its page shows; the
// alerts page lists them all.
const ruleAlerts = 10

func (c *Console) handleAlertRule(w http.ResponseWriter, r *http.Request, v *view) error {
	ctx, tenant := r.Context(), v.Actor.Tenant
	p, err := readPage(r)
	if err != nil {
		return err
	}
	rule, err := c.findRule(r, tenant)
	if err != nil {
		return err
	}
	d := alertRuleData{Rule: rule}
	if d.Alerts, d.AlertsN, err = c.Alerts.FindAlerts(ctx, tenant, fleet.AlertFilter{RuleID: rule.ID, Page: fleet.Page{Page: 1, Limit: ruleAlerts}}); err != nil {
		return err
	}
	ns, n, err := c.Alerts.FindNotificationRules(ctx, tenant, rule.ID, p)
	if err != nil {
		return err
	}
	for _, x := range ns {
		d.Notifications = append(d.Notifications, x.ShownTo(v.Actor.Role))
	}
	d.Pager = newPager(r, p, n)
	v.Title, v.Nav, v.Data = "Alert rule "+rule.Name, "alerts", d
	c.render(w, r, http.StatusOK, "alertrule", v)
	return nil
}

// findRule reads the rule of the path's id; an id that is not a UUID names
// no rule.
func (c *Console) findRule(r *http.Request, tenant string) (*fleet.AlertRule, error) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		return nil, fleet.Errorf(fleet.ENOTFOUND, "alert rule %s not found", r.PathValue("id"))
	}
	return c.Alerts.FindAlertRule(r.Context(), tenant, id.String())
}

// ruleForm is the rule editor's fields, as typed.
type ruleForm struct {
	ID                         string // empty for a new rule
	Name, Stream, Group        string
	DeviceGroup                string
	Condition, MetadataFilters string // JSON
	Activation, Deactivation   string // seconds
}

// ruleFormOf fills the editor with a saved rule.
func ruleFormOf(r *fleet.AlertRule) ruleForm {
	f := ruleForm{ID: r.ID, Name: r.Name, Stream: r.Stream, Group: r.Group, DeviceGroup: r.DeviceGroup, Condition: jsonText(r.Condition),
		Activation:   strconv.FormatFloat(r.ActivationThresholdSeconds, 'f', -1, 64),
		Deactivation: strconv.FormatFloat(r.DeactivationThresholdSeconds, 'f', -1, 64)}
	if len(r.MetadataFilters) > 0 {
		f.MetadataFilters = jsonText(r.MetadataFilters)
	}
	return f
}

// jsonText is v as indented JSON, for a person to edit.
func jsonText(v any) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // html/template escapes the page
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return ""
	}
	return strings.TrimSuffix(b.String(), "\n")
}

func readRuleForm(r *http.Request, id string) ruleForm {
	p := r.PostForm
	get := func(k string) string { return strings.TrimSpace(p.Get(k)) }
	return ruleForm{ID: id, Name: get("name"), Stream: get("stream"), Group: get("group"), DeviceGroup: get("device_group"),
		Condition: get("condition"), MetadataFilters: get("metadata_filters"),
		Activation: get("activation_threshold_seconds"), Deactivation: get("deactivation_threshold_seconds")}
}

// rule reads the form as the API reads S2's body (fleet.ReadRule): the
// same rules, the same messages, by the same field names. A field left
// empty is a field not sent.
func (f ruleForm) rule(compile func(*fleet.AlertRule) map[string]string) (*fleet.AlertRule, error) {
	body := map[string]any{}
	bad := map[string]string{}
	for k, s := range map[string]string{"name": f.Name, "stream": f.Stream, "group": f.Group, "device_group": f.DeviceGroup} {
		if s != "" {
			body[k] = s
		}
	}
	for k, s := range map[string]string{"condition": f.Condition, "metadata_filters": f.MetadataFilters} {
		if s == "" {
			continue
		}
		v, err := codec.Decode(codec.JSON, []byte(s))
		if err != nil {
			bad[k] = "must be JSON: " + fleet.ErrorMessage(err)
			continue
		}
		body[k] = v
	}
	for k, s := range map[string]string{"activation_threshold_seconds": f.Activation, "deactivation_threshold_seconds": f.Deactivation} {
		if s != "" {
			body[k] = formNumber(s)
		}
	}
	fields := fleet.NewFields(body)
	for k, p := range bad {
		fields.Fail(k, p)
	}
	rule := fleet.ReadRule(fields, compile)
	return rule, fields.Err()
}

// formNumber is a form field as the API would decode the number typed, or
// the text itself when it is not one, for validation to refuse by name.
func formNumber(s string) any {
	if _, err := strconv.ParseFloat(s, 64); err == nil {
		if v, err := codec.Decode(codec.JSON, []byte(s)); err == nil {
			return v
		}
	}
	return s
}

// ruleFormData is the rule editor's.
type ruleFormData struct {
	Form ruleForm
}

func (c *Console) handleNewAlertRule(w http.ResponseWriter, r *http.Request, v *view) error {
	v.Title, v.Nav, v.Data = "New alert rule", "alerts", ruleFormData{Form: ruleForm{Activation: "0", Deactivation: "0"}}
	c.render(w, r, http.StatusOK, "ruleform", v)
	return nil
}

func (c *Console) handleEditAlertRule(w http.ResponseWriter, r *http.Request, v *view) error {
	rule, err := c.findRule(r, v.Actor.Tenant)
	if err != nil {
		return err
	}
	v.Title, v.Nav, v.Data = "Edit alert rule "+rule.Name, "alerts", ruleFormData{Form: ruleFormOf(rule)}
	c.render(w, r, http.StatusOK, "ruleform", v)
	return nil
}

// handleSaveAlertRule creates a rule (no id in the path) or saves an edit.
// A rule the API would refuse shows the form again as typed, with the
// API's message beside each field.
func (c *Console) handleSaveAlertRule(w http.ResponseWriter, r *http.Request, v *view) error {
	ctx, tenant := r.Context(), v.Actor.Tenant
	id := ""
	v.Title, v.Nav = "New alert rule", "alerts"
	if r.PathValue("id") != "" {
		old, err := c.findRule(r, tenant)
		if err != nil {
			return err
		}
		id, v.Title = old.ID, "Edit alert rule "+old.Name
	}
	f := readRuleForm(r, id)
	rule, err := f.rule(c.Alerts.CompileRule)
	if err == nil {
		if id == "" {
			err = c.Alerts.CreateAlertRule(ctx, tenant, rule)
		} else {
			err = c.Alerts.UpdateAlertRule(ctx, tenant, id, rule)
		}
	}
	switch fleet.ErrorCode(err) {
	case "":
		http.Redirect(w, r, "/console/alerts/rules/"+rule.ID, http.StatusSeeOther)
		return nil
	case fleet.EINVALID, fleet.ECONFLICT:
		status := http.StatusBadRequest
		if fleet.ErrorCode(err) == fleet.ECONFLICT {
			status = http.StatusConflict
		}
		v.Error, v.Fields, v.Data = fleet.ErrorMessage(err), fieldsOf(err), ruleFormData{Form: f}
		c.render(w, r, status, "ruleform", v)
		return nil
	}
	return err
}

// handleDeleteAlertRule deletes a rule with its alerts and notification
// rules, as DELETE /api/v1/alert-rules/{id} does.
func (c *Console) handleDeleteAlertRule(w http.ResponseWriter, r *http.Request, v *view) error {
	rule, err := c.findRule(r, v.Actor.Tenant)
	if err != nil {
		return err
	}
	if err := c.Alerts.DeleteAlertRule(r.Context(), v.Actor.Tenant, rule.ID); err != nil {
		return err
	}
	http.Redirect(w, r, "/console/alerts/rules", http.StatusSeeOther)
	return nil
}

// problem is one field's problem, for the form that shows it beside the
// field.
type problem struct{ Field, Message string }

// problemsOf returns the problems of field and of the fields inside it
// (condition.all[1].operator is condition's), sorted by field.
func problemsOf(fields map[string]string, field string) []problem {
	var out []problem
	for k, m := range fields {
		if k == field || strings.HasPrefix(k, field+".") || strings.HasPrefix(k, field+"[") {
			out = append(out, problem{k, m})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Field < out[j].Field })
	return out
}

// formField is one input of a form with its help and its problems.
type formField struct {
	Name, Label, Value string
	Fields             map[string]string // the problems of the whole form
	Help               string
}

func fieldOf(name, label, value string, fields map[string]string, help string) formField {
	return formField{name, label, value, fields, help}
}
