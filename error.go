package fleet

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Error codes. Each maps to one HTTP status in one place (http/error.go) and is
// the "error" member of every error body.
const (
	EINVALID          = "invalid"
	EUNAUTHENTICATED  = "unauthenticated"
	EFORBIDDEN        = "forbidden"
	ENOTFOUND         = "not_found"
	EMETHODNOTALLOWED = "method_not_allowed"
	ECONFLICT         = "conflict"
	EGONE             = "gone"
	ETOOLARGE         = "too_large"
	EUNSUPPORTED      = "unsupported_media_type"
	ERANGE            = "range_not_satisfiable"
	ERATELIMITED      = "rate_limited"
	EINTERNAL         = "internal"
	EUNAVAILABLE      = "unavailable"
)

// Error is an error a person can act on: a code, a sentence, and for invalid
// input the problem with each field. Any other error is internal and its text
// is logged, never shown.
type Error struct {
	Code    string
	Message string
	Fields  map[string]string
}

func (e *Error) Error() string {
	if len(e.Fields) == 0 {
		return fmt.Sprintf("fleet error: code=%s message=%s", e.Code, e.Message)
	}
	keys := make([]string, 0, len(e.Fields))
	for k := range e.Fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(k + ": " + e.Fields[k])
	}
	return fmt.Sprintf("fleet error: code=%s message=%s fields=%s", e.Code, e.Message, b.String())
}

// Errorf returns an *Error with the code and a formatted message.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// FieldErrors returns an EINVALID error that names each field's problem.
func FieldErrors(fields map[string]string) *Error {
	names := make([]string, 0, len(fields))
	for k := range fields {
		names = append(names, k)
	}
	sort.Strings(names)
	msg := "invalid field " + names[0]
	if len(names) > 1 {
		msg = "invalid fields " + strings.Join(names, ", ")
	}
	return &Error{Code: EINVALID, Message: msg, Fields: fields}
}

// ErrorCode returns the code of err, EINTERNAL for errors that are not *Error
// and "" for nil.
func ErrorCode(err error) string {
	var e *Error
	if err == nil {
		return ""
	} else if errors.As(err, &e) {
		return e.Code
	}
	return EINTERNAL
}

// ErrorMessage returns the message a client may see for err.
func ErrorMessage(err error) string {
	var e *Error
	if err == nil {
		return ""
	} else if errors.As(err, &e) {
		return e.Message
	}
	return "internal error"
}
