package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/codec"
)

// TargetCounter counts the devices a dispatch would target, with the
// dispatch's own selection (sqlstore.DB.CountTargets).
type TargetCounter interface {
	CountTargets(ctx context.Context, tenant string, d *fleet.Dispatch) (int, error)
}

// formPhases is how many phase rows the dispatch form starts with; "Add a
// phase" adds one (up to fleet.MaxPhases), "Remove" takes one away. Rows
// left empty are not phases.
const formPhases = 2

// formRules is how many of the tenant's alert rules a phase's gate offers.
const formRules = 200

// dispatchForm is the dispatch form's fields, as typed.
type dispatchForm struct {
	Action, Params, SearchType, DeviceIDs, SearchKey, SearchQuery, Group, Timeout string
	Rollout                                                                       bool
	ReleaseNotes, WindowStart, WindowEnd, WindowTZ                                string
	// End is the schedule's end_timestamp as typed, a UTC date and time.
	End    string
	Phases []phaseForm
}

// phaseForm is one phase row.
type phaseForm struct {
	Index                          int
	Name, Kind, Value, Trigger, At string
	Wait, GateRate, GateMin        string
	// Ratio is an after_previous trigger's finished_ratio as a
	// percentage.
	Ratio     string
	GateRules []string // alert rule ids
	GateWatch string   // seconds
	// Count is how many devices the phase would release, once the form
	// was counted.
	Count *int
}

// hasRule reports whether the phase's gate names alert rule id.
func (p phaseForm) HasRule(id string) bool {
	for _, r := range p.GateRules {
		if r == id {
			return true
		}
	}
	return false
}

// dispatchData is the dispatch page's.
type dispatchData struct {
	Form    dispatchForm
	Matches *int               // devices the selection matches, once previewed
	Rules   []*fleet.AlertRule // for the phases' alert gates
}

func newPhaseForm(i int) phaseForm {
	p := phaseForm{Index: i, Kind: fleet.PhasePercentage, Trigger: fleet.TriggerAfterPrevious}
	if i == 0 {
		p.Trigger = fleet.TriggerNow
	}
	return p
}

func newDispatchForm() dispatchForm {
	f := dispatchForm{Params: "{}", SearchType: fleet.SearchDefault, WindowTZ: "UTC"}
	for i := range formPhases {
		f.Phases = append(f.Phases, newPhaseForm(i))
	}
	return f
}

// rules reads the alert rules a gate may name.
func (c *Console) rules(ctx context.Context, tenant string) ([]*fleet.AlertRule, error) {
	rules, _, err := c.Alerts.FindAlertRules(ctx, tenant, fleet.Page{Page: 1, Limit: formRules})
	return rules, err
}

func (c *Console) handleDispatchForm(w http.ResponseWriter, r *http.Request, v *view) error {
	f := newDispatchForm()
	q := r.URL.Query()
	if id := q.Get("device"); id != "" {
		f.DeviceIDs = id
	}
	if a := q.Get("action"); a != "" {
		f.Action = a
	}
	if g := q.Get("group"); g != "" {
		f.SearchType, f.Group = fleet.SearchGroup, g
	}
	if f.Action == fleet.ActionDesired {
		// A group page's "Roll out a desired change": the patch to fill
		// in, in phases (docs/twin.md).
		f.Params, f.Rollout = `{"desired": {}}`, true
		f.Phases[0].Name, f.Phases[0].Value = "canary", "10"
		f.Phases[1].Name, f.Phases[1].Value = "everyone", "100"
	}
	if v := q.Get("version"); v != "" && fleet.ValidVersion(v) {
		f.Params = `{"version": "` + v + `"}`
	}
	if q.Get("rollout") == "1" {
		// A bundle's "Roll out this bundle": a canary, then everyone.
		f.Rollout, f.SearchType = true, fleet.SearchAll
		f.Phases[0].Name, f.Phases[0].Value = "canary", "10"
		f.Phases[1].Name, f.Phases[1].Value = "everyone", "100"
	}
	rules, err := c.rules(r.Context(), v.Actor.Tenant)
	if err != nil {
		return err
	}
	v.Title, v.Nav, v.Data = "Dispatch an action", "actions", dispatchData{Form: f, Rules: rules}
	c.render(w, r, http.StatusOK, "dispatch", v)
	return nil
}

