package fleethttp_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/action"
	fleethttp "github.com/fleetd/fleet/http"
	"github.com/fleetd/fleet/sqlstore"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// benchConns is how many client connections the S10 benchmark keeps busy, as
// fleetbench does (BENCHMARKS.md, "HTTP load").
const benchConns = 64

// BenchmarkActionStatusHTTP measures S10 end to end over HTTP: 64
// connections, each posting one status report after another, every answer a
// commit. The hello sub-benchmark is a hello-world Go handler driven by the
// same load generator in the same run, the baseline BENCHMARKS.md compares
// S10 with. It reports reports/s, the p99 latency and the process's CPU per
// request (cpu-µs/op, the load generator's included).
func BenchmarkActionStatusHTTP(b *testing.B) {
	b.Run("hello", func(b *testing.B) {
		load(b, helloServer(b), nil, func(int64) []byte { return []byte(`{}`) })
	})
	for _, be := range sqlstoretest.Backends() {
		b.Run(be.Name, func(b *testing.B) {
			db := sqlstoretest.MustOpen(b, be, sqlstoretest.Options{})
			ctx := context.Background()
			key, a := s10Fleet(b, db)
			svc := &action.Service{Store: db}
			if db.Dialect() == "sqlite" {
				svc.ReportWorkers = 1 // as fleetd serve sets it
			}
			svc.Open()
			defer svc.Close()
			api := &fleethttp.Server{Addr: "127.0.0.1:0", Tenants: db, Devices: db, Audit: db, Actions: svc}
			if err := api.Open(); err != nil {
				b.Fatal(err)
			}
			defer api.Shutdown(ctx)
			header := http.Header{"X-Service-Tenant": {"bench"}, "X-Service-Api-Key": {key.Key}, "Content-Type": {"application/json"}}
			load(b, "http://"+api.ListenAddr().String()+"/api/v1/devices/action/status", header, func(i int64) []byte {
				return fmt.Appendf(nil, `{"device_id":"dev-%05d","action_id":%d,"state":"Downloading","progress":%d,"timestamp":%d,"sequence":%d}`,
					i%s10Devices, a.ID, i%100, i, i)
			})
		})
	}
}

// helloServer serves the hello-world handler the S10 benchmarks compare
// with: it reads the body and answers 204. It returns the server's URL and
// closes it when b ends.
func helloServer(b *testing.B) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	})}
	go srv.Serve(ln)
	b.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String() + "/"
}

// s10Devices is how many devices the S10 benchmarks' tenant "bench" has.
const s10Devices = 10_000

// s10Fleet makes the S10 benchmarks' tenant "bench" in db: a device key,
// s10Devices devices dev-00000… and an action dispatched to all of them.
func s10Fleet(b *testing.B, db *sqlstore.DB) (*fleet.APIKey, *fleet.Action) {
	b.Helper()
	ctx := context.Background()
	if _, _, err := db.CreateTenant(ctx, "bench"); err != nil {
		b.Fatal(err)
	}
	key := &fleet.APIKey{Name: "gw", Role: fleet.RoleDevice}
	if err := db.CreateAPIKey(ctx, "bench", key); err != nil {
		b.Fatal(err)
	}
	devs := make([]fleet.NewDevice, s10Devices)
	for i := range devs {
		devs[i] = fleet.NewDevice{ID: fmt.Sprintf("dev-%05d", i)}
	}
	if _, err := db.CreateDevices(ctx, "bench", devs); err != nil {
		b.Fatal(err)
	}
	a, err := db.DispatchAction(ctx, "bench", &fleet.Dispatch{Action: "reboot", Params: []byte(`{}`), SearchType: fleet.SearchAll, Timeout: 3600})
	if err != nil {
		b.Fatal(err)
	}
	return key, a
}

