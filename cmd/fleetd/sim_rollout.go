package main

import (
	"crypto/sha256"
	"encoding/binary"
	"math"
	"math/rand/v2"
)

// What the simulator does for rollout demonstrations and tests: devices
// that fail, chosen stably, and devices that an update leaves unhealthy.

// simFails reports whether a device of id is among the share rate of the
// fleet that fails its actions: the first 64 bits of the SHA-256 of the id,
// as a fraction, below rate. The same devices fail in every run, so a
// rollout's canary is known to fail or not.
func simFails(id string, rate float64) bool {
	sum := sha256.Sum256([]byte(id))
	return float64(binary.BigEndian.Uint64(sum[:8]))/math.MaxUint64 < rate
}

// fails reports whether the device fails the actions it runs.
func (d *simDevice) fails() bool { return simFails(d.id, d.sim.cfg.failRate) }

// updated is called when the device completed an update_firmware: with
// --unhealthy-after-update it runs hot from now on, and says so at once.
func (d *simDevice) updated() {
	if !d.sim.cfg.unhealthy {
		return
	}
	d.mu.Lock()
	d.unhealthy = true
	d.mu.Unlock()
	d.publishPoint()
}

// temperature is what the device's next telemetry point says.
func (d *simDevice) temperature() float64 {
	d.mu.Lock()
	hot := d.unhealthy
	d.mu.Unlock()
	if hot {
		return 95
	}
	return 20 + 10*rand.Float64()
}
