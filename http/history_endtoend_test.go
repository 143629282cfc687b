package fleethttp_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/ctl"
	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestStreamHistoryEndToEnd: points sent over MQTT and HTTP are kept in
// history, read back and aggregated by fleetctl, rolled up by the server's
// own job; logs are read and followed.
func TestStreamHistoryEndToEnd(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		admin := s.Admin()
		dev := s.MustDevice(t, admin, "pump-1", map[string]string{"site": "berlin"})
		f := s.NewFleetctl(t, admin)
		start := time.Now().Add(-10 * time.Minute).Truncate(time.Minute)
		var batch []map[string]any
		for i := range 60 {
			batch = append(batch, map[string]any{"timestamp": start.Add(time.Duration(i) * time.Second).UnixMilli(), "sequence": i, "temp": 20 + i%5})
		}
		batch[59]["gps"] = map[string]any{"lat": 52.5}
		batch[59]["note"] = `"hot", then "cold"`
		d := fleetdtest.DialStreamDevice(t, s.MQTTAddr, "default", "pump-1", dev.Token)
		d.PublishStream(t, "env", batch[:30])
		s.Do(t, admin, "POST", "/api/v1/devices/pump-1/streams/env", batch[30:]).Want(t, 200)

		var streams struct {
			Streams []struct {
				Name   string
				Points int
			}
		}
		f.JSON(t, &streams, "streams", "list", "pump-1", "-o", "json")
		if len(streams.Streams) != 1 || streams.Streams[0].Points != 60 {
			t.Fatalf("streams = %+v", streams)
		}
		var page struct {
			Points []struct{ Sequence int }
			Next   *string
		}
		f.JSON(t, &page, "streams", "points", "pump-1", "env", "--limit", "40", "--since", "1h", "-o", "json")
		if len(page.Points) != 40 || page.Next == nil || page.Points[39].Sequence != 39 {
			t.Fatalf("first page = %d points, next %v", len(page.Points), page.Next)
		}
		f.JSON(t, &page, "streams", "points", "pump-1", "env", "--limit", "40", "--since", "1h", "--cursor", *page.Next, "-o", "json")
		if len(page.Points) != 20 || page.Next != nil || page.Points[0].Sequence != 40 {
			t.Fatalf("second page = %+v", page)
		}
		fleetdtest.WantContains(t, "table with the cursor", f.Run("", "streams", "points", "pump-1", "env", "--limit", "1", "--since", "1h").Stderr, "more: --cursor ")
		// CSV: a column per data field, a nested one by its dotted path
		// beside its siblings; a point without a field leaves it empty.
		r := f.Run("", "streams", "points", "pump-1", "env", "--order", "desc", "--limit", "2", "--since", "1h", "-o", "csv")
		stamp := func(i int) string {
			return start.Add(time.Duration(i) * time.Second).UTC().Format("2006-01-02T15:04:05.000Z")
		}
		if lines := strings.Split(r.Stdout, "\n"); len(lines) != 4 || lines[0] != "timestamp,sequence,data.gps.lat,data.note,data.temp,received_at" ||
			!strings.HasPrefix(lines[1], stamp(59)+`,59,52.5,"""hot"", then ""cold""",24,`) || !strings.HasPrefix(lines[2], stamp(58)+",58,,,23,") {
			t.Fatalf("points -o csv:\n%s", r.Stdout)
		}
		fleetdtest.WantContains(t, "csv with the cursor", r.Stderr, "more: --cursor ")
		fleetdtest.WantContains(t, "streams list -o csv", f.OK(t, "streams", "list", "pump-1", "-o", "csv"), "name,points,first_timestamp,last_timestamp\nenv,60,"+stamp(0)+","+stamp(59)+"\n")
		// The rollup job runs every second: the minute's rollup appears.
		var agg struct {
			Buckets []struct {
				Value float64
				Count int
			}
		}
		fleetdtest.Eventually(t, "the minute's rollup", func() bool {
			f.JSON(t, &agg, "streams", "aggregate", "pump-1", "env", "--field", "temp", "--fn", "count", "--interval", "1m", "--since", "1h", "-o", "json")
			return len(agg.Buckets) == 1 && agg.Buckets[0].Count == 60
		})
		f.JSON(t, &agg, "streams", "aggregate", "env", "--field", "temp", "--fn", "max", "--interval", "1h", "--metadata", "site=berlin", "-o", "json")
		if len(agg.Buckets) != 1 || agg.Buckets[0].Value != 24 {
			t.Fatalf("fleet-wide max = %+v", agg)
		}
		s.Do(t, admin, "POST", "/api/v1/groups", map[string]any{"name": "berlin", "selector": "site=berlin"}).Want(t, 201)
		f.JSON(t, &agg, "streams", "aggregate", "env", "--field", "temp", "--fn", "max", "--interval", "1h", "--group", "berlin", "-o", "json")
		if len(agg.Buckets) != 1 || agg.Buckets[0].Value != 24 {
			t.Fatalf("fleet-wide max of group berlin = %+v", agg)
		}
		fleetdtest.WantContains(t, "fleet-wide by device -o csv", f.OK(t, "streams", "aggregate", "env", "--field", "temp", "--fn", "max", "--interval", "1h", "--by", "device", "-o", "csv"),
			"device_id,start,value,count\npump-1,"+start.Truncate(time.Hour).UTC().Format(time.RFC3339)[:19])
		fleetdtest.WantContains(t, "bad interval", f.Fails(t, ctl.ExitRefused, "streams", "aggregate", "pump-1", "env", "--field", "temp", "--interval", "90s"), "400 invalid", "interval")

		now := time.Now()
		d.PublishStream(t, "logs", []map[string]any{
			{"timestamp": now.UnixMilli(), "level": "info", "tag": "app", "message": "booted"},
			{"timestamp": now.UnixMilli() + 1, "level": "error", "tag": "app", "message": "sensor lost", "line": "sensor.c:7"},
		})
		out := f.OK(t, "logs", "pump-1")
		fleetdtest.WantContains(t, "logs", out, "INFO  app: booted", "ERROR app sensor.c:7: sensor lost")
		if out := f.OK(t, "logs", "pump-1", "--level", "warn"); strings.Contains(out, "booted") {
			t.Fatalf("--level warn printed an info line: %s", out)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		live, done := f.Start(ctx, "logs", "pump-1", "-f", "--grep", "sensor", "-o", "json")
		fleetdtest.Eventually(t, "the line there was", func() bool { return strings.Contains(live.String(), "sensor lost") })
		d.PublishStream(t, "logs", []map[string]any{{"timestamp": time.Now().UnixMilli() + 2, "level": "error", "tag": "app", "message": "sensor back"}})
		fleetdtest.Eventually(t, "the line that arrived", func() bool { return strings.Contains(live.String(), "sensor back") })
		cancel()
		if r := <-done; r.Code != 0 {
			t.Fatalf("logs -f ended with %d: %s", r.Code, r.Stderr)
		}
		var line struct{ Message string }
		if err := json.Unmarshal([]byte(strings.SplitN(live.String(), "\n", 2)[0]), &line); err != nil || line.Message != "sensor lost" {
			t.Fatalf("-o json line: %q %v", live.String(), err)
		}
	})
}
