package fleethttp

import (
	"context"
	"net/http"

	"github.com/fleetd/fleet"
)

// settingsHandlers serve GET and PUT of one kind of a tenant's settings
// (its DDI settings, its shadow settings): get reads them; fields reads
// the PUT body's fields, which set stores before the answer, 204 or the
// settings as read again.
func settingsHandlers[T any](s *Server, get func(context.Context, string) (T, error), fields func(*fleet.Fields) T,
	set func(context.Context, string, T) error) (read, write func(http.ResponseWriter, *http.Request) error) {
	read = func(w http.ResponseWriter, r *http.Request) error {
		tenant, err := pathTenant(r)
		if err != nil {
			return err
		}
		v, err := get(r.Context(), tenant)
		if err != nil {
			return err
		}
		s.respond(w, r, http.StatusOK, v)
		return nil
	}
	write = func(w http.ResponseWriter, r *http.Request) error {
		tenant, err := pathTenant(r)
		if err != nil {
			return err
		}
		body, err := s.decode(w, r, s.Limits.Body, ordinaryElements)
		if err != nil {
			return err
		}
		f := fleet.NewFields(body)
		v := fields(f)
		if err := f.Err(); err != nil {
			return err
		}
		if err := set(r.Context(), tenant, v); err != nil {
			return err
		}
		return s.quiet(w, r, http.StatusNoContent, func() (any, error) { return get(r.Context(), tenant) })
	}
	return read, write
}
