// Package server is fleetd serve: the HTTP API, the device channel and the
// background work wired together from a Config, and the administrative
// commands that open the same database (migrate, tenant, apikey). Tests
// run it in process through Serve, told where it listens by Env.Ready.
package server

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/action"
	"github.com/fleetd/fleet/alert"
	"github.com/fleetd/fleet/console"
	"github.com/fleetd/fleet/egress"
	"github.com/fleetd/fleet/enduser"
	"github.com/fleetd/fleet/firmware"
	fwbundle "github.com/fleetd/fleet/firmware/bundle"
	fleethttp "github.com/fleetd/fleet/http"
	"github.com/fleetd/fleet/internal/cli"
	"github.com/fleetd/fleet/mqtt"
	mqttbroker "github.com/fleetd/fleet/mqtt/broker"
	"github.com/fleetd/fleet/notify"
	"github.com/fleetd/fleet/remote/relay"
	"github.com/fleetd/fleet/sqlstore"
	"github.com/fleetd/fleet/twin"
)

const serveAbout = `Runs fleetd: the HTTP API, the MQTT broker devices connect to, and the
background work (action timeouts, alert timers, notification delivery).
On an empty database, once its ports are bound, it creates tenant "default"
and prints its admin API key once (lost: "fleetd apikey create" makes
another). SIGINT or SIGTERM stops it gracefully: requests in flight finish,
queued writes commit.`

// Env is the environment fleetd serve runs in.
type Env struct {
	cli.Env
	// Now, when set, is the clock of the rollouts (tests move it across a
	// daylight saving time change); time.Now otherwise.
	Now func() time.Time
	// Ready, when set, is told where fleetd listens once every listener is
	// bound and the startup line printed.
	Ready func(Listening)
}

// Listening is where a started fleetd listens.
type Listening struct {
	HTTP  string // host:port of the HTTP API
	MQTT  string // the embedded broker's host:port, or the external broker's URL
	MQTTS string // host:port of the MQTT TLS listener; empty without one
	// AdminKey is the admin API key of tenant "default" when this start
	// created the tenant (an empty database); empty otherwise.
	AdminKey string
}

// Serve is fleetd serve: its flags and their environment variables read
// into a Config (the collector's target set), then Run.
func Serve(ctx context.Context, args []string, e Env) error {
	var c Config
	fs := cli.NewFlagSet("serve", "", serveAbout, e.Env)
	c.serveFlags(fs)
	if err := fs.Parse(args, e.Getenv); err != nil {
		return err
	}
	if err := fs.Require(0, 0); err != nil {
		return err
	}
	if err := c.applyGC(fs, e.Getenv); err != nil {
		return err
	}
	return Run(ctx, c, e)
}

