package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestHTTPBodyFlood is issue 15's HTTP flood: with a device-role key, 150
// concurrent 1 MiB ingest bodies of empty objects, [{},{},…], took fleetd
// past 2 GB of RSS at 10129e9 and killed it (decoding costs ~35 times a
// body). Two bounds hold it now, and each flood here needs its own:
//   - the decoders count elements as they read and stop at the 10,001st
//     (an ingest's most points): those bodies are refused 413 after 30 KB;
//   - bodies within that limit that cost as much, arrays of 10,000 empty
//     objects in an array, are decoded at most --max-decoding-bytes
//     (4 MiB) at a time, a quarter of it for one client; the others wait.
//
// And the third: three concurrent 64 MiB bulk bodies of empty
// objects are refused at the 100,001st.
//
// fleetd runs as its own process; its peak RSS (VmHWM) must stay under
// 768 MB, three quarters of the target: measured, 390–500 MB (the
// 150 bodies themselves, held while they arrive, are 150 MB; decoding
// holds up to 35 times 4 MiB; the collector lets the heap reach twice
// what is live). Without the element limit the first flood, without the
// decoding bound the second, would take gigabytes. docs/reliability.md
// has the figures.
func TestHTTPBodyFlood(t *testing.T) {
	s, p := startFloodTarget(t)
	admin := s.admin()
	// Five gateways: one client may hold a quarter of the decoding budget,
	// so it takes several to fill it.
	var gateways []creds
	for i := range 5 {
		gateways = append(gateways, s.newKey(t, admin, fmt.Sprintf("gateway-%d", i), "device"))
	}
	s.mustDevice(t, admin, "pump-1", nil)

	const requests, size = 150, 1 << 20
	// empties returns n empty objects, "{},{},…", without brackets.
	empties := func(n int) []byte { return bytes.TrimSuffix(bytes.Repeat([]byte("{},"), n), []byte(",")) }
	flat := append(append([]byte("["), empties(size/3-1)...), ']')
	var nested []byte // [[{},…10,000],[…],…] up to 1 MiB
	for inner := append(append([]byte("["), empties(10_000)...), ']'); len(nested)+len(inner)+2 <= size; {
		if nested == nil {
			nested = []byte("[")
		} else {
			nested = append(nested, ',')
		}
		nested = append(nested, inner...)
	}
	nested = append(nested, ']')

	client := &http.Client{Timeout: time.Minute}
	// flood sends n copies of body to path, all at once, as each of cs in
	// turn.
	flood := func(n int, cs []creds, path string, body []byte, want int) {
		t.Helper()
		statuses := make(map[int]int)
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i := range n {
			c := cs[i%len(cs)]
			wg.Go(func() {
				hr, _ := http.NewRequest("POST", s.URL+path, bytes.NewReader(body))
				hr.Header.Set("Content-Type", "application/json")
				hr.Header.Set("x-service-tenant", c.Tenant)
				hr.Header.Set("x-service-api-key", c.Key)
				status := 0 // the connection failed
				if resp, err := client.Do(hr); err == nil {
					status = resp.StatusCode
					if status == 503 && resp.Header.Get("Retry-After") == "" {
						status = -503
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				mu.Lock()
				statuses[status]++
				mu.Unlock()
			})
		}
		wg.Wait()
		t.Logf("%d bodies of %d KiB to %s: statuses %v", n, len(body)>>10, path, statuses)
		// 503 with Retry-After is what a body that waited too long gets;
		// anything else is a failure.
		if statuses[want]+statuses[503] != n || statuses[want] == 0 {
			t.Errorf("statuses %v, want %d (and perhaps 503 with Retry-After) for all %d", statuses, want, n)
		}
	}
	const ingest = "/api/v1/devices/pump-1/streams/junk"
	before := vmHWM(t, p.cmd.Process.Pid)
	// The third flood first, while the peak is low enough to show
	// its own: three bulk provisioning bodies of 64 MiB, {"devices":
	// [{},{},…]}, stopped at the 100,001st device.
	bulk := append(append([]byte(`{"devices":[`), empties((64<<20-100)/3)...), ']', '}')
	flood(3, []creds{admin}, "/api/v1/devices/bulk", bulk, 413)
	afterBulk := vmHWM(t, p.cmd.Process.Pid)
	flood(requests, gateways, ingest, flat, 413)
	afterFlat := vmHWM(t, p.cmd.Process.Pid)
	flood(requests, gateways, ingest, nested, 400) // every point is an array, not an object
	peak := vmHWM(t, p.cmd.Process.Pid)
	t.Logf("fleetd VmHWM: %d MB before, %d MB after the bulk flood, %d MB after the flat one, %d MB after the nested one",
		before>>20, afterBulk>>20, afterFlat>>20, peak>>20)
	if peak >= 768<<20 {
		t.Fatalf("fleetd's peak RSS %d MB, want under 768 MB", peak>>20)
	}
	// fleetd is still serving.
	s.do(t, admin, "GET", "/api/v1/devices", nil).want(t, 200)
}
