package fleethttp

import (
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/fleetd/fleet"
)

// pathError is the answer to a path parameter that breaks its rule.
func pathError(name, what, rule string) error {
	return &fleet.Error{Code: fleet.EINVALID, Message: "invalid " + what + " in the path", Fields: map[string]string{name: rule}}
}

// pathValue returns the path parameter name, which valid must accept;
// what names it in the error.
func pathValue(r *http.Request, name, what string, valid func(string) bool, rule string) (string, error) {
	v := r.PathValue(name)
	if !valid(v) {
		return "", pathError(name, what, rule)
	}
	return v, nil
}

// query is the typed decode of a request's query string. Like codec.Fields
// it collects every problem, and a parameter nobody asked for is one.
type query struct {
	v    url.Values
	seen map[string]bool
	errs map[string]string
}

func newQuery(r *http.Request) *query {
	q := &query{seen: map[string]bool{}, errs: map[string]string{}}
	v, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		q.errs["query"] = "is not a valid query string: " + err.Error()
	}
	q.v = v
	return q
}

func (q *query) fail(name, problem string) {
	if _, ok := q.errs[name]; !ok {
		q.errs[name] = problem
	}
}

// String returns a parameter, "" when absent. Repeating it is a problem.
func (q *query) String(name string) string {
	q.seen[name] = true
	vs := q.v[name]
	if len(vs) > 1 {
		q.fail(name, "must be given once")
	}
	if len(vs) == 0 {
		return ""
	}
	return vs[0]
}

// Int returns an integer parameter in [min, max], def when absent.
func (q *query) Int(name string, def, min, max int64) int64 {
	s := q.String(name)
	if s == "" {
		return def
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < min || n > max {
		q.fail(name, fmt.Sprintf("must be an integer between %d and %d", min, max))
		return def
	}
	return n
}

// Enum returns a parameter that must be one of allowed, def when absent.
func (q *query) Enum(name, def string, allowed ...string) string {
	s := q.String(name)
	if s == "" {
		return def
	}
	for _, a := range allowed {
		if s == a {
			return s
		}
	}
	q.fail(name, "must be one of "+strings.Join(allowed, ", "))
	return def
}

// Time returns an RFC 3339 time parameter, nil when absent.
func (q *query) Time(name string) *time.Time {
	s := q.String(name)
	if s == "" {
		return nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		q.fail(name, "must be an RFC 3339 time such as 2026-11-21T10:00:00Z")
		return nil
	}
	return &t
}

// Instant returns a time parameter given as epoch milliseconds or RFC
// 3339, def when absent.
func (q *query) Instant(name string, def time.Time) time.Time {
	s := q.String(name)
	if s == "" {
		return def
	}
	if ms, err := strconv.ParseInt(s, 10, 64); err == nil {
		if ms < 0 || ms > fleet.MaxPointTime {
			q.fail(name, "must be epoch milliseconds between 0 and 253402300799999, or an RFC 3339 time")
			return def
		}
		return time.UnixMilli(ms).UTC()
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil || t.Year() < 1970 || t.Year() > 9999 {
		q.fail(name, "must be epoch milliseconds or an RFC 3339 time such as 2026-11-21T10:00:00Z")
		return def
	}
	return t.UTC()
}

// Interval returns a duration parameter in Go's syntax or as whole days
// ("7d"), def when absent.
func (q *query) Interval(name string, def time.Duration) time.Duration {
	s := q.String(name)
	if s == "" {
		return def
	}
	var d time.Duration
	var err error
	if days, ok := strings.CutSuffix(s, "d"); ok {
		var n int64
		n, err = strconv.ParseInt(days, 10, 64)
		if err == nil && (n < 1 || n > 3650) {
			err = strconv.ErrRange
		}
		d = time.Duration(n) * 24 * time.Hour
	} else {
		d, err = time.ParseDuration(s)
	}
	if err != nil || d <= 0 {
		q.fail(name, "must be a positive duration such as 30s, 5m, 1h or 7d")
		return def
	}
	return d
}

// Prefixed returns the parameters named prefix+key as key -> value.
func (q *query) Prefixed(prefix string) map[string]string {
	var m map[string]string
	for name := range q.v {
		key, ok := strings.CutPrefix(name, prefix)
		if !ok {
			continue
		}
		if key == "" {
			q.fail(name, "must name a key after "+prefix)
			continue
		}
		if m == nil {
			m = map[string]string{}
		}
		m[key] = q.String(name)
	}
	return m
}

// Page returns the page and limit parameters (docs/api.md#lists).
func (q *query) Page() fleet.Page {
	return fleet.Page{
		Page:  int(q.Int("page", 1, 1, 1<<31-1)),
		Limit: int(q.Int("limit", fleet.DefaultLimit, 1, fleet.MaxLimit)),
	}
}

// Err returns every problem, unknown parameters included, or nil.
func (q *query) Err() error {
	var unknown []string
	for name := range q.v {
		if !q.seen[name] {
			unknown = append(unknown, name)
		}
	}
	sort.Strings(unknown)
	for _, name := range unknown {
		q.fail(name, "is not a known query parameter")
	}
	if len(q.errs) == 0 {
		return nil
	}
	e := fleet.FieldErrors(q.errs)
	if len(unknown) == len(q.errs) {
		e.Message = "unknown query parameters: " + strings.Join(unknown, ", ")
	} else {
		e.Message = strings.Replace(e.Message, "invalid field", "invalid query parameter", 1)
	}
	return e
}
