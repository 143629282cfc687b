// Command fleetbench measures fleetd against the figures users will measure
// (the targets of BENCHMARKS.md) and prints them in one table, each beside a
// baseline taken in the same run: a hello-world Go handler under the same
// HTTP load, Mosquitto under the same MQTT clients, and the raw update and
// insert rates of the same database. The verdict on each target is the
// ratio to its baseline; absolute figures are information.
//
// By default it builds fleetd, runs it as a subprocess on the embedded
// defaults (SQLite in a temporary directory, the embedded MQTT broker, free
// ports), provisions what each scenario needs through the API and runs the
// scenarios. --database postgres://… runs fleetd on PostgreSQL in a fresh
// schema; --url with --api-key and --tenant measures a fleetd that is
// already running.
//
// The load generators run in this process, so on a small machine they share
// its cores with fleetd; so do the baselines, which is what makes the
// ratios fair.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(2)
		}
		fmt.Fprintln(os.Stderr, "fleetbench:", err)
		os.Exit(1)
	}
}

const usageText = `Usage: fleetbench [flags]
       fleetbench hello --addr ADDR

Measures fleetd against the figures its users will measure (BENCHMARKS.md
lists them with their targets) and prints one table: each figure, its value,
the baseline measured in the same run that it is compared with, the ratio to
it, the target and whether it is met. The targets are for the database under
test, and are of the ratio: this machine's absolute speed moves 2x within a
day. Only delivery (seconds) and memory (MB) have targets of their value.

By default fleetbench builds fleetd (go build, once, into a temporary
directory), runs it on SQLite with the embedded MQTT broker on free ports,
provisions devices, keys, actions and alert rules through the API, runs
every scenario, stops fleetd and removes what it made.

Scenarios (--scenarios takes a comma-separated subset):
  s10          S10 status reports over HTTP, 64 connections: throughput,
               p50, p99, against a hello-world handler under the same load.
               Every request is a report that is applied: each device action
               belongs to one connection and its sequence rises. Each
               connection is a gateway with a device key of its own (fleetd
               limits one key's device data to 20,000 requests/s).
  s10-random   S10's tail as wrk finds it: the same 64 connections report
               for devices drawn at random from an action dispatched to
               100,000; p99 and max, and p99 ÷ the hello-world p99.
  mqtt-status  status reports over MQTT: many devices publishing at QoS 1,
               each waiting for its PUBACK (a PUBACK means committed),
               against the same clients publishing to Mosquitto.
  streams      stream points over MQTT through alert evaluation (3 rules),
               in batches of 100 points, kept in history, against the same
               load on a stream whose points are older than the retention
               (evaluated and kept as the latest point, not in history):
               ingest with history ÷ latest-only, at least 50%.
  history      a day of one device's points at 1 Hz (86,400), kept through
               the API in batches of 1000: read back through the API (87
               pages, best of 3) ÷ the same points read with one SELECT from
               a table of a row per point on the same database (at most 2x),
               each side decoded to the same values; fleetbench reads the
               pages as a client reading many points would, each next
               one asked for on its predecessor's Link header while the
               predecessor is decoded, into two buffers in turn, with a
               fast decoder (segmentio/encoding's json: a
               quarter of encoding/json's CPU, whose cost for the same
               pages the note gives beside it), once the hour rollups
               hold the whole day and the machine is quiet, as for S7;
               a 30-day hourly aggregate's p99 over 200 requests (at most
               50 ms) beside a device read's (a primary-key lookup); the
               day's partition's bytes on disk a point beside the point's
               JSON; then the partitions of 5 consecutive days past the
               retention, each filled with 10,000,000 points (--quick
               1,000,000: copies of the day's chunks under other device
               ids), dropped by fleetd's maintenance one after the other
               in one pass, which setting the tenant's retention runs at
               once: the longest day's drop (at most 1 s; the first from
               the setting, each next from its predecessor gone), while 8
               devices keep points through the API, a request of 10 at a
               time each: the p99 of those in flight from the setting to
               the last partition gone ÷ their p99 before it (at most 2x).
  remote       remote sessions (docs/agent.md) through fleetd-agents run
               in fleetbench's process (package agent, what fleetd-agent
               runs), 50 connected devices: 1,000 idle sessions open at
               once (port forwards, each proven by a byte echoed, again
               once all are open); fleetd's memory per idle session, the
               larger of its VmRSS growth and its Go heap plus stacks
               growth, both read after forced garbage collections (at most
               64 KiB); set-up of a session for a connected device, 100 one
               at a time, from the POST to a byte echoed (p99 at most 1 s);
               a port forward through fleetctl forward (package ctl, in this
               process), fleetd and an agent ÷ a direct loopback TCP copy to
               the same service, 9 alternating rounds of 64 MiB, the median
               round's ratio (at least 50%); and a keystroke's round trip
               through a terminal session (the agent's pty running cat)
               beside the same keystroke on a pty of this process, 2,000 each
               in turn: the session's p99 less the local pty's p50 (at most
               2 ms).
  twin         the device twin (docs/twin.md) beside what fleetd did
               before it, each in turns with its baseline in 3 rounds of
               half the duration each, the verdict on the median round's
               ratio: desired writes (PATCH /api/v1/devices/{id}/shadow,
               every write a change) under S10's load, 64 connections, ÷
               S10 on 10,000 devices of its own (at least 50%); reported
               state published over MQTT by 2,000 devices, a merge patch a
               publish, QoS 1, ÷ the same devices' status reports (at least
               50%); and, with 10,000 devices connected and subscribed to
               their actions and their delta, an action dispatched to all
               of them and a desired change for all of them (one PATCH
               /api/v1/shadows), each from its request to the last device
               that received it: the median delta ÷ the median action (at
               most 2x). Shadows read back (100 of them) must hold the last
               write, and every device action the last report.
  groups       a group of 100,000 devices (selector site=…, 10,000 other
               devices elsewhere) counted with GET /api/v1/groups/{name} ÷
               the same devices counted by the devices API's metadata search
               (GET /api/v1/devices?metadata.site=…&limit=1), 50 of each in
               turns, one at a time: the medians' ratio (at most 2x).
  dispatch     dispatch to 100,000 and to 1,000,000 devices (search_type
               all, a tenant each): time to the 201, ÷ the raw insert of
               the same rows (the fleet's tenant and device ids, from a
               table with the columns of fleetd's devices, into one with a
               device action's columns and primary key only).
  s7           S7 on a device with 10,000 actions: p99 ÷ p50 for every sort_by
               (limit=50, page 1, alternating desc and asc), measured once
               the machine has been quiet for a second (waiting at most a
               minute for the last scenario's checkpoint or autovacuum).
               The note counts the garbage collections of fleetd and of
               fleetbench during the measured requests: the tail is the
               requests that overlap one.
  console      the web console's pages, signed in with an API key, on the
               dispatch scenario's 100,000-device fleet given 10 actions to
               all of it (1,000,000 device actions); each page's p99 and p50
               over 200 requests made one at a time (the overview, devices
               with and without filters, a device, actions, an action and
               its devices, the dispatch form, firmware, alerts, alert
               rules, a rule with 100 alerts, its notification rule with
               their deliveries, API keys, sign-in, the audit log with and
               without an action filter, the live pages' first event, and
               the charts: a device with a week of a point a minute on 3
               numeric fields charted over an hour, a day and a week, its
               Logs tab with 5,000 lines in the hour, the overview's fleet
               chart and an alert's chart), each met or not against 100 ms
               at p99.
  delivery     10,000 connected devices subscribed to their actions; one
               dispatch to all of them: time from the 201 until the last
               device received the action.
  memory       fleetd's resident memory (VmRSS) with 10,000 MQTT connections
               and 1,000,000 device actions stored: 3 s after connecting
               and, in a full run, again after 150 s idle (stacks of idle
               connections shrink at the runtime's periodic collection).
  idle         resident memory per idle MQTT connection as ps shows it
               (nothing forced): 5,000 devices connect, subscribed, and
               stay idle a minute once all are parked, then 5,000 more;
               the figure is VmRSS grown ÷ 5,000 over the second batch (the
               first's, which also pays what is paid once, such as
               SQLite's page caches, is in the note), ÷ Mosquitto's,
               measured the same way with the same clients. Target 3 KB.

Baselines, measured in the same run:
  hello        a hello-world Go handler, in a process of its own (this
               command re-run as "fleetbench hello"), under the same load
               generator and connections as S10.
  mosquitto    Debian's Mosquitto 2 (/usr/sbin/mosquitto) on a free loopback
               port, with a configuration generated in the temporary
               directory (anonymous, no persistence, TCP_NODELAY): the same
               paho clients, topics, payloads and load as mqtt-status;
               for idle, the same idle clients, VmRSS read 2 s after each
               batch.
               Mosquitto acknowledges a PUBLISH on receipt, fleetd once the
               report is committed. Without mosquitto installed the row
               says so (under CI=true the run fails).
  update       single-row UPDATEs by primary key, committed in batches of
               512, on the same database (SQLite: WAL, synchronous=FULL;
               PostgreSQL: 4 connections, as fleetd's 4 writers).
  insert       INSERT … SELECT of as many rows as a dispatch makes, into a
               table shaped like device_actions with its primary key only.
  loopback copy  the remote scenario's bytes sent to the same TCP service
               straight over loopback, in turns with the forward's rounds.
  local pty    the remote scenario's keystrokes typed into a pty of
               fleetbench running cat, in turns with the session's.
  S10, in turns / MQTT status, in turns / action
               the twin scenario's baselines: S10 on devices of its own,
               status reports from its reporting devices, an action to its
               connected devices, each in turns with what it is compared
               with.
  metadata search  the groups scenario's count by metadata, in turns with
               the group's.

The fleetd fleetbench starts runs with --rate-limit -1: the setup makes
thousands of API requests with a few keys, and with --remote-max-per-user,
--remote-max-per-device and --http-max-connections-per-ip raised: the remote
scenario opens a thousand sessions with one key, from 127.0.0.1 on both legs.
Device-data limits stay at their defaults. Against --url, lift the limits of the fleetd measured likewise.
It also runs with --log-level warn: at info fleetd writes an access log
line for every request. On PostgreSQL, S7 is measured after VACUUM
(ANALYZE) of the tables the setup filled, as autovacuum would run.

Each throughput figure notes the cores fleetd and fleetbench used, how
busy the whole machine was, and fleetd's group commit from its /metrics
(commits per second, store writes and status reports per commit, time
per commit), warm-up included; --profile DIR saves fleetd's CPU and allocation
profiles of each scenario (and heap and goroutines of the memory one).

File descriptors: 10,000 MQTT connections need about 10,100 descriptors in
this process and as many in fleetd. fleetbench raises its soft
RLIMIT_NOFILE to the hard limit; fleetd inherits it. Connections come from
several loopback source addresses (127.0.0.2-127.0.0.9) when fleetd is on
loopback, so ephemeral ports never run out.

--quick runs every scenario at a reduced size (10,000 devices instead of
1,000,000; 1,000 connections instead of 10,000; seconds-long runs) and
finishes in under two minutes; its met column is information only.

Flags:
`

