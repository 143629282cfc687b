package fleethttp

import (
	"net/http"
	"net/url"

	"github.com/fleetd/fleet"
)

type apiKeyCreate struct {
	Name      string     `json:"name" openapi:"required" doc:"1-64 characters from A-Z a-z 0-9 . _ -, unique in the tenant"`
	Role      fleet.Role `json:"role" openapi:"required"`
	UserEmail string     `json:"user_email,omitempty" doc:"who holds the key; shown as user_email on what it does"`
}

type apiKeyList struct {
	APIKeys []*fleet.APIKey `json:"apikeys"`
	Count   int             `json:"count"`
}

func (s *Server) handleCreateAPIKey(w http.ResponseWriter, r *http.Request) error {
	body, err := s.decode(w, r, s.Limits.Body, ordinaryElements)
	if err != nil {
		return err
	}
	f := fleet.NewFields(body)
	k := fleet.ReadAPIKey(f)
	if err := f.Err(); err != nil {
		return err
	}
	if err := s.Tenants.CreateAPIKey(r.Context(), tenantOf(r), k); err != nil {
		return err
	}
	location(w, r, "/api/v1/apikeys/", url.PathEscape(k.Name))
	s.respond(w, r, http.StatusCreated, k)
	return nil
}

func (s *Server) handleListAPIKeys(w http.ResponseWriter, r *http.Request) error {
	q := newQuery(r)
	page := q.Page()
	if err := q.Err(); err != nil {
		return err
	}
	keys, n, err := s.Tenants.FindAPIKeys(r.Context(), tenantOf(r), page)
	if err != nil {
		return err
	}
	s.respond(w, r, http.StatusOK, apiKeyList{APIKeys: keys, Count: n})
	return nil
}

func (s *Server) handleDeleteAPIKey(w http.ResponseWriter, r *http.Request) error {
	name, err := pathValue(r, "name", "API key name", fleet.ValidAPIKeyName, fleet.APIKeyNameRule)
	if err != nil {
		return err
	}
	if err := s.Tenants.DeleteAPIKey(r.Context(), tenantOf(r), name); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
