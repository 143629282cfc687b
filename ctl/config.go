package ctl

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"
)

// Config is the file of named contexts, as kubectl keeps its kubeconfig.
type Config struct {
	CurrentContext string          `yaml:"current-context"`
	Contexts       []ConfigContext `yaml:"contexts"`
}

// ConfigContext is one server, tenant and key under a name.
type ConfigContext struct {
	Name   string `yaml:"name"`
	URL    string `yaml:"url"`
	Tenant string `yaml:"tenant"`
	APIKey string `yaml:"api-key"`
	CAFile string `yaml:"ca-file,omitempty"`
}

func (c *Config) find(name string) *ConfigContext {
	for i := range c.Contexts {
		if c.Contexts[i].Name == name {
			return &c.Contexts[i]
		}
	}
	return nil
}

// configPath is $XDG_CONFIG_HOME/fleetctl/config, or under ~/.config when
// the variable is unset, as the XDG base directory specification says.
func (a *app) configPath() (string, error) {
	dir := a.env.Getenv("XDG_CONFIG_HOME")
	if dir == "" {
		home := a.env.Getenv("HOME")
		if home == "" {
			return "", usagef("neither XDG_CONFIG_HOME nor HOME is set: fleetctl cannot find its config file")
		}
		dir = filepath.Join(home, ".config")
	}
	return filepath.Join(dir, "fleetctl", "config"), nil
}

func (a *app) loadConfig() (*Config, string, error) {
	path, err := a.configPath()
	if err != nil {
		return nil, "", err
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &Config{}, path, nil
	}
	if err != nil {
		return nil, path, err
	}
	var c Config
	if err := yaml.Unmarshal(b, &c); err != nil {
		return nil, path, fmt.Errorf("%s: %w", path, err)
	}
	return &c, path, nil
}

// saveConfig writes the file whole, through a private temporary file
// renamed over the old one: it holds keys, so it is never readable by
// others, not even for a moment.
func saveConfig(path string, c *Config) error {
	b, err := yaml.Marshal(c)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".config-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// target is where and as whom requests go.
type target struct {
	URL, Tenant, APIKey, CAFile string
}

// resolve merges flags, FLEETCTL_* variables and the context, in that order.
func (a *app) resolve() (target, error) {
	cfg, path, err := a.loadConfig()
	if err != nil {
		return target{}, err
	}
	var ctx ConfigContext
	name := a.contextName
	if name == "" {
		name = cfg.CurrentContext
	}
	if name != "" {
		c := cfg.find(name)
		if c == nil {
			return target{}, usagef("no context %q in %s (fleetctl config get-contexts lists them)", name, path)
		}
		ctx = *c
	}
	pick := func(flag, env, fromContext string) string {
		if flag != "" {
			return flag
		}
		if v := a.env.Getenv(env); v != "" {
			return v
		}
		return fromContext
	}
	t := target{
		URL:    pick(a.url, "FLEETCTL_URL", ctx.URL),
		Tenant: pick(a.tenant, "FLEETCTL_TENANT", ctx.Tenant),
		APIKey: pick(a.apiKey, "FLEETCTL_API_KEY", ctx.APIKey),
		CAFile: pick(a.caFile, "FLEETCTL_CA_FILE", ctx.CAFile),
	}
	if t.URL == "" || t.Tenant == "" || t.APIKey == "" {
		return t, usagef("no server to talk to: run 'fleetctl login --url URL --tenant TENANT', or set FLEETCTL_URL, FLEETCTL_TENANT and FLEETCTL_API_KEY")
	}
	return t, nil
}

const loginLong = `Stores a context (a server URL, a tenant and an API key under a name) in
$XDG_CONFIG_HOME/fleetctl/config, mode 0600, and makes it the current one.
The key is checked first with a request that any valid key may make.
The key comes from FLEETCTL_API_KEY or, on a terminal, from a prompt that
does not echo it; --api-key - reads it from standard input. Each keeps it
out of the shell's history and out of ps, where --api-key KEY shows it.`

func (a *app) loginCmd() *cobra.Command {
	var name string
	var noCheck bool
	c := &cobra.Command{
		Use:   "login --url URL --tenant TENANT",
		Short: "Store a named context (server, tenant, key) and make it current",
		Long:  loginLong,
		Example: "  fleetctl login --url https://fleet.example.com --tenant acme --name acme-prod   # asks for the key\n" +
			"  FLEETCTL_API_KEY=\"$KEY\" fleetctl login --url https://fleet.example.com --tenant acme\n" +
			"  fleetctl login --url https://fleet.example.com --tenant acme --api-key - < key.txt",
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if a.url == "" || a.tenant == "" {
				return usagef("login needs --url and --tenant")
			}
			u, err := url.Parse(a.url)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return usagef("--url %q: want http://host:port or https://host", a.url)
			}
			key, err := a.loginKey()
			if err != nil {
				return err
			}
			if name == "" {
				name = a.tenant + "@" + u.Host
			}
			caFile := a.caFile
			if caFile != "" {
				// The context is used from any directory.
				if caFile, err = filepath.Abs(caFile); err != nil {
					return err
				}
			}
			nc := ConfigContext{Name: name, URL: strings.TrimRight(a.url, "/"), Tenant: a.tenant, APIKey: key, CAFile: caFile}
			if !noCheck {
				cl, err := newClient(target{URL: nc.URL, Tenant: nc.Tenant, APIKey: nc.APIKey, CAFile: nc.CAFile})
				if err != nil {
					return err
				}
				if err := cl.check(cmd.Context()); err != nil {
					return err
				}
			}
			cfg, path, err := a.loadConfig()
			if err != nil {
				return err
			}
			if c := cfg.find(name); c != nil {
				*c = nc
			} else {
				cfg.Contexts = append(cfg.Contexts, nc)
			}
			cfg.CurrentContext = name
			if err := saveConfig(path, cfg); err != nil {
				return err
			}
			fmt.Fprintf(a.env.Stdout, "logged in to %s as tenant %s; context %q is current (%s)\n", nc.URL, nc.Tenant, name, path)
			return nil
		},
	}
	c.Flags().StringVar(&name, "name", "", "the context's `NAME` (default TENANT@HOST)")
	c.Flags().BoolVar(&noCheck, "no-check", false, "store the context without checking the key")
	return c
}

