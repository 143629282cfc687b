package alert

import (
	"container/heap"
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetd/fleet"
	"github.com/google/uuid"
)

// Store is what the engine needs of the database.
type Store interface {
	// CommitStream writes a batch of a stream's points (sorted; the last
	// is the latest) and the alert changes of one evaluation in one
	// transaction; see sqlstore.DB.CommitStream.
	CommitStream(ctx context.Context, tenant, device, stream string, pts []fleet.DataPoint, changes []*fleet.AlertChange) error
	FindLatestPoint(ctx context.Context, tenant, device, stream string) (*fleet.DataPoint, error)
	FindLatestPoints(ctx context.Context, tenant, stream string) ([]*fleet.DataPoint, error)
	FindAllAlertRules(ctx context.Context) ([]*fleet.AlertRule, error)
	FindAlertStates(ctx context.Context) ([]*fleet.AlertState, error)
}

// DeviceFinder reads a device's metadata for rules with metadata_filters,
// and its membership of a group for rules with a device_group.
type DeviceFinder interface {
	FindDevice(ctx context.Context, tenant, id string) (*fleet.Device, error)
	// InGroup reports whether the device is in the group now; a group
	// that is not there has no devices.
	InGroup(ctx context.Context, tenant, group, device string) (bool, error)
}

// Engine evaluates alert rules on device data. Rules are indexed in memory
// by tenant and stream; each device stream keeps the state of every rule that
// watches it, in memory, and writes it behind to the store only when it
// changes phase, in the same transaction as the stream's latest point and the
// alerts and notifications the change makes. Points of one device stream are
// evaluated in order, one ingest at a time; different streams in parallel.
//
// Time passes by the points' timestamps and by the clock: a timer heap holds
// the moment each pending threshold or no_data_seconds elapses, and
// CheckTimers (called by Run every Tick) evaluates those that are due.
type Engine struct {
	Store   Store
	Devices DeviceFinder
	Logger  *slog.Logger
	Now     func() time.Time
	// Tick is how often Run checks timers; default 1s.
	Tick time.Duration
	// RefreshEvery is how often Run reloads the rules, to learn of rules
	// made or deleted on other replicas; default 10s.
	RefreshEvery time.Duration
	// MetadataTTL bounds how long a device's metadata is cached for
	// metadata_filters on another replica's PATCH; default 60s.
	MetadataTTL time.Duration
	// Changed, when set, is called after alerts opened or closed, so the
	// notification worker looks at the outbox at once.
	Changed func()

	rules   atomic.Pointer[ruleIndex]
	added   atomic.Uint64 // counts AddRule calls, so Refresh knows what it could not see
	mu      sync.RWMutex
	streams map[streamKey]*streamState
	timers  timerHeap
	meta    metaCache
	started int64
	stats   struct{ points, opened, closed atomic.Uint64 }
}

// Stats counts what the engine did since it started, for metrics.
type Stats struct {
	Points uint64 // data points ingested
	Opened uint64 // alerts opened
	Closed uint64 // alerts closed
}

// Stats returns the engine's counters.
func (e *Engine) Stats() Stats {
	return Stats{Points: e.stats.points.Load(), Opened: e.stats.opened.Load(), Closed: e.stats.closed.Load()}
}

type streamKey struct{ tenant, device, stream string }

type tenantStream struct{ tenant, stream string }

// ruleIndex is an immutable snapshot of the rules, replaced as a whole
// when rules change so that ingest reads it without a lock.
type ruleIndex struct {
	byStream map[tenantStream][]*rule
	byID     map[string]*rule
}

// rule is a compiled rule with its thresholds in milliseconds.
type rule struct {
	*fleet.AlertRule
	act, deact int64
	noData     []int64 // no_data_seconds of the condition in ms, ascending
	added      uint64  // the engine's AddRule count when it was added
	// windows are the windowed comparisons of the condition, by
	// WindowIndex; span is the longest of their windows, ms.
	windows []*fleet.Condition
	span    int64
}

// facts is what rules with metadata filters or a device group need to
// know of the device an ingest is for.
type facts struct {
	meta   map[string]string
	groups map[string]bool // membership, by group name
}

func (r *rule) matches(f facts) bool {
	return (len(r.Filters) == 0 || r.MatchesMetadata(f.meta)) && (r.DeviceGroup == "" || f.groups[r.DeviceGroup])
}

// deviceFacts reads what rules need of the device: its metadata (cached,
// see MetadataTTL) if a rule has metadata filters, and its membership of
// each device group a rule names, read now, so that a rule follows the
// group as the device's metadata or reported state change.
func (e *Engine) deviceFacts(ctx context.Context, tenant, device string, rules []*rule) (facts, error) {
	var f facts
	for _, r := range rules {
		if len(r.Filters) > 0 && f.meta == nil {
			m, err := e.metadata(ctx, tenant, device)
			if err != nil {
				return f, err
			}
			f.meta = m
			if f.meta == nil {
				f.meta = map[string]string{}
			}
		}
		if g := r.DeviceGroup; g != "" {
			if _, ok := f.groups[g]; ok {
				continue
			}
			in, err := e.Devices.InGroup(ctx, tenant, g, device)
			if err != nil {
				return f, err
			}
			if f.groups == nil {
				f.groups = map[string]bool{}
			}
			f.groups[g] = in
		}
	}
	return f, nil
}

