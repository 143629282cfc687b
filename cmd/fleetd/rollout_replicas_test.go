package main

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestRolloutRestart restarts the server in the middle of a schedule: the
// rollout is where it was (paused, its canary done), resumes, and the
// restarted server triggers what follows.
func TestRolloutRestart(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := startServer(t, b, "--rollout-interval", "20ms")
		admin := s.Admin()
		tokens := filepath.Join(t.TempDir(), "tokens.csv")
		sim := s.StartSim(t, "--devices", "6", "--provision", "--url", s.URL, "--api-key", admin.Key,
			"--tokens", tokens, "--prefix", "rs-", "--telemetry-interval", "0")
		sim.Connected(t, 6)
		id := s.Dispatch(t, admin, map[string]any{"action": "reboot", "params": map[string]any{}, "search_type": "search", "search_query": "rs-",
			"schedule": map[string]any{"phases": []any{
				fleetdtest.Phase("canary", fleetdtest.TriggerNow, fleetdtest.FixedList("rs-00001")),
				fleetdtest.Phase("pair", fleetdtest.TriggerManual, fleetdtest.FixedList("rs-00002", "rs-00003")),
				map[string]any{"name": "rest", "trigger_on": fleetdtest.TriggerAfter, "info": fleetdtest.Percent(100), "gate": map[string]any{"max_failure_rate": 0.5}},
			}}})
		s.AwaitActionStatus(t, admin, "rs-00001", id, "Completed")
		s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/pause", id), nil).Want(t, 204)
		before := s.Rollout(t, admin, id)

		sim.Stop(t)
		s.Restart(t, "--rollout-interval", "20ms")
		sim = s.StartSim(t, "--devices", "6", "--tokens", tokens, "--telemetry-interval", "0")
		sim.Connected(t, 6)
		after := s.Rollout(t, admin, id)
		if after.Status != "paused" || fmt.Sprint(after.PhasesTriggered) != "[true false false]" || after.PauseReason != before.PauseReason ||
			fmt.Sprint(after.StatusesPhased) != fmt.Sprint(before.StatusesPhased) {
			t.Fatalf("after the restart: %+v\nbefore: %+v", after, before)
		}
		s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/resume", id), nil).Want(t, 204)
		s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/trigger_next_phase", id), nil).Want(t, 204)
		a := s.AwaitRollout(t, admin, id, "completed")
		if a.Statuses["Completed"] != 6 || fmt.Sprint(a.PhasesTriggered) != "[true true true]" {
			t.Fatalf("completed: %+v", a)
		}
	})
}

