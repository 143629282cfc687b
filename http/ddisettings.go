package fleethttp

import (
	"net/http"

	"github.com/fleetd/fleet"
)

// A tenant's DDI settings (docs/hawkbit.md, Settings).

func (s *Server) handleGetDDISettings(w http.ResponseWriter, r *http.Request) error {
	tenant, err := pathTenant(r)
	if err != nil {
		return err
	}
	set, err := s.DDI.DDISettings(r.Context(), tenant)
	if err != nil {
		return err
	}
	s.respond(w, r, http.StatusOK, set)
	return nil
}

func (s *Server) handleSetDDISettings(w http.ResponseWriter, r *http.Request) error {
	tenant, err := pathTenant(r)
	if err != nil {
		return err
	}
	body, err := s.decode(w, r, s.Limits.Body, ordinaryElements)
	if err != nil {
		return err
	}
	f := fleet.NewFields(body)
	set := fleet.DDISettings{RequireConfirmation: f.Bool("require_confirmation", true), GatewayRegistration: f.Bool("gateway_registration", true)}
	if err := f.Err(); err != nil {
		return err
	}
	if err := s.DDI.SetDDISettings(r.Context(), tenant, set); err != nil {
		return err
	}
	return s.quiet(w, r, http.StatusNoContent, func() (any, error) { return s.DDI.DDISettings(r.Context(), tenant) })
}
