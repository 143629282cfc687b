package fleethttp

import (
	"context"
	"errors"
	"log/slog"
	"net/http"

	"github.com/fleetd/fleet"
)

// statuses maps each fleet error code to its HTTP status: the one place
// where the two meet.
var statuses = map[string]int{
	fleet.EINVALID:          http.StatusBadRequest,
	fleet.EUNAUTHENTICATED:  http.StatusUnauthorized,
	fleet.EFORBIDDEN:        http.StatusForbidden,
	fleet.ENOTFOUND:         http.StatusNotFound,
	fleet.EMETHODNOTALLOWED: http.StatusMethodNotAllowed,
	fleet.ECONFLICT:         http.StatusConflict,
	fleet.EGONE:             http.StatusGone,
	fleet.ETOOLARGE:         http.StatusRequestEntityTooLarge,
	fleet.EUNSUPPORTED:      http.StatusUnsupportedMediaType,
	fleet.ERANGE:            http.StatusRequestedRangeNotSatisfiable,
	fleet.ERATELIMITED:      http.StatusTooManyRequests,
	fleet.EINTERNAL:         http.StatusInternalServerError,
	fleet.EUNAVAILABLE:      http.StatusServiceUnavailable,
}

// StatusOf returns the HTTP status of a fleet error code: 500 for a code
// it does not know. The console answers with the same statuses.
func StatusOf(code string) int {
	if status, ok := statuses[code]; ok {
		return status
	}
	return http.StatusInternalServerError
}

// errorBody is every error response (docs/api.md#errors).
type errorBody struct {
	Error   string            `json:"error"`
	Message string            `json:"message"`
	Fields  map[string]string `json:"fields,omitempty"`
}

// Error writes err as the response: fleet errors with their code and
// message, anything else logged with the request id and shown as "internal
// error".
func (s *Server) Error(w http.ResponseWriter, r *http.Request, err error) {
	code := fleet.ErrorCode(err)
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		// The client went away or the server is stopping: nothing to fix.
		code = fleet.EUNAVAILABLE
		err = fleet.Errorf(fleet.EUNAVAILABLE, "the request was cancelled")
	}
	status := StatusOf(code)
	body := errorBody{Error: code, Message: fleet.ErrorMessage(err)}
	var fe *fleet.Error
	if errors.As(err, &fe) {
		body.Fields = fe.Fields
	}
	if code == fleet.EINTERNAL {
		s.logger(r).Error("internal error", slog.String("err", err.Error()))
		body.Message = "internal error"
	}
	s.respond(w, r, status, body)
}
