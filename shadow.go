package fleet

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"
)

// Shadow is a device's twin (docs/twin.md): the state operators want it in
// (Desired), the state it says it is in (Reported), and where the two
// differ (Delta), which is computed on every read and never stored.
// Version counts the changes of Desired, so that a writer can refuse to
// overwrite a change it has not seen.
type Shadow struct {
	Desired           map[string]any `json:"desired"`
	Reported          map[string]any `json:"reported"`
	Delta             map[string]any `json:"delta"`
	Version           int64          `json:"version"`
	InSync            bool           `json:"in_sync"`
	DesiredUpdatedAt  *time.Time     `json:"desired_updated_at"`
	ReportedUpdatedAt *time.Time     `json:"reported_updated_at"`

	// DeltaChanged is set by an update: its Delta differs from the one
	// before it, so the device is to be told.
	DeltaChanged bool `json:"-"`
	// DesiredChanged is set by an update of Desired that changed it.
	DesiredChanged bool `json:"-"`
	// Dispatched is the update_config action a change of Desired
	// dispatched to the device (ShadowSettings.UpdateConfig), nil for none.
	Dispatched *Action `json:"-"`
}

// MaxFleetDesired bounds the devices one fleet-wide desired change may
// select (docs/twin.md).
const MaxFleetDesired = 10_000

// FleetDesired is what a fleet-wide desired change did.
type FleetDesired struct {
	Matched int `json:"matched" doc:"the devices the selection chose"`
	Changed int `json:"changed" doc:"those whose desired state the patch changed (each audited with its previous state); 0 for a rollout, which changes them as its phases release them"`
	// ActionID is the rollout's action when the change has a schedule.
	ActionID int64 `json:"action_id,omitempty" doc:"with a schedule: the desired_state action that rolls the change out (GET /api/v1/actions/{id})"`
	// Shadows are the changed devices' shadows, by device id.
	Shadows map[string]*Shadow `json:"-"`
}

// ShadowSettings are a tenant's choices about shadows (docs/twin.md).
type ShadowSettings struct {
	UpdateConfig bool `json:"update_config" openapi:"required" doc:"true: each change of a device's desired state that leaves it out of sync is also dispatched to the device as an update_config action whose params are the whole desired state, for devices (such as uplink's) that take their configuration as an action"`
}

// Limits on each section of a shadow (docs/twin.md): its canonical JSON
// text, and how deeply its values nest (a key of the section is at depth
// 1).
const (
	MaxShadowSection = 32 << 10
	MaxShadowDepth   = 8
)

// The sections of a shadow, as they are named in requests and errors.
const (
	ShadowDesired  = "desired"
	ShadowReported = "reported"
)

// Compute fills Delta and InSync from Desired and Reported, and makes nil
// sections empty.
func (s *Shadow) Compute() {
	if s.Desired == nil {
		s.Desired = map[string]any{}
	}
	if s.Reported == nil {
		s.Reported = map[string]any{}
	}
	s.Delta = ShadowDelta(s.Desired, s.Reported)
	s.InSync = len(s.Delta) == 0
	if s.Delta == nil {
		s.Delta = map[string]any{}
	}
}

// MergePatch returns target with patch applied as a JSON merge patch
// (RFC 7386): a null deletes its key, an object merges into the object
// under its key, anything else replaces. target is not modified.
func MergePatch(target, patch map[string]any) map[string]any {
	out := maps.Clone(target)
	if out == nil {
		out = map[string]any{}
	}
	for k, v := range patch {
		switch v := v.(type) {
		case nil:
			delete(out, k)
		case map[string]any:
			old, _ := out[k].(map[string]any)
			out[k] = MergePatch(old, v)
		default:
			out[k] = v
		}
	}
	return out
}

// DesiredMet reports whether reported holds every value patch sets (its
// nulls, which delete, ask nothing): a device released by a desired
// rollout has done what it asks (ActionDesired).
func DesiredMet(patch, reported map[string]any) bool {
	return ShadowDelta(MergePatch(nil, patch), reported) == nil
}

