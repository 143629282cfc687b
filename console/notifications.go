package console

import (
	"net/http"
	"sort"
	"strconv"
	"strings"

	"github.com/fleetd/fleet"
	"github.com/google/uuid"
)

// notificationData is a notification rule's page: the rule as the role
// sees it (never its secret) and its deliveries, newest first, with every
// attempt.
type notificationData struct {
	Rule         *fleet.AlertRule
	Notification *fleet.NotificationRule
	Deliveries   []*fleet.Delivery
	Pager        pager
}

// findNotification reads the alert rule and the notification rule of the
// path's ids, the latter as role sees it.
func (c *Console) findNotification(r *http.Request, v *view) (*fleet.AlertRule, *fleet.NotificationRule, error) {
	rule, err := c.findRule(r, v.Actor.Tenant)
	if err != nil {
		return nil, nil, err
	}
	id, err := uuid.Parse(r.PathValue("nid"))
	if err != nil {
		return nil, nil, fleet.Errorf(fleet.ENOTFOUND, "alert rule %s has no notification rule %s", rule.ID, r.PathValue("nid"))
	}
	n, err := c.Alerts.FindNotificationRule(r.Context(), v.Actor.Tenant, rule.ID, id.String())
	if err != nil {
		return nil, nil, err
	}
	return rule, n.ShownTo(v.Actor.Role), nil
}

func (c *Console) handleNotification(w http.ResponseWriter, r *http.Request, v *view) error {
	p, err := readPage(r)
	if err != nil {
		return err
	}
	rule, n, err := c.findNotification(r, v)
	if err != nil {
		return err
	}
	ds, count, err := c.Alerts.FindDeliveries(r.Context(), v.Actor.Tenant, fleet.DeliveryFilter{AlertRuleID: rule.ID, NotificationRuleID: n.ID, Page: p})
	if err != nil {
		return err
	}
	v.Title, v.Nav = "Notification rule of "+rule.Name, "alerts"
	v.Data = notificationData{Rule: rule, Notification: n, Deliveries: ds, Pager: newPager(r, p, count)}
	c.render(w, r, http.StatusOK, "notification", v)
	return nil
}

// notificationForm is the notification editor's fields, as typed. The
// secret is never filled in: left empty, the stored one stays.
type notificationForm struct {
	RuleID, ID              string
	Type, URL, To, Headers  string
	Secret                  string
	HasSecret, ClearSecret  bool
	Interval                string
	Subject, Body, Timezone string
}

// notificationFormOf fills the editor with a saved rule as the role sees
// it: header values that look like credentials are *** and, sent back so,
// keep their stored values, as S4 does.
func notificationFormOf(n *fleet.NotificationRule) notificationForm {
	ch := n.ChannelParameters
	f := notificationForm{RuleID: n.AlertRuleID, ID: n.ID, Type: ch.Type, URL: ch.URL, To: strings.Join(ch.To, "\n"), HasSecret: ch.HasSecret,
		Interval: strconv.FormatInt(n.IntervalSeconds, 10), Subject: n.NotificationTemplate.Subject, Body: n.NotificationTemplate.Body, Timezone: n.Timezone}
	names := make([]string, 0, len(ch.Headers))
	for k := range ch.Headers {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		f.Headers += k + ": " + ch.Headers[k] + "\n"
	}
	return f
}

// readNotificationForm reads the editor, whose fields are named by their
// paths in the API's body, as its problems are.
func readNotificationForm(r *http.Request, ruleID, id string) notificationForm {
	p := r.PostForm
	get := func(k string) string { return strings.TrimSpace(p.Get(k)) }
	return notificationForm{RuleID: ruleID, ID: id, Type: get("channel_parameters.type"), URL: get("channel_parameters.url"),
		To: get("channel_parameters.to"), Headers: get("channel_parameters.headers"), Secret: p.Get("channel_parameters.secret"),
		ClearSecret: p.Get("clear_secret") == "on", Interval: get("interval_seconds"),
		Subject: p.Get("notification_template.subject"), Body: p.Get("notification_template.body"), Timezone: get("timezone")}
}

