package fleethttp

import (
	"context"
	"net/http"

	"github.com/fleetd/fleet"
)

// ddiSettingsHandlers serve a tenant's DDI settings (docs/hawkbit.md,
// Settings).
func (s *Server) ddiSettingsHandlers() (read, write func(http.ResponseWriter, *http.Request) error) {
	// The service is read at each request: routes are made before it is set.
	get := func(ctx context.Context, tenant string) (fleet.DDISettings, error) {
		return s.DDI.DDISettings(ctx, tenant)
	}
	set := func(ctx context.Context, tenant string, v fleet.DDISettings) error {
		return s.DDI.SetDDISettings(ctx, tenant, v)
	}
	return settingsHandlers(s, get, func(f *fleet.Fields) fleet.DDISettings {
		return fleet.DDISettings{RequireConfirmation: f.Bool("require_confirmation", true), GatewayRegistration: f.Bool("gateway_registration", true)}
	}, set)
}