// streamState is what the engine knows of one device stream.
type streamState struct {
	mu              sync.Mutex
	key             streamKey
	loaded          bool // the stored latest point was read
	hasLast         bool
	lastTS, lastSeq int64
	lastArrival     int64 // by the clock, ms
	lastPoint       *fleet.DataPoint
	states          map[string]*ruleState // by rule id
	cachedFor       []*rule               // the rule list cached is for
	cached          []*ruleState          // states in the order of cachedFor
	removed         bool
	version         int64 // of the stream in a VersionedStore (replicas.go)
}

// ruleState is the state machine of docs/alerts.md#evaluation-and-thresholds
// for one rule and device.
type ruleState struct {
	rule       *rule
	phase      string
	sinceData  int64 // -1 when the clock alone began the phase
	sinceClock int64
	alertID    string
	cond       bool   // the condition at the last evaluation
	gen        uint64 // bumped on every phase change; stale timers carry an older one
	noDataDue  int64  // when the pending no_data timer fires; 0 for none
	noDataAt   int64  // the last moment a no_data timer evaluated
	removed    bool
	// wins are the rule's windows for this device (window.go), nil until
	// warmed.
	wins []*window
}

// errNotLoaded is returned by IngestPoints before Load.
var errNotLoaded = errors.New("alert engine: Load was not called")

func (e *Engine) now() int64 { return e.Now().UnixMilli() }

// Load reads the rules and the evaluation states left by the last run,
// schedules every pending threshold, and starts the no_data timers of
// every device that has reported on a watched stream. Call it once, before
// ingest.
func (e *Engine) Load(ctx context.Context) error {
	if e.Now == nil {
		e.Now = time.Now
	}
	if e.Logger == nil {
		e.Logger = slog.New(slog.DiscardHandler)
	}
	if e.Tick <= 0 {
		e.Tick = time.Second
	}
	if e.RefreshEvery <= 0 {
		e.RefreshEvery = 10 * time.Second
	}
	if e.MetadataTTL <= 0 {
		e.MetadataTTL = time.Minute
	}
	e.streams = map[streamKey]*streamState{}
	e.started = e.now()
	rules, err := e.Store.FindAllAlertRules(ctx)
	if err != nil {
		return err
	}
	idx := &ruleIndex{byStream: map[tenantStream][]*rule{}, byID: map[string]*rule{}}
	for _, r := range rules {
		cr, err := compileRule(r)
		if err != nil {
			e.Logger.Error("alert rule does not compile; it is not evaluated", "tenant", r.Tenant, "rule", r.ID, "err", err)
			continue
		}
		idx.add(cr)
	}
	e.rules.Store(idx)
	states, err := e.Store.FindAlertStates(ctx)
	if err != nil {
		return err
	}
	for _, s := range states {
		r := idx.byID[s.RuleID]
		if r == nil {
			continue
		}
		ss := e.stream(streamKey{s.Tenant, s.DeviceID, r.Stream})
		ss.mu.Lock()
		if err := e.loadLatest(ctx, ss); err != nil {
			ss.mu.Unlock()
			return err
		}
		st := ss.state(r)
		st.phase, st.sinceClock, st.alertID = s.Phase, s.SinceClock.UnixMilli(), s.AlertID
		st.sinceData = -1
		if !s.SinceData.IsZero() {
			st.sinceData = s.SinceData.UnixMilli()
		}
		st.cond = s.Phase == fleet.PhaseActivating || s.Phase == fleet.PhaseActive
		e.schedule(ss, st)
		ss.mu.Unlock()
	}
	for _, r := range idx.byID {
		if len(r.noData) > 0 {
			if err := e.watchNoData(ctx, r); err != nil {
				return err
			}
		}
	}
	return nil
}

// CompileRule checks and compiles a rule's condition and metadata filters,
// as saved; problems are keyed by field.
func CompileRule(r *fleet.AlertRule) map[string]string {
	errs := map[string]string{}
	c, cerrs := CompileCondition("condition", r.Condition)
	for k, v := range cerrs {
		errs[k] = v
	}
	filters, ferrs := compileFilters(r.MetadataFilters)
	for k, v := range ferrs {
		errs[k] = v
	}
	if len(errs) > 0 {
		return errs
	}
	r.Compiled, r.Filters = c, filters
	return nil
}

