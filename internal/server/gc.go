package server

import (
	"context"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/fleetd/fleet/internal/cli"
)

// gcFlags registers --gc-percent. Left alone, Go's own setting stands:
// GOGC, else 100. Raised to 400, collections are a quarter as frequent,
// which takes them out of the 99th percentile of reading a device's
// history (S7), but the heap may then reach five times the live heap: a
// flood of large MQTT packets peaked at 1,075 MB resident against under
// 512 MB at 100 (TestMQTTPayloadFlood), so it is not the default.
func (c *Config) gcFlags(fs *cli.FlagSet) {
	fs.IntVar(&c.gcPercent, "gc-percent", 100, "the heap may grow `N`% over the live heap before a garbage collection (Go's GOGC, which stands when this is not given); 400 makes slow API reads rarer for up to five times the heap; negative: collect only to stay under GOMEMLIMIT")
}

// applyGC sets the collector's target if --gc-percent was given (as a
// flag or FLEETD_GC_PERCENT); otherwise Go has applied GOGC or its
// default.
func (c *Config) applyGC(fs *cli.FlagSet, getenv func(string) string) error {
	if !fs.IsSet("gc-percent") {
		return nil
	}
	if c.gcPercent < 0 && getenv("GOMEMLIMIT") == "" {
		return fmt.Errorf("--gc-percent %d turns the collector off: set GOMEMLIMIT to bound the heap", c.gcPercent)
	}
	debug.SetGCPercent(c.gcPercent)
	return nil
}

// Memory after a burst of connections. Each MQTT connection leaves about
// 7 KB of garbage from its CONNECT (the device's authentication, its
// pending actions read, its last-seen write); 2,000 devices reconnecting
// after a restart leave some 14 MB. The collector frees it, but with a
// small live heap its goal stays above what the burst left and Go's
// scavenger gives back to the system only what lies over that goal, so
// the process keeps the burst's pages resident: 5.6 to 6.6 KB a parked
// connection, as ps shows it, against 3.3 KB once they are returned
// (docs/benchmarks-notebook.md, "Idle connections as ps shows them").
const (
	burstConnects = 256             // connections that make a burst worth giving back
	burstQuiet    = 5 * time.Second // no connection for this long: the burst is over
	burstSpacing  = time.Minute     // at most one give-back this often
)

// releaseAfterBursts watches connects (the broker's count of accepted
// connections) every tick and, once burstConnects or more connected since
// the last give-back and none has for burstQuiet, runs release
// (debug.FreeOSMemory: a collection, then every free page back to the
// system), at most once per burstSpacing. A steady trickle of connections
// never triggers it. It returns when ctx is done.
func releaseAfterBursts(ctx context.Context, connects func() uint64, tick <-chan time.Time, release func()) {
	var released, last uint64 // connects at the last give-back, at the last change
	var changed, releasedAt time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick:
			n := connects()
			if n != last {
				last, changed = n, now
				continue
			}
			if n-released >= burstConnects && now.Sub(changed) >= burstQuiet && now.Sub(releasedAt) >= burstSpacing {
				release()
				released, releasedAt = n, now
			}
		}
	}
}
