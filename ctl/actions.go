package ctl

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/fleetd/fleet"
	"github.com/spf13/cobra"
)

var (
	actionCols = cols("ID", "id", "ACTION", "action", "SEARCH", "search_type", "TARGETED", "targeted", "STATUSES", "statuses",
		"ROLLOUT", "status", "PAUSE REASON", "pause_reason", "BY", "user_name", "CREATED", "created_at")
	actionView        = view{cols: actionCols}
	actionListView    = view{items: "actions", cols: actionCols}
	dispatchedView    = view{cols: cols("ID", "id", "TARGETED", "targeted", "CREATED", "created_at")}
	actionDevicesView = view{items: "device_actions", cols: deviceActionCols}
)

const dispatchLong = `Dispatches ACTION to the devices chosen by exactly one of --devices (a list
of ids), --all, --metadata-match KEY=VALUE, --search TEXT [--search-key
KEY] or --group NAME, atomically. --params gives the parameters as a JSON object; --param
adds string parameters one by one. --file reads the whole body (JSON or
YAML, as POST /api/v1/actions takes it); flags given beside it override its
fields.

A rollout releases the targets phase by phase. Give its schedule as a file
(--schedule, the API's schedule object) or phase by phase with --phase, each
'NAME SELECTION [KEY=VALUE]...':
  SELECTION        N% (cumulative share of the targets), ID,ID,... (fixed_list)
                   KEY=VALUE,... (metadata: the targets not released yet
                   whose metadata match when the phase triggers) or @GROUP
                   (group: the targets not released yet in the group when
                   the phase triggers)
  trigger=         now, manual, after_previous or an RFC 3339 time (default:
                   now for the first phase, after_previous for the others)
  wait=            after_previous: how long to wait, such as 30s or 1h
  finished-ratio=  after_previous: the share of the earlier phases' devices that
                   must be final, such as 0.95 (default 1: every one)
  max-failure-rate=, min-finished=, alert-rules=ID,ID, watch=DURATION: the gate
--release-notes, --end and --maintenance-window complete the schedule.`

const dispatchExample = `  fleetctl actions dispatch reboot --devices pump-1,pump-2 --params '{"delay": 5}' --timeout 10m
  fleetctl actions dispatch update_firmware --param version=2.3.0 --search roll- \
    --phase 'canary roll-00005,roll-00006' \
    --phase 'everyone 100% trigger=after_previous max-failure-rate=0.2 min-finished=3' --watch`

