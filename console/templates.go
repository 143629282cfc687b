package console

import (
	"encoding/json"
	"fmt"
	"html/template"
	"strconv"
	"strings"

	"github.com/fleetd/fleet"
)

// pageNames are the templates under templates/, each rendered inside
// layout.html.
var pageNames = []string{"error", "signin", "overview", "devices", "device", "actions", "action", "dispatch", "firmware", "bundle", "alerts", "keys", "auth", "ddi", "audit", "sessions", "alertrules", "alertrule", "ruleform", "notification", "notificationform", "devicelogs", "alert", "terminal", "remotesessions", "groups", "group", "remotesettings"}

var funcs = template.FuncMap{
	"when":       when,
	"sortedKeys": sortedKeys[string],
	"withQuery":  withQuery,
	"pretty": func(raw any) string {
		var b []byte
		switch v := raw.(type) {
		case json.RawMessage:
			b = v
		case string:
			b = []byte(v)
		default:
			b, _ = json.Marshal(v)
		}
		var x any
		if json.Unmarshal(b, &x) != nil {
			return string(b)
		}
		// html/template escapes the text; JSON's own escaping of < > &
		// would only show as \u003c.
		var out strings.Builder
		enc := json.NewEncoder(&out)
		enc.SetEscapeHTML(false)
		enc.SetIndent("", "  ")
		_ = enc.Encode(x) // a decoded value always encodes
		return strings.TrimSuffix(out.String(), "\n")
	},
	"join":  strings.Join,
	"final": func(s fleet.ActionStatus) bool { return s.Final() },
	"inc":   func(i int) int { return i + 1 },
	// plural is the noun a count of n takes: {{n}} {{plural n "device" "devices"}}.
	"plural": plural,
	"count":  func(m map[string]int, k fleet.ActionStatus) int { return m[string(k)] },
	"list":   func(s ...string) []string { return s },
	// allows: the rollout of the action allows the operation now
	// (fleet.RolloutOperations); the page shows only those.
	"allows":        func(a *fleet.Action, op string) bool { return a.RolloutAllows(fleet.RolloutOp(op)) == nil },
	"opLabel":       func(op string) string { return opLabels[op] },
	"confirmOp":     confirmOp,
	"paramsSummary": paramsSummary,
	"clip":          clip,
	"phaseCount": func(a *fleet.Action, phase int, st fleet.ActionStatus) int {
		return a.StatusesPhased[strconv.Itoa(phase)][string(st)]
	},
	"bytes":       byteSize,
	"progress":    newProgress,
	"searchLabel": func(s string) string { return searchLabels[s] },
	"percent":     func(f *float64) string { return strconv.FormatFloat(*f*100, 'f', -1, 64) },
	"problems":    problemsOf,
	"fieldOf":     fieldOf,
	"tab":         func(id, tab string) struct{ ID, Tab string } { return struct{ ID, Tab string }{id, tab} },
}

func parsePages() map[string]*template.Template {
	pages := map[string]*template.Template{}
	for _, name := range pageNames {
		pages[name] = template.Must(template.New(name).Funcs(funcs).ParseFS(assets, "templates/layout.html", "templates/charts.html", "templates/"+name+".html"))
	}
	return pages
}

var opLabels = map[string]string{
	"pause": "Pause", "resume": "Resume", "trigger_next_phase": "Trigger next phase", "abort": "Abort rollout",
}

// confirmOp is what an operation's button asks before it goes, naming
// what it will do: abort and cancel cancel at once every device action
// not yet on its device, and ask the devices that have it (mid-download,
// for an update) to stop, by a cancel_action; each of those is Cancelled
// when its device agrees (docs/actions.md, "Cancelling"). The other
// operations can be undone, and ask nothing ("").
func confirmOp(a *fleet.Action, op string) string {
	p := newProgress(a.Statuses)
	open, queued := p.Total-p.Final, p.Scheduled+p.Waiting
	what := fmt.Sprintf("%d %s not finished: %d not yet on %s cancelled at once, and the %d %s sent a cancel_action and asked to stop",
		open, plural(open, "device action", "device actions"),
		queued, plural(queued, "its device is", "their device are"),
		p.Running, plural(p.Running, "device that has it (mid-download, for an update) is", "devices that have it (mid-download, for an update) are"))
	switch op {
	case "abort":
		return fmt.Sprintf("Abort rollout #%d (%s)? No further phase is released, and this cancels the %s. It cannot be undone.", a.ID, a.Action, what)
	case "cancel":
		return fmt.Sprintf("Cancel action #%d (%s)? This cancels the %s. It cannot be undone.", a.ID, a.Action, what)
	}
	return ""
}

// plural is the noun, or the words, that go with a count of n: one for
// 1, many for any other count.
func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// paramsSummary is an action's params on one line, key=value, for a list
// to tell one version of an action from another: {"version":"2.3.0"} is
// version=2.3.0.
func paramsSummary(raw json.RawMessage) string {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return ""
	}
	parts := make([]string, 0, len(m))
	for _, k := range sortedKeys(m) {
		v := string(m[k])
		var s string
		if json.Unmarshal(m[k], &s) == nil {
			v = s
		}
		parts = append(parts, k+"="+v)
	}
	return clip(strings.Join(parts, " "), 100)
}

// clip shortens s to at most n characters, marking the cut.
func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

var searchLabels = map[string]string{
	"default": "these devices", "all": "all devices", "metadata": "metadata equals", "search": "id or metadata contains",
	"group": "the devices of a group",
}

// byteSize formats a size for a person: bytes, KiB, MiB or GiB.
func byteSize(v any) string {
	var n int64
	switch v := v.(type) {
	case int64:
		n = v
	case *int64:
		if v == nil {
			return "—"
		}
		n = *v
	}
	switch {
	case n >= 1<<30:
		return strconv.FormatFloat(float64(n)/(1<<30), 'f', 1, 64) + " GiB"
	case n >= 1<<20:
		return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) + " MiB"
	case n >= 1<<10:
		return strconv.FormatFloat(float64(n)/(1<<10), 'f', 1, 64) + " KiB"
	}
	return strconv.FormatInt(n, 10) + " bytes"
}
