package fleethttp

import (
	"context"
	"math"
	"net/http"

	"github.com/fleetd/fleet"
)

// shadowPatch is the body of a change of a device's desired state.
type shadowPatch struct {
	Desired map[string]any `json:"desired" openapi:"required" doc:"a JSON merge patch (RFC 7386) of the desired state: null deletes a key, an object merges into the object under its key; at most 32 KiB of JSON and 8 levels deep once merged"`
	Version *int64         `json:"version,omitempty" doc:"the version the change was made from: when the shadow is at another, 409 and nothing changes"`
}

func (s *Server) handleGetShadow(w http.ResponseWriter, r *http.Request) error {
	return getOne(s, w, r, deviceID, s.Shadows.FindShadow)
}

func (s *Server) handlePatchShadow(w http.ResponseWriter, r *http.Request) error {
	id, err := deviceID(r)
	if err != nil {
		return err
	}
	body, err := s.decode(w, r, s.Limits.Body, ordinaryElements)
	if err != nil {
		return err
	}
	f := fleet.NewFields(body)
	patch := f.Object(fleet.ShadowDesired, true)
	var version *int64
	if f.Has("version") {
		v := f.Int("version", false, 0, math.MaxInt64)
		version = &v
	}
	if err := f.Err(); err != nil {
		return err
	}
	sh, err := s.Shadows.UpdateDesired(r.Context(), tenantOf(r), id, patch, version)
	if err != nil {
		return err
	}
	s.respond(w, r, http.StatusOK, sh)
	return nil
}

// fleetDesiredBody is the body of a fleet-wide desired change.
type fleetDesiredBody struct {
	SearchType  string          `json:"search_type" openapi:"required" doc:"default (exactly device_ids), all, metadata (metadata[search_key] equals search_query), search (id or metadata value contains search_query, ignoring case) or group (the devices of the group named by group), as a dispatch chooses its targets"`
	DeviceIDs   []string        `json:"device_ids,omitempty"`
	SearchKey   string          `json:"search_key,omitempty"`
	SearchQuery string          `json:"search_query,omitempty"`
	Group       string          `json:"group,omitempty"`
	Desired     map[string]any  `json:"desired" openapi:"required" doc:"a JSON merge patch (RFC 7386) of each device's desired state, as PATCH /api/v1/devices/{id}/shadow takes"`
	Schedule    *fleet.Schedule `json:"schedule,omitempty" doc:"roll the change out in phases, as a dispatch's schedule: each phase merges the patch into its devices' desired state when it triggers, and a device counts Completed once it reports what the patch asks; the answer names the desired_state action"`
	Timeout     int64           `json:"timeout,omitempty" doc:"with a schedule: seconds a released device has to report the patch's values before it counts Failed (default 86400)"`
}

func (s *Server) handleFleetDesired(w http.ResponseWriter, r *http.Request) error {
	body, err := s.decode(w, r, s.Limits.Body, ordinaryElements)
	if err != nil {
		return err
	}
	f := fleet.NewFields(body)
	sel := fleet.ReadSelection(f)
	patch := f.Object(fleet.ShadowDesired, true)
	sel.Schedule = fleet.ReadSchedule(f.Nested("schedule", false))
	if f.Has("timeout") {
		if sel.Timeout = f.Int("timeout", false, 1, fleet.MaxActionTimeout); sel.Schedule == nil {
			f.Fail("timeout", "is only for a change with a schedule")
		}
	}
	f.Unknown()
	if err := f.Err(); err != nil {
		return err
	}
	fd, err := s.Shadows.UpdateDesiredMany(r.Context(), tenantOf(r), sel, patch)
	if err != nil {
		return err
	}
	s.respond(w, r, http.StatusOK, fd)
	return nil
}

// shadowSettingsHandlers serve a tenant's shadow settings (docs/twin.md).
func (s *Server) shadowSettingsHandlers() (read, write func(http.ResponseWriter, *http.Request) error) {
	get := func(ctx context.Context, tenant string) (fleet.ShadowSettings, error) {
		return s.Shadows.ShadowSettings(ctx, tenant)
	}
	set := func(ctx context.Context, tenant string, v fleet.ShadowSettings) error {
		return s.Shadows.SetShadowSettings(ctx, tenant, v)
	}
	return settingsHandlers(s, get, func(f *fleet.Fields) fleet.ShadowSettings {
		v := fleet.ShadowSettings{UpdateConfig: f.Bool("update_config", true)}
		f.Unknown()
		return v
	}, set)
}