// loginKey is the key to log in with: --api-key (- reads standard
// input), else FLEETCTL_API_KEY, else what is typed at a prompt that does
// not echo it.
func (a *app) loginKey() (string, error) {
	key := a.apiKey
	switch {
	case key == "-":
		b, err := readAllLimited(a.env.Stdin, 4096)
		if err != nil {
			return "", err
		}
		key = string(b)
	case key == "":
		key = a.env.Getenv("FLEETCTL_API_KEY")
	}
	if key == "" && a.env.ReadSecret != nil {
		var err error
		if key, err = a.env.ReadSecret("API key for tenant " + a.tenant + ": "); err != nil {
			return "", err
		}
	}
	if key = strings.TrimSpace(key); key == "" {
		return "", usagef("login needs an API key: set FLEETCTL_API_KEY, type it when asked on a terminal, or pipe it in with --api-key -")
	}
	return key, nil
}

func (a *app) configCmd() *cobra.Command {
	getContexts := &cobra.Command{
		Use:   "get-contexts",
		Short: "List the contexts of the config file; * marks the current one",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, _, err := a.loadConfig()
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(a.env.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "CURRENT\tNAME\tURL\tTENANT")
			for _, c := range cfg.Contexts {
				cur := ""
				if c.Name == cfg.CurrentContext {
					cur = "*"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", cur, c.Name, c.URL, c.Tenant)
			}
			return tw.Flush()
		},
	}
	useContext := a.contextCmd("use-context NAME", "Make a context the current one", func(cfg *Config, name string) {
		cfg.CurrentContext = name
	})
	deleteContext := a.contextCmd("delete-context NAME", "Remove a context, and its key, from the config file", func(cfg *Config, name string) {
		kept := cfg.Contexts[:0]
		for _, c := range cfg.Contexts {
			if c.Name != name {
				kept = append(kept, c)
			}
		}
		cfg.Contexts = kept
		if cfg.CurrentContext == name {
			cfg.CurrentContext = ""
		}
	})
	return group("config", "Show and change the contexts of the config file", getContexts, useContext, deleteContext)
}

// contextCmd makes a command that changes the config file by the name of
// one of its contexts.
func (a *app) contextCmd(use, short string, change func(cfg *Config, name string)) *cobra.Command {
	return &cobra.Command{
		Use:               use,
		Short:             short,
		Args:              exactArgs(1),
		ValidArgsFunction: a.completeContexts,
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, path, err := a.loadConfig()
			if err != nil {
				return err
			}
			if cfg.find(args[0]) == nil {
				return usagef("no context %q in %s", args[0], path)
			}
			change(cfg, args[0])
			return saveConfig(path, cfg)
		},
	}
}

func (a *app) completeContexts(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	cfg, _, err := a.loadConfig()
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	var names []string
	for _, c := range cfg.Contexts {
		names = append(names, c.Name)
	}
	sort.Strings(names)
	return names, cobra.ShellCompDirectiveNoFileComp
}

// connect resolves the target and makes the client, once.
func (a *app) connect(ctx context.Context) (*client, error) {
	if a.client != nil {
		return a.client, nil
	}
	t, err := a.resolve()
	if err != nil {
		return nil, err
	}
	c, err := newClient(t)
	if err != nil {
		return nil, err
	}
	a.client = c
	return c, nil
}