// handleDispatch previews (how many devices match) or dispatches. Either
// way the form goes through the API's own validation (fleet.ReadDispatch),
// so the console accepts exactly what POST /api/v1/actions accepts.
func (c *Console) handleDispatch(w http.ResponseWriter, r *http.Request, v *view) error {
	f := readDispatchForm(r)
	v.Title, v.Nav = "Dispatch an action", "actions"
	rules, err := c.rules(r.Context(), v.Actor.Tenant)
	if err != nil {
		return err
	}
	data := dispatchData{Form: f, Rules: rules}
	if r.PostForm.Has("add_phase") || r.PostForm.Has("remove_phase") {
		// The form again with a row more or less; nothing is checked yet.
		v.Data = data
		c.render(w, r, http.StatusOK, "dispatch", v)
		return nil
	}
	again := func(err error) error {
		if fleet.ErrorCode(err) != fleet.EINVALID {
			return err
		}
		v.Error, v.Fields, v.Data = fleet.ErrorMessage(err), fieldsOf(err), data
		c.render(w, r, http.StatusBadRequest, "dispatch", v)
		return nil
	}
	d, err := f.dispatch()
	if err != nil {
		return again(err)
	}
	if r.PostForm.Has("preview") {
		n, err := c.Targets.CountTargets(r.Context(), v.Actor.Tenant, d)
		if err != nil {
			return again(err)
		}
		data.Matches = &n
		if d.Schedule != nil {
			for i, k := range phaseCounts(d.Schedule, n) {
				if t := d.Schedule.Phases[i].Info.Type; t != fleet.PhaseMetadata && t != fleet.PhaseGroup { // known when it triggers
					data.Form.Phases[f.phaseRow(i)].Count = &k
				}
			}
		}
		v.Data = data
		c.render(w, r, http.StatusOK, "dispatch", v)
		return nil
	}
	a, err := c.Actions.DispatchAction(r.Context(), v.Actor.Tenant, d)
	if err != nil {
		return again(err)
	}
	http.Redirect(w, r, "/console/actions/"+strconv.FormatInt(a.ID, 10), http.StatusSeeOther)
	return nil
}

func fieldsOf(err error) map[string]string {
	if e, ok := err.(*fleet.Error); ok {
		return e.Fields
	}
	return nil
}

func readDispatchForm(r *http.Request) dispatchForm {
	p := r.PostForm
	get := func(k string) string { return strings.TrimSpace(p.Get(k)) }
	f := dispatchForm{
		Action: get("action"), Params: get("params"), SearchType: get("search_type"), DeviceIDs: get("device_ids"),
		SearchKey: get("search_key"), SearchQuery: get("search_query"), Group: get("group"), Timeout: get("timeout"),
		Rollout: p.Get("rollout") == "on", ReleaseNotes: p.Get("release_notes"),
		WindowStart: get("window_start"), WindowEnd: get("window_end"), WindowTZ: get("window_tz"), End: get("end"),
	}
	rows, err := strconv.Atoi(get("phases"))
	if err != nil || rows < 1 {
		rows = formPhases
	}
	remove, err := strconv.Atoi(get("remove_phase"))
	if err != nil {
		remove = -1
	}
	for i := range min(rows, fleet.MaxPhases) {
		if i == remove {
			continue
		}
		n := strconv.Itoa(i)
		f.Phases = append(f.Phases, phaseForm{Index: len(f.Phases),
			Name: get("phase" + n + "_name"), Kind: get("phase" + n + "_kind"), Value: get("phase" + n + "_value"),
			Trigger: get("phase" + n + "_trigger"), At: get("phase" + n + "_at"), Wait: get("phase" + n + "_wait"), Ratio: get("phase" + n + "_ratio"),
			GateRate: get("phase" + n + "_gate_rate"), GateMin: get("phase" + n + "_gate_min"),
			GateRules: p["phase"+n+"_gate_rules"], GateWatch: get("phase" + n + "_gate_watch"),
		})
	}
	if p.Has("add_phase") && len(f.Phases) < fleet.MaxPhases {
		f.Phases = append(f.Phases, newPhaseForm(len(f.Phases)))
	}
	if len(f.Phases) == 0 {
		f.Phases = append(f.Phases, newPhaseForm(0))
	}
	return f
}