func compileFilters(m map[string]any) (map[string][]string, map[string]string) {
	errs := map[string]string{}
	if len(m) > fleet.MaxMetadataKeys {
		errs["metadata_filters"] = "must have at most 64 keys"
		return nil, errs
	}
	out := make(map[string][]string, len(m))
	for k, v := range m {
		path := "metadata_filters." + k
		switch v := v.(type) {
		case string:
			out[k] = []string{v}
		case []any:
			if len(v) == 0 || len(v) > 100 {
				errs[path] = "must list 1 to 100 values"
				continue
			}
			for i, e := range v {
				s, ok := e.(string)
				if !ok {
					errs[path] = "must be a string or an array of strings; element " + itoa(i) + " is " + fleet.Describe(e)
					break
				}
				out[k] = append(out[k], s)
			}
		default:
			errs[path] = "must be a string or an array of strings, not " + fleet.Describe(v)
		}
	}
	return out, errs
}

func itoa(i int) string {
	if i < 10 {
		return string(rune('0' + i))
	}
	return itoa(i/10) + string(rune('0'+i%10))
}

func compileRule(r *fleet.AlertRule) (*rule, error) {
	if r.Compiled == nil {
		if errs := CompileRule(r); errs != nil {
			return nil, fleet.FieldErrors(errs)
		}
	}
	cr := &rule{AlertRule: r, act: r.ActivationThreshold().Milliseconds(), deact: r.DeactivationThreshold().Milliseconds()}
	for _, d := range r.Compiled.NoDataDurations() {
		cr.noData = append(cr.noData, d.Milliseconds())
	}
	slices.Sort(cr.noData)
	cr.noData = slices.Compact(cr.noData)
	cr.windows = r.Compiled.Windows()
	for _, c := range cr.windows {
		cr.span = max(cr.span, c.Window.Milliseconds())
	}
	return cr, nil
}

func (idx *ruleIndex) add(r *rule) {
	k := tenantStream{r.Tenant, r.Stream}
	idx.byStream[k] = append(idx.byStream[k], r)
	idx.byID[r.ID] = r
}

// clone copies the index for a change; the rule lists are copied so that
// readers of the old snapshot never see them move.
func (idx *ruleIndex) clone() *ruleIndex {
	n := &ruleIndex{byStream: make(map[tenantStream][]*rule, len(idx.byStream)), byID: make(map[string]*rule, len(idx.byID))}
	for k, v := range idx.byStream {
		n.byStream[k] = slices.Clone(v)
	}
	for k, v := range idx.byID {
		n.byID[k] = v
	}
	return n
}

// AddRule starts evaluating a rule saved just now. Its condition must be
// compiled.
func (e *Engine) AddRule(ctx context.Context, r *fleet.AlertRule) error {
	cr, err := compileRule(r)
	if err != nil {
		return err
	}
	e.mu.Lock()
	old := e.rules.Load()
	if _, ok := old.byID[r.ID]; ok {
		e.mu.Unlock()
		return nil
	}
	cr.added = e.added.Add(1)
	idx := old.clone()
	idx.add(cr)
	e.rules.Store(idx)
	e.mu.Unlock()
	if len(cr.noData) > 0 {
		return e.watchNoData(ctx, cr)
	}
	return nil
}

// RemoveRule stops evaluating a rule and forgets its states.
func (e *Engine) RemoveRule(tenant, id string) {
	e.mu.Lock()
	old := e.rules.Load()
	r, ok := old.byID[id]
	if !ok || r.Tenant != tenant {
		e.mu.Unlock()
		return
	}
	idx := old.clone()
	delete(idx.byID, id)
	k := tenantStream{r.Tenant, r.Stream}
	idx.byStream[k] = slices.DeleteFunc(idx.byStream[k], func(x *rule) bool { return x.ID == id })
	if len(idx.byStream[k]) == 0 {
		delete(idx.byStream, k)
	}
	e.rules.Store(idx)
	affected := e.streamsOf(r.Tenant, r.Stream)
	e.mu.Unlock()
	for _, ss := range affected {
		ss.mu.Lock()
		if st, ok := ss.states[id]; ok {
			st.removed = true
			delete(ss.states, id)
			ss.cachedFor = nil
		}
		ss.mu.Unlock()
	}
}

// streamsOf returns the device streams of a tenant's stream the engine
// holds; e.mu is held.
func (e *Engine) streamsOf(tenant, stream string) []*streamState {
	var out []*streamState
	for key, ss := range e.streams {
		if key.tenant == tenant && key.stream == stream {
			out = append(out, ss)
		}
	}
	return out
}

