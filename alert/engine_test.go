package alert_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/alert"
	"github.com/fleetd/fleet/internal/testclock"
)

var t0 = time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)

// memStore is an in-memory alert.Store that records what is committed.
type memStore struct {
	mu      sync.Mutex
	rules   []*fleet.AlertRule
	latest  map[string]*fleet.DataPoint // tenant/device/stream
	alerts  map[string]*fleet.Alert
	order   []string
	states  map[string]fleet.AlertState // rule/device
	commits int
	fail    error
	devices map[string]map[string]string // tenant/device -> metadata
	members map[string]bool              // tenant/group/device: in the group
	// onFindRules, when set, runs as the rules are read: what happens
	// meanwhile on this replica.
	onFindRules func()
}

func newMemStore() *memStore {
	return &memStore{latest: map[string]*fleet.DataPoint{}, alerts: map[string]*fleet.Alert{}, states: map[string]fleet.AlertState{},
		devices: map[string]map[string]string{}, members: map[string]bool{}}
}

func (m *memStore) CommitStream(ctx context.Context, tenant, device, stream string, pts []fleet.DataPoint, changes []*fleet.AlertChange) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return m.fail
	}
	m.commits++
	k := tenant + "/" + device + "/" + stream
	var latest *fleet.DataPoint
	if len(pts) > 0 {
		latest = &pts[len(pts)-1]
	}
	if old := m.latest[k]; latest != nil && (old == nil || latest.After(old)) {
		m.latest[k] = latest
	}
	for _, c := range changes {
		if o := c.Open; o != nil {
			for _, a := range m.alerts {
				if a.RuleID == o.RuleID && a.DeviceID == device && a.EndedAt == nil {
					return fmt.Errorf("alert of rule %s for %s opened twice", o.RuleID, device)
				}
			}
			a := *o
			m.alerts[a.ID] = &a
			m.order = append(m.order, a.ID)
		}
		if cl := c.Close; cl != nil {
			a := m.alerts[cl.ID]
			if a == nil || a.EndedAt != nil {
				return fmt.Errorf("closing alert %s that is not open", cl.ID)
			}
			t := cl.EndedAt
			a.EndedAt = &t
		}
		sk := c.State.RuleID + "/" + device
		if c.State.Phase == fleet.PhaseNormal {
			delete(m.states, sk)
		} else {
			m.states[sk] = c.State
		}
	}
	return nil
}

func (m *memStore) FindLatestPoint(ctx context.Context, tenant, device, stream string) (*fleet.DataPoint, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p := m.latest[tenant+"/"+device+"/"+stream]; p != nil {
		return p, nil
	}
	return nil, fleet.Errorf(fleet.ENOTFOUND, "none")
}

func (m *memStore) FindLatestPoints(ctx context.Context, tenant, stream string) ([]*fleet.DataPoint, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*fleet.DataPoint
	for _, p := range m.latest {
		if p.Stream == stream {
			out = append(out, p)
		}
	}
	return out, nil
}

func (m *memStore) FindAllAlertRules(ctx context.Context) ([]*fleet.AlertRule, error) {
	m.mu.Lock()
	defer func() {
		hook := m.onFindRules
		m.mu.Unlock()
		if hook != nil {
			hook()
		}
	}()
	var out []*fleet.AlertRule
	for _, r := range m.rules {
		c := *r
		c.Compiled, c.Filters = nil, nil
		out = append(out, &c)
	}
	return out, nil
}

func (m *memStore) FindAlertStates(ctx context.Context) ([]*fleet.AlertState, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*fleet.AlertState
	for _, s := range m.states {
		c := s
		out = append(out, &c)
	}
	return out, nil
}

func (m *memStore) FindDevice(ctx context.Context, tenant, id string) (*fleet.Device, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	meta, ok := m.devices[tenant+"/"+id]
	if !ok {
		return nil, fleet.Errorf(fleet.ENOTFOUND, "device %q not found", id)
	}
	return &fleet.Device{ID: id, Metadata: meta}, nil
}