// BenchmarkActionStatusBudget takes S10's CPU a request apart, item by
// item, under BenchmarkActionStatusHTTP's load generator, every stage sent
// S10's headers and bodies on SQLite's store: hello is the hello-world
// handler; bare the same handler served with fleetd's server settings and
// connection limit (the deadlines net/http sets); servehttp a route behind
// fleetd's ServeHTTP alone (the request id, the contexts, the mux);
// middleware one behind the whole middleware of S10's route as well
// (deadlines, metrics, the device key's authentication, the rate limit);
// decode one that reads S10's body as handleActionStatus does; handoff S10
// itself with a store whose ReportStatus sleeps a commit's time and writes
// nothing (the report workers' hand-off, the sightings); commit S10 on
// SQLite. Each answers 204; the difference of two neighbours' cpu-µs/op
// is what the second adds a request (docs/benchmarks-notebook.md, "S10's
// CPU a request, item by item").
//
//	go test ./http -run '^$' -bench ActionStatusBudget -benchtime 20000x
func BenchmarkActionStatusBudget(b *testing.B) {
	db := sqlstoretest.MustOpen(b, sqlstoretest.Backends()[0], sqlstoretest.Options{})
	ctx := context.Background()
	key, a := s10Fleet(b, db)
	// Each device action's first report (from Queued) is not S10's usual
	// one: apply them first.
	var seq atomic.Int64 // each report newer than the last, across sub-benchmarks
	for start := 0; start < s10Devices; start += 500 {
		var first []fleet.StatusReport
		for i := start; i < start+500; i++ {
			n := seq.Add(1)
			first = append(first, fleet.StatusReport{DeviceID: fmt.Sprintf("dev-%05d", i), ActionID: a.ID, State: "Downloading", Timestamp: &n, Sequence: &n})
		}
		if _, err := db.ReportStatus(ctx, "bench", first); err != nil {
			b.Fatal(err)
		}
	}
	header := http.Header{"X-Service-Tenant": {"bench"}, "X-Service-Api-Key": {key.Key}, "Content-Type": {"application/json"}} // each report newer than the last, across sub-benchmarks
	body := func(int64) []byte {
		i := seq.Add(1)
		return fmt.Appendf(nil, `{"device_id":"dev-%05d","action_id":%d,"state":"Downloading","progress":%d,"timestamp":%d,"sequence":%d}`,
			i%s10Devices, a.ID, i%100, i, i)
	}
	b.Run("hello", func(b *testing.B) {
		load(b, helloServer(b), header, body)
	})
	serve := func(b *testing.B, store action.Store, path string) {
		svc := &action.Service{Store: store, ReportWorkers: 1}
		svc.Open()
		defer svc.Close()
		api := &fleethttp.Server{Addr: "127.0.0.1:0", Tenants: db, Devices: db, Audit: db, Actions: svc}
		api.AddBudgetRoutes()
		if err := api.Open(); err != nil {
			b.Fatal(err)
		}
		defer api.Shutdown(ctx)
		load(b, "http://"+api.ListenAddr().String()+path, header, body)
	}
	b.Run("bare", func(b *testing.B) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		srv := (&fleethttp.Server{}).ServeBare(ln)
		defer srv.Close()
		load(b, "http://"+ln.Addr().String()+"/", header, body)
	})
	for _, path := range []string{"servehttp", "middleware", "decode"} {
		b.Run(path, func(b *testing.B) { serve(b, db, "/bench/"+path) })
	}
	b.Run("handoff", func(b *testing.B) { serve(b, sleepingStore{db}, "/api/v1/devices/action/status") })
	b.Run("commit", func(b *testing.B) { serve(b, db, "/api/v1/devices/action/status") })
}

// sleepingStore applies no status report: ReportStatus takes about a
// SQLite commit's time under S10 (BenchmarkActionStatusBudget's handoff).
type sleepingStore struct{ *sqlstore.DB }

func (sleepingStore) ReportStatus(ctx context.Context, tenant string, reports []fleet.StatusReport) ([]error, error) {
	time.Sleep(3 * time.Millisecond)
	return make([]error, len(reports)), nil
}

