package ctl

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

var (
	alertRuleCols = cols("ID", "id", "NAME", "name", "STREAM", "stream", "GROUP", "group", "CONDITION", "condition",
		"FILTERS", "metadata_filters", "ACTIVATE S", "activation_threshold_seconds", "DEACTIVATE S", "deactivation_threshold_seconds")
	notificationRuleCols = cols("ID", "id", "CHANNEL", "channel_parameters.type", "URL", "channel_parameters.url", "TO", "channel_parameters.to",
		"INTERVAL S", "interval_seconds", "TIMEZONE", "timezone", "UPDATED", "updated_at")
	rolloutRuleCols = cols("ID", "id", "CHANNEL", "channel_parameters.type", "URL", "channel_parameters.url", "TO", "channel_parameters.to",
		"EVENTS", "events", "TIMEZONE", "timezone", "UPDATED", "updated_at")
	alertCols = cols("ID", "id", "RULE", "rule_name", "DEVICE", "device_id", "STATE", "state", "STARTED", "started_at", "ENDED", "ended_at",
		"VALUE", "value.data")
	deliveryCols = cols("ID", "id", "EVENT", "event", "STATUS", "status", "DUE", "due_at", "DELIVERED", "delivered_at", "ATTEMPTS", "attempts")
)

// body is a request body from a JSON or YAML file, with the fields the
// flags set laid over it.
type body struct {
	file   string
	fields map[string]any
}

func (b *body) fileFlag(c *cobra.Command, what string) {
	c.Flags().StringVarP(&b.file, "file", "f", "", "JSON or YAML `FILE` with the "+what+" (- for standard input); flags override its fields")
}

func (b *body) set(k string, v any) {
	if b.fields == nil {
		b.fields = map[string]any{}
	}
	b.fields[k] = v
}

// build reads the file, if any, and lays the flags' fields over it.
func (a *app) build(b *body) (map[string]any, error) {
	m := map[string]any{}
	if b.file != "" {
		v, err := a.readDoc(b.file)
		if err != nil {
			return nil, err
		}
		var ok bool
		if m, ok = v.(map[string]any); !ok {
			return nil, usagef("%s: want an object", b.file)
		}
	}
	for k, v := range b.fields {
		m[k] = v
	}
	return m, nil
}

// channelFlags set channel_parameters, interval, template and timezone of
// alert and rollout notification rules.
type channelFlags struct {
	webhook, slack, secret, timezone, subject, text string
	email, events                                   []string
	headers                                         keyValues
}

func (f *channelFlags) add(c *cobra.Command, rollout bool) {
	fl := c.Flags()
	fl.StringVar(&f.webhook, "webhook", "", "send to this webhook `URL`")
	fl.StringVar(&f.slack, "slack", "", "send to this Slack incoming-webhook `URL`")
	fl.StringSliceVar(&f.email, "email", nil, "send email to these `ADDRESSES`")
	fl.StringVar(&f.secret, "secret", "", "webhook: the `SECRET` that signs each body (X-Fleet-Signature)")
	f.headers = keyValues{}
	fl.Var(f.headers, "header", "webhook: a header NAME=VALUE to send; repeatable")
	fl.StringVar(&f.timezone, "timezone", "", "IANA time `ZONE` of the times in the template (default UTC)")
	fl.StringVar(&f.subject, "subject", "", "the template's subject, a Go text/template")
	fl.StringVar(&f.text, "body", "", "the template's body, a Go text/template")
	if rollout {
		fl.StringSliceVar(&f.events, "events", nil, "the events to send, of phase_triggered, paused, resumed, completed, aborted (default all)")
	}
}

// apply lays the flags that were given over b.
func (f *channelFlags) apply(b *body) error {
	ch := map[string]any{}
	n := 0
	if f.webhook != "" {
		ch["type"], ch["url"] = "webhook", f.webhook
		n++
	}
	if f.slack != "" {
		ch["type"], ch["url"] = "slack", f.slack
		n++
	}
	if len(f.email) > 0 {
		ch["type"], ch["to"] = "email", f.email
		n++
	}
	if n > 1 {
		return usagef("choose one channel: --webhook, --slack or --email")
	}
	if f.secret != "" {
		ch["secret"] = f.secret
	}
	if len(f.headers) > 0 {
		ch["headers"] = f.headers
	}
	if len(ch) > 0 {
		b.set("channel_parameters", ch)
	}
	if f.timezone != "" {
		b.set("timezone", f.timezone)
	}
	if f.subject != "" || f.text != "" {
		b.set("notification_template", map[string]any{"subject": f.subject, "body": f.text})
	}
	if len(f.events) > 0 {
		b.set("events", f.events)
	}
	return nil
}