func (m *memStore) InGroup(ctx context.Context, tenant, group, device string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.members[tenant+"/"+group+"/"+device], nil
}

// span is an alert as seconds after t0; end -1 while open.
type span struct{ start, end int }

func (m *memStore) spans() []span {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []span
	for _, id := range m.order {
		a := m.alerts[id]
		s := span{int(a.StartedAt.Sub(t0) / time.Second), -1}
		if a.EndedAt != nil {
			s.end = int(a.EndedAt.Sub(t0) / time.Second)
		}
		out = append(out, s)
	}
	return out
}

// rig is an engine on a memStore with a test clock.
type rig struct {
	t     *testing.T
	store *memStore
	clock *testclock.Clock
	e     *alert.Engine
}

func newRig(t *testing.T, store *memStore, rules ...*fleet.AlertRule) *rig {
	t.Helper()
	if store == nil {
		store = newMemStore()
		store.devices["acme/d1"] = map[string]string{"site": "berlin"}
		store.devices["acme/d2"] = map[string]string{"site": "paris"}
	}
	store.rules = append(store.rules, rules...)
	c := testclock.New(t0)
	e := &alert.Engine{Store: store, Devices: store, Now: c.Now}
	if err := e.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	return &rig{t: t, store: store, clock: c, e: e}
}

func mustRule(t testing.TB, id, cond string, act, deact float64, filters map[string]any) *fleet.AlertRule {
	t.Helper()
	r := &fleet.AlertRule{Tenant: "acme", ID: id, Name: id, Stream: "env", Condition: canon(t, cond),
		MetadataFilters: filters, ActivationThresholdSeconds: act, DeactivationThresholdSeconds: deact}
	if errs := alert.CompileRule(r); errs != nil {
		t.Fatalf("CompileRule: %v", errs)
	}
	return r
}

// data ingests one point for d1 taken at dataSec, arriving at clockSec.
func (r *rig) data(clockSec, dataSec int, temp float64) {
	r.t.Helper()
	r.dataFor("d1", clockSec, dataSec, temp)
}

func (r *rig) dataFor(device string, clockSec, dataSec int, temp float64) {
	r.t.Helper()
	r.clock.Set(t0.Add(time.Duration(clockSec) * time.Second))
	p := fleet.DataPoint{DeviceID: device, Stream: "env", Timestamp: t0.Add(time.Duration(dataSec) * time.Second),
		Data: map[string]any{"temp": temp}, ReceivedAt: r.clock.Now()}
	if err := r.e.IngestPoints(context.Background(), "acme", device, "env", []fleet.DataPoint{p}); err != nil {
		r.t.Fatalf("ingest at %d: %v", clockSec, err)
	}
}

// tick lets the clock reach clockSec and fires the timers due.
func (r *rig) tick(clockSec int) {
	r.t.Helper()
	r.clock.Set(t0.Add(time.Duration(clockSec) * time.Second))
	if err := r.e.CheckTimers(context.Background()); err != nil {
		r.t.Fatalf("timers at %d: %v", clockSec, err)
	}
}

func (r *rig) want(spans ...span) {
	r.t.Helper()
	got := r.store.spans()
	if fmt.Sprint(got) != fmt.Sprint(spans) {
		r.t.Fatalf("alerts (start, end seconds) = %v, want %v", got, spans)
	}
}

const hot = `{"field": "temp", "operator": ">", "value": 80}`