func (a *app) actionsCmd() *cobra.Command {
	var (
		file, paramsJSON, searchQ, searchKey, groupName, timeout, scheduleFile, releaseNotes, end, window string
		devices, phases                                                                                   []string
		all, watchAfter                                                                                   bool
	)
	params, metaMatch := keyValues{}, keyValues{}
	var w watchOptions
	dispatch := &cobra.Command{
		Use:     "dispatch ACTION [selection] [flags]",
		Short:   "Dispatch an action to devices, at once or as a phased rollout",
		Long:    dispatchLong,
		Example: dispatchExample,
		Args:    rangeArgs(0, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			body := map[string]any{}
			if file != "" {
				v, err := a.readDoc(file)
				if err != nil {
					return err
				}
				m, ok := v.(map[string]any)
				if !ok {
					return usagef("%s: want an object, the body of POST /api/v1/actions", file)
				}
				body = m
			}
			if len(args) == 1 {
				body["action"] = args[0]
			}
			if body["action"] == nil {
				return usagef("dispatch needs an ACTION (or a --file that names one)")
			}
			if paramsJSON != "" {
				var p map[string]any
				if err := json.Unmarshal([]byte(paramsJSON), &p); err != nil {
					return usagef("--params: want a JSON object: %v", err)
				}
				body["params"] = p
			}
			if len(params) > 0 {
				p, _ := body["params"].(map[string]any)
				if p == nil {
					p = map[string]any{}
				}
				for k, v := range params {
					p[k] = v
				}
				body["params"] = p
			}
			if body["params"] == nil {
				body["params"] = map[string]any{}
			}
			chosen := 0
			if len(devices) > 0 {
				chosen++
				body["search_type"], body["device_ids"] = "default", devices
			}
			if all {
				chosen++
				body["search_type"] = "all"
			}
			if len(metaMatch) > 0 {
				if len(metaMatch) > 1 {
					return usagef("--metadata-match takes one KEY=VALUE")
				}
				chosen++
				for k, v := range metaMatch {
					body["search_type"], body["search_key"], body["search_query"] = "metadata", k, v
				}
			}
			if searchQ != "" {
				chosen++
				body["search_type"], body["search_query"] = "search", searchQ
				if searchKey != "" {
					body["search_key"] = searchKey
				}
			}
			if groupName != "" {
				chosen++
				body["search_type"], body["group"] = "group", groupName
			}
			if chosen > 1 || (chosen == 0 && body["search_type"] == nil) {
				return usagef("choose the devices with exactly one of --devices, --all, --metadata-match, --search or --group")
			}
			if timeout != "" {
				secs, err := seconds(timeout)
				if err != nil {
					return usagef("--timeout: %v", err)
				}
				body["timeout"] = secs
			}
			sched, err := a.schedule(body["schedule"], scheduleFile, phases, releaseNotes, end, window)
			if err != nil {
				return err
			}
			if sched != nil {
				body["schedule"] = sched
			}
			if !watchAfter {
				for _, name := range []string{"watch-timeout", "max-failed", "interval"} {
					if cmd.Flags().Changed(name) {
						return usagef("--%s goes with --watch", name)
					}
				}
				return a.show(cmd, request{method: "POST", path: "/api/v1/actions", body: body}, dispatchedView)
			}
			if err := a.checkWatchOutput(); err != nil {
				return err
			}
			c, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			b, err := c.call(cmd.Context(), request{method: "POST", path: "/api/v1/actions", body: body})
			if err != nil {
				return err
			}
			var d struct {
				ID       int64 `json:"id"`
				Targeted int   `json:"targeted"`
			}
			if err := json.Unmarshal(b, &d); err != nil {
				return err
			}
			said := a.env.Stdout
			if a.output == "json" {
				said = a.env.Stderr // stdout is JSON lines
			}
			fmt.Fprintf(said, "dispatched action %d to %d devices\n", d.ID, d.Targeted)
			return a.watch(cmd, d.ID, w)
		},
	}
	f := dispatch.Flags()
	f.StringVarP(&file, "file", "f", "", "JSON or YAML `FILE` with the dispatch body (- for standard input)")
	f.StringVar(&paramsJSON, "params", "", "the action's parameters, a JSON `OBJECT`")
	f.Var(params, "param", "a string parameter KEY=VALUE; repeatable")
	f.StringSliceVar(&devices, "devices", nil, "exactly these device `IDS` (comma-separated or repeated)")
	f.BoolVar(&all, "all", false, "every device of the tenant")
	f.Var(metaMatch, "metadata-match", "devices whose metadata KEY equals VALUE")
	f.StringVar(&searchQ, "search", "", "devices whose id or metadata contains `TEXT`, case-insensitively")
	f.StringVar(&searchKey, "search-key", "", "with --search: look only in this metadata `KEY`")
	f.StringVar(&groupName, "group", "", "the devices of the group `NAME` at dispatch")
	f.StringVar(&timeout, "timeout", "", "a device action not final this long after Initiated fails: seconds, or a `DURATION` such as 10m")
	f.StringVar(&scheduleFile, "schedule", "", "JSON or YAML `FILE` with the rollout's schedule")
	f.StringArrayVar(&phases, "phase", nil, "a rollout phase, 'NAME SELECTION [KEY=VALUE]...' (see above); repeatable, in order")
	f.StringVar(&releaseNotes, "release-notes", "", "the rollout's release notes `TEXT`")
	f.StringVar(&end, "end", "", "an RFC 3339 `TIME` after which no phase triggers")
	f.StringVar(&window, "maintenance-window", "", "hand released device actions to devices only between START-END in ZONE: `HH:MM-HH:MM/ZONE`, such as 02:00-05:00/Europe/Berlin")
	f.BoolVar(&watchAfter, "watch", false, "then watch the action as 'actions watch' does, and exit as it does (codes 3 to 6)")
	w.flags(dispatch, "watch-timeout")
	dispatch.RegisterFlagCompletionFunc("devices", a.completeDevices)

	var name string
	var incomplete bool
	list := a.listCmd("List actions, newest first, with their device actions counted per status", "/api/v1/actions", actionListView,
		func(q url.Values) error {
			setIf(q, "action", name)
			if incomplete {
				q.Set("incomplete", "true")
			}
			return nil
		})
	list.Flags().StringVar(&name, "action", "", "only actions of this `NAME`")
	list.Flags().BoolVar(&incomplete, "incomplete", false, "only actions with device actions not yet final")

	get := a.actionCmd("get ID", "Show an action: its device actions counted per status, its rollout", func(cmd *cobra.Command, id int64) error {
		return a.get(cmd, fmt.Sprintf("/api/v1/actions/%d", id), nil, actionView)
	})

	var dp page
	var status string
	devs := a.actionCmd("devices ID", "An action's device actions, by device id", func(cmd *cobra.Command, id int64) error {
		q := url.Values{}
		setIf(q, "action_status", status)
		return a.get(cmd, fmt.Sprintf("/api/v1/actions/%d/devices", id), dp.query(q), actionDevicesView)
	})
	devs.Flags().StringVar(&status, "status", "", "only device actions of this action_status")
	devs.RegisterFlagCompletionFunc("status", completeStatuses)
	dp.flags(devs)

	op := func(use, short, path string) *cobra.Command {
		return a.actionCmd(use+" ID", short, func(cmd *cobra.Command, id int64) error {
			return a.show(cmd, request{method: "POST", path: fmt.Sprintf("/api/v1/actions/%d/%s", id, path)}, actionView)
		})
	}

	var appendFile string
	var appendPhase string
	appendCmd := a.actionCmd("append-phase ID (--phase 'NAME ID,ID... [KEY=VALUE]...' | --file FILE)",
		"Add a fixed_list phase to a rollout; its devices become targets", func(cmd *cobra.Command, id int64) error {
			var body any
			var err error
			switch {
			case (appendFile == "") == (appendPhase == ""):
				return usagef("append-phase takes one of --phase or --file")
			case appendFile != "":
				if body, err = a.readDoc(appendFile); err != nil {
					return err
				}
			default:
				if body, err = parsePhase(appendPhase, false); err != nil {
					return err
				}
			}
			return a.show(cmd, request{method: "POST", path: fmt.Sprintf("/api/v1/actions/%d/append_phase", id), body: body}, actionView)
		})
	appendCmd.Flags().StringVar(&appendPhase, "phase", "", "the phase, 'NAME ID,ID... [KEY=VALUE]...' as dispatch --phase takes it (default trigger after_previous)")
	appendCmd.Flags().StringVarP(&appendFile, "file", "f", "", "JSON or YAML `FILE` with the phase object")

	var ww watchOptions
	watch := a.actionCmd("watch ID", "Show an action's progress live until it ends; the exit code says how (0 passed, 3 paused, 4 too many failed, 5 timed out, 6 aborted)",
		func(cmd *cobra.Command, id int64) error { return a.watch(cmd, id, ww) })
	watch.Long = `Shows the action's device actions per status, and per phase for a rollout,
as progress bars that redraw in place (on a terminal; elsewhere a line per
change), until every device action is final, the rollout pauses or is
aborted, or --timeout runs out. With -o json it writes one JSON object a
line: {"event":"change","action":{...}} at each change, the action as
'actions get' shows it, then {"event":"final","action":{...},
"exit_code":N,"reason":"..."}. A rollout that waits says for
what (the API's waiting_reason).

The exit code is what a CI job gates on:
  0  every device finished, and no more failed than --max-failed allows
  3  the rollout paused (a gate did not hold, or an operator paused it)
  4  more devices failed than --max-failed allows (default 0)
  5  --timeout ran out
  6  the rollout was aborted, or device actions were cancelled
  1  a request failed; 2 the command line cannot be run`
	watch.Example = `  fleetctl actions watch 42 --timeout 30m --max-failed 2% || exit $?
  fleetctl actions watch 42 -o json | jq -c 'select(.event == "final") | .reason'`
	ww.flags(watch, "timeout")

	var device, state string
	var progress int
	var errs []string
	report := a.actionCmd("report ID --device DEVICE --state STATE [--progress N] [--error MESSAGE]...",
		"Report a device's status on an action (S10), as a gateway or an agent over HTTP does", func(cmd *cobra.Command, id int64) error {
			if device == "" || state == "" {
				return usagef("report needs --device and --state")
			}
			b := map[string]any{"device_id": device, "action_id": id, "state": state}
			if cmd.Flags().Changed("progress") {
				b["progress"] = progress
			}
			if len(errs) > 0 {
				b["errors"] = errs
			}
			b["timestamp"] = a.now().UnixMilli()
			if err := a.do(cmd, "POST", "/api/v1/devices/action/status", b); err != nil {
				return err
			}
			fmt.Fprintf(a.env.Stdout, "reported %s of %s on action %d\n", state, device, id)
			return nil
		})
	report.Long = `Sends one status report (S10) with the time of now. States Completed and
Failed are final; any other state is progress. Needs a key of role device,
operator or admin. A report older than one already applied, or after the
device action is final, is acknowledged and changes nothing.`
	report.Flags().StringVar(&device, "device", "", "the reporting device's `ID`")
	report.Flags().StringVar(&state, "state", "", "the device's `STATE`: Completed, Failed, or any word of progress such as Downloading")
	report.Flags().IntVar(&progress, "progress", 0, "progress, 0 to 100")
	report.Flags().StringArrayVar(&errs, "error", nil, "an error `MESSAGE` to report; repeatable")
	report.RegisterFlagCompletionFunc("device", a.completeDevices)

	var retryStatuses []string
	retry := a.actionCmd("retry ID [--status STATUS]...", "Dispatch an action again to its devices that Failed (or ended in the --status given)",
		func(cmd *cobra.Command, id int64) error {
			var body any
			if len(retryStatuses) > 0 {
				body = map[string]any{"statuses": retryStatuses}
			}
			return a.show(cmd, request{method: "POST", path: fmt.Sprintf("/api/v1/actions/%d/retry", id), body: body}, dispatchedView)
		})
	retry.Long = `Dispatches the action again, its params and timeout, to its devices whose
device actions ended Failed, or in the final statuses --status names
(Completed, Failed, Cancelled): a new action, whose retry_of is ID. A
rollout is retried without its schedule. The action must be finished:
every device action final (cancel the rest first).`
	retry.Flags().StringSliceVar(&retryStatuses, "status", nil, "retry the devices whose device actions ended in this `STATUS` (Completed, Failed, Cancelled); repeatable; default Failed")
	retry.RegisterFlagCompletionFunc("status", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return []string{"Completed", "Failed", "Cancelled"}, cobra.ShellCompDirectiveNoFileComp
	})

	return group("actions", "Dispatch actions and follow them; cancel them; steer rollouts",
		dispatch, list, get, devs, watch, report, retry,
		op("cancel", "Cancel every device action not yet final", "cancel"),
		op("pause", "Pause a rollout: nothing more is released until it is resumed", "pause"),
		op("resume", "Resume a paused rollout; the gate that paused it is waived for the phase it held back", "resume"),
		op("abort", "Abort a rollout: cancel what is not final and release nothing more", "abort"),
		op("trigger-next-phase", "Release a rollout's next phase now, whatever its trigger, if its gate holds", "trigger_next_phase"),
		appendCmd)
}