// TestRolloutReplicas runs a rollout on two replicas sharing PostgreSQL and
// an external broker, with simulated devices on that broker: every phase is
// triggered once, by whichever replica gets to it, and each change of
// state is notified once. A replica killed in the middle of releasing a
// phase of 49,999 device actions leaves none of them released (its
// transaction rolls back), and the other replica releases them.
func TestRolloutReplicas(t *testing.T) {
	c := newCluster(t, append([]string{"--rollout-interval", "10ms"}, fleetdtest.AlertFlags...)...)
	a := c.start("replica-a")
	b := c.start("replica-b")
	admin := a.Admin()
	hook := fleetdtest.NewReceiver(t, 0)
	a.Do(t, admin, "POST", "/api/v1/rollout-notification-rules", map[string]any{
		"channel_parameters": map[string]any{"type": "webhook", "url": hook.URL}}).Want(t, 201)
	tokens := filepath.Join(t.TempDir(), "tokens.csv")
	sim := a.StartSim(t, "--devices", "20", "--provision", "--url", a.URL, "--api-key", admin.Key,
		"--tokens", tokens, "--prefix", "rep-", "--telemetry-interval", "0")
	sim.Connected(t, 20)

	t.Run("EachPhaseOnce", func(t *testing.T) {
		before := metric(t, a.URL, "fleetd_rollout_events_total") + metric(t, b.URL, "fleetd_rollout_events_total")
		id := b.Dispatch(t, admin, map[string]any{"action": "reboot", "params": map[string]any{}, "search_type": "search", "search_query": "rep-",
			"schedule": map[string]any{"phases": []any{
				fleetdtest.Phase("canary", fleetdtest.TriggerNow, fleetdtest.FixedList("rep-00001")),
				fleetdtest.Phase("quarter", fleetdtest.TriggerAfter, fleetdtest.Percent(25)),
				fleetdtest.Phase("half", fleetdtest.TriggerAfter, fleetdtest.Percent(50)),
				fleetdtest.Phase("most", fleetdtest.TriggerAfter, fleetdtest.Percent(75)),
				fleetdtest.Phase("all", fleetdtest.TriggerAfter, fleetdtest.Percent(100)),
			}}})
		r := a.AwaitRollout(t, admin, id, "completed")
		if r.Statuses["Completed"] != 20 {
			t.Fatalf("completed: %+v", r)
		}
		fleetdtest.AwaitEvents(t, hook, id, "phase_triggered:0", "phase_triggered:1", "phase_triggered:2", "phase_triggered:3", "phase_triggered:4", "completed")
		after := metric(t, a.URL, "fleetd_rollout_events_total") + metric(t, b.URL, "fleetd_rollout_events_total")
		if after-before != 6 {
			t.Fatalf("the replicas made %v changes of state, want 6", after-before)
		}
	})

	t.Run("KilledMidTrigger", func(t *testing.T) {
		a.ProvisionDevices(t, admin, "bulk-", 50_000, nil)
		id := a.Dispatch(t, admin, map[string]any{"action": "reboot", "params": map[string]any{}, "search_type": "search", "search_query": "bulk-",
			"schedule": map[string]any{"phases": []any{
				fleetdtest.Phase("first", fleetdtest.TriggerManual, fleetdtest.FixedList("bulk-00000")),
				fleetdtest.Phase("rest", fleetdtest.TriggerManual, fleetdtest.Percent(100)),
			}}})
		a.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/trigger_next_phase", id), nil).Want(t, 204)
		db := c.db()
		const rest = 50_000 - 1 // but the first phase's device
		phase1 := func() (released, waiting, next int) {
			return fleetdtest.Count(t, db, "SELECT count(*) FROM device_actions WHERE action_id = $1 AND phase = 1 AND action_status = 'Queued'", id),
				fleetdtest.Count(t, db, "SELECT count(*) FROM device_actions WHERE action_id = $1 AND phase = 1 AND action_status = 'Scheduled'", id),
				fleetdtest.Count(t, db, "SELECT next_phase FROM rollouts WHERE action_id = $1", id)
		}
		// The test holds one of phase 1's device actions locked, so that A's
		// release of the phase, once begun, waits on it inside A's
		// transaction: the kill lands in the middle of the release, every
		// time, not when it happens to.
		ctx := context.Background()
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		var holder int
		if err := conn.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&holder); err != nil {
			t.Fatal(err)
		}
		hold, err := conn.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer hold.Rollback()
		var held string
		if err := hold.QueryRow("SELECT device_id FROM device_actions WHERE action_id = $1 AND device_id = 'bulk-49999' AND phase = 1 FOR UPDATE", id).Scan(&held); err != nil {
			t.Fatal(err)
		}
		go http.DefaultClient.Do(a.Request(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/trigger_next_phase", id)))
		var releaser int
		fleetdtest.Eventually(t, "A's release of phase 1 to begin and wait on "+held, func() bool {
			err := db.QueryRow(`SELECT pid FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid)) AND query LIKE 'UPDATE device_actions SET%'`, holder).Scan(&releaser)
			return err == nil
		})
		a.kill()
		if err := hold.Rollback(); err != nil {
			t.Fatal(err)
		}
		// A's session ends, its transaction rolled back, once PostgreSQL
		// finds A gone; until then its rows are not committed, nor
		// visible, and B would wait on the rollout A locked.
		fleetdtest.Eventually(t, "A's session to end", func() bool {
			return fleetdtest.Count(t, db, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", releaser) == 0
		})
		if released, waiting, next := phase1(); released != 0 || waiting != rest || next != 1 {
			t.Fatalf("after the kill mid-release: %d released, %d waiting, next phase %d; want none released, %d waiting, next phase 1", released, waiting, next, rest)
		}
		// B does what A did not.
		b.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/trigger_next_phase", id), nil).Want(t, 204)
		if released, waiting, next := phase1(); released != rest || waiting != 0 || next != 2 {
			t.Fatalf("after B's trigger: %d released, %d waiting, next phase %d; want %d released", released, waiting, next, rest)
		}
		if r := b.Rollout(t, admin, id); r.StatusesPhased["1"]["Queued"] != rest || fmt.Sprint(r.PhasesTriggered) != "[true true]" {
			t.Fatalf("after B's trigger: %+v, phases triggered %v", r.StatusesPhased, r.PhasesTriggered)
		}
	})
	sim.Stop(t)
}
