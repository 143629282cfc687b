package main

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fleetd/fleet/blob/s3test"
	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/mqtt"
	"github.com/fleetd/fleet/mqtt/mosquittotest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
	"github.com/minio/minio-go/v7"
)

// These tests run fleetd as production runs it scaled out
// (docs/operations.md#scaling-out): the real binary, several processes on
// one PostgreSQL database and one external broker. They need PostgreSQL
// (FLEETD_TEST_POSTGRES) and Mosquitto, as CI has.

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// fleetdBinary builds fleetd once per test run.
func fleetdBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "fleetd-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "fleetd")
		// go test puts its own go first on the test's PATH.
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// replica is one fleetd process of a cluster.
type replica struct {
	*process
	name string
}

// cluster is replicas on one database and one broker.
type cluster struct {
	t      *testing.T
	dsn    string
	broker *mosquittotest.Broker
	flags  []string
	env    []string // added to the replicas' environment
	key    string   // the admin key of tenant "default"
}

func newCluster(t *testing.T, flags ...string) *cluster {
	t.Helper()
	b := sqlstoretest.Postgres(t, "replicas share a PostgreSQL database")
	return &cluster{t: t, dsn: b.DSN(t), broker: mosquittotest.Start(t), flags: flags}
}

// start runs a replica named name (its MQTT client id) and waits until it
// listens.
func (c *cluster) start(name string) *replica {
	t := c.t
	t.Helper()
	args := append([]string{"serve", "--database", c.dsn, "--data-dir", t.TempDir(), "--http-addr", "127.0.0.1:0",
		"--log-level", "info", "--mqtt-client-id", name, "--outbound-allow", "127.0.0.0/8"}, fleetdtest.ExternalBrokerFlags(c.broker, c.flags...)...)
	r := &replica{name: name, process: runFleetd(t, &testServer{&fleetdtest.Server{DSN: c.dsn}}, args, c.env)}
	t.Cleanup(r.stop)
	if r.Key != "" { // the first replica made the tenant and its key
		c.key = r.Key
	}
	r.Key = c.key
	r.MQTTAddr = c.broker.Addr // a cluster's devices connect to the broker itself
	// Connected to the broker and subscribed: its share of the devices'
	// traffic comes to it, and its dispatches go out.
	fleetdtest.Eventually(t, name+" to connect to the broker", func() bool {
		resp, err := http.Get(r.URL + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(b), "\nfleetd_mqtt_broker_connected 1\n")
	})
	return r
}

// stop ends the replica gracefully, as SIGTERM does in production.
func (r *replica) stop() {
	select {
	case <-r.exited:
		return
	default:
	}
	r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.exited:
	case <-time.After(30 * time.Second):
		r.cmd.Process.Kill()
		<-r.exited
	}
}

// db opens the cluster's database for checks the API does not show.
func (c *cluster) db() *sql.DB {
	c.t.Helper()
	db, err := sql.Open("pgx", c.dsn)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { db.Close() })
	return db
}

// timedOut sums the device actions the replicas say their sweepers failed.
// sweeps is the number of timeout sweeps r finished.
func sweeps(t *testing.T, r *replica) float64 {
	t.Helper()
	return metric(t, r.URL, "fleetd_action_sweeps_total")
}

func timedOut(t *testing.T, rs ...*replica) int {
	t.Helper()
	n := 0
	for _, r := range rs {
		n += int(metric(t, r.URL, "fleetd_device_actions_timed_out_total"))
	}
	return n
}