// ReplaceRule evaluates an edited rule from now on in place of the rule of
// the same id. Each device keeps its phase and open alert, which the next
// point moves by the new condition; thresholds pending are timed again by
// the new thresholds. An edit cannot move a rule to another stream.
func (e *Engine) ReplaceRule(ctx context.Context, r *fleet.AlertRule) error {
	cr, err := compileRule(r)
	if err != nil {
		return err
	}
	e.mu.Lock()
	old := e.rules.Load()
	prev, ok := old.byID[r.ID]
	if !ok || prev.Tenant != r.Tenant || prev.Stream != r.Stream {
		e.mu.Unlock()
		if ok {
			e.RemoveRule(prev.Tenant, prev.ID)
		}
		return e.AddRule(ctx, r)
	}
	cr.added = e.added.Add(1)
	idx := old.clone()
	idx.byID[r.ID] = cr
	k := tenantStream{r.Tenant, r.Stream}
	for i, x := range idx.byStream[k] {
		if x.ID == r.ID {
			idx.byStream[k][i] = cr
		}
	}
	e.rules.Store(idx)
	affected := e.streamsOf(r.Tenant, r.Stream)
	e.mu.Unlock()
	for _, ss := range affected {
		ss.mu.Lock()
		if st, ok := ss.states[r.ID]; ok && !st.removed {
			st.rule = cr
			st.wins = nil // warmed again for the new condition
			st.gen++      // the old thresholds' timers are stale
			st.noDataDue = 0
			ss.cachedFor = nil
			e.schedule(ss, st)
		}
		ss.mu.Unlock()
	}
	if len(cr.noData) > 0 {
		return e.watchNoData(ctx, cr)
	}
	return nil
}

// sameRule reports whether a rule read from the store is the one evaluated.
func sameRule(a, b *fleet.AlertRule) bool {
	if a.Name != b.Name || a.Group != b.Group || a.DeviceGroup != b.DeviceGroup || a.Stream != b.Stream ||
		a.ActivationThresholdSeconds != b.ActivationThresholdSeconds || a.DeactivationThresholdSeconds != b.DeactivationThresholdSeconds {
		return false
	}
	ac, err1 := fleet.MarshalCanonical(a.Condition)
	bc, err2 := fleet.MarshalCanonical(b.Condition)
	af, err3 := fleet.MarshalCanonical(a.MetadataFilters)
	bf, err4 := fleet.MarshalCanonical(b.MetadataFilters)
	return errors.Join(err1, err2, err3, err4) == nil && string(ac) == string(bc) && string(af) == string(bf)
}

// Refresh reloads the rules from the store and applies the difference: how a
// replica learns of rules made, edited or deleted on another.
func (e *Engine) Refresh(ctx context.Context) error {
	// A rule added while the list is read may be missing from it: it is
	// left for the next refresh to judge.
	before := e.added.Load()
	rules, err := e.Store.FindAllAlertRules(ctx)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, r := range rules {
		seen[r.ID] = true
		cur, ok := e.rules.Load().byID[r.ID]
		switch {
		case !ok:
			err = e.AddRule(ctx, r)
		case cur.added <= before && !sameRule(cur.AlertRule, r):
			err = e.ReplaceRule(ctx, r)
		}
		if err != nil {
			e.Logger.Error("alert rule does not compile; it is not evaluated", "tenant", r.Tenant, "rule", r.ID, "err", err)
			err = nil
		}
	}
	for id, r := range e.rules.Load().byID {
		if !seen[id] && r.added <= before {
			e.RemoveRule(r.Tenant, id)
		}
	}
	return nil
}

// ForgetDevice drops what the engine holds of a deleted device.
func (e *Engine) ForgetDevice(tenant, device string) {
	e.meta.invalidate(tenant, device)
	e.mu.Lock()
	var gone []*streamState
	for k, ss := range e.streams {
		if k.tenant == tenant && k.device == device {
			gone = append(gone, ss)
			delete(e.streams, k)
		}
	}
	e.mu.Unlock()
	for _, ss := range gone {
		ss.mu.Lock()
		ss.removed = true
		for _, st := range ss.states {
			st.removed = true
		}
		ss.mu.Unlock()
	}
}

// InvalidateMetadata forgets a device's cached metadata, after a PATCH.
func (e *Engine) InvalidateMetadata(tenant, device string) { e.meta.invalidate(tenant, device) }

// watchNoData gives every device that has reported on the rule's stream a
// no_data timer, counting from its last point or from the engine's start,
// whichever is later: while fleetd was down, devices could not report.
func (e *Engine) watchNoData(ctx context.Context, r *rule) error {
	pts, err := e.Store.FindLatestPoints(ctx, r.Tenant, r.Stream)
	if err != nil {
		return err
	}
	for _, p := range pts {
		ss := e.stream(streamKey{r.Tenant, p.DeviceID, r.Stream})
		ss.mu.Lock()
		if !ss.loaded {
			ss.setLoaded(p, e.started)
		}
		if !ss.removed {
			st := ss.state(r)
			e.schedule(ss, st)
		}
		ss.mu.Unlock()
	}
	return nil
}

