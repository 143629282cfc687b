package fleet

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"
)

// Fields is the typed decode of a canonical value (what package codec makes
// of any request body or device message: nil, bool, int64, float64, string,
// []any and map[string]any) into a domain type. Each getter reads one
// field and checks its rules, collecting problems under the field's path, and
// Err reports them all at once together with any field nobody asked for.
//
// A null field counts as absent: optional fields may be sent as null.
type Fields struct {
	path string            // prefix of this object's field names, "" at the top
	m    map[string]any    // the object
	seen []string          // fields read so far: a few, so a slice beats a map
	errs map[string]string // shared by nested Fields
}

// NewFields starts the typed decode of v, which must be an object.
func NewFields(v any) *Fields {
	f := &Fields{errs: map[string]string{}, seen: make([]string, 0, 8)}
	m, ok := v.(map[string]any)
	if !ok {
		f.errs["body"] = "must be an object, not " + Describe(v)
	}
	f.m = m
	return f
}

// Describe names the kind of a canonical value for error messages.
func Describe(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case int64:
		return "an integer"
	case float64:
		return "a number"
	case string:
		return "a string"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}

func (f *Fields) name(field string) string {
	if f.path == "" {
		return field
	}
	return f.path + "." + field
}

// Fail records a problem with field, for rules the getters do not know.
// The first problem of a field wins.
func (f *Fields) Fail(field, problem string) {
	n := f.name(field)
	if _, ok := f.errs[n]; !ok {
		f.errs[n] = problem
	}
}

// see marks field read, once however often it is read.
func (f *Fields) see(field string) {
	if !slices.Contains(f.seen, field) {
		f.seen = append(f.seen, field)
	}
}

// Has reports whether field is present and not null, and marks it read.
func (f *Fields) Has(field string) bool {
	f.see(field)
	v, ok := f.m[field]
	return ok && v != nil
}

// Value returns a field's raw canonical value and whether it was present and
// not null; a missing required field is recorded as a problem.
func (f *Fields) Value(field string, required bool) (any, bool) {
	f.see(field)
	v, ok := f.m[field]
	if !ok || v == nil {
		if required {
			f.Fail(field, "is required")
		}
		return nil, false
	}
	return v, true
}

// String reads a string field.
func (f *Fields) String(field string, required bool) string {
	v, ok := f.Value(field, required)
	if !ok {
		return ""
	}
	s, ok := v.(string)
	if !ok {
		f.Fail(field, "must be a string, not "+Describe(v))
	}
	return s
}

// NonEmptyString reads a string field that, when present, must not be empty
// and at most max characters long.
func (f *Fields) NonEmptyString(field string, required bool, max int) string {
	s := f.String(field, required)
	if f.Has(field) && f.errs[f.name(field)] == "" {
		if s == "" {
			f.Fail(field, "must not be empty")
		} else if n := len([]rune(s)); n > max {
			f.Fail(field, fmt.Sprintf("must be at most %d characters", max))
		}
	}
	return s
}

// Int reads an integer field in [min, max]. Integral numbers such as 30.0
// count as integers; strings such as "30" do not.
func (f *Fields) Int(field string, required bool, min, max int64) int64 {
	v, ok := f.Value(field, required)
	if !ok {
		return 0
	}
	n, ok := AsInt(v)
	if !ok || n < min || n > max {
		f.Fail(field, fmt.Sprintf("must be an integer between %d and %d", min, max))
		return 0
	}
	return n
}

// AsInt returns v as an int64 if it is an integer or an integral number.
func AsInt(v any) (int64, bool) {
	switch n := v.(type) {
	case int64:
		return n, true
	case float64:
		if n == math.Trunc(n) && n >= -(1<<63) && n < 1<<63 {
			return int64(n), true
		}
	}
	return 0, false
}

// Float reads a number field in [min, max].
func (f *Fields) Float(field string, required bool, min, max float64) float64 {
	v, ok := f.Value(field, required)
	if !ok {
		return 0
	}
	var x float64
	switch n := v.(type) {
	case int64:
		x = float64(n)
	case float64:
		x = n
	default:
		f.Fail(field, fmt.Sprintf("must be a number between %g and %g, not %s", min, max, Describe(v)))
		return 0
	}
	if x < min || x > max {
		f.Fail(field, fmt.Sprintf("must be a number between %g and %g", min, max))
	}
	return x
}

