package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// latencies are the durations of the operations of one measurement, every
// one of them, so percentiles are exact.
type latencies []time.Duration

// percentile returns the p-th percentile (0 < p <= 100) by the nearest-rank
// method. l must be sorted.
func (l latencies) percentile(p float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	rank := int(float64(len(l))*p/100+0.9999999) - 1
	return l[max(0, min(rank, len(l)-1))]
}

// window is a measurement: operations started after a warmup and finished
// before its end count; those around it load the server but are not
// counted.
type window struct {
	start, end time.Time
	mu         sync.Mutex
	lat        latencies
	errors     atomic.Int64
	firstErr   atomic.Value // string
}

func newWindow(warmup, duration time.Duration) *window {
	start := time.Now().Add(warmup)
	return &window{start: start, end: start.Add(duration)}
}

// over reports whether the window has ended.
func (w *window) over() bool { return time.Now().After(w.end) }

// recorder collects one worker's samples without locking; flush adds them
// to the window.
type recorder struct {
	w   *window
	lat latencies
}

func (w *window) recorder() *recorder { return &recorder{w: w, lat: make(latencies, 0, 1<<14)} }

// done records an operation that began at t0 and succeeded now.
func (r *recorder) done(t0 time.Time) {
	t1 := time.Now()
	if t0.Before(r.w.start) || t1.After(r.w.end) {
		return
	}
	r.lat = append(r.lat, t1.Sub(t0))
}

// fail records a failed operation; failures count whenever they happen.
func (r *recorder) fail(err error) {
	if r.w.errors.Add(1) == 1 {
		r.w.firstErr.Store(err.Error())
	}
}

func (r *recorder) flush() {
	r.w.mu.Lock()
	r.w.lat = append(r.w.lat, r.lat...)
	r.w.mu.Unlock()
}

// result is a window's outcome.
type result struct {
	ops           int
	rate          float64 // operations per second
	p50, p99, max time.Duration
	over50        int // operations that took more than 50 ms
	errors        int64
	firstErr      string
}

func (w *window) result() result {
	slices.Sort(w.lat)
	r := result{ops: len(w.lat), errors: w.errors.Load(), p50: w.lat.percentile(50), p99: w.lat.percentile(99), max: w.lat.percentile(100)}
	r.over50 = len(w.lat) - sort.Search(len(w.lat), func(i int) bool { return w.lat[i] > 50*time.Millisecond })
	r.rate = float64(r.ops) / w.end.Sub(w.start).Seconds()
	if s, ok := w.firstErr.Load().(string); ok {
		r.firstErr = s
	}
	return r
}

// httpLoad is a closed-loop HTTP load: conns workers, each on a connection
// of its own, each sending its next request when the last one answered.
type httpLoad struct {
	method string // POST when empty
	url    string
	// urlOf, when not nil, is worker's i-th request's URL instead.
	urlOf func(worker, i int) string
	// headers are the requests' headers: worker w sends
	// headers[w%len(headers)].
	headers []http.Header
	conns   int
	want    int // the status every answer must have
	// body returns worker's i-th request body.
	body             func(worker, i int) []byte
	warmup, duration time.Duration
}

// newClient returns an HTTP/1.1 client that keeps exactly conns
// connections to one host.
func newClient(conns int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		MaxConnsPerHost:     conns,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}, Timeout: time.Minute}
}

// run drives the load until its window ends.
func (l *httpLoad) run(ctx context.Context) result {
	client := newClient(l.conns)
	defer client.CloseIdleConnections()
	w := newWindow(l.warmup, l.duration)
	method := l.method
	if method == "" {
		method = http.MethodPost
	}
	var wg sync.WaitGroup
	for worker := range l.conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec := w.recorder()
			defer rec.flush()
			header := l.headers[worker%len(l.headers)].Clone()
			for i := 0; !w.over() && ctx.Err() == nil; i++ {
				u := l.url
				if l.urlOf != nil {
					u = l.urlOf(worker, i)
				}
				req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(l.body(worker, i)))
				if err != nil {
					rec.fail(err)
					return
				}
				req.Header = header
				t0 := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					rec.fail(err)
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != l.want {
					rec.fail(fmt.Errorf("status %d, want %d: %s", resp.StatusCode, l.want, b))
					continue
				}
				rec.done(t0)
			}
		}()
	}
	wg.Wait()
	return w.result()
}