// stream returns the state of a device stream, made on first use.
func (e *Engine) stream(k streamKey) *streamState {
	e.mu.RLock()
	ss := e.streams[k]
	e.mu.RUnlock()
	if ss != nil {
		return ss
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if ss = e.streams[k]; ss == nil {
		ss = &streamState{key: k, states: map[string]*ruleState{}}
		e.streams[k] = ss
	}
	return ss
}

// loadLatest reads the stream's stored latest point once, so that points
// delivered again after a restart (MQTT QoS 1) are not evaluated twice.
func (e *Engine) loadLatest(ctx context.Context, ss *streamState) error {
	if ss.loaded {
		return nil
	}
	if vs, ok := e.versioned(); ok {
		return e.loadSnapshot(ctx, ss, vs)
	}
	p, err := e.Store.FindLatestPoint(ctx, ss.key.tenant, ss.key.device, ss.key.stream)
	if fleet.ErrorCode(err) == fleet.ENOTFOUND {
		ss.loaded = true
		return nil
	} else if err != nil {
		return err
	}
	ss.setLoaded(p, e.started)
	return nil
}

func (ss *streamState) setLoaded(p *fleet.DataPoint, started int64) {
	ss.loaded, ss.hasLast = true, true
	ss.lastTS, ss.lastSeq, ss.lastPoint = p.Timestamp.UnixMilli(), p.Sequence, p
	ss.lastArrival = max(p.ReceivedAt.UnixMilli(), started)
}

// state returns the rule's state for this stream, made on first use.
func (ss *streamState) state(r *rule) *ruleState {
	st := ss.states[r.ID]
	if st == nil || st.rule != r {
		if st == nil {
			st = &ruleState{sinceData: -1}
		}
		st.rule, st.wins = r, nil
		ss.states[r.ID] = st
		ss.cachedFor = nil
	}
	return st
}

// statesFor returns the states of rules, in their order.
func (ss *streamState) statesFor(rules []*rule) []*ruleState {
	if ss.cachedFor != nil && len(ss.cachedFor) == len(rules) && &ss.cachedFor[0] == &rules[0] {
		return ss.cached
	}
	out := make([]*ruleState, len(rules))
	for i, r := range rules {
		out[i] = ss.state(r)
	}
	ss.cachedFor, ss.cached = rules, out
	return out
}

// IngestPoints evaluates a batch of one device's points on one stream and
// commits the points (kept in history, the last as the stream's latest)
// with whatever alerts they open or close, in one store job. Points older than the last one evaluated (by
// timestamp, then sequence) are stored if newer than the stored latest, but
// not evaluated again.
func (e *Engine) IngestPoints(ctx context.Context, tenant, device, stream string, pts []fleet.DataPoint) error {
	if len(pts) == 0 {
		return nil
	}
	e.stats.points.Add(uint64(len(pts)))
	idx := e.rules.Load()
	if idx == nil {
		return errNotLoaded
	}
	if !slices.IsSortedFunc(pts, comparePoints) {
		fleet.SortDataPoints(pts)
	}
	rules := idx.byStream[tenantStream{tenant, stream}]
	if len(rules) == 0 {
		return e.Store.CommitStream(ctx, tenant, device, stream, pts, nil)
	}
	meta, err := e.deviceFacts(ctx, tenant, device, rules)
	if err != nil {
		return err
	}
	ss := e.stream(streamKey{tenant, device, stream})
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if err := e.loadLatest(ctx, ss); err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		err := e.evaluate(ctx, ss, rules, meta, pts)
		if !errors.Is(err, fleet.ErrStale) || attempt == maxStaleRetries {
			return err
		}
		// Another replica committed this stream since this one read it.
		if err := e.reloadStale(ctx, ss); err != nil {
			return err
		}
	}
}

// evaluate runs pts through the stream's rules and commits the result;
// on failure the stream's state is as before. ss.mu is held.
func (e *Engine) evaluate(ctx context.Context, ss *streamState, rules []*rule, meta facts, pts []fleet.DataPoint) error {
	states := ss.statesFor(rules)
	saved := make([]ruleState, len(states))
	for i, st := range states {
		saved[i] = *st
	}
	savedSS := ss.snapshot()
	for _, st := range states {
		if len(st.rule.windows) > 0 && st.wins == nil {
			if err := e.warm(ctx, ss, st); err != nil {
				return err
			}
		}
	}
	now := e.now()
	var changes []*fleet.AlertChange
	var changed []*ruleState
	for i := range pts {
		p := &pts[i]
		ts := p.Timestamp.UnixMilli()
		if ss.hasLast && (ts < ss.lastTS || ts == ss.lastTS && p.Sequence <= ss.lastSeq) {
			continue
		}
		for j, r := range rules {
			st := states[j]
			if st.wins != nil {
				st.addPoint(ts, p.Data)
			}
			c := r.matches(meta) && eval(r.Compiled, p.Data, nil, st.wins)
			if ch := st.onData(c, ts, now, p, ss.key); ch != nil {
				changes = append(changes, ch)
				changed = append(changed, st)
			}
		}
		ss.hasLast, ss.lastTS, ss.lastSeq, ss.lastPoint = true, ts, p.Sequence, p
	}
	ss.lastArrival = now
	opened := openedIDs(changes)
	if err := e.commitStream(ctx, ss, pts, changes); err != nil {
		for i, st := range states {
			*st = saved[i]
			st.wins = nil // they counted pts: warmed again from what was committed
		}
		ss.restore(savedSS)
		return err
	}
	e.committed(ss, changes, changed, opened)
	for _, st := range states {
		if len(st.rule.noData) > 0 && st.noDataDue == 0 {
			e.schedule(ss, st)
		}
	}
	return nil
}

