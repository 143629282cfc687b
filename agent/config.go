package agent

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"

	"github.com/fleetd/fleet"
)

// Config is the agent's configuration, built by parseConfig from flags,
// FLEETD_AGENT_* variables and the config file, in that order of precedence.
type Config struct {
	Server   string // fleetd's HTTP base URL
	MQTTAddr string // host:port (plain TCP) or mqtts://host:port (TLS)
	Tenant   string
	Device   string
	Token    string // from FLEETD_AGENT_TOKEN or TokenFile; never a flag

	TokenFile string
	CAFile    string // the CA that verifies fleetd's TLS certificate
	CertFile  string // the device's client certificate (mqtts)
	KeyFile   string

	ActionsDir    string
	ActionTimeout time.Duration
	DownloadDir   string
	InstallHook   string
	RebootHook    string
	// UpdateConfigFile and UpdateConfigHook take update_config's desired
	// state: written to the file, then the hook run.
	UpdateConfigFile string
	UpdateConfigHook string

	LogFile       string
	Journald      bool
	StatsInterval time.Duration
	FlushInterval time.Duration

	Remote        bool
	RemoteShell   string
	RemoteRoot    string
	RemoteMaxFile int64
	RemoteRate    int64 // bytes a second; 0 is no limit
	// RemoteWebSocket dials sessions as WebSockets, never as streams.
	RemoteWebSocket bool

	LogLevel string
}

// envName is the variable that stands for a flag: FLEETD_AGENT_ and the
// flag's name in capitals, dashes as underscores.
func envName(flag string) string {
	return "FLEETD_AGENT_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// tokenEnv holds the device's token. It has no flag: a flag would show the
// token to anyone who can list processes.
const tokenEnv = "FLEETD_AGENT_TOKEN"

func newFlagSet(c *Config) *pflag.FlagSet {
	fs := pflag.NewFlagSet("fleetd-agent", pflag.ContinueOnError)
	fs.SortFlags = false
	fs.String("config", "", "a YAML file of flag names and values (server: https://…); flags and variables win over it")
	fs.StringVar(&c.Server, "server", "", "fleetd's HTTP base URL, such as https://fleet.example.com")
	fs.StringVar(&c.MQTTAddr, "mqtt-addr", "", "fleetd's MQTT listener: HOST:PORT for plain TCP, mqtts://HOST:PORT for TLS")
	fs.StringVar(&c.Tenant, "tenant", "", "the device's tenant")
	fs.StringVar(&c.Device, "device", "", "the device's id")
	fs.StringVar(&c.TokenFile, "token-file", "", "a file holding the device's token (fdt_…), if "+tokenEnv+" is not set")
	fs.StringVar(&c.CAFile, "ca-file", "", "PEM CA certificates that verify fleetd over TLS (default: the system's)")
	fs.StringVar(&c.CertFile, "cert-file", "", "the device's client certificate (PEM) for mqtts; no token is needed with it")
	fs.StringVar(&c.KeyFile, "key-file", "", "the client certificate's private key (PEM)")
	fs.StringVar(&c.ActionsDir, "actions-dir", "", "a directory of executables, one per action name, run with the action's params as JSON on stdin")
	fs.DurationVar(&c.ActionTimeout, "action-timeout", time.Hour, "how long an action's program may run before it is killed and the action fails")
	fs.StringVar(&c.DownloadDir, "download-dir", "/var/lib/fleetd-agent/downloads", "where update_firmware keeps downloads (partial ones resume)")
	fs.StringVar(&c.InstallHook, "install-hook", "", "the command update_firmware runs for each component, such as 'swupdate -i {file}' or 'rauc install {file}'; {file}, {component} and {version} are replaced (no shell)")
	fs.StringVar(&c.RebootHook, "reboot-hook", "", "the command the reboot action runs, such as 'systemctl reboot'")
	fs.StringVar(&c.UpdateConfigFile, "update-config-file", "", "where update_config writes the twin's desired state (JSON), replacing the file whole")
	fs.StringVar(&c.UpdateConfigHook, "update-config-hook", "", "the command update_config runs after writing the file (the desired state on its stdin; {file} is replaced by --update-config-file), such as 'systemctl reload app'")
	fs.StringVar(&c.LogFile, "log-file", "", "a file whose new lines go to the logs stream (followed as it grows and rotates)")
	fs.BoolVar(&c.Journald, "journald", false, "send the journal (journalctl -f -o json) to the logs stream")
	fs.DurationVar(&c.StatsInterval, "stats-interval", 0, "how often to send system statistics (uplink_system_stats); 0 sends none")
	fs.DurationVar(&c.FlushInterval, "flush-interval", time.Second, "how long stream points wait to be sent together")
	fs.BoolVar(&c.Remote, "remote", false, "allow remote sessions (a shell, port forwards, file transfers) that fleetd's operators open; off unless given. Needs --server and a token")
	fs.StringVar(&c.RemoteShell, "remote-shell", "/bin/sh", "the shell of remote sessions: on a pty for a terminal, with -c for a command")
	fs.StringVar(&c.RemoteRoot, "remote-root", "/", "the directory remote sessions start in, and outside of which files cannot be got or put")
	fs.Int64Var(&c.RemoteMaxFile, "remote-max-file-bytes", 100<<20, "the largest file a remote session may get or put")
	fs.Int64Var(&c.RemoteRate, "remote-rate", 0, "bytes a second at most for a file got or put (0: no limit)")
	fs.BoolVar(&c.RemoteWebSocket, "remote-websocket", false, "dial remote sessions back as WebSockets, not streams (for a proxy before fleetd that passes no other upgrade)")
	fs.StringVar(&c.LogLevel, "log-level", "info", "debug, info, warn or error")
	return fs
}

// usage is --help's text.
func usage(fs *pflag.FlagSet) string {
	return `fleetd-agent runs on a device and connects it to fleetd over MQTT, as
docs/device-protocol.md describes: it runs the actions fleetd sends and
reports their progress, and sends the device's logs and statistics.

Usage: fleetd-agent --mqtt-addr HOST:PORT --tenant T --device D [flags]

The token comes from ` + tokenEnv + ` or --token-file (or a client certificate
over mqtts). Every flag may also be set by a variable, FLEETD_AGENT_ and the
flag's name in capitals with underscores (FLEETD_AGENT_MQTT_ADDR), or in the
--config file; a flag wins over a variable, a variable over the file.

Actions: fleetd's action NAME runs --actions-dir/NAME with the params on
stdin. A line "progress N" on its stdout reports N percent; exit status 0
completes the action, any other fails it with the end of its stderr.
--action-timeout or a cancellation kills its process group. Built in:
update_firmware (download, checksums, then --install-hook per component),
reboot (--reboot-hook) and update_config (the twin's desired state to
--update-config-file, then --update-config-hook). See docs/agent.md.

Flags:
` + fs.FlagUsages()
}

var errHelp = errors.New("help requested")

// parseConfig builds the configuration from args, getenv and the config
// file, and checks it.
func parseConfig(args []string, getenv func(string) string) (*Config, *pflag.FlagSet, error) {
	c := &Config{}
	fs := newFlagSet(c)
	fs.Usage = func() {}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil, fs, errHelp
		}
		return nil, fs, err
	}
	if fs.NArg() > 0 {
		return nil, fs, fmt.Errorf("unexpected argument %q: fleetd-agent takes flags only", fs.Arg(0))
	}
	var file map[string]any
	path, _ := fs.GetString("config")
	if path == "" {
		path = getenv(envName("config"))
	}
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fs, fmt.Errorf("config file: %w", err)
		}
		if err := yaml.Unmarshal(b, &file); err != nil {
			return nil, fs, fmt.Errorf("config file %s: %w", path, err)
		}
		for name := range file {
			if fs.Lookup(name) == nil || name == "config" {
				return nil, fs, fmt.Errorf("config file %s: %q is not a flag of fleetd-agent", path, name)
			}
		}
	}
	var bad error
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed || bad != nil {
			return
		}
		from, v := envName(f.Name), getenv(envName(f.Name))
		if v == "" {
			raw, ok := file[f.Name]
			if !ok || raw == nil {
				return
			}
			from, v = path+": "+f.Name, fmt.Sprint(raw)
		}
		if err := f.Value.Set(v); err != nil {
			bad = fmt.Errorf("%s: %v", from, err)
		}
	})
	if bad != nil {
		return nil, fs, bad
	}
	c.Token = getenv(tokenEnv)
	if c.Token == "" && c.TokenFile != "" {
		b, err := os.ReadFile(c.TokenFile)
		if err != nil {
			return nil, fs, fmt.Errorf("token file: %w", err)
		}
		c.Token = strings.TrimSpace(string(b))
	}
	return c, fs, c.check()
}

