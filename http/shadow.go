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
	id, err := deviceID(r)
	if err != nil {
		return err
	}
	sh, err := s.Shadows.FindShadow(r.Context(), tenantOf(r), id)
	if err != nil {
		return err
	}
	s.respond(w, r, http.StatusOK, sh)
	return nil
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
