package fleethttp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"syscall"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/codec"
	fleethttp "github.com/fleetd/fleet/http"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// BenchmarkPointsDayHTTP reads a day of one device's points at 1 Hz
// (86,400, kept in batches of 1000 as fleetbench's history scenario
// keeps them) through GET .../points in pages of 1000, in process, in
// each encoding; an iteration is the day. cpu-ms/day is the process's
// CPU time (getrusage), which survives a busy machine better than the
// time does.
func BenchmarkPointsDayHTTP(b *testing.B) {
	for _, be := range sqlstoretest.Backends() {
		b.Run(be.Name, func(b *testing.B) {
			ctx := context.Background()
			db := sqlstoretest.MustOpen(b, be, sqlstoretest.Options{})
			_, admin, err := db.CreateTenant(ctx, "acme")
			if err != nil {
				b.Fatal(err)
			}
			if _, err := db.CreateDevices(ctx, "acme", []fleet.NewDevice{{ID: "d1"}}); err != nil {
				b.Fatal(err)
			}
			now := time.Now()
			day := now.UTC().Truncate(24*time.Hour).AddDate(0, 0, -1)
			for i := 0; i < 86400; i += 1000 {
				pts := make([]fleet.DataPoint, 1000)
				for j := range pts {
					k := i + j
					pts[j] = fleet.DataPoint{Timestamp: day.Add(time.Duration(k) * time.Second), Sequence: int64(k),
						Data: map[string]any{"temp": 20 + float64(k%1000)/8}, ReceivedAt: now}
				}
				if err := db.CommitStream(ctx, "acme", "d1", "env", pts, nil); err != nil {
					b.Fatal(err)
				}
			}
			h := (&fleethttp.Server{Tenants: db, Devices: db, Audit: db, History: db, Security: fleethttp.Security{Rate: -1}}).Handler()
			for _, accept := range []string{"application/json", "application/transit+json", "application/transit+msgpack", "application/edn"} {
				b.Run(accept[len("application/"):], func(b *testing.B) {
					var cpu time.Duration
					for range b.N {
						q := url.Values{"limit": {"1000"}, "from": {day.Format(time.RFC3339)}, "to": {day.Add(24 * time.Hour).Format(time.RFC3339)}}
						pages := 0
						for {
							r := httptest.NewRequest("GET", "/api/v1/devices/d1/streams/env/points?"+q.Encode(), nil)
							r.Header.Set("X-Service-Tenant", "acme")
							r.Header.Set("X-Service-Api-Key", admin)
							r.Header.Set("Accept", accept)
							w := httptest.NewRecorder()
							c0 := processCPU()
							h.ServeHTTP(w, r)
							cpu += processCPU() - c0
							if w.Code != http.StatusOK {
								b.Fatalf("%d %s", w.Code, w.Body)
							}
							pages++
							f, _ := codec.FormatOf(w.Header().Get("Content-Type"))
							v, err := codec.Decode(f, w.Body.Bytes())
							if err != nil {
								b.Fatal(err)
							}
							next, _ := v.(map[string]any)["next"].(string)
							if next == "" {
								break
							}
							q.Set("cursor", next)
						}
						if pages != 87 {
							b.Fatalf("read %d pages, want 87", pages)
						}
					}
					b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/day")
				})
			}
		})
	}
}

// processCPU returns the user and system CPU time the process used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
