package ctl

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"

	"github.com/spf13/cobra"
)

var (
	groupView     = view{cols: cols("NAME", "name", "SELECTOR", "selector", "DEVICES", "count", "DESCRIPTION", "description", "UPDATED", "updated_at")}
	groupListView = view{items: "groups", cols: groupView.cols}
	shadowView    = view{cols: cols("VERSION", "version", "IN SYNC", "in_sync", "DESIRED", "desired", "REPORTED", "reported", "DELTA", "delta")}
	fleetSetView  = view{cols: cols("MATCHED", "matched", "CHANGED", "changed")}
	// rolloutSetView is a desired change rolled out: the action to watch.
	rolloutSetView = view{cols: cols("MATCHED", "matched", "ACTION", "action_id")}
)

// shadowCmd reads and changes devices' shadows (docs/twin.md).
func (a *app) shadowCmd() *cobra.Command {
	get := &cobra.Command{
		Use:               "get ID",
		Short:             "Show a device's shadow: desired, reported, the delta, the version",
		Args:              exactArgs(1),
		ValidArgsFunction: a.completeDevices,
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.get(cmd, "/api/v1/devices/"+esc(args[0])+"/shadow", nil, shadowView)
		},
	}
	diff := &cobra.Command{
		Use:               "diff ID",
		Short:             "Show where a device differs from its desired state: the delta alone",
		Long:              "Prints the delta of the device's shadow: the desired keys whose values the\nreported state does not have; {} when the device is in sync. YAML, or JSON\nwith -o json.",
		Args:              exactArgs(1),
		ValidArgsFunction: a.completeDevices,
		RunE: func(cmd *cobra.Command, args []string) error {
			if a.output == "edn" {
				return usagef("shadow diff prints YAML or JSON")
			}
			c, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			body, err := c.call(cmd.Context(), request{method: "GET", path: "/api/v1/devices/" + esc(args[0]) + "/shadow"})
			if err != nil {
				return err
			}
			var sh struct {
				Delta json.RawMessage `json:"delta"`
			}
			if err := json.Unmarshal(body, &sh); err != nil {
				return fmt.Errorf("the server's answer is not a shadow: %w", err)
			}
			return a.print(sh.Delta, view{})
		},
	}
	var version int64
	var groupName, scheduleFile, timeout string
	var phases []string
	set := &cobra.Command{
		Use:   "set {ID | --group NAME} KEY=VALUE...",
		Short: "Merge values into a device's desired state; KEY=null removes a key",
		Long: "Merges KEY=VALUE pairs into the desired state as a JSON merge patch. A VALUE\n" +
			"that reads as JSON (10, true, \"text\", {\"a\":1}) is that value, any other is a\n" +
			"string; null removes the key. A dotted KEY (log.level=debug) sets a key of a\n" +
			"nested object. With --version the change is refused (409) unless the shadow\nis at that version. With --group, every device of the group is changed, in\none transaction, and the numbers matched and changed are shown. With --group\nand --phase or --schedule (as 'actions dispatch' takes them), the change rolls\nout in phases instead: a desired_state action, shown to watch with\n'fleetctl actions watch', changes each phase's devices when it triggers and\ncounts a device Completed once it reports the values (docs/twin.md).",
		Example:           "  fleetctl shadow set pump-1 interval=10 log.level=debug\n  fleetctl shadow set pump-1 log=null --version 4\n  fleetctl shadow set --group berlin interval=30\n  fleetctl shadow set --group berlin interval=30 --phase 'canary 10%' --phase 'rest 100% trigger=manual'",
		Args:              rangeArgs(1, 1000),
		ValidArgsFunction: a.completeDevices,
		RunE: func(cmd *cobra.Command, args []string) error {
			if groupName != "" {
				if cmd.Flags().Changed("version") {
					return usagef("--version is for one device; a change of a group's devices takes none")
				}
				patch, err := desiredPatch(args)
				if err != nil {
					return err
				}
				body := map[string]any{"search_type": "group", "group": groupName, "desired": patch}
				sched, err := a.schedule(nil, scheduleFile, phases, "", "", "")
				if err != nil {
					return err
				}
				if timeout != "" {
					if sched == nil {
						return usagef("--timeout goes with --phase or --schedule")
					}
					secs, err := seconds(timeout)
					if err != nil {
						return usagef("--timeout: %v", err)
					}
					body["timeout"] = secs
				}
				if sched == nil {
					return a.show(cmd, request{method: "PATCH", path: "/api/v1/shadows", body: body}, fleetSetView)
				}
				body["schedule"] = sched
				return a.show(cmd, request{method: "PATCH", path: "/api/v1/shadows", body: body}, rolloutSetView)
			}
			if len(phases) > 0 || scheduleFile != "" || timeout != "" {
				return usagef("--phase, --schedule and --timeout roll a change of a --group out")
			}
			if len(args) < 2 {
				return usagef("set needs a device ID and KEY=VALUE pairs, or --group NAME and the pairs")
			}
			patch, err := desiredPatch(args[1:])
			if err != nil {
				return err
			}
			body := map[string]any{"desired": patch}
			if cmd.Flags().Changed("version") {
				body["version"] = version
			}
			return a.show(cmd, request{method: "PATCH", path: "/api/v1/devices/" + esc(args[0]) + "/shadow", body: body}, shadowView)
		},
	}
	set.Flags().Int64Var(&version, "version", 0, "the `VERSION` the change is made from")
	set.Flags().StringVar(&groupName, "group", "", "change every device of the group `NAME` instead of one")
	set.Flags().StringArrayVar(&phases, "phase", nil, "with --group: a rollout phase, 'NAME SELECTION [KEY=VALUE]...' as 'actions dispatch' takes it; repeatable, in order")
	set.Flags().StringVar(&scheduleFile, "schedule", "", "with --group: JSON or YAML `FILE` with the rollout's schedule")
	set.Flags().StringVar(&timeout, "timeout", "", "with a rollout: how long a released device has to report the values before it fails: seconds, or a `DURATION` such as 10m")
	return group("shadow", "Read and change devices' shadows: desired and reported state, and the delta", get, set, diff)
}

