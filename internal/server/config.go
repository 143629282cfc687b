package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/blob"
	fleethttp "github.com/fleetd/fleet/http"
	"github.com/fleetd/fleet/internal/cli"
	"github.com/fleetd/fleet/notify"
	"github.com/fleetd/fleet/remote/relay"
	"github.com/fleetd/fleet/sqlstore"
)

// Config is everything fleetd serve can be told, from defaults, flags and
// the environment, in that order of weakness; Serve reads it.
type Config struct {
	database  string
	httpAddr  string
	mqttAddr  string
	dataDir   string
	blobStore string
	logLevel  string
	logFormat string
	maxBody   int64
	maxBulk   int64
	maxUpload int64
	maxDecode int64 // bytes of request bodies decoded at once
	maxHeld   int64 // bytes of request bodies held at once while they arrive

	remote     relay.Limits // remote sessions' caps and timeouts
	replicaURL string       // this replica's HTTP base as the others reach it

	// Alerts and their notifications.
	smtp              notify.SMTP
	notifyMaxAttempts int
	notifyBackoff     time.Duration
	notifyMaxBackoff  time.Duration
	templates         fleet.TemplateLimits
	alertTick         time.Duration

	publicURL string

	// outboundAllow lists the internal CIDRs and host names that
	// notifications, JWKS and S9 webhooks may reach (egress).
	outboundAllow string

	sweepInterval time.Duration // of the action timeout sweeper
	rolloutTick   time.Duration // between looks at the rollouts

	streamRetention time.Duration // of raw stream points (docs/telemetry.md)
	sqliteWALLimit  int64         // bytes past which SQLite's WAL is restarted (sqlstore.Options.WALLimit)

	ddiPollInterval time.Duration // the sleep hawkBit DDI devices are told

	// An external broker and many replicas (broker.go).
	scale scaleConfig

	// TLS, the device CA, timeouts and limits (security.go).
	sec securityConfig

	pprofAddr string // hidden: runtime profiles for cmd/fleetbench (pprof.go)
	gcPercent int    // the collector's target (gc.go)
}

// defaultDatabase is where fleetd keeps its data when not told otherwise.
const defaultDatabase = "./fleetd.db"

func (c *Config) databaseFlags(fs *cli.FlagSet) {
	fs.StringVar(&c.database, "database", defaultDatabase, "`DB`: a SQLite file path, or a postgres:// URL")
}

func (c *Config) logFlags(fs *cli.FlagSet) {
	fs.StringVar(&c.logLevel, "log-level", "info", "`LEVEL` of logs: debug, info, warn, error")
	fs.StringVar(&c.logFormat, "log-format", "text", "`FORMAT` of logs on standard error: text or json")
}