type streamSnapshot struct {
	hasLast         bool
	lastTS, lastSeq int64
	lastArrival     int64
	lastPoint       *fleet.DataPoint
}

func (ss *streamState) snapshot() streamSnapshot {
	return streamSnapshot{ss.hasLast, ss.lastTS, ss.lastSeq, ss.lastArrival, ss.lastPoint}
}

func (ss *streamState) restore(s streamSnapshot) {
	ss.hasLast, ss.lastTS, ss.lastSeq, ss.lastArrival, ss.lastPoint = s.hasLast, s.lastTS, s.lastSeq, s.lastArrival, s.lastPoint
}

// committed applies what the store decided (an alert another replica had
// opened first is adopted: its id replaces ours) and schedules the timers
// of the new phases.
func (e *Engine) committed(ss *streamState, changes []*fleet.AlertChange, changed []*ruleState, opened map[*fleet.Alert]string) {
	notify := false
	for i, ch := range changes {
		st := changed[i]
		if ch.Open != nil || ch.Close != nil {
			notify = true
		}
		if ch.Open != nil {
			e.stats.opened.Add(1)
		}
		if ch.Close != nil {
			e.stats.closed.Add(1)
		}
		if ch.Open != nil && st.alertID == opened[ch.Open] {
			st.alertID = ch.Open.ID
		}
	}
	for _, st := range changed {
		e.schedule(ss, st)
	}
	if notify && e.Changed != nil {
		e.Changed()
	}
}

// openedIDs remembers the ids the engine gave the alerts it opens, before
// the store may replace them.
func openedIDs(changes []*fleet.AlertChange) map[*fleet.Alert]string {
	var m map[*fleet.Alert]string
	for _, ch := range changes {
		if ch.Open != nil {
			if m == nil {
				m = map[*fleet.Alert]string{}
			}
			m[ch.Open] = ch.Open.ID
		}
	}
	return m
}

func comparePoints(a, b fleet.DataPoint) int {
	if c := a.Timestamp.Compare(b.Timestamp); c != 0 {
		return c
	}
	switch {
	case a.Sequence < b.Sequence:
		return -1
	case a.Sequence > b.Sequence:
		return 1
	}
	return 0
}

// onData steps the state machine for a point at data time ts that arrived at
// clock time now, with the condition c. It returns the change to commit, or
// nil when the phase stays.
func (st *ruleState) onData(c bool, ts, now int64, p *fleet.DataPoint, k streamKey) *fleet.AlertChange {
	st.cond = c
	r := st.rule
	switch st.phase {
	case fleet.PhaseNormal:
		if !c {
			return nil
		}
		if r.act == 0 {
			return st.open(ts, p, k)
		}
		return st.enter(fleet.PhaseActivating, ts, now, k)
	case fleet.PhaseActivating:
		switch {
		case !c:
			return st.enter(fleet.PhaseNormal, -1, now, k)
		case st.sinceData >= 0 && ts-st.sinceData >= r.act:
			return st.open(st.sinceData+r.act, p, k)
		case now-st.sinceClock >= r.act:
			return st.open(st.sinceClock+r.act, p, k)
		}
	case fleet.PhaseActive:
		if c {
			return nil
		}
		if r.deact == 0 {
			return st.close(ts, k)
		}
		return st.enter(fleet.PhaseDeactivating, ts, now, k)
	case fleet.PhaseDeactivating:
		switch {
		case c:
			return st.enter(fleet.PhaseActive, -1, now, k)
		case st.sinceData >= 0 && ts-st.sinceData >= r.deact:
			return st.close(st.sinceData+r.deact, k)
		case now-st.sinceClock >= r.deact:
			return st.close(st.sinceClock+r.deact, k)
		}
	}
	return nil
}

// onClock steps the state machine at clock time t, without new data: c is
// the condition now (it changes only through no_data_seconds).
func (st *ruleState) onClock(c bool, t int64, last *fleet.DataPoint, k streamKey) *fleet.AlertChange {
	st.cond = c
	r := st.rule
	switch st.phase {
	case fleet.PhaseNormal:
		if !c {
			return nil
		}
		if r.act == 0 {
			return st.open(t, last, k)
		}
		return st.enter(fleet.PhaseActivating, -1, t, k)
	case fleet.PhaseActivating:
		switch {
		case !c:
			return st.enter(fleet.PhaseNormal, -1, t, k)
		case t-st.sinceClock >= r.act:
			return st.open(st.sinceClock+r.act, last, k)
		}
	case fleet.PhaseActive:
		if c {
			return nil
		}
		if r.deact == 0 {
			return st.close(t, k)
		}
		return st.enter(fleet.PhaseDeactivating, -1, t, k)
	case fleet.PhaseDeactivating:
		switch {
		case c:
			return st.enter(fleet.PhaseActive, -1, t, k)
		case t-st.sinceClock >= r.deact:
			return st.close(st.sinceClock+r.deact, k)
		}
	}
	return nil
}