// body is the form as the API's body of S3 (and S4, which takes the same
// fields), with what cannot be put in it (a header line without a colon)
// as problems by the API's field names.
func (f notificationForm) body() (map[string]any, map[string]string) {
	bad := map[string]string{}
	ch := map[string]any{}
	if f.Type != "" {
		ch["type"] = f.Type
	}
	switch f.Type {
	case fleet.ChannelWebhook, fleet.ChannelSlack:
		if f.URL != "" {
			ch["url"] = f.URL
		}
	case fleet.ChannelEmail:
		to := []any{}
		for _, a := range strings.FieldsFunc(f.To, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\r' || r == '\t' }) {
			to = append(to, a)
		}
		ch["to"] = to
	}
	if f.Type == fleet.ChannelWebhook {
		headers := map[string]any{}
		for _, line := range strings.Split(f.Headers, "\n") {
			if line = strings.TrimSpace(line); line == "" {
				continue
			}
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				bad["channel_parameters.headers"] = "must be one header a line, as Name: value"
				continue
			}
			headers[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
		if len(headers) > 0 {
			ch["headers"] = headers
		}
		switch {
		case f.Secret != "":
			ch["secret"] = f.Secret
		case f.ClearSecret:
			ch["secret"] = ""
		}
	}
	body := map[string]any{"channel_parameters": ch}
	if f.Interval != "" {
		body["interval_seconds"] = formNumber(f.Interval)
	}
	if f.Subject != "" || f.Body != "" {
		body["notification_template"] = map[string]any{"subject": f.Subject, "body": f.Body}
	}
	if f.Timezone != "" {
		body["timezone"] = f.Timezone
	}
	return body, bad
}

// sameChannel reports whether f's channel is shown's, as shown, with no
// new secret.
func (f notificationForm) sameChannel(shown notificationForm) bool {
	norm := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	return f.Type == shown.Type && f.URL == shown.URL && norm(f.To) == norm(shown.To) && norm(f.Headers) == norm(shown.Headers) &&
		f.Secret == "" && !f.ClearSecret
}

// notificationFormData is the notification editor's.
type notificationFormData struct {
	Rule *fleet.AlertRule
	Form notificationForm
}

func (c *Console) handleNewNotification(w http.ResponseWriter, r *http.Request, v *view) error {
	rule, err := c.findRule(r, v.Actor.Tenant)
	if err != nil {
		return err
	}
	f := notificationForm{RuleID: rule.ID, Type: fleet.ChannelWebhook, Interval: "0", Timezone: "UTC"}
	v.Title, v.Nav, v.Data = "New notification rule of "+rule.Name, "alerts", notificationFormData{Rule: rule, Form: f}
	c.render(w, r, http.StatusOK, "notificationform", v)
	return nil
}

func (c *Console) handleEditNotification(w http.ResponseWriter, r *http.Request, v *view) error {
	rule, n, err := c.findNotification(r, v)
	if err != nil {
		return err
	}
	v.Title, v.Nav, v.Data = "Edit notification rule of "+rule.Name, "alerts", notificationFormData{Rule: rule, Form: notificationFormOf(n)}
	c.render(w, r, http.StatusOK, "notificationform", v)
	return nil
}

// handleSaveNotification creates a notification rule (no nid in the path)
// or saves an edit, read by the API's readers (fleet.ReadNotificationRule,
// fleet.ReadNotificationRuleUpdate). A refused form shows again as typed,
// but for the secret, with the API's messages beside the fields.
func (c *Console) handleSaveNotification(w http.ResponseWriter, r *http.Request, v *view) error {
	ctx, tenant := r.Context(), v.Actor.Tenant
	var rule *fleet.AlertRule
	var old *fleet.NotificationRule
	var err error
	if r.PathValue("nid") != "" {
		rule, old, err = c.findNotification(r, v)
		v.Title = "Edit notification rule of "
	} else {
		rule, err = c.findRule(r, tenant)
		v.Title = "New notification rule of "
	}
	if err != nil {
		return err
	}
	v.Title, v.Nav = v.Title+rule.Name, "alerts"
	f := readNotificationForm(r, rule.ID, "")
	body, bad := f.body()
	if old != nil {
		// A channel as it was shown is kept as stored: what the page
		// hides of a URL (a Slack path, query values) cannot come back.
		shown := notificationFormOf(old)
		switch {
		case f.sameChannel(shown):
			delete(body, "channel_parameters")
		case f.URL == shown.URL && strings.Contains(f.URL, fleet.Masked):
			bad["channel_parameters.url"] = "type the whole URL again: its hidden parts (" + fleet.Masked + ") are not shown"
		}
	}
	fields := fleet.NewFields(body)
	for k, p := range bad {
		fields.Fail(k, p)
	}
	var saved *fleet.NotificationRule
	if old == nil {
		saved = fleet.ReadNotificationRule(ctx, fields, c.Templates)
		if err = fields.Err(); err == nil {
			saved.AlertRuleID = rule.ID
			err = c.Alerts.CreateNotificationRule(ctx, tenant, saved)
		}
	} else {
		f.ID, f.HasSecret = old.ID, old.ChannelParameters.HasSecret
		u := fleet.ReadNotificationRuleUpdate(ctx, fields, c.Templates)
		if err = fields.Err(); err == nil {
			saved, err = c.Alerts.UpdateNotificationRule(ctx, tenant, rule.ID, old.ID, u)
		}
	}
	if fleet.ErrorCode(err) == fleet.EINVALID {
		f.Secret = "" // never sent back to the browser
		v.Error, v.Fields, v.Data = fleet.ErrorMessage(err), fieldsOf(err), notificationFormData{Rule: rule, Form: f}
		c.render(w, r, http.StatusBadRequest, "notificationform", v)
		return nil
	} else if err != nil {
		return err
	}
	http.Redirect(w, r, "/console/alerts/rules/"+rule.ID+"/notifications/"+saved.ID, http.StatusSeeOther)
	return nil
}

// handleDeleteNotification deletes a notification rule and its pending
// notifications, as S4's DELETE does.
func (c *Console) handleDeleteNotification(w http.ResponseWriter, r *http.Request, v *view) error {
	rule, n, err := c.findNotification(r, v)
	if err != nil {
		return err
	}
	if err := c.Alerts.DeleteNotificationRule(r.Context(), v.Actor.Tenant, rule.ID, n.ID); err != nil {
		return err
	}
	http.Redirect(w, r, "/console/alerts/rules/"+rule.ID, http.StatusSeeOther)
	return nil
}
