package server

import (
	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/action"
	"github.com/fleetd/fleet/alert"
	"github.com/fleetd/fleet/mqtt"
	"github.com/fleetd/fleet/mqtt/bridge"
	"github.com/fleetd/fleet/notify"
	"github.com/fleetd/fleet/sqlstore"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Every Prometheus series fleetd publishes beyond the HTTP API's own
// (fleethttp registers those) is registered here, read from the components'
// Stats at scrape time, so no component depends on Prometheus.

// newRegistry returns the registry /metrics serves, with the Go runtime,
// the process, and each component's counters.
func newRegistry(db *sqlstore.DB, actions *action.Service, sweeper *action.Sweeper, engine *alert.Engine, notifier, rolloutNotifier *notify.Worker, ch mqtt.Channel) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	counter := func(name, help string, f func() float64) {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, f))
	}
	gauge := func(name, help string, f func() float64) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f))
	}

	counter("fleetd_db_commits_total", "write transactions committed; fleetd_db_write_jobs_total divided by this is the group-commit batch size (a cancel or a deletion on PostgreSQL commits alone)",
		func() float64 { return float64(db.Stats().Commits) })
	counter("fleetd_db_write_jobs_total", "writes committed, each a request's or a device message's change",
		func() float64 { return float64(db.Stats().Jobs) })
	counter("fleetd_db_commit_failures_total", "write transactions whose commit failed",
		func() float64 { return float64(db.Stats().Failures) })
	counter("fleetd_db_write_retries_total", "writes run again because PostgreSQL aborted them to break a deadlock or as not serialisable",
		func() float64 { return float64(db.Stats().Retries) })
	counter("fleetd_db_commit_seconds_total", "time spent in write transactions, BEGIN to COMMIT",
		func() float64 { return db.Stats().CommitSeconds })
	gauge("fleetd_db_write_queue", "writes waiting for the commit loop",
		func() float64 { return float64(db.Stats().Queued) })
	gauge("fleetd_sqlite_wal_frames", "frames in SQLite's WAL at the last checkpoint (0 on PostgreSQL)",
		func() float64 { return float64(db.Stats().WALFrames) })
	counter("fleetd_sqlite_wal_restarts_total", "RESTART checkpoints that reset SQLite's WAL once it passed its limit",
		func() float64 { return float64(db.Stats().WALRestarts) })
	counter("fleetd_sqlite_wal_restart_seconds_total", "time the commit loop waited for those checkpoints",
		func() float64 { return db.Stats().WALRestartSeconds })
	counter("fleetd_sqlite_wal_restart_frames_total", "WAL frames those checkpoints copied or synced while the commit loop waited",
		func() float64 { return float64(db.Stats().WALRestartFrames) })

	gauge("fleetd_sqlite_page_cache_bytes", "SQLite's page caches, all its connections together, but for each one's first 20 pages (0 on PostgreSQL)",
		func() float64 { return float64(db.Memory().SQLitePageCache) })
	gauge("fleetd_db_read_connections", "database connections of the read pool open now",
		func() float64 { return float64(db.Memory().ReadConns) })

	counter("fleetd_actions_dispatched_total", "actions dispatched", func() float64 { return float64(actions.Stats().Dispatches) })
	counter("fleetd_device_actions_created_total", "device actions the dispatches made", func() float64 { return float64(actions.Stats().Targeted) })
	counter("fleetd_status_reports_total", "status reports received over HTTP and MQTT", func() float64 { return float64(actions.Stats().Reports) })
	counter("fleetd_status_reports_rejected_total", "status reports refused: unknown action or device, or invalid",
		func() float64 { return float64(actions.Stats().Rejected) })
	counter("fleetd_rollout_events_total", "rollouts' changes of state this replica made: phases triggered, pauses, resumptions, completions, aborts",
		func() float64 { return float64(actions.Stats().RolloutEvents) })
	gauge("fleetd_action_deliveries_in_flight", "dispatches being handed to their connected devices in the background",
		func() float64 { return float64(actions.Stats().Delivering) })
	counter("fleetd_action_sweeps_total", "sweeps for device actions whose timeout elapsed this replica finished",
		func() float64 { return float64(sweeper.Sweeps()) })
	counter("fleetd_device_actions_timed_out_total", "device actions this replica failed because their timeout elapsed",
		func() float64 { return float64(sweeper.TimedOut()) })

	counter("fleetd_stream_points_total", "data points ingested over HTTP and MQTT", func() float64 { return float64(engine.Stats().Points) })
	counter("fleetd_stream_history_points_total", "data points kept in stream history", func() float64 { return float64(db.HistoryStats().Kept) })
	reg.MustRegister(historyRejects{db})
	counter("fleetd_alerts_opened_total", "alerts opened", func() float64 { return float64(engine.Stats().Opened) })
	counter("fleetd_alerts_closed_total", "alerts closed", func() float64 { return float64(engine.Stats().Closed) })
	gauge("fleetd_alert_timers", "threshold and no-data timers pending", func() float64 { return float64(engine.Pending()) })

	counter("fleetd_notifications_delivered_total", "notifications that arrived", func() float64 { return float64(notifier.Stats().Delivered) })
	counter("fleetd_notification_retries_total", "failed notification attempts that will be retried",
		func() float64 { return float64(notifier.Stats().Retried) })
	counter("fleetd_notifications_dead_total", "notifications given up on after the last attempt",
		func() float64 { return float64(notifier.Stats().Dead) })
	counter("fleetd_rollout_notifications_delivered_total", "rollout notifications that arrived",
		func() float64 { return float64(rolloutNotifier.Stats().Delivered) })
	counter("fleetd_rollout_notifications_dead_total", "rollout notifications given up on after the last attempt",
		func() float64 { return float64(rolloutNotifier.Stats().Dead) })

	if c, ok := ch.(*bridge.Client); ok {
		gauge("fleetd_mqtt_broker_connected", "1 while fleetd is connected and subscribed to the external MQTT broker", func() float64 {
			if c.Connected() {
				return 1
			}
			return 0
		})
	} else {
		gauge("fleetd_mqtt_connections", "devices connected to the embedded broker", func() float64 { return float64(ch.Stats().Connections) })
		gauge("fleetd_mqtt_parked_connections", "of them, idle connections holding no goroutine or read buffer", func() float64 { return float64(ch.Stats().Parked) })
		counter("fleetd_mqtt_parked_pings_total", "keepalive pings answered to parked connections, which stayed parked", func() float64 { return float64(ch.Stats().ParkedPings) })
	}
	counter("fleetd_mqtt_messages_in_total", "device publishes handed to fleetd", func() float64 { return float64(ch.Stats().MessagesIn) })
	counter("fleetd_mqtt_messages_out_total", "action messages sent to a subscribed device: written to its connection, or handed to the external broker",
		func() float64 { return float64(ch.Stats().MessagesOut) })
	counter("fleetd_mqtt_handler_errors_total", "device publishes fleetd refused and acknowledged (to MQTT 5 devices with a reason code)",
		func() float64 { return float64(ch.Stats().HandlerErrors) })
	counter("fleetd_mqtt_unacknowledged_total", "device publishes left unacknowledged because fleetd could not commit them",
		func() float64 { return float64(ch.Stats().Unacknowledged) })
	return reg
}

var historyRejectsDesc = prometheus.NewDesc("fleetd_stream_points_rejected_total",
	"data points not kept in stream history (the stream's latest point and alerts still see them), by reason: "+
		fleet.RejectExpired+" (older than the retention on arrival) or "+fleet.RejectFuture+" (more than a day ahead of the clock)",
	[]string{"reason"}, nil)

// historyRejects publishes the points history did not keep, by reason.
type historyRejects struct{ db *sqlstore.DB }

func (historyRejects) Describe(ch chan<- *prometheus.Desc) { ch <- historyRejectsDesc }

func (h historyRejects) Collect(ch chan<- prometheus.Metric) {
	s := h.db.HistoryStats()
	ch <- prometheus.MustNewConstMetric(historyRejectsDesc, prometheus.CounterValue, float64(s.Expired), fleet.RejectExpired)
	ch <- prometheus.MustNewConstMetric(historyRejectsDesc, prometheus.CounterValue, float64(s.Future), fleet.RejectFuture)
}