func (c *Config) serveFlags(fs *cli.FlagSet) {
	c.databaseFlags(fs)
	fs.StringVar(&c.httpAddr, "http-addr", ":8080", "`ADDR` the HTTP API listens on")
	fs.StringVar(&c.mqttAddr, "mqtt-addr", ":1883", "`ADDR` the embedded MQTT broker listens on")
	fs.StringVar(&c.dataDir, "data-dir", "./fleetd-data", "`DIR` for firmware files, unless --blob-store names another place")
	fs.StringVar(&c.blobStore, "blob-store", "", "`URL` of the firmware store: file://DIR, or s3://bucket/prefix?endpoint=…&region=…&path_style=true with credentials from the standard AWS variables, profile or role; default: file://<data-dir>/blobs")
	fs.Int64Var(&c.maxBody, "max-body-bytes", 1<<20, "largest request body in `BYTES`")
	fs.Int64Var(&c.maxBulk, "max-bulk-bytes", 64<<20, "largest bulk provisioning body in `BYTES`")
	fs.Int64Var(&c.maxUpload, "max-upload-bytes", 2<<30, "largest firmware upload in `BYTES`")
	fs.Int64Var(&c.maxDecode, "max-decoding-bytes", fleethttp.DefaultLimits.Decoding, "`BYTES` of request bodies decoded at once, over all requests; more wait their turn, then 503 (decoding costs up to ~35 times a body's size)")
	fs.Int64Var(&c.sqliteWALLimit, "sqlite-wal-limit", 128<<20, "`BYTES` of SQLite's WAL past which it is copied back and restarted, 1 MiB to 64 GiB; the file is kept up to half again this size (docs/operations.md, Databases)")
	fs.Int64Var(&c.maxHeld, "max-held-body-bytes", fleethttp.DefaultLimits.Held, "`BYTES` of request bodies held in memory at once while they arrive, over all requests; a request finding no room waits 2s, then 503 (at least twice the largest body: --max-bulk-bytes)")
	fs.IntVar(&c.remote.PerUser, "remote-max-per-user", relay.DefaultLimits.PerUser, "remote sessions one person (API key or end user) may have open at once in a tenant, over every replica")
	fs.IntVar(&c.remote.PerDevice, "remote-max-per-device", relay.DefaultLimits.PerDevice, "remote sessions one device may have open at once, over every replica")
	fs.DurationVar(&c.remote.Idle, "remote-idle-timeout", relay.DefaultLimits.Idle, "`DURATION` without a byte either way after which a remote session ends")
	fs.DurationVar(&c.remote.Lifetime, "remote-max-lifetime", relay.DefaultLimits.Lifetime, "`DURATION` after which a remote session ends, however busy")
	fs.Int64Var(&c.remote.RecordingMax, "remote-recording-max", relay.DefaultLimits.RecordingMax, "`BYTES` of one remote session's output recording, at least 4096, after which it stops with a marker (the session goes on)")
	fs.DurationVar(&c.remote.RecordingRetention, "remote-recording-retention", relay.DefaultLimits.RecordingRetention, "`DURATION` a remote session's recording is kept, at least 1s (the session's row stays, without it)")
	fs.StringVar(&c.replicaURL, "replica-url", "", "`URL` the other replicas reach this one's HTTP API at, where they proxy a remote session's leg that landed on them (default: http:// and --http-addr as bound, its host name if it is a wildcard)")
	fs.DurationVar(&c.remote.RecordingFlush, "remote-recording-flush", relay.DefaultLimits.RecordingFlush, "`DURATION` between the parts of an open remote session's recording stored in the blob store: at most this much of it is lost with a replica that dies")
	fs.DurationVar(&c.remote.ReplicaTimeout, "remote-replica-timeout", relay.DefaultLimits.ReplicaTimeout, "`DURATION` without a heartbeat after which a replica is lost and another ends the remote sessions it relayed (PostgreSQL; each replica beats every third of it)")
	fs.DurationVar(&c.remote.ConnectTimeout, "remote-connect-timeout", relay.DefaultLimits.ConnectTimeout, "`DURATION` the device (and the operator) have to connect a new remote session's WebSockets")
	fs.StringVar(&c.publicURL, "public-url", "", "`URL` (scheme and host) devices reach the API at, for signed firmware download URLs; default: the URL the dispatching request used")
	fs.DurationVar(&c.sweepInterval, "action-sweep-interval", time.Second, "`DURATION` between sweeps that fail device actions whose timeout elapsed")
	fs.DurationVar(&c.rolloutTick, "rollout-interval", time.Second, "`DURATION` between looks at the rollouts: triggers, gates, maintenance windows, end_timestamp")
	fs.StringVar(&c.outboundAllow, "outbound-allow", "", "`LIST` of CIDRs and host names, comma-separated, that webhooks, Slack, JWKS and S9 webhooks may reach though they are loopback, link-local or private; by default none")
	fs.DurationVar(&c.streamRetention, "stream-retention", fleet.DefaultStreamRetention, "`DURATION` stream points are kept, 24h to 87600h (ten years); a tenant may set its own through the API (docs/telemetry.md)")
	fs.DurationVar(&c.ddiPollInterval, "ddi-poll-interval", 5*time.Minute, "`DURATION` hawkBit DDI devices are told to sleep between polls (config.polling.sleep), 1s to 24h")
	c.alertFlags(fs)
	c.scale.flags(fs)
	c.sec.flags(fs)
	c.logFlags(fs)
	c.gcFlags(fs)
	c.pprofFlags(fs)
}

func (c *Config) alertFlags(fs *cli.FlagSet) {
	fs.StringVar(&c.smtp.Addr, "smtp-addr", "", "`HOST:PORT` of the SMTP server email notifications go through; none disables email")
	fs.StringVar(&c.smtp.From, "smtp-from", "", "`ADDRESS` email notifications come from")
	fs.StringVar(&c.smtp.Username, "smtp-username", "", "`NAME` for SMTP authentication (PLAIN, over TLS only)")
	fs.StringVar(&c.smtp.Password, "smtp-password", "", "`PASSWORD` for SMTP authentication")
	fs.StringVar(&c.smtp.TLS, "smtp-tls", "auto", "`MODE` of SMTP TLS: auto (STARTTLS when offered), starttls, tls (implicit, port 465), none")
	fs.IntVar(&c.notifyMaxAttempts, "notify-max-attempts", 10, "`N` attempts to deliver a notification before giving up")
	fs.DurationVar(&c.notifyBackoff, "notify-backoff", 5*time.Second, "`DURATION` before the first retry of a notification; doubles with each retry")
	fs.DurationVar(&c.notifyMaxBackoff, "notify-max-backoff", time.Hour, "longest `DURATION` between retries of a notification")
	fs.DurationVar(&c.templates.Timeout, "template-timeout", fleet.DefaultTemplateLimits.Timeout, "longest `DURATION` one render of a notification subject or body may take")
	fs.IntVar(&c.templates.MaxOutput, "template-max-output-bytes", fleet.DefaultTemplateLimits.MaxOutput, "most `BYTES` one render of a notification subject or body may produce")
	fs.DurationVar(&c.alertTick, "alert-timer-interval", time.Second, "`DURATION` between checks of alert thresholds and no_data_seconds by the clock")
}