// TestReplicas runs two replicas: what one is asked is done once, and what
// one records the other sees.
func TestReplicas(t *testing.T) {
	c := newCluster(t, append([]string{"--action-sweep-interval", "50ms"}, fleetdtest.AlertFlags...)...)
	a := c.start("replica-a")
	b := c.start("replica-b")
	admin := a.Admin()
	db := c.db()
	tok := map[string]string{}
	for _, id := range []string{"pump-1", "pump-2", "pump-3"} {
		tok[id] = a.MustDevice(t, admin, id, nil).Token
	}

	t.Run("DeletedKeyRefusedByTheOtherReplica", func(t *testing.T) {
		ops := a.NewKey(t, admin, "ops", "operator")
		b.Do(t, ops, "GET", "/api/v1/devices", nil).Want(t, 200) // cached on B now
		a.Do(t, admin, "DELETE", "/api/v1/apikeys/ops", nil).Want(t, 204)
		// B hears of it at once (NOTIFY), well within its 10s cache.
		fleetdtest.EventuallyWithin(t, 3*time.Second, "B to refuse the key A deleted", func() bool {
			return b.Do(t, ops, "GET", "/api/v1/devices", nil).Status == http.StatusUnauthorized
		})
	})

	t.Run("SignOutRefusedByTheOtherReplica", func(t *testing.T) {
		// The session's row is read on every request: no cache to wait for.
		onA := fleetdtest.NewBrowser(t, a.URL)
		tok := onA.SignIn("default", admin.Key).CSRF(t)
		onB := onA.CopyTo(b.URL)
		onB.Get("/console/devices").Want(t, 200)
		onA.Do("POST", "/console/signout", url.Values{"csrf": {tok}}).Want(t, 303)
		onB.Get("/console/devices").Want(t, 303)
	})

	t.Run("ActionThroughAReachesTheDeviceOnce", func(t *testing.T) {
		// The device arrives through B's broker-auth endpoints; once B has
		// served its arrival (nothing was queued), A dispatches.
		d := b.arriveExternal(t, c.broker.Addr, "default", "pump-1", tok["pump-1"])
		fleetdtest.Eventually(t, "the arrival to be served", func() bool { return fleetdtest.Count(t, db, "SELECT count(*) FROM device_redeliveries") == 0 })
		id := a.Dispatch(t, admin, map[string]any{"action": "reboot", "params": map[string]any{}, "search_type": "default", "device_ids": []string{"pump-1"}})
		if m := d.next(t); m.ID != fmt.Sprint(id) {
			t.Fatalf("pump-1 received %+v", m)
		}
		// Once neither replica is handing a dispatch to the broker and no
		// arrival waits to be served, every copy either sent is counted.
		fleetdtest.Eventually(t, "the replicas to finish sending", func() bool {
			return metric(t, a.URL, "fleetd_action_deliveries_in_flight")+metric(t, b.URL, "fleetd_action_deliveries_in_flight") == 0 &&
				fleetdtest.Count(t, db, "SELECT count(*) FROM device_redeliveries") == 0
		})
		if n := metric(t, a.URL, "fleetd_mqtt_messages_out_total") + metric(t, b.URL, "fleetd_mqtt_messages_out_total"); n != 1 {
			t.Fatalf("the replicas sent %v action messages, want 1", n)
		}
		select {
		case m := <-d.actions:
			t.Fatalf("pump-1 received %+v a second time", m)
		default:
		}

		t.Run("StatusThroughBVisibleFromA", func(t *testing.T) {
			// Over MQTT, through whichever replica the broker picks...
			d.publish(t, mqtt.ActionStatusTopic("default", "pump-1"), map[string]any{"id": fmt.Sprint(id), "state": "Rebooting", "progress": 50})
			a.AwaitActionStatus(t, admin, "pump-1", id, "Progress")
			// ...and over HTTP through B: committed when B answers.
			b.Do(t, admin, "POST", "/api/v1/devices/action/status", map[string]any{"device_id": "pump-1", "action_id": id, "state": "Completed", "progress": 100}).Want(t, 204)
			if da := a.DeviceAction(t, admin, "pump-1", id); da.ActionStatus != "Completed" {
				t.Fatalf("A sees %+v", da)
			}
		})
	})

	t.Run("TimeoutOnce", func(t *testing.T) {
		before := timedOut(t, a, b)
		id := a.Dispatch(t, admin, map[string]any{"action": "slow", "params": map[string]any{}, "search_type": "default",
			"device_ids": []string{"pump-2", "pump-3"}, "timeout": 1})
		for _, dev := range []string{"pump-2", "pump-3"} {
			b.Do(t, admin, "POST", "/api/v1/devices/action/status", map[string]any{"device_id": dev, "action_id": id, "state": "Running"}).Want(t, 204)
		}
		for _, dev := range []string{"pump-2", "pump-3"} {
			da := a.AwaitActionStatus(t, admin, dev, id, "Failed")
			if da.Status != "TimedOut" || len(da.Errors["TimedOut"]) != 1 {
				t.Fatalf("%s: %+v", dev, da)
			}
		}
		// Both replicas sweep every 50ms; the two device actions were
		// failed once in all. A sweep that could still count one has ended
		// once each replica finished two more.
		sa, sb := sweeps(t, a), sweeps(t, b)
		fleetdtest.Eventually(t, "a sweep of each replica to begin and end", func() bool { return sweeps(t, a) >= sa+2 && sweeps(t, b) >= sb+2 })
		if n := timedOut(t, a, b) - before; n != 2 {
			t.Fatalf("the replicas timed out %d device actions, want 2:\nA:\n%s\nB:\n%s", n, a.stderr, b.stderr)
		}
	})

	t.Run("NotificationOnce", func(t *testing.T) {
		hook := fleetdtest.NewReceiver(t, 0)
		rule := a.MustAlertRule(t, admin, map[string]any{"name": "hot", "stream": "env",
			"condition": map[string]any{"field": "temp", "operator": ">", "value": 80}})
		a.Do(t, admin, "POST", "/api/v1/alert-rules/"+rule.ID+"/alert-notification-rules", map[string]any{
			"channel_parameters": map[string]any{"type": "webhook", "url": hook.URL}}).Want(t, 201)
		// B learns of the rule A made from A's notification at once, not
		// from its periodic refresh (10s): a hot reading through B opens
		// the alert.
		start := time.Now().Add(-time.Hour)
		path := "/api/v1/devices/pump-2/streams/env"
		i := 0
		fleetdtest.Eventually(t, "B to open the alert", func() bool {
			i++
			b.Do(t, admin, "POST", path, fleetdtest.Points(start.Add(time.Duration(i)*time.Second), 90)).Want(t, 200)
			return len(a.Alerts(t, admin, "?rule_id="+rule.ID)) == 1
		})
		// A hot reading through A, which never saw the stream, finds the
		// alert open: still one alert, one notification.
		a.Do(t, admin, "POST", path, fleetdtest.Points(start.Add(time.Minute), 95)).Want(t, 200)
		// A delivered notification is claimed by no one again: once it
		// is recorded, the receiver has every copy it will get.
		fleetdtest.Eventually(t, "the notification to be delivered", func() bool {
			return fleetdtest.Count(t, db, "SELECT count(*) FROM alert_outbox WHERE status = 'delivered'") == 1
		})
		if n := fleetdtest.Count(t, db, "SELECT count(*) FROM alert_outbox"); n != 1 {
			t.Fatalf("%d notifications in the outbox, want 1", n)
		}
		if n := len(hook.Got()); n != 1 {
			t.Fatalf("%d notifications, want 1", n)
		}
		if n := len(a.Alerts(t, admin, "?rule_id="+rule.ID)); n != 1 {
			t.Fatalf("%d alerts, want 1", n)
		}
	})
}