func (st *ruleState) enter(phase string, sinceData, sinceClock int64, k streamKey) *fleet.AlertChange {
	st.phase, st.sinceData, st.sinceClock = phase, sinceData, sinceClock
	st.gen++
	return st.change(k)
}

func (st *ruleState) open(at int64, p *fleet.DataPoint, k streamKey) *fleet.AlertChange {
	st.alertID = uuid.NewString()
	st.enter(fleet.PhaseActive, -1, at, k)
	ch := st.change(k)
	ch.Open = &fleet.Alert{ID: st.alertID, RuleID: st.rule.ID, RuleName: st.rule.Name, DeviceID: k.device, Stream: k.stream,
		State: fleet.AlertActive, StartedAt: time.UnixMilli(at).UTC(), Value: p}
	return ch
}

func (st *ruleState) close(at int64, k streamKey) *fleet.AlertChange {
	id := st.alertID
	st.alertID = ""
	st.enter(fleet.PhaseNormal, -1, at, k)
	ch := st.change(k)
	ch.Close = &fleet.AlertClose{ID: id, EndedAt: time.UnixMilli(at).UTC()}
	return ch
}

func (st *ruleState) change(k streamKey) *fleet.AlertChange {
	s := fleet.AlertState{Tenant: k.tenant, RuleID: st.rule.ID, DeviceID: k.device, Phase: st.phase,
		SinceClock: time.UnixMilli(st.sinceClock).UTC(), AlertID: st.alertID}
	if st.sinceData >= 0 {
		s.SinceData = time.UnixMilli(st.sinceData).UTC()
	}
	return &fleet.AlertChange{Stream: k.stream, State: s}
}

// schedule puts the state's next clock-driven moment on the timer heap: the
// end of a pending threshold, and the next no_data_seconds to elapse.
func (e *Engine) schedule(ss *streamState, st *ruleState) {
	switch st.phase {
	case fleet.PhaseActivating:
		e.timers.push(timer{at: st.sinceClock + st.rule.act, ss: ss, st: st, gen: st.gen})
	case fleet.PhaseDeactivating:
		e.timers.push(timer{at: st.sinceClock + st.rule.deact, ss: ss, st: st, gen: st.gen})
	}
	if len(st.rule.noData) > 0 && st.noDataDue == 0 && ss.hasLast {
		for _, n := range st.rule.noData {
			if at := ss.lastArrival + n; at > st.noDataAt {
				st.noDataDue = at
				e.timers.push(timer{at: at, ss: ss, st: st, noData: true})
				return
			}
		}
	}
}

// timer is a moment at which a state may change by the clock alone.
type timer struct {
	at     int64
	ss     *streamState
	st     *ruleState
	gen    uint64 // for thresholds: stale once the phase changed
	noData bool
}

type timerHeap struct {
	mu sync.Mutex
	h  timerSlice
}

type timerSlice []timer

func (h timerSlice) Len() int           { return len(h) }
func (h timerSlice) Less(i, j int) bool { return h[i].at < h[j].at }
func (h timerSlice) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *timerSlice) Push(x any)        { *h = append(*h, x.(timer)) }
func (h *timerSlice) Pop() any {
	old := *h
	t := old[len(old)-1]
	*h = old[:len(old)-1]
	return t
}

func (t *timerHeap) push(x timer) {
	t.mu.Lock()
	heap.Push(&t.h, x)
	t.mu.Unlock()
}

// due pops every timer at or before now.
func (t *timerHeap) due(now int64) []timer {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []timer
	for len(t.h) > 0 && t.h[0].at <= now {
		out = append(out, heap.Pop(&t.h).(timer))
	}
	return out
}

// Pending returns how many timers wait, for tests and metrics.
func (e *Engine) Pending() int {
	e.timers.mu.Lock()
	defer e.timers.mu.Unlock()
	return len(e.timers.h)
}

// CheckTimers evaluates every timer that is due by the clock and commits
// what changes, one store job per device stream. A stream whose commit
// fails keeps its timers for the next check.
func (e *Engine) CheckTimers(ctx context.Context) error {
	now := e.now()
	due := e.timers.due(now)
	if len(due) == 0 {
		return nil
	}
	byStream := map[*streamState][]timer{}
	var order []*streamState
	for _, t := range due {
		if _, ok := byStream[t.ss]; !ok {
			order = append(order, t.ss)
		}
		byStream[t.ss] = append(byStream[t.ss], t)
	}
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	var errMu sync.Mutex
	var firstErr error
	for _, ss := range order {
		wg.Add(1)
		sem <- struct{}{}
		go func(ss *streamState, ts []timer) {
			defer func() { <-sem; wg.Done() }()
			if err := e.fire(ctx, ss, ts, now); err != nil {
				errMu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				errMu.Unlock()
			}
		}(ss, byStream[ss])
	}
	wg.Wait()
	return firstErr
}