// phaseRow returns the form row of the schedule's phase i: rows left
// empty are not phases.
func (f dispatchForm) phaseRow(i int) int {
	for _, p := range f.Phases {
		if p.empty() {
			continue
		}
		if i == 0 {
			return p.Index
		}
		i--
	}
	return -1
}

func (p phaseForm) empty() bool { return p.Name == "" && p.Value == "" }

// phaseCounts says how many of total targets each phase would release, by
// the rule the store partitions them with (docs/actions.md, "Rollouts"):
// fixed_list phases take their devices first, then each percentage phase
// what its cumulative quota still lacks, in order.
func phaseCounts(s *fleet.Schedule, total int) []int {
	counts := make([]int, len(s.Phases))
	left := total
	for k, p := range s.Phases {
		if p.Info.Type == fleet.PhaseFixedList {
			counts[k] = len(p.Info.DeviceIDs)
			left -= counts[k]
		}
	}
	taken := 0
	for k, p := range s.Phases {
		if p.Info.Type == fleet.PhasePercentage {
			counts[k] = max(0, min(fleet.PhaseQuota(p.Info.Percentage, total)-taken, left))
			left -= counts[k]
		}
		taken += counts[k]
	}
	return counts
}

// number is a form field as a JSON number when it reads as one, else as
// the string typed, which validation then refuses by the field's name.
func number(s string) any {
	if n, err := strconv.ParseFloat(s, 64); err == nil {
		return json.Number(strconv.FormatFloat(n, 'f', -1, 64))
	}
	return s
}

// dispatch builds the API's dispatch body from the form and validates it
// as the API does.
func (f dispatchForm) dispatch() (*fleet.Dispatch, error) {
	body := map[string]any{"action": f.Action, "search_type": f.SearchType}
	if f.Params == "" {
		f.Params = "{}"
	}
	var params json.RawMessage
	if err := json.Unmarshal([]byte(f.Params), &params); err != nil {
		return nil, fleet.FieldErrors(map[string]string{"params": "must be a JSON object: " + err.Error()})
	}
	body["params"] = params
	if ids := strings.FieldsFunc(f.DeviceIDs, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\r' || r == '\t' }); len(ids) > 0 {
		body["device_ids"] = ids
	}
	if f.SearchKey != "" {
		body["search_key"] = f.SearchKey
	}
	if f.SearchQuery != "" {
		body["search_query"] = f.SearchQuery
	}
	if f.Group != "" {
		body["group"] = f.Group
	}
	if f.Timeout != "" {
		body["timeout"] = number(f.Timeout)
	}
	if f.Rollout {
		s, err := f.schedule()
		if err != nil {
			return nil, err
		}
		body["schedule"] = s
	}
	text, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	v, err := codec.Decode(codec.JSON, text)
	if err != nil {
		return nil, err
	}
	fields := fleet.NewFields(v)
	d := fleet.ReadDispatch(fields, true)
	if err := fields.Err(); err != nil {
		return nil, err
	}
	return &d, nil
}

