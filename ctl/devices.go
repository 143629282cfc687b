package ctl

import (
	"bytes"
	"encoding/csv"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"
)

var (
	deviceView       = view{cols: cols("ID", "id", "METADATA", "metadata", "COMPONENTS", "components", "LAST SEEN", "last_seen_at", "CREATED", "created_at")}
	deviceListView   = view{items: "devices", cols: deviceView.cols}
	createdView      = view{cols: cols("ID", "id", "TOKEN", "token", "METADATA", "metadata")}
	bulkCreatedView  = view{items: "devices", cols: cols("ID", "id", "TOKEN", "token")}
	deviceActionCols = cols("ACTION", "action_id", "DEVICE", "device_id", "TYPE", "type", "ACTION STATUS", "action_status",
		"STATUS", "status", "PHASE", "phase", "PROGRESS", "progress", "ERRORS", "errors", "UPDATED", "updated_at")
	deviceActionsView = view{items: "device_actions", cols: deviceActionCols}
)

// keyValues collects repeated KEY=VALUE flags.
type keyValues map[string]string

func (kv keyValues) String() string { return "" }
func (kv keyValues) Type() string   { return "KEY=VALUE" }
func (kv keyValues) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("want KEY=VALUE, got %q", s)
	}
	kv[k] = v
	return nil
}

