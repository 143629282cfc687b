package main

import (
	"fmt"
	"runtime/debug"
)

// gcFlags registers --gc-percent. Left alone, Go's own setting stands:
// GOGC, else 100. Raised to 400, collections are a quarter as frequent,
// which takes them out of the 99th percentile of reading a device's
// history (S7), but the heap may then reach five times the live heap: a
// flood of large MQTT packets peaked at 1,075 MB resident against under
// 512 MB at 100 (TestMQTTPayloadFlood), so it is not the default.
func (c *config) gcFlags(fs *flagSet) {
	fs.IntVar(&c.gcPercent, "gc-percent", 100, "the heap may grow `N`% over the live heap before a garbage collection (Go's GOGC, which stands when this is not given); 400 makes slow API reads rarer for up to five times the heap; negative: collect only to stay under GOMEMLIMIT")
}

// applyGC sets the collector's target if --gc-percent was given (as a
// flag or FLEETD_GC_PERCENT); otherwise Go has applied GOGC or its
// default.
func (c *config) applyGC(fs *flagSet, getenv func(string) string) error {
	if !fs.isSet("gc-percent") {
		return nil
	}
	if c.gcPercent < 0 && getenv("GOMEMLIMIT") == "" {
		return fmt.Errorf("--gc-percent %d turns the collector off: set GOMEMLIMIT to bound the heap", c.gcPercent)
	}
	debug.SetGCPercent(c.gcPercent)
	return nil
}
