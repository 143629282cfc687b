package fleetdtest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/fleetd/fleet/notify"
)

// RolloutBody is an action as GET /api/v1/actions/{id} shows a rollout.
type RolloutBody struct {
	ActionBody
	StatusesPhased  map[string]map[string]int          `json:"statuses_phased"`
	Schedule        *struct{ Phases []map[string]any } `json:"schedule"`
	PhasesTriggered []bool                             `json:"phases_triggered"`
	NextPhaseIndex  *int                               `json:"next_phase_index"`
	Status          string                             `json:"status"`
	PauseReason     string                             `json:"pause_reason"`
	WaitingReason   string                             `json:"waiting_reason"`
}

// Rollout returns rollout id as c sees it.
func (s *Server) Rollout(t *testing.T, c Creds, id int64) RolloutBody {
	t.Helper()
	var a RolloutBody
	s.Do(t, c, "GET", fmt.Sprintf("/api/v1/actions/%d", id), nil).Want(t, 200).Decode(t, &a)
	return a
}

// AwaitRollout waits for the rollout's status.
func (s *Server) AwaitRollout(t *testing.T, c Creds, id int64, status string) RolloutBody {
	t.Helper()
	var a RolloutBody
	Eventually(t, fmt.Sprintf("rollout %d to be %s", id, status), func() bool {
		a = s.Rollout(t, c, id)
		return a.Status == status
	})
	return a
}

// Phase is a phase of a schedule.
func Phase(name string, trigger map[string]any, info map[string]any) map[string]any {
	return map[string]any{"name": name, "trigger_on": trigger, "info": info}
}

// FixedList is a phase's selection of these devices.
func FixedList(ids ...string) map[string]any {
	return map[string]any{"type": "fixed_list", "device_ids": ids}
}

// Percent is a phase's selection of p% of the targets, cumulative.
func Percent(p int) map[string]any { return map[string]any{"type": "percentage", "percentage": p} }

// Phase triggers: at once, by hand, after the previous phase.
var (
	TriggerNow    = map[string]any{"type": "now"}
	TriggerManual = map[string]any{"type": "manual"}
	TriggerAfter  = map[string]any{"type": "after_previous", "wait_seconds": 0}
)

// RolloutEvents lists the rollout notifications a receiver got for action
// id, as "event" or "event:phase", in the order the changes were made
// (their outbox ids; the notifier sends several at once).
func RolloutEvents(t *testing.T, r *Receiver, id int64) []string {
	t.Helper()
	type event struct {
		delivery int64
		name     string
	}
	var got []event
	for _, req := range r.Got() {
		var p notify.RolloutWebhookPayload
		if err := json.Unmarshal(req.Body, &p); err != nil || p.Rollout == nil {
			t.Fatalf("a rollout notification %s: %v", req.Body, err)
		}
		if p.Rollout.ActionID != id {
			continue
		}
		e := p.Rollout.Event
		if p.Rollout.Phase != nil && e == "phase_triggered" {
			e += fmt.Sprintf(":%d", *p.Rollout.Phase)
		}
		if p.Event != "rollout."+p.Rollout.Event || req.Header.Get("X-Fleet-Event") != p.Event {
			t.Fatalf("notification event %q, header %q, for %q", p.Event, req.Header.Get("X-Fleet-Event"), p.Rollout.Event)
		}
		got = append(got, event{p.DeliveryID, e})
	}
	sort.Slice(got, func(i, j int) bool { return got[i].delivery < got[j].delivery })
	out := []string{}
	for _, e := range got {
		out = append(out, e.name)
	}
	return out
}

// AwaitEvents waits until the receiver got want for action id, exactly.
func AwaitEvents(t *testing.T, r *Receiver, id int64, want ...string) {
	t.Helper()
	Eventually(t, fmt.Sprintf("the rollout notifications of action %d to be %v", id, want), func() bool {
		return slices.Equal(RolloutEvents(t, r, id), want)
	})
}

// At is the value under path in a decoded body: map keys and list indexes.
func At(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[k]
		case int:
			l, _ := v.([]any)
			if k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

// Times makes instants comparable: JSON shows them as RFC 3339 strings,
// the other encodings as instants, which decode to RFC 3339 again, in
// their own precision.
func Times(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			out[k] = Times(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = Times(e)
		}
		return out
	case string:
		if tm, err := time.Parse(time.RFC3339Nano, x); err == nil {
			return tm.UTC().Format(time.RFC3339Nano)
		}
	}
	return v
}

// Request is an authenticated request without a body, for a test that
// sends it itself (and may not see its answer).
func (s *Server) Request(t *testing.T, c Creds, method, path string) *http.Request {
	t.Helper()
	r, err := http.NewRequest(method, s.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set("x-service-tenant", c.Tenant)
	r.Header.Set("x-service-api-key", c.Key)
	return r
}
