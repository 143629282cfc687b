package fleethttp

import (
	"bytes"
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/codec"
)

// Element limits of the two kinds of body, enforced while decoding
// (codec.Limits). No array or map of an ordinary body may hold more than an
// ingest's points (fleet.MaxPointsPerBatch); of a bulk one, more than its
// devices. A bulk body may hold 2,000,000 elements in all: 100,000 devices
// with 18 metadata entries each, and at most some 200 MB of decoded values
// whatever it nests (an ordinary body's 1 MiB bounds it already).
var (
	ordinaryElements = codec.Limits{Len: fleet.MaxPointsPerBatch}
	bulkElements     = codec.Limits{Len: fleet.MaxBulkDevices, Total: 20 * fleet.MaxBulkDevices}
)

// decodingWait bounds how long a body waits for its turn to be decoded
// (Limits.Decoding) before it is refused with 503.
const decodingWait = 10 * time.Second

// decode reads the request body, at most limit bytes, in the encoding its
// Content-Type names, and returns its canonical value, within elems.
// Reading takes from the budget of bodies held (Limits.Held) as the body
// arrives; decoding then waits for its share of Limits.Decoding, of which
// one client may hold a quarter.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, limit int64, elems codec.Limits) (any, error) {
	ct := r.Header.Get("Content-Type")
	f, ok := codec.FormatOf(ct)
	if !ok {
		if ct == "" {
			return nil, fleet.Errorf(fleet.EUNSUPPORTED, "a body needs a Content-Type: one of %s", supportedTypes())
		}
		return nil, fleet.Errorf(fleet.EUNSUPPORTED, "Content-Type %q is not supported: use one of %s", ct, supportedTypes())
	}
	body, err := s.bodies.read(w, r, limit)
	if err != nil {
		return nil, err
	}
	return s.decodeRead(w, r, f, body, elems)
}

// decodeRead is decode's second half: the canonical value of a body read
// already, in format f, within elems and the decoding budget.
func (s *Server) decodeRead(w http.ResponseWriter, r *http.Request, f codec.Format, body []byte, elems codec.Limits) (any, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, fleet.Errorf(fleet.EINVALID, "the request body is empty; send a %s value", f)
	}
	busy := func(err error) error {
		if r.Context().Err() != nil {
			return r.Context().Err()
		}
		w.Header().Set("Retry-After", "1")
		return fleet.Errorf(fleet.EUNAVAILABLE, "fleetd is decoding as many request bodies as it may (%s at once, a quarter of it for one client); retry", byteSize(s.decoding.Max()))
	}
	// The client's share first: one client's bodies do not queue in
	// front of everyone else's.
	start := time.Now()
	weight := codec.DecodingWeight(f, len(body))
	share, err := s.decodingShares.Acquire(r.Context(), clientKey(fleet.ActorFromContext(r.Context())), weight, decodingWait)
	if err != nil {
		return nil, busy(err)
	}
	defer share.Release()
	held, err := s.decoding.Acquire(r.Context(), weight, max(decodingWait-time.Since(start), time.Millisecond))
	if err != nil {
		return nil, busy(err)
	}
	defer s.decoding.Release(held)
	return codec.DecodeWithin(f, body, elems)
}

func tooLarge(limit int64) error {
	return fleet.Errorf(fleet.ETOOLARGE, "the request body is larger than %s", byteSize(limit))
}

func byteSize(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return strconv.FormatInt(n>>30, 10) + " GiB"
	case n >= 1<<20 && n%(1<<20) == 0:
		return strconv.FormatInt(n>>20, 10) + " MiB"
	case n >= 1<<10 && n%(1<<10) == 0:
		return strconv.FormatInt(n>>10, 10) + " KiB"
	}
	return strconv.FormatInt(n, 10) + " bytes"
}

func supportedTypes() string {
	var names []string
	for _, f := range codec.Formats {
		names = append(names, f.ContentType())
	}
	return strings.Join(names, ", ")
}

// getOne answers a GET of one thing of the caller's tenant: id reads its
// identifier from the path (a 400 naming the rule it breaks), find reads
// it (the store's 404 when there is none), and it is written with 200.
func getOne[K, T any](s *Server, w http.ResponseWriter, r *http.Request, id func(*http.Request) (K, error),
	find func(ctx context.Context, tenant string, id K) (T, error)) error {
	k, err := id(r)
	if err != nil {
		return err
	}
	v, err := find(r.Context(), tenantOf(r), k)
	if err != nil {
		return err
	}
	s.respond(w, r, http.StatusOK, v)
	return nil
}

// respond writes v with status in the encoding the client's Accept
// prefers, straight from the encoder's buffer.
func (s *Server) respond(w http.ResponseWriter, r *http.Request, status int, v any) {
	f := codec.Negotiate(r.Header.Get("Accept"))
	err := codec.Encoded(f, v, func(b []byte) error {
		writeBody(w, r, f, status, b)
		return nil
	})
	if err != nil { // the encoding's: nothing was written
		s.logger(r).Error("encode response", "err", err)
		writeBody(w, r, codec.JSON, http.StatusInternalServerError, []byte(`{"error":"internal","message":"internal error"}`))
	}
}

// writeBody writes a response of status whose body b is in format f.
func writeBody(w http.ResponseWriter, r *http.Request, f codec.Format, status int, b []byte) {
	w.Header().Set("Content-Type", f.ContentType())
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.Header().Add("Vary", "Accept")
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		w.Write(b)
	}
}

// wantsRepresentation reports whether the client sent
// "Prefer: return=representation" (RFC 7240).
func wantsRepresentation(r *http.Request) bool {
	for _, h := range r.Header.Values("Prefer") {
		for _, p := range strings.Split(h, ",") {
			if k, v, _ := strings.Cut(strings.TrimSpace(p), "="); strings.EqualFold(k, "return") && strings.EqualFold(strings.Trim(v, `"`), "representation") {
				return true
			}
		}
	}
	return false
}

// quiet answers an endpoint of the seed interface that has no body: status
// with an empty body, or v when the client asked for the representation.
func (s *Server) quiet(w http.ResponseWriter, r *http.Request, status int, v func() (any, error)) error {
	if !wantsRepresentation(r) {
		w.WriteHeader(status)
		return nil
	}
	body, err := v()
	if err != nil {
		return err
	}
	w.Header().Set("Preference-Applied", "return=representation")
	if status == http.StatusNoContent {
		status = http.StatusOK
	}
	s.respond(w, r, status, body)
	return nil
}