func TestThresholds(t *testing.T) {
	type ev struct {
		tick        bool
		clock, data int
		temp        float64
		want        []span // checked after the event when not nil
	}
	none := []span{}
	tests := []struct {
		name       string
		cond       string
		act, deact float64
		events     []ev
		final      []span
	}{
		{"OpensAtOnceWithoutThreshold", hot, 0, 0, []ev{
			{clock: 0, data: 0, temp: 70, want: none},
			{clock: 10, data: 10, temp: 81, want: []span{{10, -1}}},
			{clock: 20, data: 20, temp: 90},
		}, []span{{10, -1}}},
		{"ClosesAtOnceWithoutThreshold", hot, 0, 0, []ev{
			{clock: 0, data: 0, temp: 81},
			{clock: 5, data: 5, temp: 79},
			{clock: 6, data: 6, temp: 85},
		}, []span{{0, 5}, {6, -1}}},
		{"ActivationByDataTime", hot, 60, 0, []ev{
			{clock: 0, data: 0, temp: 81},
			{clock: 30, data: 30, temp: 82, want: none},
			{clock: 59, data: 59, temp: 83, want: none},
			{clock: 60, data: 60, temp: 84},
		}, []span{{60, -1}}},
		{"ActivationByDataTimeOfBufferedPoints", hot, 60, 0, []ev{
			// Points of the past, delivered together at clock 500.
			{clock: 500, data: 0, temp: 81},
			{clock: 500, data: 90, temp: 81},
		}, []span{{60, -1}}},
		{"ActivationByClockAlone", hot, 60, 0, []ev{
			{clock: 0, data: 0, temp: 81},
			{tick: true, clock: 59, want: none},
			{tick: true, clock: 60},
		}, []span{{60, -1}}},
		{"ActivationByClockWhenDeviceClockLags", hot, 60, 0, []ev{
			// The device's clock is an hour behind: the clock counts.
			{clock: 3600, data: 0, temp: 81},
			{clock: 3630, data: 30, temp: 81, want: none},
			{tick: true, clock: 3660},
		}, []span{{3660, -1}}},
		{"FlappingBelowActivation", hot, 60, 0, []ev{
			{clock: 0, data: 0, temp: 81},
			{clock: 30, data: 30, temp: 70},
			{clock: 40, data: 40, temp: 81},
			{clock: 90, data: 90, temp: 81, want: none},
			{tick: true, clock: 99, want: none},
			{tick: true, clock: 100},
		}, []span{{100, -1}}},
		{"FlappingNeverOpens", hot, 30, 0, []ev{
			{clock: 0, data: 0, temp: 81},
			{clock: 20, data: 20, temp: 70},
			{tick: true, clock: 30},
			{clock: 40, data: 40, temp: 81},
			{clock: 60, data: 60, temp: 70},
			{tick: true, clock: 200},
		}, none},
		{"DeactivationByDataTime", hot, 0, 30, []ev{
			{clock: 0, data: 0, temp: 81},
			{clock: 10, data: 10, temp: 70},
			{clock: 39, data: 39, temp: 70, want: []span{{0, -1}}},
			{clock: 40, data: 40, temp: 70},
		}, []span{{0, 40}}},
		{"DeactivationByClockAlone", hot, 0, 30, []ev{
			{clock: 0, data: 0, temp: 81},
			{clock: 10, data: 10, temp: 70},
			{tick: true, clock: 39, want: []span{{0, -1}}},
			{tick: true, clock: 45},
		}, []span{{0, 40}}},
		{"FlappingBelowDeactivation", hot, 0, 30, []ev{
			{clock: 0, data: 0, temp: 81},
			{clock: 10, data: 10, temp: 70},
			{clock: 20, data: 20, temp: 81},
			{clock: 25, data: 25, temp: 70},
			{tick: true, clock: 50, want: []span{{0, -1}}},
			{tick: true, clock: 55},
		}, []span{{0, 55}}},
		{"BothThresholds", hot, 20, 20, []ev{
			{clock: 0, data: 0, temp: 81},
			{tick: true, clock: 20, want: []span{{20, -1}}},
			{clock: 30, data: 30, temp: 70},
			{tick: true, clock: 50},
			{clock: 60, data: 60, temp: 90},
			{tick: true, clock: 79, want: []span{{20, 50}}},
			{tick: true, clock: 80},
		}, []span{{20, 50}, {80, -1}}},
		{"NoDataOpensByClockAndClosesOnData", `{"no_data_seconds": 60}`, 0, 0, []ev{
			{clock: 0, data: 0, temp: 1},
			{tick: true, clock: 59, want: none},
			{tick: true, clock: 61, want: []span{{60, -1}}},
			{tick: true, clock: 500, want: []span{{60, -1}}},
			{clock: 600, data: 600, temp: 1},
		}, []span{{60, 600}}},
		{"NoDataRestartsWithEachPoint", `{"no_data_seconds": 60}`, 0, 0, []ev{
			{clock: 0, data: 0, temp: 1},
			{clock: 50, data: 50, temp: 1},
			{tick: true, clock: 60, want: none},
			{tick: true, clock: 109, want: none},
			{tick: true, clock: 110},
		}, []span{{110, -1}}},
		{"NoDataWithActivation", `{"no_data_seconds": 60}`, 30, 0, []ev{
			{clock: 0, data: 0, temp: 1},
			{tick: true, clock: 60, want: none},
			{tick: true, clock: 89, want: none},
			{tick: true, clock: 95},
		}, []span{{90, -1}}},
		{"NoDataOrHot", `{"any": [{"no_data_seconds": 60}, ` + hot + `]}`, 0, 0, []ev{
			{clock: 0, data: 0, temp: 90, want: []span{{0, -1}}},
			{clock: 10, data: 10, temp: 70, want: []span{{0, 10}}},
			{tick: true, clock: 70},
		}, []span{{0, 10}, {70, -1}}},
		{"HotThenSilent", `{"all": [{"no_data_seconds": 30}, ` + hot + `]}`, 0, 0, []ev{
			{clock: 0, data: 0, temp: 70},
			{tick: true, clock: 40, want: none},
			{clock: 50, data: 50, temp: 90, want: none},
			{tick: true, clock: 80},
		}, []span{{80, -1}}},
		{"OldAndDuplicatePointsIgnored", hot, 0, 0, []ev{
			{clock: 0, data: 100, temp: 81},
			{clock: 1, data: 50, temp: 70},
			{clock: 2, data: 100, temp: 70},
		}, []span{{100, -1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, nil, mustRule(t, "r1", tt.cond, tt.act, tt.deact, nil))
			for i, e := range tt.events {
				if e.tick {
					r.tick(e.clock)
				} else {
					r.data(e.clock, e.data, e.temp)
				}
				if e.want != nil {
					got := r.store.spans()
					if fmt.Sprint(got) != fmt.Sprint(e.want) {
						t.Fatalf("after event %d (%+v): alerts %v, want %v", i, e, got, e.want)
					}
				}
			}
			if tt.final == nil {
				tt.final = []span{}
			}
			r.want(tt.final...)
		})
	}
}