// actionCmd makes a command whose one argument is an action id.
func (a *app) actionCmd(use, short string, run func(cmd *cobra.Command, id int64) error) *cobra.Command {
	return &cobra.Command{
		Use:               use,
		Short:             short,
		Args:              exactArgs(1),
		ValidArgsFunction: a.completeActions,
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := actionID(args[0])
			if err != nil {
				return err
			}
			return run(cmd, id)
		},
	}
}

func actionID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, usagef("action id %q: want a positive integer", s)
	}
	return id, nil
}

// seconds reads a whole number of seconds or a Go duration.
func seconds(s string) (int64, error) {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return n, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("want seconds or a duration such as 90s or 10m, got %q", s)
	}
	if d%time.Second != 0 {
		return 0, fmt.Errorf("%s is not a whole number of seconds", s)
	}
	return int64(d / time.Second), nil
}

// schedule builds the rollout schedule from a file and the flags, or
// returns nil when none was asked for. fromBody is the body file's.
func (a *app) schedule(fromBody any, file string, phases []string, notes, end, window string) (any, error) {
	sched, _ := fromBody.(map[string]any)
	if file != "" {
		v, err := a.readDoc(file)
		if err != nil {
			return nil, err
		}
		m, ok := v.(map[string]any)
		if !ok {
			return nil, usagef("%s: want the schedule object", file)
		}
		sched = m
	}
	if len(phases) > 0 {
		if sched == nil {
			sched = map[string]any{}
		}
		list := make([]fleet.Phase, len(phases))
		for i, p := range phases {
			ph, err := parsePhase(p, i == 0)
			if err != nil {
				return nil, err
			}
			list[i] = ph
		}
		sched["phases"] = list
	}
	if notes == "" && end == "" && window == "" {
		if sched == nil {
			return nil, nil
		}
		return sched, nil
	}
	if sched == nil {
		return nil, usagef("--release-notes, --end and --maintenance-window complete a schedule: give its --phase flags or --schedule")
	}
	if notes != "" {
		sched["release_notes"] = notes
	}
	if end != "" {
		t, err := time.Parse(time.RFC3339, end)
		if err != nil {
			return nil, usagef("--end: want an RFC 3339 time such as 2026-12-01T18:00:00Z")
		}
		sched["end_timestamp"] = t.UnixMilli()
	}
	if window != "" {
		span, zone, ok := strings.Cut(window, "/")
		start, stop, ok2 := strings.Cut(span, "-")
		if !ok || !ok2 {
			return nil, usagef("--maintenance-window: want HH:MM-HH:MM/ZONE, such as 02:00-05:00/Europe/Berlin")
		}
		sched["maintenance_window"] = fleet.MaintenanceWindow{Start: start, End: stop, Timezone: zone}
	}
	return sched, nil
}

