package fleetdtest

import (
	"fmt"
	"testing"
)

// provisionBatch is how many devices ProvisionDevices creates a request,
// well within the default --max-bulk-bytes.
const provisionBatch = 10_000

// ProvisionDevices creates n devices as c through the bulk API, named
// prefix and a five-digit number from 00000 (sim-00000, sim-00001, …),
// each with metadata (nil: none), and returns their tokens by id.
func (s *Server) ProvisionDevices(t *testing.T, c Creds, prefix string, n int, metadata map[string]string) map[string]string {
	t.Helper()
	tokens := make(map[string]string, n)
	for first := 0; first < n; first += provisionBatch {
		devs := make([]map[string]any, 0, min(provisionBatch, n-first))
		for i := first; i < min(first+provisionBatch, n); i++ {
			d := map[string]any{"id": fmt.Sprintf("%s%05d", prefix, i)}
			if metadata != nil {
				d["metadata"] = metadata
			}
			devs = append(devs, d)
		}
		var out struct{ Devices []struct{ ID, Token string } }
		s.Do(t, c, "POST", "/api/v1/devices/bulk", map[string]any{"devices": devs}).Want(t, 201).Decode(t, &out)
		for _, d := range out.Devices {
			tokens[d.ID] = d.Token
		}
	}
	if len(tokens) != n {
		t.Fatalf("provisioned %d devices, want %d", len(tokens), n)
	}
	return tokens
}