func (a *app) devicesCmd() *cobra.Command {
	var search string
	meta := keyValues{}
	list := a.listCmd("List devices, filtered by a search or metadata values", "/api/v1/devices", deviceListView, func(q url.Values) error {
		setIf(q, "search", search)
		for k, v := range meta {
			q.Set("metadata."+k, v)
		}
		return nil
	})
	list.Example = "  fleetctl devices list --search pump --metadata site=berlin"
	list.Flags().StringVar(&search, "search", "", "case-insensitive `TEXT` in the id or any metadata value")
	list.Flags().Var(meta, "metadata", "only devices whose metadata KEY equals VALUE; repeatable (all must match)")

	get := &cobra.Command{
		Use:               "get ID",
		Short:             "Show a device: metadata, installed components, when last seen",
		Args:              exactArgs(1),
		ValidArgsFunction: a.completeDevices,
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.get(cmd, "/api/v1/devices/"+esc(args[0]), nil, deviceView)
		},
	}

	createMeta := keyValues{}
	var file string
	create := &cobra.Command{
		Use:   "create [ID] [--metadata KEY=VALUE]... | create --file FILE",
		Short: "Provision a device, or many from a CSV or JSON file; tokens are shown this once",
		Long: `Provisions one device (its id generated when not given) or, with --file, up
to 100,000 in one transaction: all or none. The file is CSV with a header
row whose column id is the device id and whose other columns are metadata
keys (an empty cell sets no key), or JSON (or YAML): a list of
{"id", "metadata"} objects, or {"devices": [...]} as the API takes. - reads
standard input. Each device's token is shown this once.`,
		Example: "  fleetctl devices create pump-1 --metadata site=berlin --metadata model=x1\n  fleetctl devices create --file devices.csv -o json > tokens.json",
		Args:    rangeArgs(0, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if file != "" {
				if len(args) > 0 || len(createMeta) > 0 {
					return usagef("--file provisions the devices it lists: give no ID nor --metadata with it")
				}
				devs, err := a.readDevices(file)
				if err != nil {
					return err
				}
				return a.show(cmd, request{method: "POST", path: "/api/v1/devices/bulk", body: map[string]any{"devices": devs}}, bulkCreatedView)
			}
			body := map[string]any{}
			if len(args) == 1 {
				body["id"] = args[0]
			}
			if len(createMeta) > 0 {
				body["metadata"] = createMeta
			}
			return a.show(cmd, request{method: "POST", path: "/api/v1/devices", body: body}, createdView)
		},
	}
	create.Flags().Var(createMeta, "metadata", "metadata KEY=VALUE; repeatable")
	create.Flags().StringVarP(&file, "file", "f", "", "CSV or JSON `FILE` of devices to provision at once (- for standard input)")

	set := keyValues{}
	var unset []string
	patch := &cobra.Command{
		Use:               "patch ID [--set KEY=VALUE]... [--unset KEY]...",
		Short:             "Set or remove metadata keys of a device; the others stay",
		Args:              exactArgs(1),
		ValidArgsFunction: a.completeDevices,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(set) == 0 && len(unset) == 0 {
				return usagef("patch changes nothing without --set or --unset")
			}
			m := map[string]any{}
			for k, v := range set {
				m[k] = v
			}
			for _, k := range unset {
				m[k] = nil
			}
			return a.show(cmd, request{method: "PATCH", path: "/api/v1/devices/" + esc(args[0]), body: map[string]any{"metadata": m}}, deviceView)
		},
	}
	patch.Flags().Var(set, "set", "metadata KEY=VALUE to set; repeatable")
	patch.Flags().StringArrayVar(&unset, "unset", nil, "metadata `KEY` to remove; repeatable")

	del := &cobra.Command{
		Use:               "delete ID...",
		Short:             "Delete devices with their records",
		Args:              rangeArgs(1, 1000),
		ValidArgsFunction: a.completeDevices,
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, id := range args {
				if err := a.do(cmd, "DELETE", "/api/v1/devices/"+esc(id), nil); err != nil {
					return err
				}
				fmt.Fprintf(a.env.Stdout, "deleted device %s\n", id)
			}
			return nil
		},
	}

	token := &cobra.Command{
		Use:               "rotate-token ID",
		Short:             "Give a device a new token (shown this once); the old one stops working",
		Args:              exactArgs(1),
		ValidArgsFunction: a.completeDevices,
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.show(cmd, request{method: "POST", path: "/api/v1/devices/" + esc(args[0]) + "/token"}, view{cols: cols("TOKEN", "token")})
		},
	}

	cert := &cobra.Command{
		Use:               "certificate ID",
		Short:             "Issue a device a client certificate for MQTT over TLS; its key is shown this once",
		Long:              "Issues the device a client certificate for mutual TLS (its previous one stops\nworking) and prints the CA certificate, the device certificate and its\nprivate key (YAML unless -o says otherwise).",
		Args:              exactArgs(1),
		ValidArgsFunction: a.completeDevices,
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.show(cmd, request{method: "POST", path: "/api/v1/devices/" + esc(args[0]) + "/certificate"}, view{})
		},
	}
	uplink := &cobra.Command{
		Use:               "uplink-config ID",
		Short:             "Issue a device a certificate inside a complete uplink agent device file",
		Long:              "Issues the device a client certificate as 'certificate' does, inside a\ncomplete device file of the uplink agent. -o json writes the file uplink -a\nreads:\n  fleetctl devices uplink-config pump-1 -o json > device.json",
		Args:              exactArgs(1),
		ValidArgsFunction: a.completeDevices,
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.show(cmd, request{method: "POST", path: "/api/v1/devices/" + esc(args[0]) + "/uplink-config"}, view{})
		},
	}

	var ap page
	var sortBy, order, status, typ string
	actions := &cobra.Command{
		Use:               "actions ID",
		Short:             "A device's actions with their status, sorted and filtered",
		Example:           "  fleetctl devices actions pump-1 --sort-by updated_at --order asc --status Failed",
		Args:              exactArgs(1),
		ValidArgsFunction: a.completeDevices,
		RunE: func(cmd *cobra.Command, args []string) error {
			q := url.Values{}
			setIf(q, "sort_by", sortBy)
			setIf(q, "sort_order", order)
			setIf(q, "action_status", status)
			setIf(q, "type", typ)
			return a.get(cmd, "/api/v1/devices/"+esc(args[0])+"/actions", ap.query(q), deviceActionsView)
		},
	}
	actions.Flags().StringVar(&sortBy, "sort-by", "", "`FIELD`: action_id (default), type, status, user_email, user_name, updated_at or errors")
	actions.Flags().StringVar(&order, "order", "", "desc (default) or asc")
	actions.Flags().StringVar(&status, "status", "", "only device actions of this action_status (Queued, Initiated, Progress, Completed, Failed, Cancelled, Scheduled)")
	actions.Flags().StringVar(&typ, "type", "", "only actions of this `NAME`")
	actions.RegisterFlagCompletionFunc("sort-by", cobra.FixedCompletions([]string{"action_id", "type", "status", "user_email", "user_name", "updated_at", "errors"}, cobra.ShellCompDirectiveNoFileComp))
	actions.RegisterFlagCompletionFunc("order", cobra.FixedCompletions([]string{"asc", "desc"}, cobra.ShellCompDirectiveNoFileComp))
	actions.RegisterFlagCompletionFunc("status", completeStatuses)
	ap.flags(actions)

	return group("devices", "Provision, list, change and delete devices; their actions and credentials",
		list, get, create, patch, del, token, cert, uplink, actions)
}