// Run runs fleetd on c until ctx is done, then stops gracefully: requests
// in flight finish, queued writes commit.
func Run(ctx context.Context, c Config, e Env) error {
	log, err := c.logger(e.Stderr)
	if err != nil {
		return err
	}
	stopPprof, err := servePprof(c.pprofAddr, log)
	if err != nil {
		return err
	}
	defer stopPprof()
	if err := c.checkDatabase(); err != nil {
		return err
	}
	db, err := c.openDB(ctx, log)
	if err != nil {
		return err
	}
	defer db.Close()

	blobs, err := c.openBlobs(ctx, e.Getenv)
	if err != nil {
		return err
	}
	if err := firmware.CheckPublicURL(c.publicURL); err != nil {
		return err
	}
	fw := &firmware.Service{Parse: fwbundle.ParseOptions{MaxInflated: c.maxUpload}, Store: db, Blobs: blobs, Logger: log, PublicURL: c.publicURL}

	// Alerts: the engine evaluates stream data and writes what changes, with
	// its notifications, to the outbox, which the notifier delivers.
	if err := c.checkAlerts(); err != nil {
		return err
	}
	// Requests to addresses tenants choose go through one egress policy.
	outbound, err := egress.Parse(c.outboundAllow)
	if err != nil {
		return fmt.Errorf("--outbound-allow: %w", err)
	}
	notifier := &notify.Worker{Store: db, Logger: log, SMTP: c.smtp, Templates: c.templates, HTTP: outbound.Client(10*time.Second, egress.NoRedirects),
		MaxAttempts: c.notifyMaxAttempts, Backoff: c.notifyBackoff, MaxBackoff: c.notifyMaxBackoff, Lease: c.scale.notifyLease,
		Owner: replicaName()}
	engine := &alert.Engine{Store: db, Devices: db, Logger: log, Tick: c.alertTick, Changed: notifier.Wake}
	if err := engine.Load(ctx); err != nil {
		return fmt.Errorf("load alert rules: %w", err)
	}
	alerts := &alert.Service{ServiceStore: db, Engine: engine, EmailEnabled: c.smtp.Addr != ""}
	loopCtx, stopLoops := context.WithCancel(ctx)
	var loops sync.WaitGroup
	defer loops.Wait()
	defer stopLoops()
	// Rollouts' changes of state go to the tenants' rollout notification
	// rules through an outbox of their own, delivered the same way.
	rolloutNotifier := &notify.Worker{Store: db.RolloutOutbox(), Logger: log.With("outbox", "rollouts"), SMTP: c.smtp, Templates: c.templates, HTTP: outbound.Client(10*time.Second, egress.NoRedirects),
		MaxAttempts: c.notifyMaxAttempts, Backoff: c.notifyBackoff, MaxBackoff: c.notifyMaxBackoff, Lease: c.scale.notifyLease,
		Owner: replicaName()}
	loops.Add(7)
	go func() { defer loops.Done(); db.RunOrphanSweep(loopCtx, time.Hour) }()
	go func() { defer loops.Done(); db.RunHistoryMaintenance(loopCtx, time.Hour) }()
	go func() { defer loops.Done(); db.RunRollups(loopCtx, time.Second) }()
	go func() { defer loops.Done(); engine.Run(loopCtx) }()
	go func() { defer loops.Done(); notifier.Run(loopCtx) }()
	go func() { defer loops.Done(); rolloutNotifier.Run(loopCtx) }()
	go func() { defer loops.Done(); fw.RunOrphanRemoval(loopCtx, time.Hour) }()

	// Actions: the service sends through the broker, the broker hands the
	// devices' messages to the service; the sweeper fails what times out.
	// update_firmware is prepared by the firmware service: the bundle is
	// checked, devices get its signed URL, incompatible devices fail.
	actions := &action.Service{Store: db, Logger: log,
		Preparers: map[string]fleet.ActionPreparer{fleet.ActionUpdateFirmware: fw},
		Notified:  rolloutNotifier.Wake, EmailEnabled: c.smtp.Addr != "", Now: e.Now}
	// A report worker gathers every report that arrives while its last
	// batch commits. SQLite has one writer: a single worker makes batches
	// as large as they can be (fewer commits, no savepoints). PostgreSQL's
	// writers commit side by side, and two workers beat the default four
	// in a quiet series: batches of ~16 reports instead of ~9, less CPU a
	// report, more reports a second (docs/benchmarks-notebook.md, "Two
	// report workers on PostgreSQL, a quiet series").
	actions.ReportWorkers = 2
	if db.Dialect() == "sqlite" {
		actions.ReportWorkers = 1
	}
	// TLS, the device CA, timeouts and limits (security.go).
	sec, err := c.sec.build(ctx, db, c.mqttAddr, c.scale.broker != "", log)
	if err != nil {
		return err
	}
	// The device channel is the embedded broker, or a client of an external
	// one whose broker-auth endpoints the API serves (broker.go).
	// Device shadows: the twin service sends each device its delta through
	// the channel; uplink's device_shadow stream fills the reported state.
	shadows := &twin.Service{Store: db, Logger: log}
	streams := &twin.Streams{StreamService: alerts, Twin: shadows, Logger: log}
	broker, brokerAuth, err := c.scale.channel(sec.mqttBase, db, &mqtt.Devices{
		Registry: db, Actions: actions, Delivery: actions, Streams: streams, Twin: shadows, LastSeen: db, Logger: log,
		Certificates: sec.certs, MaxDecoding: sec.mqttDecoding,
		// A compressed payload may inflate to what a device may send.
		MaxInflated: sec.mqttBase.MaxPacketSize,
	}, log)
	if err != nil {
		return err
	}
	actions.Sender = broker
	shadows.Sender, shadows.Actions, shadows.Rollouts, shadows.Waiting = broker, actions, actions, db
	// A fleet-wide desired change rolled out in phases is a desired_state
	// action, which the twin checks and its phases' releases apply.
	actions.Preparers[fleet.ActionDesired], actions.Shadows = shadows, shadows
	if c.scale.broker != "" {
		actions.SendWorkers = 64 // each send waits for the external broker's PUBACK
	}
	actions.Open()
	defer actions.Close()
	if err := broker.Open(); err != nil {
		return err
	}
	defer broker.Close() // before actions.Close: no device may call in after it
	sweeper := &action.Sweeper{Store: db, Interval: c.sweepInterval, Logger: log}
	loops.Add(3)
	go func() {
		defer loops.Done()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		releaseAfterBursts(loopCtx, func() uint64 { return broker.Stats().Connects }, tick.C, debug.FreeOSMemory)
	}()
	go func() { defer loops.Done(); sweeper.Run(loopCtx) }()
	go func() { defer loops.Done(); actions.RunRollouts(loopCtx, c.rolloutTick) }()

	// End users of tenants that configured S9 sign in with bearer tokens.
	users := &enduser.Authenticator{Store: db, Logger: log, Client: outbound.Client(enduser.FetchTimeout, egress.FollowRedirects)}

	reg := newRegistry(db, actions, sweeper, engine, notifier, rolloutNotifier, broker)
	api := &fleethttp.Server{
		Addr:            c.httpAddr,
		Logger:          log,
		Registry:        reg,
		Limits:          fleethttp.Limits{Body: c.maxBody, Bulk: c.maxBulk, Upload: c.maxUpload, Decoding: c.maxDecode, Held: c.maxHeld},
		Tenants:         db,
		Devices:         &alert.Devices{DeviceService: db, Engine: engine},
		Shadows:         shadows,
		Groups:          db,
		Alerts:          alerts,
		Streams:         streams,
		History:         db,
		DDI:             db,
		Templates:       c.templates,
		Audit:           db,
		Ready:           []fleethttp.Pinger{db},
		TenantAuth:      users,
		Tokens:          users,
		Firmware:        fw,
		Actions:         actions,
		Delivery:        actions, // hawkBit DDI devices poll for theirs
		DDIPollInterval: c.ddiPollInterval,
		BrokerAuth:      brokerAuth,

		RolloutNotifications: actions,
		Security:             sec.http,
		Follows:              sec.follows,

		Remote:         relay.NewHub(db, actions, blobs, filepath.Join(c.dataDir, "remote-spool"), c.remote, log, reg),
		RemoteSessions: db,
	}
	// The web console, at /console/, uses the same services as the API.
	con := &console.Console{Tenants: db, TenantAuth: users, Devices: api.Devices, Shadows: shadows, Groups: db, Actions: actions, Firmware: fw,
		Alerts: alerts, Streams: alerts, History: db, Audit: db, DDI: db, Sessions: db, Secrets: db, Targets: db, Logger: log, UploadLimit: c.maxUpload,
		OIDC: users, PublicURL: c.publicURL, Templates: c.templates, Bodies: api,
		Remote: api.Remote, RemoteSessions: db, Follows: sec.follows}
	if p, ok := broker.(console.Presence); ok {
		con.Presence = p
	}
	if o, ok := broker.(console.OnlineCounter); ok {
		con.Online = o
	}
	con.Open()
	api.Console = con
	if ms, ok := broker.(*mqttbroker.Server); ok && sec.certs != nil {
		api.DeviceCerts, con.Certificates = sec.certs, sec.certs
		if api.UplinkBroker, err = c.sec.uplinkBroker(c.publicURL, ms.TLSAddr()); err != nil {
			return err
		}
	}

	loops.Add(2)
	go func() { defer loops.Done(); api.Remote.RunRecordingRemoval(loopCtx) }()
	// What another replica changes drops what this one caches (PostgreSQL
	// LISTEN/NOTIFY; nothing to hear on SQLite).
	go func() {
		defer loops.Done()
		db.Listen(loopCtx, func(ch fleet.Change) {
			users.ApplyChange(ch)
			engine.ApplyChange(loopCtx, ch)
			api.Remote.Revoke(ch)
			switch ch.Kind {
			case fleet.ChangeDeviceCredentials, fleet.ChangeDeviceDelete:
				// A connection made with revoked credentials ends now, on
				// whichever replica holds it.
				broker.CredentialsChanged(ch.Tenant, ch.Key)
			}
		})
	}()

	if err := api.Open(); err != nil {
		return err
	}
	api.Remote.SetRelayURL(replicaURL(c.replicaURL, api.ListenAddr()))
	if n, err := api.Remote.EndStale(ctx); err != nil {
		log.Warn("remote sessions left open by this replica's last run could not be ended", "err", err)
	} else if n > 0 {
		log.Info("ended remote sessions left open by this replica's last run", "sessions", n)
	}
	loops.Add(1)
	go func() { defer loops.Done(); api.Remote.RunHeartbeat(loopCtx) }()
	// Every listener is bound: only now may the one-time key be spent, so
	// that a start that fails on a taken port leaves it for the retry.
	key, err := bootstrap(ctx, db, c.database, e.Stdout)
	if err != nil {
		api.Shutdown(context.Background())
		return err
	}
	at := Listening{HTTP: api.ListenAddr().String(), MQTT: channelAddr(broker), MQTTS: tlsAddr(broker), AdminKey: key}
	log.Info("fleetd started", "http", at.HTTP, "mqtt", at.MQTT, "database", db.Dialect())
	fmt.Fprintf(e.Stdout, "fleetd: listening http=%s mqtt=%s%s\n", at.HTTP, at.MQTT, tlsAddrs(broker))
	if e.Ready != nil {
		e.Ready(at)
	}

	<-ctx.Done()
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := api.Shutdown(sctx); err != nil {
		log.Warn("HTTP shutdown", "err", err)
	}
	return nil
}