func (a *app) alertRulesCmd() *cobra.Command {
	list := a.listCmd("List alert rules, oldest first", "/api/v1/alert-rules", view{items: "alert_rules", cols: alertRuleCols}, nil)

	get := a.idCmd("get ID", "Show an alert rule", a.completeAlertRules, func(cmd *cobra.Command, id string) error {
		return a.get(cmd, "/api/v1/alert-rules/"+esc(id), nil, view{cols: alertRuleCols})
	})
	del := a.idCmd("delete ID", "Delete an alert rule with its notification rules, alerts and pending notifications", a.completeAlertRules,
		func(cmd *cobra.Command, id string) error {
			if err := a.do(cmd, "DELETE", "/api/v1/alert-rules/"+esc(id), nil); err != nil {
				return err
			}
			fmt.Fprintf(a.env.Stdout, "deleted alert rule %s\n", id)
			return nil
		})

	var cb body
	var cf ruleFlags
	create := &cobra.Command{
		Use:   "create (-f FILE | --name NAME --stream STREAM --condition JSON) [flags]",
		Short: "Create an alert rule (S2) from a file or flags",
		Long: `Creates an alert rule from a JSON or YAML file in the shape of POST
/api/v1/alert-rules, or from flags, or both (flags override the file).
The condition is JSON: {"field": "temperature", "operator": ">", "value": 80}
(with "aggregate": "avg", "window_seconds": 300 for a window's average, min or
max), {"all": [...]}, {"any": [...]}, {"not": {...}} or {"no_data_seconds": 300}.`,
		Example: `  fleetctl alert-rules create --name overheating --stream telemetry \
    --condition '{"field": "temperature", "operator": ">", "value": 80}' --activation 30s`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := a.alertRuleBody(&cb, &cf)
			if err != nil {
				return err
			}
			return a.show(cmd, request{method: "POST", path: "/api/v1/alert-rules", body: m}, view{cols: alertRuleCols})
		},
	}
	cb.fileFlag(create, "rule")
	cf.add(create, true)

	var eb body
	var ef ruleFlags
	edit := a.idCmd("edit ID [-f FILE] [flags]", "Change an alert rule's name, condition, filters, thresholds or group; what is not given stays",
		a.completeAlertRules, func(cmd *cobra.Command, id string) error {
			change, err := a.alertRuleBody(&eb, &ef)
			if err != nil {
				return err
			}
			if len(change) == 0 {
				return usagef("edit changes nothing without --file or a flag")
			}
			// PUT replaces every field: the rule as it is, with the change.
			c, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			var rule map[string]any
			if err := c.getJSON(cmd.Context(), "/api/v1/alert-rules/"+esc(id), nil, &rule); err != nil {
				return err
			}
			m := map[string]any{}
			for _, k := range alertRuleFields {
				m[k] = rule[k]
			}
			for k, v := range change {
				m[k] = v
			}
			return a.show(cmd, request{method: "PUT", path: "/api/v1/alert-rules/" + esc(id), body: m}, view{cols: alertRuleCols})
		})
	edit.Long = `Changes an alert rule (PUT /api/v1/alert-rules/{id}): the file's fields
and the flags replace the rule's, and the others stay as they are. Its
stream cannot change. Devices keep their open alerts, which their next
points end or keep by the new condition and thresholds.`
	edit.Example = `  fleetctl alert-rules edit "$RULE" --condition '{"field": "temperature", "operator": ">", "value": 90}'
  fleetctl alert-rules edit "$RULE" -f changes.yaml --activation 1m`
	eb.fileFlag(edit, "fields to change")
	ef.add(edit, false)

	c := group("alert-rules", "Alert rules (S2) and their notification rules (S3, S4)",
		list, get, create, edit, del, a.notificationRulesCmd())
	c.Long = `Alert rules watch a stream for a condition (S2); edit changes all but a
rule's stream. Notification rules can be edited too (S4).`
	return c
}