// TestReplicasEvaluateOneStream sends one device's readings alternately
// through two replicas, as a shared subscription or a load balancer does:
// the alert follows the data, whichever replica saw the previous reading.
func TestReplicasEvaluateOneStream(t *testing.T) {
	c := newCluster(t, fleetdtest.AlertFlags...)
	a := c.start("replica-a")
	admin := a.Admin()
	a.MustDevice(t, admin, "pump-1", nil)
	rule := a.MustAlertRule(t, admin, map[string]any{"name": "warm", "stream": "env",
		"condition": map[string]any{"field": "temp", "operator": ">", "value": 50}})
	b := c.start("replica-b") // loads the rule at start
	start := time.Now().Add(-time.Hour)
	path := "/api/v1/devices/pump-1/streams/env"
	state := func() []string {
		var out []string
		for _, al := range a.Alerts(t, admin, "?rule_id="+rule.ID) {
			out = append(out, al.State)
		}
		return out
	}
	for i, step := range []struct {
		via  *replica
		temp float64
		want string
	}{
		{b, 90, "[active]"},
		{a, 20, "[ended]"},
		{a, 91, "[active ended]"},
		{b, 21, "[ended ended]"},
		{b, 92, "[active ended ended]"},
		{a, 93, "[active ended ended]"},
		{b, 22, "[ended ended ended]"},
	} {
		step.via.Do(t, admin, "POST", path, fleetdtest.Points(start.Add(time.Duration(i)*time.Second), step.temp)).Want(t, 200)
		if got := fmt.Sprint(state()); got != step.want {
			t.Fatalf("step %d (%v through %s): alerts %s, want %s", i, step.temp, step.via.name, got, step.want)
		}
	}
}

