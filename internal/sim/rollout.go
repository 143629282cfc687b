package sim

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"strings"
)

// What the simulator does for rollout demonstrations and tests: devices
// that fail, chosen stably, devices that an update leaves unhealthy, and
// devices with metadata for a rollout's phases to choose by.

// simMetadata is what provisioned devices carry besides simulated=true:
// --metadata's pairs, then their row of --metadata-file.
type simMetadata struct {
	all  map[string]string
	file string
}

// add is --metadata: one KEY=VALUE.
func (m *simMetadata) add(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("want KEY=VALUE, got %q", s)
	}
	if m.all == nil {
		m.all = map[string]string{}
	}
	m.all[k] = v
	return nil
}

// of returns the metadata of each device of ids, or an error naming the
// line of the file that cannot be used.
func (m simMetadata) of(ids []string) (map[string]map[string]string, error) {
	out := make(map[string]map[string]string, len(ids))
	for _, id := range ids {
		md := map[string]string{"simulated": "true"}
		for k, v := range m.all {
			md[k] = v
		}
		out[id] = md
	}
	if m.file == "" {
		return out, nil
	}
	f, err := os.Open(m.file)
	if err != nil {
		return nil, fmt.Errorf("--metadata-file: %w", err)
	}
	defer f.Close()
	r := csv.NewReader(f)
	r.Comment = '#'
	header, err := r.Read()
	if err != nil || len(header) < 2 || strings.TrimSpace(header[0]) != "id" {
		return nil, fmt.Errorf("--metadata-file %s: want a header line id,KEY,... (such as id,ring), then a row per device", m.file)
	}
	for {
		row, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, fmt.Errorf("--metadata-file %s: %w", m.file, err)
		}
		line, _ := r.FieldPos(0)
		md, ok := out[row[0]]
		if !ok {
			return nil, fmt.Errorf("--metadata-file %s:%d: %q is not one of the %d devices provisioned (%s to %s)", m.file, line, row[0], len(ids), ids[0], ids[len(ids)-1])
		}
		for i, v := range row[1:] {
			if v != "" {
				md[strings.TrimSpace(header[i+1])] = v
			}
		}
	}
}

// Fails reports whether a device of id is among the share rate of the
// fleet that fails its actions: the first 64 bits of the SHA-256 of the id,
// as a fraction, below rate. The same devices fail in every run, so a
// rollout's canary is known to fail or not.
func Fails(id string, rate float64) bool {
	sum := sha256.Sum256([]byte(id))
	return float64(binary.BigEndian.Uint64(sum[:8]))/math.MaxUint64 < rate
}

// fails reports whether the device fails the actions it runs.
func (d *simDevice) fails() bool { return Fails(d.id, d.sim.cfg.failRate) }

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