// alertRuleFields are the fields of an alert rule that a client sets.
var alertRuleFields = []string{"name", "stream", "group", "condition", "metadata_filters",
	"activation_threshold_seconds", "deactivation_threshold_seconds"}

// ruleFlags set an alert rule's fields.
type ruleFlags struct {
	name, stream, group, condition, activation, deactivation string
	filters                                                  keyValues
}

// add adds the flags; a rule's stream is given only when it is created.
func (f *ruleFlags) add(c *cobra.Command, create bool) {
	fl := c.Flags()
	fl.StringVar(&f.name, "name", "", "the rule's `NAME`, unique in the tenant")
	if create {
		fl.StringVar(&f.stream, "stream", "", "the `STREAM` it watches")
	}
	fl.StringVar(&f.group, "group", "", "a `LABEL` to group rules by")
	fl.StringVar(&f.condition, "condition", "", "the condition, as `JSON`")
	f.filters = keyValues{}
	fl.Var(f.filters, "metadata-filter", "only devices whose metadata KEY equals VALUE; repeatable")
	fl.StringVar(&f.activation, "activation", "", "how long the condition must hold before an alert opens: seconds or a `DURATION`")
	fl.StringVar(&f.deactivation, "deactivation", "", "how long it must be false before the alert closes: seconds or a `DURATION`")
}

// alertRuleBody builds an alert rule's body from its file and flags.
func (a *app) alertRuleBody(b *body, f *ruleFlags) (map[string]any, error) {
	for k, v := range map[string]string{"name": f.name, "stream": f.stream, "group": f.group} {
		if v != "" {
			b.set(k, v)
		}
	}
	if f.condition != "" {
		var c any
		if err := json.Unmarshal([]byte(f.condition), &c); err != nil {
			return nil, usagef("--condition: want JSON: %v", err)
		}
		b.set("condition", c)
	}
	if len(f.filters) > 0 {
		b.set("metadata_filters", f.filters)
	}
	for k, v := range map[string]string{"activation_threshold_seconds": f.activation, "deactivation_threshold_seconds": f.deactivation} {
		if v != "" {
			s, err := seconds(v)
			if err != nil {
				return nil, usagef("%s: %v", k, err)
			}
			b.set(k, s)
		}
	}
	return a.build(b)
}

func (a *app) notificationRulesCmd() *cobra.Command {
	base := func(rule string) string { return "/api/v1/alert-rules/" + esc(rule) + "/alert-notification-rules" }
	var lp page
	list := a.idCmd("list RULE", "List an alert rule's notification rules; secrets are never shown", a.completeAlertRules,
		func(cmd *cobra.Command, rule string) error {
			return a.get(cmd, base(rule), lp.query(nil), view{items: "alert_notification_rules", cols: notificationRuleCols})
		})
	lp.flags(list)

	var cb body
	var cf channelFlags
	var interval string
	create := a.idCmd("create RULE (-f FILE | --webhook URL | --slack URL | --email ADDRESSES) [flags]",
		"Create a notification rule of an alert rule (S3)", a.completeAlertRules, func(cmd *cobra.Command, rule string) error {
			m, err := a.ruleBody(&cb, &cf, interval)
			if err != nil {
				return err
			}
			return a.show(cmd, request{method: "POST", path: base(rule), body: m}, view{cols: notificationRuleCols})
		})
	cb.fileFlag(create, "notification rule")
	cf.add(create, false)
	create.Flags().StringVar(&interval, "interval", "", "0: notify once per opening; else repeat this often while open: seconds or a `DURATION`")

	var eb body
	var ef channelFlags
	var eInterval string
	edit := &cobra.Command{
		Use:   "edit RULE ID [-f FILE] [flags]",
		Short: "Change a notification rule's channel, interval, template or time zone (S4); what is not given stays",
		Args:  exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := a.ruleBody(&eb, &ef, eInterval)
			if err != nil {
				return err
			}
			if len(m) == 0 {
				return usagef("edit changes nothing without --file or a flag")
			}
			return a.show(cmd, request{method: "PUT", path: base(args[0]) + "/" + esc(args[1]), body: m}, view{cols: notificationRuleCols})
		},
	}
	eb.fileFlag(edit, "fields to change")
	ef.add(edit, false)
	edit.Flags().StringVar(&eInterval, "interval", "", "0: notify once per opening; else repeat this often while open: seconds or a `DURATION`")

	del := &cobra.Command{
		Use:   "delete RULE ID",
		Short: "Delete a notification rule",
		Args:  exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.do(cmd, "DELETE", base(args[0])+"/"+esc(args[1]), nil); err != nil {
				return err
			}
			fmt.Fprintf(a.env.Stdout, "deleted notification rule %s\n", args[1])
			return nil
		},
	}
	return group("notifications", "Where an alert rule's alerts are sent: webhook, Slack or email", list, create, edit, del)
}

