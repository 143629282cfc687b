package fleethttp

import (
	"net/http"
	"net/url"

	"github.com/fleetd/fleet"
)

// groupCreate is the body that saves a group.
type groupCreate struct {
	Name        string `json:"name" openapi:"required" doc:"1-64 characters from A-Z a-z 0-9 . _ -, unique in the tenant"`
	Selector    string `json:"selector" openapi:"required" doc:"a label selector (k=v, k!=v, k in (a,b), k notin (a,b), k, !k; comma = and) over metadata keys and reported.PATH"`
	Description string `json:"description,omitempty" doc:"up to 1024 characters"`
}

// groupUpdate is the body that replaces a group's selector and description.
type groupUpdate struct {
	Selector    string `json:"selector" openapi:"required"`
	Description string `json:"description,omitempty"`
}

type groupList struct {
	Groups []*fleet.Group `json:"groups"`
	Count  int            `json:"count"`
}

// groupName returns the {name} of the path, which must be a valid group
// name.
func groupName(r *http.Request) (string, error) {
	return pathValue(r, "name", "group name", fleet.ValidGroupName, fleet.GroupNameRule)
}

func (s *Server) handleCreateGroup(w http.ResponseWriter, r *http.Request) error {
	body, err := s.decode(w, r, s.Limits.Body, ordinaryElements)
	if err != nil {
		return err
	}
	f := fleet.NewFields(body)
	g := fleet.ReadGroup(f, true)
	if err := f.Err(); err != nil {
		return err
	}
	g, err = s.Groups.CreateGroup(r.Context(), tenantOf(r), g)
	if err != nil {
		return err
	}
	location(w, r, "/api/v1/groups/", url.PathEscape(g.Name))
	s.respond(w, r, http.StatusCreated, g)
	return nil
}

func (s *Server) handleListGroups(w http.ResponseWriter, r *http.Request) error {
	q := newQuery(r)
	p := q.Page()
	if err := q.Err(); err != nil {
		return err
	}
	gs, n, err := s.Groups.FindGroups(r.Context(), tenantOf(r), p)
	if err != nil {
		return err
	}
	s.respond(w, r, http.StatusOK, groupList{Groups: gs, Count: n})
	return nil
}

func (s *Server) handleGetGroup(w http.ResponseWriter, r *http.Request) error {
	return getOne(s, w, r, groupName, s.Groups.FindGroup)
}

func (s *Server) handleUpdateGroup(w http.ResponseWriter, r *http.Request) error {
	name, err := groupName(r)
	if err != nil {
		return err
	}
	body, err := s.decode(w, r, s.Limits.Body, ordinaryElements)
	if err != nil {
		return err
	}
	f := fleet.NewFields(body)
	g := fleet.ReadGroup(f, false)
	if err := f.Err(); err != nil {
		return err
	}
	g, err = s.Groups.UpdateGroup(r.Context(), tenantOf(r), name, g)
	if err != nil {
		return err
	}
	return s.quiet(w, r, http.StatusNoContent, func() (any, error) { return g, nil })
}

func (s *Server) handleDeleteGroup(w http.ResponseWriter, r *http.Request) error {
	name, err := groupName(r)
	if err != nil {
		return err
	}
	if err := s.Groups.DeleteGroup(r.Context(), tenantOf(r), name); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) handleListGroupDevices(w http.ResponseWriter, r *http.Request) error {
	name, err := groupName(r)
	if err != nil {
		return err
	}
	q := newQuery(r)
	p := q.Page()
	if err := q.Err(); err != nil {
		return err
	}
	devs, n, err := s.Groups.FindGroupDevices(r.Context(), tenantOf(r), name, p)
	if err != nil {
		return err
	}
	s.respond(w, r, http.StatusOK, deviceList{Devices: devs, Count: n})
	return nil
}
