package ctl

import (
	"fmt"
	"net/url"
	"time"

	"github.com/spf13/cobra"
)

var (
	apiKeyCols    = cols("NAME", "name", "ROLE", "role", "EMAIL", "user_email", "KEY", "key", "CREATED", "created_at")
	tenantAuthCol = cols("METHOD", "method", "JWKS URL", "jwks_url", "ISSUER", "issuer", "AUDIENCE", "audience", "WEBHOOK URL", "webhook_url",
		"DEFAULT ROLE", "default_role", "UPDATED", "updated_at")
	ddiSettingsCols = cols("REQUIRE CONFIRMATION", "require_confirmation", "GATEWAY REGISTRATION", "gateway_registration")
	auditCols       = cols("ID", "id", "AT", "created_at", "ACTOR", "actor", "ROLE", "role", "ACTION", "action", "TARGET", "target", "DETAILS", "details")
)

func (a *app) apikeysCmd() *cobra.Command {
	var role, email string
	create := &cobra.Command{
		Use:     "create NAME --role ROLE [--email EMAIL]",
		Short:   "Create an API key; its secret is shown this once",
		Example: "  fleetctl apikeys create dashboard --role viewer --email ops@example.com",
		Args:    exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if role == "" {
				return usagef("apikeys create needs --role: viewer, device, operator or admin")
			}
			b := map[string]any{"name": args[0], "role": role}
			if email != "" {
				b["user_email"] = email
			}
			return a.show(cmd, request{method: "POST", path: "/api/v1/apikeys", body: b}, view{cols: apiKeyCols})
		},
	}
	create.Flags().StringVar(&role, "role", "", "viewer, device, operator or admin")
	create.Flags().StringVar(&email, "email", "", "who holds the key, shown as user_email on what it does")
	create.RegisterFlagCompletionFunc("role", cobra.FixedCompletions([]string{"viewer", "device", "operator", "admin"}, cobra.ShellCompDirectiveNoFileComp))

	list := a.listCmd("List API keys, without their secrets", "/api/v1/apikeys", view{items: "apikeys", cols: apiKeyCols[:3:3]}, nil)
	del := a.idCmd("delete NAME", "Delete an API key; it is refused from then on", nil, func(cmd *cobra.Command, name string) error {
		if err := a.do(cmd, "DELETE", "/api/v1/apikeys/"+esc(name), nil); err != nil {
			return err
		}
		fmt.Fprintf(a.env.Stdout, "deleted API key %s\n", name)
		return nil
	})
	return group("apikeys", "The tenant's API keys (admin)", create, list, del)
}

func (a *app) tenantCmd() *cobra.Command {
	path := func() (string, error) { return a.tenantPath("auth") }
	get := &cobra.Command{
		Use:   "get",
		Short: "Show how the tenant's end users authenticate (S9)",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := path()
			if err != nil {
				return err
			}
			return a.get(cmd, p, nil, view{cols: tenantAuthCol})
		},
	}
	var b body
	var method, jwksURL, issuer, audience, webhookURL, defaultRole string
	set := &cobra.Command{
		Use:   "set (-f FILE | --method jwks --jwks-url URL --issuer ISS --audience AUD | --method webhook --webhook-url URL) [--default-role ROLE]",
		Short: "Set how the tenant's end users authenticate with bearer tokens (S9)",
		Long: `Sets the tenant's end-user authentication: bearer tokens checked against a
JWK Set (jwks), or by a webhook of the tenant's (webhook). The whole
setting is replaced. The tenant is the context's.`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			for k, v := range map[string]string{"method": method, "jwks_url": jwksURL, "issuer": issuer, "audience": audience,
				"webhook_url": webhookURL, "default_role": defaultRole} {
				if v != "" {
					b.set(k, v)
				}
			}
			m, err := a.build(&b)
			if err != nil {
				return err
			}
			p, err := path()
			if err != nil {
				return err
			}
			return a.show(cmd, request{method: "PUT", path: p, body: m}, view{cols: tenantAuthCol})
		},
	}
	b.fileFlag(set, "setting")
	set.Flags().StringVar(&method, "method", "", "jwks or webhook")
	set.Flags().StringVar(&jwksURL, "jwks-url", "", "jwks: the JWK Set's `URL`")
	set.Flags().StringVar(&issuer, "issuer", "", "jwks: the iss every token must carry")
	set.Flags().StringVar(&audience, "audience", "", "jwks: a value the aud of every token must contain")
	set.Flags().StringVar(&webhookURL, "webhook-url", "", "webhook: the `URL` fleetd posts {tenant, token} to")
	set.Flags().StringVar(&defaultRole, "default-role", "", "role of users whose token names none (default viewer)")
	set.RegisterFlagCompletionFunc("method", cobra.FixedCompletions([]string{"jwks", "webhook"}, cobra.ShellCompDirectiveNoFileComp))
	return group("tenant", "The tenant's settings (admin)", group("auth", "How the tenant's end users authenticate (S9)", get, set), a.tenantDDICmd(), a.tenantRemoteCmd())
}

// tenantPath is the path of the context's tenant's setting.
func (a *app) tenantPath(setting string) (string, error) {
	t, err := a.resolve()
	if err != nil {
		return "", err
	}
	return "/api/v1/tenants/" + esc(t.Tenant) + "/" + setting, nil
}