// ruleBody builds a notification rule's body from its file and flags.
func (a *app) ruleBody(b *body, f *channelFlags, interval string) (map[string]any, error) {
	if err := f.apply(b); err != nil {
		return nil, err
	}
	if interval != "" {
		s, err := seconds(interval)
		if err != nil {
			return nil, usagef("--interval: %v", err)
		}
		b.set("interval_seconds", s)
	}
	return a.build(b)
}

func (a *app) rolloutRulesCmd() *cobra.Command {
	const base = "/api/v1/rollout-notification-rules"
	v := view{cols: rolloutRuleCols}
	list := a.listCmd("List the rollout notification rules; secrets are never shown", base,
		view{items: "rollout_notification_rules", cols: rolloutRuleCols}, nil)
	get := a.idCmd("get ID", "Show a rollout notification rule", nil, func(cmd *cobra.Command, id string) error {
		return a.get(cmd, base+"/"+esc(id), nil, v)
	})
	var cb body
	var cf channelFlags
	create := &cobra.Command{
		Use:   "create (-f FILE | --webhook URL | --slack URL | --email ADDRESSES) [flags]",
		Short: "Send the tenant's rollouts' changes of state to a webhook, Slack or email",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := a.ruleBody(&cb, &cf, "")
			if err != nil {
				return err
			}
			return a.show(cmd, request{method: "POST", path: base, body: m}, v)
		},
	}
	cb.fileFlag(create, "rule")
	cf.add(create, true)
	var eb body
	var ef channelFlags
	edit := a.idCmd("edit ID [-f FILE] [flags]", "Change a rollout notification rule; what is not given stays", nil, func(cmd *cobra.Command, id string) error {
		m, err := a.ruleBody(&eb, &ef, "")
		if err != nil {
			return err
		}
		if len(m) == 0 {
			return usagef("edit changes nothing without --file or a flag")
		}
		return a.show(cmd, request{method: "PUT", path: base + "/" + esc(id), body: m}, v)
	})
	eb.fileFlag(edit, "fields to change")
	ef.add(edit, true)
	del := a.idCmd("delete ID", "Delete a rollout notification rule and its pending notifications", nil, func(cmd *cobra.Command, id string) error {
		if err := a.do(cmd, "DELETE", base+"/"+esc(id), nil); err != nil {
			return err
		}
		fmt.Fprintf(a.env.Stdout, "deleted rollout notification rule %s\n", id)
		return nil
	})
	return group("rollout-rules", "Where rollouts' changes of state (phase triggered, paused, …) are sent", list, get, create, edit, del)
}