type options struct {
	quick     bool
	scenarios []string
	database  string
	url       string
	mqttAddr  string
	apiKey    string
	tenant    string
	pid       int
	jsonOut   string
	profile   string
	fleetd    string
	keep      bool
	conns     int
	duration  time.Duration
}

// allScenarios in the order they run. S7 runs before delivery, whose
// 10,000 connections stay open for the memory scenario: with them fleetd's
// heap is larger and its collections longer, which S7's p99 would show.
var allScenarios = []string{"s10", "s10-random", "mqtt-status", "streams", "history", "remote", "twin", "groups", "dispatch", "s7", "console", "delivery", "memory", "idle"}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "hello" {
		return runHello(ctx, args[1:], stdout, stderr)
	}
	var o options
	var scenarios string
	fs := flag.NewFlagSet("fleetbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usageText)
		fs.PrintDefaults()
	}
	fs.BoolVar(&o.quick, "quick", false, "run every scenario at a reduced size; finishes in under two minutes")
	fs.StringVar(&scenarios, "scenarios", strings.Join(allScenarios, ","), "comma-separated `LIST` of scenarios to run")
	fs.StringVar(&o.database, "database", "", "`DSN` fleetd runs on: a postgres:// URL (fleetbench makes a fresh schema in it) or a SQLite path; default: SQLite in a temporary directory")
	fs.StringVar(&o.url, "url", "", "`URL` of a running fleetd to measure instead of starting one (needs --api-key, --tenant, --mqtt-addr)")
	fs.StringVar(&o.mqttAddr, "mqtt-addr", "", "`HOST:PORT` of the running fleetd's MQTT broker (with --url)")
	fs.StringVar(&o.apiKey, "api-key", "", "admin API `KEY` of --tenant (with --url)")
	fs.StringVar(&o.tenant, "tenant", "", "`TENANT` to provision into (with --url)")
	fs.IntVar(&o.pid, "pid", 0, "`PID` of the running fleetd, to read its VmRSS (with --url; default: /metrics' process_resident_memory_bytes)")
	fs.StringVar(&o.jsonOut, "json", "", "also write the figures as JSON to `FILE`")
	fs.StringVar(&o.profile, "profile", "", "save fleetd's CPU and allocation profiles of each scenario under `DIR` (needs the fleetd fleetbench starts)")
	fs.StringVar(&o.fleetd, "fleetd", "", "`PATH` of a fleetd binary to run instead of building one")
	fs.BoolVar(&o.keep, "keep", false, "keep the temporary directory (database, fleetd's log) and the PostgreSQL schema")
	fs.IntVar(&o.conns, "connections", 64, "`N` HTTP connections of the S10 load and its baseline")
	fs.DurationVar(&o.duration, "duration", 0, "`DURATION` of each throughput measurement (default 10s, --quick 2s)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q; see --help", fs.Args())
	}
	for _, s := range strings.Split(scenarios, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if !slices.Contains(allScenarios, s) {
			return fmt.Errorf("--scenarios: unknown scenario %q; choose from %s", s, strings.Join(allScenarios, ", "))
		}
		o.scenarios = append(o.scenarios, s)
	}
	if o.url != "" && (o.apiKey == "" || o.tenant == "" || o.mqttAddr == "") {
		return errors.New("--url needs --api-key (an admin key), --tenant and --mqtt-addr")
	}
	if o.url != "" && o.profile != "" {
		return errors.New("--profile needs the fleetd that fleetbench starts (it runs it with --pprof-addr)")
	}
	if o.duration == 0 {
		o.duration = 10 * time.Second
		if o.quick {
			o.duration = 2 * time.Second
		}
	}
	if o.conns < 1 {
		return errors.New("--connections must be at least 1")
	}
	return bench(ctx, &o, stdout, stderr)
}

func newHelloFlags(stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("fleetbench hello", flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}