// desiredPatch builds a merge patch from KEY=VALUE arguments.
func desiredPatch(pairs []string) (map[string]any, error) {
	patch := map[string]any{}
	for _, p := range pairs {
		k, raw, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, usagef("want KEY=VALUE, got %q", p)
		}
		var v any
		if err := json.Unmarshal([]byte(raw), &v); err != nil {
			v = raw
		}
		m := patch
		path := strings.Split(k, ".")
		for _, seg := range path[:len(path)-1] {
			next, ok := m[seg].(map[string]any)
			if !ok {
				next = map[string]any{}
				m[seg] = next
			}
			m = next
		}
		m[path[len(path)-1]] = v
	}
	return patch, nil
}

// groupsCmd manages groups (docs/twin.md).
func (a *app) groupsCmd() *cobra.Command {
	list := a.listCmd("List groups, each with the number of its devices now", "/api/v1/groups", groupListView, func(url.Values) error { return nil })
	get := &cobra.Command{
		Use:   "get NAME",
		Short: "Show a group with the number of its devices now",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.get(cmd, "/api/v1/groups/"+esc(args[0]), nil, groupView)
		},
	}
	var description string
	create := &cobra.Command{
		Use:     "create NAME SELECTOR",
		Short:   "Save a group: a label selector over metadata and reported.PATH",
		Example: "  fleetctl groups create berlin-canary 'site=berlin,ring in (canary),reported.fw.version!=2.3.0'",
		Args:    exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.show(cmd, request{method: "POST", path: "/api/v1/groups",
				body: map[string]any{"name": args[0], "selector": args[1], "description": description}}, groupView)
		},
	}
	create.Flags().StringVar(&description, "description", "", "what the group is for")
	update := &cobra.Command{
		Use:   "update NAME SELECTOR",
		Short: "Replace a group's selector (and description)",
		Args:  exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.show(cmd, request{method: "PUT", path: "/api/v1/groups/" + esc(args[0]),
				body: map[string]any{"selector": args[1], "description": description}}, groupView)
		},
	}
	update.Flags().StringVar(&description, "description", "", "what the group is for")
	del := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a group; its devices stay",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.do(cmd, "DELETE", "/api/v1/groups/"+esc(args[0]), nil)
		},
	}
	var dp page
	devices := &cobra.Command{
		Use:   "devices NAME",
		Short: "The devices of a group now",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.get(cmd, "/api/v1/groups/"+esc(args[0])+"/devices", dp.query(url.Values{}), deviceListView)
		},
	}
	dp.flags(devices)
	return group("groups", "Saved selectors whose devices are chosen live", list, get, create, update, del, devices)
}