func (e *Engine) fire(ctx context.Context, ss *streamState, ts []timer, now int64) error {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.removed {
		return nil
	}
	type touched struct {
		st    *ruleState
		saved ruleState
	}
	for _, t := range ts {
		if st := t.st; !st.removed && len(st.rule.windows) > 0 && st.wins == nil {
			if err := e.warm(ctx, ss, st); err != nil {
				for _, t := range ts {
					e.timers.push(t)
				}
				return err
			}
		}
	}
	var before []touched
	var changes []*fleet.AlertChange
	var changed []*ruleState
	slices.SortFunc(ts, func(a, b timer) int { return int(a.at - b.at) })
	for _, t := range ts {
		st := t.st
		if st.removed {
			continue
		}
		if t.noData {
			if st.noDataDue != t.at {
				continue // superseded
			}
		} else if t.gen != st.gen {
			continue // the phase changed since
		}
		before = append(before, touched{st, *st})
		c := st.cond
		at := t.at
		if t.noData {
			st.noDataDue = 0
			at = e.noDataMoment(ss, st, now)
			if at <= st.noDataAt {
				continue // data arrived since: the next timer is scheduled below
			}
			st.noDataAt = at
		}
		if len(st.rule.noData) > 0 {
			var data map[string]any
			if ss.lastPoint != nil {
				data = ss.lastPoint.Data
			}
			silence := at - ss.lastArrival
			c = e.deviceMatches(ctx, ss, st.rule) && eval(st.rule.Compiled, data, func(d time.Duration) bool { return silence >= d.Milliseconds() }, st.wins)
		}
		if ch := st.onClock(c, at, ss.lastPoint, ss.key); ch != nil {
			changes = append(changes, ch)
			changed = append(changed, st)
		}
	}
	opened := openedIDs(changes)
	if len(changes) > 0 {
		if err := e.commitStream(ctx, ss, nil, changes); err != nil {
			for _, b := range before {
				*b.st = b.saved
			}
			if errors.Is(err, fleet.ErrStale) {
				// Another replica moved the stream on: its phases, read
				// again, have timers of their own.
				return e.reloadStale(ctx, ss)
			}
			for _, t := range ts {
				e.timers.push(t)
			}
			e.Logger.Error("alert timers: commit failed; retrying", "tenant", ss.key.tenant, "device", ss.key.device, "err", err)
			return err
		}
	}
	e.committed(ss, changes, changed, opened)
	for _, b := range before {
		if b.st.noDataDue == 0 {
			e.schedule(ss, b.st)
		}
	}
	return nil
}

// noDataMoment is the latest moment at or before now at which one of the
// rule's no_data_seconds elapsed since the last arrival, or -1 if none has.
func (e *Engine) noDataMoment(ss *streamState, st *ruleState, now int64) int64 {
	at := int64(-1)
	for _, n := range st.rule.noData {
		if m := ss.lastArrival + n; m <= now {
			at = m
		}
	}
	return at
}

// deviceMatches checks a rule's metadata filters and device group for a
// clock step. A device that cannot be read does not match.
func (e *Engine) deviceMatches(ctx context.Context, ss *streamState, r *rule) bool {
	f, err := e.deviceFacts(ctx, ss.key.tenant, ss.key.device, []*rule{r})
	return err == nil && r.matches(f)
}

// Run checks timers every Tick and reloads rules every RefreshEvery until
// ctx ends.
func (e *Engine) Run(ctx context.Context) {
	tick := time.NewTicker(e.Tick)
	defer tick.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if err := e.CheckTimers(ctx); err != nil && ctx.Err() == nil {
			e.Logger.Warn("alert timers", "err", err)
		}
		if time.Since(last) >= e.RefreshEvery {
			last = time.Now()
			if err := e.Refresh(ctx); err != nil && ctx.Err() == nil {
				e.Logger.Warn("alert rules refresh", "err", err)
			}
		}
	}
}

// metaCache keeps devices' metadata for metadata_filters.
type metaCache struct {
	mu sync.Mutex
	m  map[streamKey]metaEntry // stream is ""
}

type metaEntry struct {
	meta map[string]string
	at   int64
}

func (c *metaCache) invalidate(tenant, device string) {
	c.mu.Lock()
	delete(c.m, streamKey{tenant: tenant, device: device})
	c.mu.Unlock()
}

func (e *Engine) metadata(ctx context.Context, tenant, device string) (map[string]string, error) {
	k := streamKey{tenant: tenant, device: device}
	now := e.now()
	e.meta.mu.Lock()
	ent, ok := e.meta.m[k]
	e.meta.mu.Unlock()
	if ok && now-ent.at < e.MetadataTTL.Milliseconds() {
		return ent.meta, nil
	}
	d, err := e.Devices.FindDevice(ctx, tenant, device)
	if err != nil {
		return nil, err
	}
	e.meta.mu.Lock()
	if e.meta.m == nil || len(e.meta.m) > 1_000_000 {
		e.meta.m = map[streamKey]metaEntry{}
	}
	e.meta.m[k] = metaEntry{meta: d.Metadata, at: now}
	e.meta.mu.Unlock()
	return d.Metadata, nil
}