func TestMetadataFilters(t *testing.T) {
	r := newRig(t, nil, mustRule(t, "berlin", hot, 0, 0, map[string]any{"site": []any{"berlin", "rome"}}))
	r.dataFor("d1", 0, 0, 90)
	r.dataFor("d2", 0, 0, 90)
	got := r.store.spans()
	if len(got) != 1 {
		t.Fatalf("alerts %v, want one, for d1 alone", got)
	}
	t.Run("MetadataChangeAfterInvalidation", func(t *testing.T) {
		r.store.mu.Lock()
		r.store.devices["acme/d2"] = map[string]string{"site": "rome"}
		r.store.mu.Unlock()
		r.dataFor("d2", 1, 1, 91)
		if n := len(r.store.spans()); n != 1 {
			t.Fatalf("%d alerts before the cache was invalidated, want 1 (cached metadata)", n)
		}
		r.e.InvalidateMetadata("acme", "d2")
		r.dataFor("d2", 2, 2, 92)
		if n := len(r.store.spans()); n != 2 {
			t.Fatalf("%d alerts, want 2 once d2 moved to rome", n)
		}
	})
	t.Run("UnknownDevice", func(t *testing.T) {
		p := fleet.DataPoint{Timestamp: t0, Data: map[string]any{"temp": 99.0}}
		err := r.e.IngestPoints(context.Background(), "acme", "ghost", "env", []fleet.DataPoint{p})
		if fleet.ErrorCode(err) != fleet.ENOTFOUND {
			t.Fatalf("ingest for an unknown device: %v, want not_found", err)
		}
	})
}

