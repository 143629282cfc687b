package fleethttp

import (
	"net/http"
	"strings"

	"github.com/fleetd/fleet"
)

// public marks routes that need no credentials.
const public fleet.Permission = -1

var permissionNames = map[fleet.Permission]string{
	fleet.PermRead:       "read fleet data",
	fleet.PermDeviceData: "report device data",
	fleet.PermOperate:    "change devices, actions, firmware or alert rules",
	fleet.PermAdmin:      "administer the tenant",
	fleet.PermRemote:     "open remote sessions with devices",
}

// authenticate returns the actor of r if it may use a route that needs
// perm: an API key, or an end user's bearer token when the tenant configured
// S9. A missing header, an unknown tenant and a wrong key or token are one
// 401; a role without the right is 403.
func (s *Server) authenticate(r *http.Request, perm fleet.Permission) (*fleet.Actor, error) {
	tenant := r.Header.Get("X-Service-Tenant")
	key := r.Header.Get("X-Service-Api-Key")
	var a *fleet.Actor
	var err error
	if token, ok := bearerToken(r); ok && key == "" && s.Tokens != nil {
		a, err = s.Tokens.AuthenticateToken(r.Context(), tenant, token)
	} else {
		a, err = s.Tenants.AuthenticateAPIKey(r.Context(), tenant, key)
	}
	if err != nil {
		return nil, err
	}
	if !a.Role.Can(perm) {
		return nil, fleet.Errorf(fleet.EFORBIDDEN, "the %s role may not %s", a.Role, permissionNames[perm])
	}
	return a, nil
}

// tenantOf returns the tenant of an authenticated request.
func tenantOf(r *http.Request) string {
	return fleet.ActorFromContext(r.Context()).Tenant
}

// roleOf returns the role of an authenticated request's actor.
func roleOf(r *http.Request) fleet.Role {
	return fleet.ActorFromContext(r.Context()).Role
}

// bearerToken returns the token of an "Authorization: Bearer" header.
func bearerToken(r *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}
