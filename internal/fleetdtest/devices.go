package fleetdtest

import (
	"database/sql"
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

// Device is a device as the API shows it.
type Device struct {
	ID         string            `json:"id"`
	Token      string            `json:"token"`
	Metadata   map[string]string `json:"metadata"`
	Components map[string]string `json:"components"`
	CreatedAt  string            `json:"created_at"`
	LastSeenAt *string           `json:"last_seen_at"`
}

// MustDevice provisions a device as c and returns it with its token.
func (s *Server) MustDevice(t *testing.T, c Creds, id string, meta map[string]string) Device {
	t.Helper()
	var d Device
	s.Do(t, c, "POST", "/api/v1/devices", map[string]any{"id": id, "metadata": meta}).Want(t, 201).Decode(t, &d)
	return d
}

// Count runs a query that counts rows.
func Count(t *testing.T, db *sql.DB, query string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// Shadow is a device shadow as the API shows it.
type Shadow struct {
	Desired           map[string]any `json:"desired"`
	Reported          map[string]any `json:"reported"`
	Delta             map[string]any `json:"delta"`
	Version           int64          `json:"version"`
	InSync            bool           `json:"in_sync"`
	DesiredUpdatedAt  *string        `json:"desired_updated_at"`
	ReportedUpdatedAt *string        `json:"reported_updated_at"`
}