// TestDeviceGroup: a rule with a device group watches the devices in the
// group when each point is evaluated: no cache, so a device that joins is
// watched from its next point, and one that leaves has its alert closed.
func TestDeviceGroup(t *testing.T) {
	rule := mustRule(t, "lab", hot, 0, 0, nil)
	rule.DeviceGroup = "lab"
	r := newRig(t, nil, rule)
	r.store.members["acme/lab/d1"] = true
	r.dataFor("d1", 0, 0, 90)
	r.dataFor("d2", 0, 0, 90)
	r.want(span{0, -1})
	r.store.mu.Lock()
	r.store.members["acme/lab/d1"], r.store.members["acme/lab/d2"] = false, true
	r.store.mu.Unlock()
	r.dataFor("d1", 1, 1, 91)
	r.dataFor("d2", 1, 1, 91)
	r.want(span{0, 1}, span{1, -1})
}

func TestTenantAndStreamIsolation(t *testing.T) {
	r := newRig(t, nil, mustRule(t, "r1", hot, 0, 0, nil))
	ctx := context.Background()
	p := []fleet.DataPoint{{Timestamp: t0, Data: map[string]any{"temp": 99.0}}}
	if err := r.e.IngestPoints(ctx, "beta", "d1", "env", p); err != nil {
		t.Fatal(err)
	}
	if err := r.e.IngestPoints(ctx, "acme", "d1", "other", p); err != nil {
		t.Fatal(err)
	}
	r.want()
}

func TestCommitFailureLeavesNoTrace(t *testing.T) {
	r := newRig(t, nil, mustRule(t, "r1", hot, 0, 0, nil))
	r.store.fail = fleet.Errorf(fleet.EUNAVAILABLE, "down")
	p := []fleet.DataPoint{{Timestamp: t0, Data: map[string]any{"temp": 99.0}}}
	if err := r.e.IngestPoints(context.Background(), "acme", "d1", "env", p); fleet.ErrorCode(err) != fleet.EUNAVAILABLE {
		t.Fatalf("ingest = %v, want unavailable", err)
	}
	r.store.fail = nil
	// The same point again, as the device retries: it must open the alert.
	r.data(1, 0, 99)
	r.want(span{0, -1})
}

func TestRestartResumes(t *testing.T) {
	t.Run("PendingActivationElapsesAfterRestart", func(t *testing.T) {
		rule := mustRule(t, "r1", hot, 60, 0, nil)
		r := newRig(t, nil, rule)
		r.data(0, 0, 81)
		r2 := newRig(t, r.store) // a new engine on the same store
		r2.tick(30)
		r2.want()
		r2.tick(60)
		r2.want(span{60, -1})
	})
	t.Run("OpenAlertNotOpenedAgain", func(t *testing.T) {
		r := newRig(t, nil, mustRule(t, "r1", hot, 0, 0, nil))
		r.data(0, 0, 81)
		r2 := newRig(t, r.store)
		r2.data(1, 0, 81)  // the same point, redelivered after the restart
		r2.data(2, 10, 85) // still hot
		r2.data(3, 20, 70) // cool: the alert from before the restart ends
		r2.want(span{0, 20})
	})
	t.Run("NoDataCountsFromRestart", func(t *testing.T) {
		r := newRig(t, nil, mustRule(t, "r1", `{"no_data_seconds": 60}`, 0, 0, nil))
		r.data(0, 0, 1)
		r2 := newRig(t, nil)
		r2.store = r.store
		r2.clock.Set(t0.Add(1000 * time.Second)) // down for a while
		r2.e = &alert.Engine{Store: r.store, Devices: r.store, Now: r2.clock.Now}
		if err := r2.e.Load(context.Background()); err != nil {
			t.Fatal(err)
		}
		r2.tick(1059)
		r2.want()
		r2.tick(1060)
		r2.want(span{1060, -1})
	})
}

