package fleethttp

import (
	"net/http"
	"strconv"
	"sync"

	"github.com/fleetd/fleet"
)

// DefaultFollowsPerTenant is Follows.PerTenant's default.
const DefaultFollowsPerTenant = 20

// followRetry is the Retry-After of a follow refused: streams end, at the
// latest, when their maximum age passes, and clients close them sooner.
const followRetry = 10

// Follows caps the log streams that follow a device (logs?follow=true and
// the console's Logs tab) that one tenant holds open at once on a
// replica: each holds a connection and polls the store every second, and
// the cap of connections per source address does not stop one tenant's
// clients from many addresses, or behind one proxy's, taking them all.
type Follows struct {
	PerTenant int // ≤ 0: no cap

	mu   sync.Mutex
	open map[string]int
}

// take holds one of tenant's follows until release is called, or is
// ERATELIMITED with Retry-After set on w.
func (f *Follows) take(w http.ResponseWriter, tenant string) (release func(), err error) {
	if f == nil || f.PerTenant <= 0 {
		return func() {}, nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.open[tenant] >= f.PerTenant {
		w.Header().Set("Retry-After", strconv.Itoa(followRetry))
		return nil, fleet.Errorf(fleet.ERATELIMITED, "tenant %s follows %d devices' logs at once, the most this server allows; close one, or retry in %d s",
			tenant, f.open[tenant], followRetry)
	}
	if f.open == nil {
		f.open = map[string]int{}
	}
	f.open[tenant]++
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.open[tenant]--; f.open[tenant] <= 0 {
				delete(f.open, tenant)
			}
		})
	}, nil
}