// checkAlerts reports alert, notification and limit settings that cannot
// work.
func (c *Config) checkAlerts() error {
	valid := false
	for _, m := range notify.SMTPTLSModes {
		valid = valid || c.smtp.TLS == m
	}
	switch {
	case !valid:
		return fmt.Errorf("--smtp-tls %q: want auto, starttls, tls or none", c.smtp.TLS)
	case c.smtp.Addr != "" && c.smtp.From == "":
		return fmt.Errorf("--smtp-addr is set: --smtp-from must name the sender")
	case c.notifyMaxAttempts < 1 || c.notifyBackoff <= 0 || c.notifyMaxBackoff < c.notifyBackoff:
		return fmt.Errorf("--notify-max-attempts must be at least 1, --notify-backoff positive and at most --notify-max-backoff")
	case c.templates.Timeout <= 0 || c.templates.MaxOutput <= 0:
		return fmt.Errorf("--template-timeout and --template-max-output-bytes must be positive")
	case c.alertTick <= 0:
		return fmt.Errorf("--alert-timer-interval must be positive")
	case c.rolloutTick <= 0:
		return fmt.Errorf("--rollout-interval must be positive")
	case c.maxHeld < 2*max(c.maxBulk, c.maxBody, 1<<20):
		return fmt.Errorf("--max-held-body-bytes %d: want at least twice the largest body (--max-bulk-bytes, --max-body-bytes), %d: a body may hold twice its size while it arrives",
			c.maxHeld, 2*max(c.maxBulk, c.maxBody, 1<<20))
	case c.streamRetention < fleet.MinStreamRetention || c.streamRetention > fleet.MaxStreamRetention:
		return fmt.Errorf("--stream-retention must be from 24h to 87600h (ten years)")
	case c.ddiPollInterval < time.Second || c.ddiPollInterval >= 24*time.Hour:
		return fmt.Errorf("--ddi-poll-interval must be from 1s to under 24h (DDI writes it as HH:MM:SS)")
	case c.remote.RecordingRetention < time.Second:
		// The sweep runs at least twice within it (relay.RunRecordingRemoval).
		return fmt.Errorf("--remote-recording-retention must be at least 1s")
	case c.remote.RecordingFlush < 100*time.Millisecond:
		return fmt.Errorf("--remote-recording-flush must be at least 100ms")
	case c.remote.ReplicaTimeout < 3*time.Second:
		// A heartbeat every third of it, each a write to the database.
		return fmt.Errorf("--remote-replica-timeout must be at least 3s")
	case c.remote.RecordingMax < 4096:
		// Below a terminal's screenful a recording is little more than its
		// marker; 0 and negatives would mean the default without a word.
		return fmt.Errorf("--remote-recording-max must be at least 4096 bytes")
	}
	return nil
}

// openBlobs opens the firmware store: --blob-store, else the blobs
// directory of --data-dir, as before there was a choice.
func (c *Config) openBlobs(ctx context.Context, getenv func(string) string) (blob.Store, error) {
	loc := c.blobStore
	if loc == "" {
		loc = "file://" + filepath.Join(c.dataDir, "blobs")
	}
	s, err := blob.Open(ctx, loc, getenv)
	if err != nil {
		return nil, fmt.Errorf("--blob-store: %w", err)
	}
	return s, nil
}

// logger builds the process logger on w.
func (c *Config) logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", c.logLevel)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch strings.ToLower(c.logFormat) {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", c.logFormat)
}

// checkDatabase reports database settings that cannot work, before the
// database is opened and migrated.
func (c *Config) checkDatabase() error {
	if c.sqliteWALLimit < 1<<20 || c.sqliteWALLimit > 64<<30 {
		// Under a megabyte the WAL would be restarted after every few
		// commits; the bound above keeps the size and its half again
		// (journal_size_limit) far from overflowing.
		return fmt.Errorf("--sqlite-wal-limit %d: want from 1 MiB (1048576) to 64 GiB", c.sqliteWALLimit)
	}
	return nil
}

// openDB opens the database and applies migrations, logging what it did.
func (c *Config) openDB(ctx context.Context, log *slog.Logger) (*sqlstore.DB, error) {
	db, err := sqlstore.Open(ctx, c.database, sqlstore.Options{Logger: log, StreamRetention: c.streamRetention, WALLimit: c.sqliteWALLimit})
	if err != nil {
		return nil, err
	}
	applied, err := db.Migrate(ctx)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("migrate: %w", err)
	}
	for _, m := range applied {
		log.Info("applied migration", "migration", m)
	}
	return db, nil
}