func TestRuleChanges(t *testing.T) {
	r := newRig(t, nil)
	ctx := context.Background()
	rule := mustRule(t, "r1", hot, 0, 0, nil)
	r.store.rules = append(r.store.rules, rule)
	if err := r.e.AddRule(ctx, rule); err != nil {
		t.Fatal(err)
	}
	r.data(0, 0, 90)
	r.want(span{0, -1})
	r.e.RemoveRule("acme", "r1")
	r.data(1, 1, 70) // no rule: nothing changes
	r.want(span{0, -1})
	// Refresh learns of a rule made elsewhere, and forgets one deleted
	// elsewhere.
	gone := mustRule(t, "gone", hot, 0, 0, nil)
	if err := r.e.AddRule(ctx, gone); err != nil {
		t.Fatal(err)
	}
	r.store.rules = []*fleet.AlertRule{mustRule(t, "r2", hot, 0, 0, nil)}
	if err := r.e.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	r.data(2, 2, 95)
	spans := r.store.spans()
	sort.Slice(spans, func(i, j int) bool { return spans[i].start < spans[j].start })
	if len(spans) != 2 {
		t.Fatalf("alerts %v, want r1's and one of r2", spans)
	}
}

func TestRefreshKeepsRuleAddedMeanwhile(t *testing.T) {
	r := newRig(t, nil)
	ctx := context.Background()
	late := mustRule(t, "late", hot, 0, 0, nil)
	r.store.onFindRules = func() {
		r.store.onFindRules = nil
		if err := r.e.AddRule(ctx, late); err != nil {
			t.Error(err)
		}
	}
	if err := r.e.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	r.data(0, 0, 90)
	r.want(span{0, -1})
}

// TestRuleEdited: an edited rule keeps each device's phase and open alert,
// which the next point moves by the new condition; a threshold running is
// timed again by the new one; another replica learns of the edit by
// Refresh.
func TestRuleEdited(t *testing.T) {
	ctx := context.Background()
	t.Run("OpenAlertFollowsNewCondition", func(t *testing.T) {
		r := newRig(t, nil, mustRule(t, "r1", hot, 0, 0, nil))
		r.data(0, 0, 90)
		r.want(span{0, -1})
		if err := r.e.ReplaceRule(ctx, mustRule(t, "r1", `{"field": "temp", "operator": ">", "value": 95}`, 0, 0, nil)); err != nil {
			t.Fatal(err)
		}
		r.want(span{0, -1}) // nothing moves before the next point
		r.data(1, 1, 92)    // hot by the old rule, not by the new one
		r.want(span{0, 1})
	})
	t.Run("ThresholdTimedAgain", func(t *testing.T) {
		r := newRig(t, nil, mustRule(t, "r1", hot, 60, 0, nil))
		r.data(0, 0, 90) // activating: would open at 60
		if err := r.e.ReplaceRule(ctx, mustRule(t, "r1", hot, 10, 0, nil)); err != nil {
			t.Fatal(err)
		}
		r.tick(10)
		r.want(span{10, -1})
	})
	t.Run("RefreshSeesEditElsewhere", func(t *testing.T) {
		r := newRig(t, nil, mustRule(t, "r1", hot, 0, 0, nil))
		r.data(0, 0, 90)
		r.want(span{0, -1})
		r.store.rules = []*fleet.AlertRule{mustRule(t, "r1", `{"field": "temp", "operator": ">", "value": 95}`, 0, 0, nil)}
		if err := r.e.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		r.data(1, 1, 92)
		r.want(span{0, 1})
	})
}