// Bool reads a boolean field.
func (f *Fields) Bool(field string, required bool) bool {
	v, ok := f.Value(field, required)
	if !ok {
		return false
	}
	b, ok := v.(bool)
	if !ok {
		f.Fail(field, "must be a boolean, not "+Describe(v))
	}
	return b
}

// Strings reads an array of strings.
func (f *Fields) Strings(field string, required bool) []string {
	v, ok := f.Value(field, required)
	if !ok {
		return nil
	}
	a, ok := v.([]any)
	if !ok {
		f.Fail(field, "must be an array of strings, not "+Describe(v))
		return nil
	}
	out := make([]string, len(a))
	for i, e := range a {
		s, ok := e.(string)
		if !ok {
			f.Fail(fmt.Sprintf("%s[%d]", field, i), "must be a string, not "+Describe(e))
			continue
		}
		out[i] = s
	}
	return out
}

// Object reads an object field as its canonical map.
func (f *Fields) Object(field string, required bool) map[string]any {
	v, ok := f.Value(field, required)
	if !ok {
		return nil
	}
	m, ok := v.(map[string]any)
	if !ok {
		f.Fail(field, "must be an object, not "+Describe(v))
	}
	return m
}

// Array reads an array field as canonical values.
func (f *Fields) Array(field string, required bool) []any {
	v, ok := f.Value(field, required)
	if !ok {
		return nil
	}
	a, ok := v.([]any)
	if !ok {
		f.Fail(field, "must be an array, not "+Describe(v))
	}
	return a
}

// StringMap reads an object whose values are all strings.
func (f *Fields) StringMap(field string, required bool) map[string]string {
	m := f.Object(field, required)
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		s, ok := v.(string)
		if !ok {
			f.Fail(field+"."+k, "must be a string, not "+Describe(v))
			continue
		}
		out[k] = s
	}
	return out
}

// Nested starts the typed decode of an object field; its problems are
// reported under "field.sub". It returns nil when the field is absent or not
// an object (that problem is already recorded).
func (f *Fields) Nested(field string, required bool) *Fields {
	return f.nested(field, f.Object(field, required))
}

// Element starts the typed decode of the i-th element of an array field,
// which must be an object; problems are reported under "field[i].sub".
func (f *Fields) Element(field string, i int, v any) *Fields {
	name := fmt.Sprintf("%s[%d]", field, i)
	m, ok := v.(map[string]any)
	if !ok {
		f.Fail(name, "must be an object, not "+Describe(v))
		return nil
	}
	return f.nested(name, m)
}

func (f *Fields) nested(name string, m map[string]any) *Fields {
	if m == nil {
		return nil
	}
	n := &Fields{path: f.name(name), m: m, seen: make([]string, 0, 8), errs: f.errs}
	return n
}

// Unknown records every field of this object that was not read as unknown.
// Err calls it for the top level; call it on nested Fields when done.
func (f *Fields) Unknown() {
	if f == nil {
		return
	}
	var unknown []string
	for k := range f.m {
		if !slices.Contains(f.seen, k) {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	for _, k := range unknown {
		f.Fail(k, "is not a known field")
	}
}

// IgnoreUnknown marks every field of this object read, so that Err finds
// none unknown: for the formats whose own servers skip what they do not
// know (hawkBit's DDI).
func (f *Fields) IgnoreUnknown() {
	for k := range f.m {
		f.see(k)
	}
}

// Err returns every problem found, unknown fields included, as one EINVALID
// error, or nil.
func (f *Fields) Err() error {
	if f.m != nil {
		f.Unknown()
	}
	if len(f.errs) == 0 {
		return nil
	}
	e := FieldErrors(f.errs)
	if _, ok := f.errs["body"]; ok && len(f.errs) == 1 {
		e.Message = "the request body " + f.errs["body"]
	} else if unknown := f.unknownNames(); len(unknown) > 0 && len(unknown) == len(f.errs) {
		e.Message = "unknown fields: " + strings.Join(unknown, ", ")
	}
	return e
}

func (f *Fields) unknownNames() []string {
	var names []string
	for k, v := range f.errs {
		if v == "is not a known field" {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	return names
}

// PlainText reports whether s is UTF-8 text without NUL characters, which
// every text column of both databases can hold (PostgreSQL's text and JSON
// hold no NUL).
func PlainText(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

// PlainTextRule says what PlainText requires, for error messages.
const PlainTextRule = "must be UTF-8 text without NUL characters"