// parsePhase reads 'NAME SELECTION [KEY=VALUE]...'. The server checks the
// values; this only puts them where the API wants them.
func parsePhase(s string, first bool) (fleet.Phase, error) {
	fields := strings.Fields(s)
	if len(fields) < 2 {
		return fleet.Phase{}, usagef("phase %q: want 'NAME SELECTION [KEY=VALUE]...', such as 'canary pump-1,pump-2' or 'everyone 100%%'", s)
	}
	p := fleet.Phase{Name: fields[0], TriggerOn: fleet.Trigger{Type: fleet.TriggerAfterPrevious}}
	if first {
		p.TriggerOn.Type = fleet.TriggerNow
	}
	if pct, ok := strings.CutSuffix(fields[1], "%"); ok {
		n, err := strconv.Atoi(pct)
		if err != nil {
			return p, usagef("phase %s: %q is not a percentage", p.Name, fields[1])
		}
		p.Info = fleet.PhaseInfo{Type: fleet.PhasePercentage, Percentage: n}
	} else if g, ok := strings.CutPrefix(fields[1], "@"); ok { // device ids have no '@'
		p.Info = fleet.PhaseInfo{Type: fleet.PhaseGroup, Group: g}
	} else if strings.Contains(fields[1], "=") { // device ids have no '='
		p.Info = fleet.PhaseInfo{Type: fleet.PhaseMetadata, Metadata: map[string]string{}}
		for _, kv := range strings.Split(fields[1], ",") {
			k, v, _ := strings.Cut(kv, "=")
			p.Info.Metadata[k] = v
		}
	} else {
		p.Info = fleet.PhaseInfo{Type: fleet.PhaseFixedList, DeviceIDs: strings.Split(fields[1], ",")}
	}
	gate := &fleet.Gate{}
	for _, kv := range fields[2:] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return p, usagef("phase %s: %q is not KEY=VALUE", p.Name, kv)
		}
		var err error
		switch k {
		case "trigger":
			switch v {
			case fleet.TriggerNow, fleet.TriggerManual, fleet.TriggerAfterPrevious:
				p.TriggerOn.Type = v
			default:
				t, perr := time.Parse(time.RFC3339, v)
				if perr != nil {
					return p, usagef("phase %s: trigger %q: want now, manual, after_previous or an RFC 3339 time", p.Name, v)
				}
				p.TriggerOn = fleet.Trigger{Type: fleet.TriggerTimestamp, Timestamp: t.UnixMilli()}
			}
		case "wait":
			p.TriggerOn.WaitSeconds, err = seconds(v)
		case "finished-ratio":
			p.TriggerOn.FinishedRatio, err = strconv.ParseFloat(v, 64)
		case "max-failure-rate":
			var r float64
			r, err = strconv.ParseFloat(v, 64)
			gate.MaxFailureRate = &r
		case "min-finished":
			gate.MinFinished, err = strconv.Atoi(v)
		case "alert-rules":
			gate.AlertRules = strings.Split(v, ",")
		case "watch":
			gate.WatchSeconds, err = seconds(v)
		default:
			return p, usagef("phase %s: unknown key %q (trigger, wait, finished-ratio, max-failure-rate, min-finished, alert-rules, watch)", p.Name, k)
		}
		if err != nil {
			return p, usagef("phase %s: %s: %v", p.Name, k, err)
		}
	}
	if gate.MaxFailureRate != nil || gate.MinFinished != 0 || gate.AlertRules != nil || gate.WatchSeconds != 0 {
		p.Gate = gate
	}
	return p, nil
}

// completeActions completes the ids of the newest actions, described.
func (a *app) completeActions(cmd *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var list struct {
		Actions []struct {
			ID       int64  `json:"id"`
			Action   string `json:"action"`
			Targeted int    `json:"targeted"`
		} `json:"actions"`
	}
	if !a.complete(cmd, "/api/v1/actions", url.Values{"limit": {"100"}}, &list) {
		return nil, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveError
	}
	var out []string
	for _, x := range list.Actions {
		id := strconv.FormatInt(x.ID, 10)
		if strings.HasPrefix(id, prefix) {
			out = append(out, fmt.Sprintf("%s\t%s, %d devices", id, x.Action, x.Targeted))
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveKeepOrder
}
