package fleethttp

import (
	"net/http"
	"time"

	"github.com/fleetd/fleet"
)

// ingestBody documents the ingest body: an array of points, each an object
// with "timestamp" (epoch ms, required), "sequence" (integer ≥ 0) and any
// data fields.
type ingestBody []map[string]any

// ingestResult answers an ingest: the usable points were stored; the others
// are listed by index with their problem.
type ingestResult struct {
	Accepted int               `json:"accepted"`
	Rejected int               `json:"rejected"`
	Errors   map[string]string `json:"errors,omitempty" doc:"each refused point by index, \"[3].timestamp\", with its problem"`
}

// streamPath returns the device id and stream name of the path.
func streamPath(r *http.Request) (string, string, error) {
	id, err := deviceID(r)
	if err != nil {
		return "", "", err
	}
	stream, err := pathValue(r, "stream", "stream name", fleet.ValidStreamName, fleet.StreamNameRule)
	if err != nil {
		return "", "", err
	}
	return id, stream, nil
}

func (s *Server) handleIngest(w http.ResponseWriter, r *http.Request) error {
	id, stream, err := streamPath(r)
	if err != nil {
		return err
	}
	body, err := s.decode(w, r, s.Limits.Body, ordinaryElements)
	if err != nil {
		return err
	}
	pts, problems := fleet.ReadDataPoints(body, id, stream, s.Now().UTC().Truncate(time.Millisecond))
	if _, ok := problems["body"]; ok || (len(pts) == 0 && len(problems) > 0) {
		e := fleet.FieldErrors(problems)
		if !ok {
			e.Message = "no usable data point: every point has a problem"
		} else {
			e.Message = "the request body " + problems["body"]
		}
		return e
	}
	if len(pts) > 0 {
		if err := s.Streams.IngestPoints(r.Context(), tenantOf(r), id, stream, pts); err != nil {
			return err
		}
	}
	res := ingestResult{Accepted: len(pts), Rejected: len(problems)}
	if len(problems) > 0 {
		res.Errors = problems
	}
	s.respond(w, r, http.StatusOK, res)
	return nil
}

func (s *Server) handleLatestPoint(w http.ResponseWriter, r *http.Request) error {
	id, stream, err := streamPath(r)
	if err != nil {
		return err
	}
	p, err := s.Streams.FindLatestPoint(r.Context(), tenantOf(r), id, stream)
	if err != nil {
		return err
	}
	s.respond(w, r, http.StatusOK, p)
	return nil
}