func (a *app) tenantDDICmd() *cobra.Command {
	get := &cobra.Command{
		Use:   "get",
		Short: "Show the tenant's hawkBit DDI settings",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := a.tenantPath("ddi")
			if err != nil {
				return err
			}
			return a.get(cmd, p, nil, view{cols: ddiSettingsCols})
		},
	}
	var confirm, register bool
	set := &cobra.Command{
		Use:   "set [--require-confirmation=true|false] [--gateway-registration=true|false]",
		Short: "Change the tenant's hawkBit DDI settings; those not given stay as they are",
		Example: `  fleetctl tenant ddi set --require-confirmation
  fleetctl tenant ddi set --gateway-registration=false`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			flags := cmd.Flags()
			if !flags.Changed("require-confirmation") && !flags.Changed("gateway-registration") {
				return usagef("tenant ddi set needs --require-confirmation or --gateway-registration")
			}
			p, err := a.tenantPath("ddi")
			if err != nil {
				return err
			}
			c, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			var cur struct {
				RequireConfirmation bool `json:"require_confirmation"`
				GatewayRegistration bool `json:"gateway_registration"`
			}
			if err := c.getJSON(cmd.Context(), p, nil, &cur); err != nil {
				return err
			}
			if flags.Changed("require-confirmation") {
				cur.RequireConfirmation = confirm
			}
			if flags.Changed("gateway-registration") {
				cur.GatewayRegistration = register
			}
			return a.show(cmd, request{method: "PUT", path: p, body: cur}, view{cols: ddiSettingsCols})
		},
	}
	set.Flags().BoolVar(&confirm, "require-confirmation", false, "DDI devices confirm each update before it is handed over (docs/hawkbit.md)")
	set.Flags().BoolVar(&register, "gateway-registration", false, "a gateway's poll for an unknown controller creates the device")
	return group("ddi", "The tenant's hawkBit DDI settings: confirmations, gateway registration", get, set)
}

func (a *app) auditCmd() *cobra.Command {
	var actor, action, since, until string
	list := a.listCmd("Every change made through the API, newest first", "/api/v1/audit-logs", view{items: "audit_logs", cols: auditCols},
		func(q url.Values) error {
			setIf(q, "actor", actor)
			setIf(q, "action", action)
			for k, v := range map[string]string{"since": since, "until": until} {
				if v == "" {
					continue
				}
				t, err := a.when(v)
				if err != nil {
					return usagef("--%s: %v", k, err)
				}
				q.Set(k, t)
			}
			return nil
		})
	list.Example = "  fleetctl audit-logs list --actor deploy-bot --since 24h"
	list.Flags().StringVar(&actor, "actor", "", "only changes by this `ACTOR` (API key name or user name)")
	list.Flags().StringVar(&action, "action", "", "only this `ACTION` (device.update), or every action of this kind (device)")
	list.Flags().StringVar(&since, "since", "", "only changes at or after this `TIME`: RFC 3339, or a duration ago such as 24h")
	list.Flags().StringVar(&until, "until", "", "only changes before this `TIME`: RFC 3339, or a duration ago")
	return group("audit-logs", "The audit log (admin)", list)
}

// when reads an RFC 3339 time, or a duration meaning that long ago.
func (a *app) when(s string) (string, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t.UTC().Format(time.RFC3339Nano), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return "", fmt.Errorf("want an RFC 3339 time or a duration ago such as 24h, got %q", s)
	}
	return a.now().Add(-d).UTC().Format(time.RFC3339Nano), nil
}

func (a *app) streamsCmd() *cobra.Command {
	latest := &cobra.Command{
		Use:               "latest DEVICE STREAM",
		Short:             "A device stream's latest data point",
		Args:              exactArgs(2),
		ValidArgsFunction: a.completeDevices,
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.get(cmd, "/api/v1/devices/"+esc(args[0])+"/streams/"+esc(args[1])+"/latest", nil,
				view{cols: cols("DEVICE", "device_id", "STREAM", "stream", "TIMESTAMP", "timestamp", "SEQUENCE", "sequence", "DATA", "data", "RECEIVED", "received_at")})
		},
	}
	var file string
	ingest := &cobra.Command{
		Use:   "ingest DEVICE STREAM -f FILE",
		Short: "Send data points for a device, as a gateway does (role device)",
		Long: `Sends the data points in FILE (JSON or YAML: a list of objects with
timestamp in epoch milliseconds, sequence and the data fields) to the
device's stream. Usable points are kept when others are refused.`,
		Args:              exactArgs(2),
		ValidArgsFunction: a.completeDevices,
		RunE: func(cmd *cobra.Command, args []string) error {
			if file == "" {
				return usagef("ingest needs -f FILE")
			}
			v, err := a.readDoc(file)
			if err != nil {
				return err
			}
			return a.show(cmd, request{method: "POST", path: "/api/v1/devices/" + esc(args[0]) + "/streams/" + esc(args[1]), body: v},
				view{cols: cols("ACCEPTED", "accepted", "REJECTED", "rejected", "ERRORS", "errors")})
		},
	}
	ingest.Flags().StringVarP(&file, "file", "f", "", "JSON or YAML `FILE` with the points (- for standard input)")
	return group("streams", "Device data streams: the latest point, ingest, and the history kept: streams, points, aggregates", append([]*cobra.Command{latest, ingest}, a.historyCmds()...)...)
}