// TestReplicaKilled kills one replica with SIGKILL under load: every write
// a replica acknowledged is kept, and the notification the dead one had
// claimed is delivered by the other once the lease ran out.
func TestReplicaKilled(t *testing.T) {
	c := newCluster(t, append([]string{"--notify-lease", "2s", "--mqtt-redelivery-lease", "2s"}, fleetdtest.AlertFlags...)...)
	a := c.start("replica-a")
	admin := a.Admin()
	db := c.db()

	// A webhook that hangs on its first request: the replica delivering it
	// holds its claim until it dies.
	var hits atomic.Int32
	release := make(chan struct{})
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hits.Add(1) == 1 {
			select {
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer hook.Close()
	defer close(release)
	a.MustDevice(t, admin, "pump-1", nil)
	rule := a.MustAlertRule(t, admin, map[string]any{"name": "hot", "stream": "env",
		"condition": map[string]any{"field": "temp", "operator": ">", "value": 80}})
	a.Do(t, admin, "POST", "/api/v1/alert-rules/"+rule.ID+"/alert-notification-rules", map[string]any{
		"channel_parameters": map[string]any{"type": "webhook", "url": hook.URL}}).Want(t, 201)
	a.Do(t, admin, "POST", "/api/v1/devices/pump-1/streams/env", fleetdtest.Points(time.Now(), 90)).Want(t, 200)
	fleetdtest.Eventually(t, "A to claim the notification", func() bool { return hits.Load() == 1 })
	b := c.start("replica-b")

	// Load: writers create devices through both replicas; a 201 is a
	// promise.
	var mu sync.Mutex
	acked := map[string]bool{}
	ctx, stopLoad := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var seq atomic.Int64
	client := &http.Client{Timeout: 5 * time.Second}
	for w := range 8 {
		target := []*replica{a, b}[w%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				id := fmt.Sprintf("load-%d", seq.Add(1))
				rq, _ := http.NewRequest("POST", target.URL+"/api/v1/devices", strings.NewReader(`{"id":"`+id+`"}`))
				rq.Header.Set("Content-Type", "application/json")
				rq.Header.Set("x-service-tenant", "default")
				rq.Header.Set("x-service-api-key", c.key)
				resp, err := client.Do(rq)
				if err != nil {
					if target == a {
						target = b // A is gone: a client retries elsewhere
					}
					continue
				}
				resp.Body.Close()
				if resp.StatusCode == http.StatusCreated {
					mu.Lock()
					acked[id] = true
					mu.Unlock()
				}
			}
		}()
	}
	ackedNow := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(acked)
	}
	fleetdtest.Eventually(t, "50 writes acknowledged before the kill", func() bool { return ackedNow() >= 50 })
	a.kill()
	before := ackedNow()
	fleetdtest.Eventually(t, "50 more through B after it", func() bool { return ackedNow() >= before+50 })
	stopLoad()
	wg.Wait()

	mu.Lock()
	n := len(acked)
	missing := 0
	for id := range acked {
		if fleetdtest.Count(t, db, "SELECT count(*) FROM devices WHERE tenant = 'default' AND id = $1", id) != 1 {
			missing++
		}
	}
	mu.Unlock()
	if n < 100 || missing > 0 {
		t.Fatalf("%d writes acknowledged, %d of them lost", n, missing)
	}
	t.Logf("%d device creations acknowledged under load, none lost", n)

	// B takes the dead replica's notification over after the lease.
	fleetdtest.Eventually(t, "B to deliver the notification", func() bool {
		return fleetdtest.Count(t, db, "SELECT count(*) FROM alert_outbox WHERE status = 'delivered'") == 1
	})
	if h := hits.Load(); h != 2 {
		t.Fatalf("webhook hit %d times, want 2 (A's, cut by the crash, and B's)", h)
	}
	_ = b
}