// check reports the first thing that keeps the configuration from working,
// in words that say what to set.
func (c *Config) check() error {
	switch {
	case c.MQTTAddr == "":
		return errors.New("no --mqtt-addr: say where fleetd's MQTT listener is (HOST:PORT, or mqtts://HOST:PORT)")
	case !fleet.ValidTenantName(c.Tenant):
		return fmt.Errorf("--tenant %q is not a tenant name", c.Tenant)
	case !fleet.ValidDeviceID(c.Device):
		return fmt.Errorf("--device %q is not a device id", c.Device)
	case c.Token == "" && c.CertFile == "":
		return errors.New("no credentials: set " + tokenEnv + ", --token-file, or --cert-file and --key-file over mqtts")
	case (c.CertFile == "") != (c.KeyFile == ""):
		return errors.New("--cert-file and --key-file go together")
	case c.CertFile != "" && !strings.HasPrefix(c.MQTTAddr, "mqtts://"):
		return errors.New("a client certificate needs TLS: give --mqtt-addr as mqtts://HOST:PORT")
	case c.ActionTimeout <= 0:
		return errors.New("--action-timeout must be positive")
	case c.FlushInterval <= 0:
		return errors.New("--flush-interval must be positive")
	case c.StatsInterval < 0:
		return errors.New("--stats-interval must not be negative")
	case c.Remote && (c.Server == "" || c.Token == ""):
		return errors.New("--remote needs --server (the device dials fleetd back there) and the device's token")
	case c.RemoteMaxFile < 0 || c.RemoteRate < 0:
		return errors.New("--remote-max-file-bytes and --remote-rate must not be negative")
	}
	if c.Server != "" {
		u, err := url.Parse(c.Server)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("--server %q is not an http or https URL", c.Server)
		}
	}
	return nil
}