func setIf(q url.Values, k, v string) {
	if v != "" {
		q.Set(k, v)
	}
}

// do makes a request whose answer is not shown (a delete, say).
func (a *app) do(cmd *cobra.Command, method, path string, body any) error {
	c, err := a.connect(cmd.Context())
	if err != nil {
		return err
	}
	_, err = c.call(cmd.Context(), request{method: method, path: path, body: body})
	return err
}

// readInput reads a file argument; - is standard input.
func (a *app) readInput(name string) ([]byte, error) {
	if name == "-" {
		return readAllLimited(a.env.Stdin, 256<<20)
	}
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, usagef("%v", err)
	}
	return b, nil
}

// readDoc reads a JSON or YAML file into a value to send as JSON.
func (a *app) readDoc(name string) (any, error) {
	b, err := a.readInput(name)
	if err != nil {
		return nil, err
	}
	var v any
	if err := yaml.Unmarshal(b, &v); err != nil {
		return nil, usagef("%s: neither JSON nor YAML: %v", name, err)
	}
	if v == nil {
		return nil, usagef("%s is empty", name)
	}
	return v, nil
}

// readDevices reads the devices to provision: CSV with a header row, or
// JSON/YAML.
func (a *app) readDevices(name string) ([]any, error) {
	b, err := a.readInput(name)
	if err != nil {
		return nil, err
	}
	trimmed := bytes.TrimSpace(b)
	if len(trimmed) > 0 && (trimmed[0] == '[' || trimmed[0] == '{' || strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml")) {
		var v any
		if err := yaml.Unmarshal(b, &v); err != nil {
			return nil, usagef("%s: %v", name, err)
		}
		if m, ok := v.(map[string]any); ok {
			v = m["devices"]
		}
		list, ok := v.([]any)
		if !ok {
			return nil, usagef("%s: want a list of devices, or {\"devices\": [...]}", name)
		}
		return list, nil
	}
	r := csv.NewReader(bytes.NewReader(b))
	head, err := r.Read()
	if err != nil {
		return nil, usagef("%s: no CSV header row: %v", name, err)
	}
	idCol := -1
	for i, h := range head {
		// Spreadsheets write a byte order mark before the first header.
		head[i] = strings.TrimSpace(strings.TrimPrefix(h, "\ufeff"))
		if head[i] == "id" {
			idCol = i
		}
	}
	if idCol < 0 {
		return nil, usagef("%s: the CSV header row has no column id", name)
	}
	var devs []any
	for {
		rec, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, usagef("%s: %v", name, err)
		}
		d := map[string]any{"id": rec[idCol]}
		meta := map[string]string{}
		for i, v := range rec {
			if i != idCol && v != "" {
				meta[head[i]] = v
			}
		}
		if len(meta) > 0 {
			d["metadata"] = meta
		}
		devs = append(devs, d)
	}
	if len(devs) == 0 {
		return nil, usagef("%s lists no device", name)
	}
	return devs, nil
}

// completeDevices completes device ids from the server.
func (a *app) completeDevices(cmd *cobra.Command, _ []string, prefix string) ([]string, cobra.ShellCompDirective) {
	var list struct {
		Devices []struct{ ID string } `json:"devices"`
	}
	if !a.complete(cmd, "/api/v1/devices", url.Values{"search": {prefix}, "limit": {"1000"}}, &list) {
		return nil, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveError
	}
	var ids []string
	for _, d := range list.Devices {
		if strings.HasPrefix(d.ID, prefix) {
			ids = append(ids, d.ID)
		}
	}
	return ids, cobra.ShellCompDirectiveNoFileComp
}

// complete reads a list for shell completion, quietly.
func (a *app) complete(cmd *cobra.Command, path string, q url.Values, v any) bool {
	c, err := a.connect(cmd.Context())
	if err != nil {
		return false
	}
	return c.getJSON(cmd.Context(), path, q, v) == nil
}

func completeStatuses(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return []string{"Scheduled", "Queued", "Initiated", "Progress", "Completed", "Failed", "Cancelled"}, cobra.ShellCompDirectiveNoFileComp
}