// TestReplicasShareBundlesThroughS3 runs two replicas, each with a data
// directory of its own, on one S3 bucket: a bundle uploaded through one is
// served, in ranges, by the other, and deleted through it.
func TestReplicasShareBundlesThroughS3(t *testing.T) {
	srv := s3test.Start(t)
	c := newCluster(t, "--blob-store", srv.URL("fleet/prod"))
	c.env = []string{"AWS_ACCESS_KEY_ID=" + srv.AccessKey, "AWS_SECRET_ACCESS_KEY=" + srv.SecretKey}
	a := c.start("replica-a")
	b := c.start("replica-b")
	admin := a.Admin()
	data := fleetdtest.MakeBundle(t, "3.1.0", fleetdtest.Bootloader, fleetdtest.App230)
	up := a.MustUpload(t, admin, data)
	path := "/api/v1/firmware-bundles/id/" + up.ID + "/artifact"

	resp, body := b.Get(t, admin, path)
	if resp.StatusCode != 200 || !bytes.Equal(body, data) {
		t.Fatalf("B serves %d, %d bytes; want 200 and the %d bytes A took", resp.StatusCode, len(body), len(data))
	}
	resp, body = b.Get(t, admin, path, "Range", "bytes=100-199")
	if resp.StatusCode != 206 || !bytes.Equal(body, data[100:200]) {
		t.Fatalf("B serves bytes=100-199 as %d, %d bytes", resp.StatusCode, len(body))
	}
	var objects []string
	for o := range srv.Client(t).ListObjects(context.Background(), srv.Bucket, minio.ListObjectsOptions{Recursive: true}) {
		objects = append(objects, o.Key)
	}
	// The archive, and each of its two components' files (hawkBit
	// clients download those), under the prefix.
	if len(objects) != 3 || !strings.HasPrefix(objects[0], "fleet/prod/bundles/default/"+up.ID+"/") ||
		!strings.HasPrefix(objects[1], "fleet/prod/components/default/") || !strings.HasPrefix(objects[2], "fleet/prod/components/default/") {
		t.Fatalf("the bucket holds %v, want the archive and two component files under the prefix", objects)
	}

	// Deleted through B: the archive goes; the component versions, and
	// their files, stay (docs/firmware.md).
	b.Do(t, admin, "DELETE", "/api/v1/firmware-bundles/id/"+up.ID, nil).Want(t, 204)
	for o := range srv.Client(t).ListObjects(context.Background(), srv.Bucket, minio.ListObjectsOptions{Recursive: true}) {
		if !strings.HasPrefix(o.Key, "fleet/prod/components/") {
			t.Errorf("after the delete through B, the bucket still holds %s", o.Key)
		}
	}
	if resp, _ := a.Get(t, admin, path); resp.StatusCode != 404 {
		t.Fatalf("A serves the deleted bundle: %d", resp.StatusCode)
	}
}