// DesiredWait is a desired rollout's device action waiting for its
// device's reported state to meet the patch.
type DesiredWait struct {
	ActionID int64
	Patch    map[string]any
}

// DesiredPatch returns the patch of a desired_state action's params.
func DesiredPatch(params []byte) (map[string]any, error) {
	v, err := ParseCanonical(params)
	if err != nil {
		return nil, err
	}
	m, _ := v.(map[string]any)
	patch, ok := m[ShadowDesired].(map[string]any)
	if !ok {
		return nil, Errorf(EINVALID, "params.desired must be an object")
	}
	return patch, nil
}

// MergePatchFor returns the merge patch that turns from into to, holding
// only what differs: a key from has and to lacks (or holds null) is null,
// an object both hold is compared key by key, any other value of to that
// from does not have is to's. A person who edits a whole desired state
// (the console) changes it by this patch, so the audit log names what the
// edit changed.
func MergePatchFor(from, to map[string]any) map[string]any {
	patch := map[string]any{}
	for k := range from {
		if v, ok := to[k]; !ok || v == nil {
			patch[k] = nil
		}
	}
	for k, v := range to {
		if v == nil {
			continue
		}
		was, wasMap := from[k].(map[string]any)
		if now, isMap := v.(map[string]any); isMap && wasMap {
			if sub := MergePatchFor(was, now); len(sub) > 0 {
				patch[k] = sub
			}
		} else if ShadowDelta(map[string]any{k: v}, from) != nil {
			patch[k] = v
		}
	}
	return patch
}

// ShadowDelta returns the keys of desired whose values reported does not
// have: an object is compared key by key, so the delta of a nested object
// holds only its keys that differ; any other value differs unless equal
// (numbers by value: 1 and 1.0 are equal). Nil when nothing differs.
func ShadowDelta(desired, reported map[string]any) map[string]any {
	var delta map[string]any
	for k, want := range desired {
		have, ok := reported[k]
		var d any
		if wm, isMap := want.(map[string]any); isMap {
			hm, _ := have.(map[string]any)
			if sub := ShadowDelta(wm, hm); sub != nil {
				d = sub
			}
			if len(wm) == 0 && !isMapValue(have) {
				d = wm // an empty object reported as something else
			}
		} else if !ok || !canonicalEqual(want, have) {
			d = want
		}
		if d != nil {
			if delta == nil {
				delta = map[string]any{}
			}
			delta[k] = d
		}
	}
	return delta
}

func isMapValue(v any) bool { _, ok := v.(map[string]any); return ok }