// bootstrap gives a new installation a tenant and an admin key, printed
// once, so the first request can be authenticated at once, and says how to
// make another key should that one be lost. It returns the key, or "" when
// the database had a tenant.
func bootstrap(ctx context.Context, db *sqlstore.DB, database string, stdout io.Writer) (string, error) {
	ts, err := db.FindTenants(ctx)
	if err != nil || len(ts) > 0 {
		return "", err
	}
	_, key, err := db.CreateTenant(ctx, "default")
	if fleet.ErrorCode(err) == fleet.ECONFLICT {
		return "", nil // another replica was first
	} else if err != nil {
		return "", err
	}
	fmt.Fprintf(stdout, "fleetd: created tenant \"default\" with an admin API key; it is shown only this once:\n%s\n", key)
	// The database may be a URL with a password: name the flag, not its value.
	same := ""
	if database != defaultDatabase {
		same = " with serve's --database"
	}
	fmt.Fprintf(stdout, "fleetd: if it is lost, make another admin key%s: fleetd apikey create --tenant default --name admin-2 --role admin\n", same)
	return key, nil
}

// replicaURL is --replica-url, or http:// and the address the API is
// bound to, with the host's name for a wildcard address.
func replicaURL(flag string, addr net.Addr) string {
	if flag != "" {
		return strings.TrimRight(flag, "/")
	}
	host, port, _ := net.SplitHostPort(addr.String())
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host, _ = os.Hostname()
	}
	return "http://" + net.JoinHostPort(host, port)
}