// load posts b.N bodies to url over benchConns connections and reports
// requests per second and the p99 latency.
func load(b *testing.B, url string, header http.Header, body func(i int64) []byte) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: benchConns, MaxConnsPerHost: benchConns}}
	defer client.CloseIdleConnections()
	var next atomic.Int64
	lat := make([][]time.Duration, benchConns)
	var wg sync.WaitGroup
	b.ResetTimer()
	cpu0 := processCPU()
	for c := range benchConns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				req, _ := http.NewRequest("POST", url, bytes.NewReader(body(i)))
				req.Header = header.Clone()
				start := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					b.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				lat[c] = append(lat[c], time.Since(start))
				if resp.StatusCode != http.StatusNoContent {
					b.Errorf("status %d", resp.StatusCode)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	// The process's CPU, the load generator's included (the same in every
	// build): what moves less than req/s on a shared machine.
	b.ReportMetric(float64(processCPU()-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu-µs/op")
	all := slices.Concat(lat...)
	slices.Sort(all)
	if len(all) > 0 {
		b.ReportMetric(float64(all[len(all)*99/100].Microseconds())/1000, "p99-ms")
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
}

// BenchmarkDeviceActionsHTTP is S7 through the handler, in process: one
// page of 50 of a device's 10,000 actions, every sort in turn, desc and
// asc alternating, in each encoding. S7's tail is the requests that overlap
// a garbage collection, so what it reports first is the garbage: B/op and
// allocs/op with -benchmem.
//
//	go test ./http -run '^$' -bench DeviceActionsHTTP -benchmem
func BenchmarkDeviceActionsHTTP(b *testing.B) {
	const n = 10_000
	a := newAPI(b)
	ctx := context.Background()
	ids := make([]int64, n)
	errs := make([]error, 16)
	var wg sync.WaitGroup
	for w := range errs {
		wg.Go(func() {
			for i := w; i < n && errs[w] == nil; i += len(errs) {
				d, err := a.db.DispatchAction(ctx, "acme", &fleet.Dispatch{Action: fmt.Sprintf("act-%d", i%8),
					Params: []byte(fmt.Sprintf(`{"i":%d}`, i)), SearchType: fleet.SearchDefault, DeviceIDs: []string{"d1"}, Timeout: 3600,
					UserEmail: fmt.Sprintf("operator%d@example.com", i%4), UserName: fmt.Sprintf("operator%d", i%4)})
				if err != nil {
					errs[w] = err
				} else {
					ids[i] = d.ID
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
	// As fleetbench's S7 device has them: all final but the last 30, some
	// Failed with one or two errors, some Completed after a warning.
	var reports []fleet.StatusReport
	for i, id := range ids[:n-30] {
		switch {
		case i%4 == 2:
			reports = append(reports, fleet.StatusReport{DeviceID: "d1", ActionID: id, State: "Failed", Errors: []string{"checksum mismatch", "retry limit"}[:1+i%3/2]})
		case i%4 == 3:
			reports = append(reports, fleet.StatusReport{DeviceID: "d1", ActionID: id, State: "Installing", Errors: []string{"low battery"}},
				fleet.StatusReport{DeviceID: "d1", ActionID: id, State: "Completed"})
		default:
			reports = append(reports, fleet.StatusReport{DeviceID: "d1", ActionID: id, State: "Completed"})
		}
	}
	for start := 0; start < len(reports); start += 500 {
		if _, err := a.db.ReportStatus(ctx, "acme", reports[start:min(start+500, len(reports))]); err != nil {
			b.Fatal(err)
		}
	}
	sorts := []string{"action_id", "type", "status", "user_email", "user_name", "updated_at", "errors"}
	for _, accept := range []string{"application/json", "application/transit+json", "application/transit+msgpack", "application/edn"} {
		b.Run(accept[len("application/"):], func(b *testing.B) {
			w := &discard{header: http.Header{}}
			i := 0
			for b.Loop() {
				order := []string{"desc", "asc"}[i%2]
				r, _ := http.NewRequest("GET", "/api/v1/devices/d1/actions?limit=50&sort_by="+sorts[i/2%len(sorts)]+"&sort_order="+order, nil)
				r.Header.Set("Accept", accept)
				r.Header.Set("X-Service-Tenant", "acme")
				r.Header.Set("X-Service-Api-Key", a.keys["viewer"])
				clear(w.header)
				w.status = 0
				a.h.ServeHTTP(w, r)
				if w.status != http.StatusOK {
					b.Fatalf("status %d", w.status)
				}
				i++
			}
		})
	}
}

// discard is a ResponseWriter that keeps only the status, so that the
// benchmark's garbage is the handler's.
type discard struct {
	header http.Header
	status int
}

func (d *discard) Header() http.Header         { return d.header }
func (d *discard) Write(p []byte) (int, error) { return len(p), nil }
func (d *discard) WriteHeader(code int)        { d.status = code }