func (a *app) alertsCmd() *cobra.Command {
	var state, rule, device string
	list := a.listCmd("Alert sessions, newest first; --watch shows each change", "/api/v1/alerts", view{items: "alerts", cols: alertCols},
		func(q url.Values) error {
			setIf(q, "state", state)
			setIf(q, "rule_id", rule)
			setIf(q, "device_id", device)
			return nil
		})
	list.Flags().StringVar(&state, "state", "", "active or ended")
	list.Flags().StringVar(&rule, "rule", "", "only alerts of this rule `ID`")
	list.Flags().StringVar(&device, "device", "", "only alerts of this device `ID`")
	list.RegisterFlagCompletionFunc("state", cobra.FixedCompletions([]string{"active", "ended"}, cobra.ShellCompDirectiveNoFileComp))
	list.RegisterFlagCompletionFunc("rule", a.completeAlertRules)
	list.RegisterFlagCompletionFunc("device", a.completeDevices)

	get := a.idCmd("get ID", "Show an alert session, with the data point that opened it", nil, func(cmd *cobra.Command, id string) error {
		return a.get(cmd, "/api/v1/alerts/"+esc(id), nil, view{cols: alertCols})
	})
	var np page
	notifications := a.idCmd("notifications ID", "An alert's notifications and each attempt to deliver them", nil, func(cmd *cobra.Command, id string) error {
		return a.get(cmd, "/api/v1/alerts/"+esc(id)+"/notifications", np.query(nil), view{items: "notifications", cols: deliveryCols})
	})
	np.flags(notifications)
	return group("alerts", "Alert sessions: which rule opened on which device, when, and their notifications", list, get, notifications)
}

// idCmd makes a command whose one argument is an id.
func (a *app) idCmd(use, short string, complete cobra.CompletionFunc, run func(cmd *cobra.Command, id string) error) *cobra.Command {
	if complete == nil {
		complete = cobra.NoFileCompletions
	}
	return &cobra.Command{
		Use:               use,
		Short:             short,
		Args:              exactArgs(1),
		ValidArgsFunction: complete,
		RunE:              func(cmd *cobra.Command, args []string) error { return run(cmd, args[0]) },
	}
}

// completeAlertRules completes alert rule ids, described by their names.
func (a *app) completeAlertRules(cmd *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var list struct {
		Rules []struct{ ID, Name string } `json:"alert_rules"`
	}
	if !a.complete(cmd, "/api/v1/alert-rules", url.Values{"limit": {"1000"}}, &list) {
		return nil, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveError
	}
	var out []string
	for _, r := range list.Rules {
		if strings.HasPrefix(r.ID, prefix) {
			out = append(out, r.ID+"\t"+r.Name)
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// listCmd makes a resource's list command; filters puts what its flags
// ask into the query. Paging and --watch are every list's.
func (a *app) listCmd(short, path string, v view, filters func(url.Values) error) *cobra.Command {
	var p page
	var w listWatch
	c := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   short,
		Args:    exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			q := url.Values{}
			if filters != nil {
				if err := filters(q); err != nil {
					return err
				}
			}
			return a.list(cmd, path, p.query(q), v, w)
		},
	}
	p.flags(c)
	w.flags(c)
	return c
}

// listWatch is a list's --watch.
type listWatch struct {
	on       bool
	interval time.Duration
}

func (w *listWatch) flags(c *cobra.Command) {
	c.Flags().BoolVarP(&w.on, "watch", "w", false, "ask again every --interval and show the list each time it changes, until interrupted")
	c.Flags().DurationVar(&w.interval, "interval", 2*time.Second, "with --watch: how often to ask")
}

// list shows a list once, or with --watch each time it changes until the
// command's context ends (an interrupt), which is no failure.
func (a *app) list(cmd *cobra.Command, path string, q url.Values, v view, w listWatch) error {
	r := request{method: "GET", path: path, query: q}
	if !w.on {
		return a.show(cmd, r, v)
	}
	if w.interval <= 0 {
		return usagef("--interval must be positive")
	}
	c, err := a.connect(cmd.Context())
	if err != nil {
		return err
	}
	if a.output == "edn" {
		r.accept = "application/edn"
	}
	var last []byte
	tick := time.NewTicker(w.interval)
	defer tick.Stop()
	for {
		b, err := c.call(cmd.Context(), r)
		if cmd.Context().Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		if !bytes.Equal(b, last) {
			if last != nil && a.output == "table" {
				fmt.Fprintf(a.env.Stdout, "\n--- %s\n", a.now().UTC().Format(time.RFC3339))
			}
			if err := a.print(b, v); err != nil {
				return err
			}
			last = b
		}
		select {
		case <-cmd.Context().Done():
			return nil
		case <-tick.C:
		}
	}
}