// schedule is the rollout part of the form as the API's schedule.
func (f dispatchForm) schedule() (map[string]any, error) {
	s := map[string]any{}
	if f.ReleaseNotes != "" {
		s["release_notes"] = f.ReleaseNotes
	}
	if f.WindowStart != "" || f.WindowEnd != "" {
		s["maintenance_window"] = map[string]any{"start": f.WindowStart, "end": f.WindowEnd, "timezone": f.WindowTZ}
	}
	if f.End != "" {
		end, err := utcMillis(f.End)
		if err != nil {
			return nil, fleet.FieldErrors(map[string]string{"schedule.end_timestamp": "must be a date and time (UTC)"})
		}
		s["end_timestamp"] = end
	}
	phases := []any{}
	for _, p := range f.Phases {
		if p.empty() {
			continue
		}
		info := map[string]any{"type": p.Kind}
		switch p.Kind {
		case fleet.PhaseFixedList:
			info["device_ids"] = strings.FieldsFunc(p.Value, func(r rune) bool { return r == ',' || r == ' ' })
		case fleet.PhaseMetadata:
			md := map[string]any{}
			for _, pair := range strings.FieldsFunc(p.Value, func(r rune) bool { return r == ',' }) {
				k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
				if !ok || k == "" {
					return nil, fleet.FieldErrors(map[string]string{fmt.Sprintf("schedule.phases[%d].info.metadata", p.Index): "must be KEY=VALUE pairs separated by commas, as ring=lab"})
				}
				md[k] = v
			}
			info["metadata"] = md
		case fleet.PhaseGroup:
			info["group"] = p.Value
		default:
			info["percentage"] = number(p.Value)
		}
		trigger := map[string]any{"type": p.Trigger}
		switch p.Trigger {
		case fleet.TriggerAfterPrevious:
			if p.Wait != "" {
				trigger["wait_seconds"] = number(p.Wait)
			}
			if p.Ratio != "" {
				// The form asks for a percentage, the API for a fraction.
				ratio, err := strconv.ParseFloat(p.Ratio, 64)
				if err != nil {
					return nil, fleet.FieldErrors(map[string]string{fmt.Sprintf("schedule.phases[%d].trigger_on.finished_ratio", p.Index): "must be a percentage above 0, at most 100"})
				}
				trigger["finished_ratio"] = json.Number(strconv.FormatFloat(ratio/100, 'f', -1, 64))
			}
		case fleet.TriggerTimestamp:
			at, err := utcMillis(p.At)
			if err != nil {
				return nil, fleet.FieldErrors(map[string]string{fmt.Sprintf("schedule.phases[%d].trigger_on.timestamp", p.Index): "must be a date and time (UTC)"})
			}
			trigger["timestamp"] = at
		}
		phase := map[string]any{"name": p.Name, "trigger_on": trigger, "info": info}
		gate := map[string]any{}
		if p.GateRate != "" {
			// The form asks for a percentage, the API for a fraction.
			rate, err := strconv.ParseFloat(p.GateRate, 64)
			if err != nil {
				return nil, fleet.FieldErrors(map[string]string{fmt.Sprintf("schedule.phases[%d].gate.max_failure_rate", p.Index): "must be a percentage from 0 to 100"})
			}
			gate["max_failure_rate"] = json.Number(strconv.FormatFloat(rate/100, 'f', -1, 64))
		}
		if p.GateMin != "" {
			gate["min_finished"] = number(p.GateMin)
		}
		if len(p.GateRules) > 0 {
			gate["alert_rules"] = p.GateRules
		}
		if p.GateWatch != "" {
			gate["watch_seconds"] = number(p.GateWatch)
		}
		if len(gate) > 0 {
			phase["gate"] = gate
		}
		phases = append(phases, phase)
	}
	s["phases"] = phases
	return s, nil
}

// utcMillis reads a datetime-local field, a date and time in UTC, as the
// API's epoch milliseconds.
func utcMillis(s string) (int64, error) {
	t, err := time.ParseInLocation("2006-01-02T15:04", s, time.UTC)
	return t.UnixMilli(), err
}