// canonicalEqual compares two canonical values, numbers by value.
func canonicalEqual(a, b any) bool {
	switch a := a.(type) {
	case int64:
		switch b := b.(type) {
		case int64:
			return a == b
		case float64:
			return float64(a) == b && int64(b) == a
		}
		return false
	case float64:
		switch b := b.(type) {
		case float64:
			return a == b
		case int64:
			return canonicalEqual(b, a)
		}
		return false
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range a {
			if !canonicalEqual(a[i], b[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for k, v := range a {
			w, ok := b[k]
			if !ok || !canonicalEqual(v, w) {
				return false
			}
		}
		return true
	}
	return a == b
}

// CheckShadowSection returns the problem with a section of a shadow, as it
// is to be stored, or nil: a value nested deeper than MaxShadowDepth is
// EINVALID naming its path (desired.a.b[0]), and so is a string or a key
// that is not UTF-8 text without NUL characters (PostgreSQL's JSON cannot
// hold it); a section whose JSON text is larger than MaxShadowSection is
// ETOOLARGE.
func CheckShadowSection(section string, doc map[string]any) error {
	if path := tooDeep(section, doc, 0); path != "" {
		return &Error{Code: EINVALID, Message: fmt.Sprintf("%s nests deeper than %d levels", path, MaxShadowDepth),
			Fields: map[string]string{path: fmt.Sprintf("is nested deeper than %d levels", MaxShadowDepth)}}
	}
	if path, problem := badText(section, doc); path != "" {
		return &Error{Code: EINVALID, Message: path + " " + problem, Fields: map[string]string{path: problem}}
	}
	b, err := MarshalCanonical(doc)
	if err != nil {
		return FieldErrors(map[string]string{section: err.Error()})
	}
	if len(b) > MaxShadowSection {
		return &Error{Code: ETOOLARGE, Message: fmt.Sprintf("%s would be %d bytes of JSON; at most %d are kept", section, len(b), MaxShadowSection),
			Fields: map[string]string{section: fmt.Sprintf("must be at most %d bytes of JSON", MaxShadowSection)}}
	}
	return nil
}

// tooDeep returns the path of the first value, in key order, that is
// below depth MaxShadowDepth, or "".
func tooDeep(path string, v any, depth int) string {
	switch v := v.(type) {
	case map[string]any:
		for _, k := range slices.Sorted(maps.Keys(v)) {
			p := path + "." + k
			if depth+1 > MaxShadowDepth {
				return p
			}
			if q := tooDeep(p, v[k], depth+1); q != "" {
				return q
			}
		}
	case []any:
		for i, e := range v {
			p := path + "[" + strconv.Itoa(i) + "]"
			if depth+1 > MaxShadowDepth {
				return p
			}
			if q := tooDeep(p, e, depth+1); q != "" {
				return q
			}
		}
	}
	return ""
}

// badText returns the path of the first string, in key order, that is not
// UTF-8 text without NUL characters, or of the first object with such a
// key, and what is wrong there; "" when there is none.
func badText(path string, v any) (string, string) {
	switch v := v.(type) {
	case string:
		if !PlainText(v) {
			return path, PlainTextRule
		}
	case map[string]any:
		keys := slices.Sorted(maps.Keys(v))
		for _, k := range keys {
			if !PlainText(k) {
				return path, "has a key that is not UTF-8 text without NUL characters"
			}
		}
		for _, k := range keys {
			if p, problem := badText(path+"."+k, v[k]); p != "" {
				return p, problem
			}
		}
	case []any:
		for i, e := range v {
			if p, problem := badText(path+"["+strconv.Itoa(i)+"]", e); p != "" {
				return p, problem
			}
		}
	}
	return "", ""
}

// ShadowService keeps the devices' shadows. A device that has none reads
// as an empty shadow at version 0.
type ShadowService interface {
	FindShadow(ctx context.Context, tenant, device string) (*Shadow, error)
	// UpdateDesired merges patch into the desired section. With a version,
	// a shadow at another version is ECONFLICT. A patch that changes
	// nothing changes neither the version nor the audit log.
	UpdateDesired(ctx context.Context, tenant, device string, patch map[string]any, version *int64) (*Shadow, error)
	// UpdateReported merges patch into the reported section, as the device
	// reported it.
	UpdateReported(ctx context.Context, tenant, device string, patch map[string]any) (*Shadow, error)
	// ReportPoint merges the data of p, a point of the device's stream
	// that was kept (uplink's device_shadow), into the reported section,
	// unless the stream holds a newer point (by timestamp, then
	// sequence): a batch that arrives after a newer one, a retry or a
	// backlog, leaves the reported state as the newer point made it.
	ReportPoint(ctx context.Context, tenant, device, stream string, p *DataPoint) (*Shadow, error)
	// UpdateDesiredMany merges patch into the desired section of every
	// device sel chooses (its search type and what that needs, as a
	// dispatch's), in one transaction: all or none.
	UpdateDesiredMany(ctx context.Context, tenant string, sel *Dispatch, patch map[string]any) (*FleetDesired, error)
	ShadowSettings(ctx context.Context, tenant string) (ShadowSettings, error)
	// SetShadowSettings replaces the tenant's settings, audited with the
	// previous ones.
	SetShadowSettings(ctx context.Context, tenant string, s ShadowSettings) error
}
