package console

import (
	"context"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/fleetd/fleet"
)

// pageSize is the rows of every console list: pages are read a page at a
// time, never whole.
const pageSize = 50

// pager is the paging of a list page.
type pager struct {
	Page, Pages, Count int
	Prev, Next         string // URLs, empty at the ends
}

// readPage reads the page parameter: absent is 1, anything but a number
// from 1 is EINVALID.
func readPage(r *http.Request) (fleet.Page, error) {
	p := fleet.Page{Page: 1, Limit: pageSize}
	if s := r.URL.Query().Get("page"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 1_000_000 {
			return p, fleet.Errorf(fleet.EINVALID, "page must be a number from 1")
		}
		p.Page = n
	}
	return p, nil
}

func newPager(r *http.Request, p fleet.Page, count int) pager {
	pg := pager{Page: p.Page, Count: count, Pages: max(1, (count+p.Limit-1)/p.Limit)}
	link := func(n int) string {
		q := r.URL.Query()
		q.Set("page", strconv.Itoa(n))
		return r.URL.Path + "?" + q.Encode()
	}
	if p.Page > 1 {
		pg.Prev = link(min(p.Page-1, pg.Pages))
	}
	if p.Page < pg.Pages {
		pg.Next = link(p.Page + 1)
	}
	return pg
}

// progress sums an action's device actions by where they are.
type progress struct {
	Total, Final                          int
	Scheduled, Waiting, Running           int // Scheduled; Queued; Initiated or Progress
	Completed, Failed, Cancelled          int
	Percent                               int // of Total that is final
	CompletedPct, FailedPct, CancelledPct int
	ScheduledPct, WaitingPct, RunningPct  int
}

func newProgress(st map[string]int) progress {
	p := progress{
		Scheduled: st[string(fleet.StatusScheduled)], Waiting: st[string(fleet.StatusQueued)],
		Running:   st[string(fleet.StatusInitiated)] + st[string(fleet.StatusProgress)],
		Completed: st[string(fleet.StatusCompleted)], Failed: st[string(fleet.StatusFailed)],
		Cancelled: st[string(fleet.StatusCancelled)],
	}
	p.Final = p.Completed + p.Failed + p.Cancelled
	p.Total = p.Final + p.Scheduled + p.Waiting + p.Running
	if p.Total > 0 {
		pct := func(n int) int { return n * 100 / p.Total }
		p.Percent = pct(p.Final)
		p.CompletedPct, p.FailedPct, p.CancelledPct = pct(p.Completed), pct(p.Failed), pct(p.Cancelled)
		p.ScheduledPct, p.WaitingPct, p.RunningPct = pct(p.Scheduled), pct(p.Waiting), pct(p.Running)
	}
	return p
}

// actionRow is an action in a list.
type actionRow struct {
	*fleet.Action
	Progress progress
}

// overviewPage is the overview's: what its live event carries, and the
// fleet-wide chart the page's form chose.
type overviewPage struct {
	*overviewLive
	Chart *fleetChartData
}

func (c *Console) handleOverview(w http.ResponseWriter, r *http.Request, v *view) error {
	o, err := c.readOverview(r.Context(), v.Actor.Tenant)
	if err != nil {
		return err
	}
	fc, err := c.fleetChart(r, v.Actor.Tenant)
	if err != nil {
		return err
	}
	v.Title, v.Nav, v.Data = "Overview", "overview", overviewPage{o, fc}
	c.render(w, r, http.StatusOK, "overview", v)
	return nil
}

// deviceRow is a device in a list.
type deviceRow struct {
	*fleet.Device
	Online      bool
	OnlineKnown bool
}

// deviceRows are devs with their online state, as far as this replica's
// broker can tell.
func (c *Console) deviceRows(tenant string, devs []*fleet.Device) []deviceRow {
	rows := make([]deviceRow, len(devs))
	for i, dev := range devs {
		rows[i].Device = dev
		if c.Presence != nil {
			rows[i].Online, rows[i].OnlineKnown = c.Presence.Online(tenant, dev.ID), true
		}
	}
	return rows
}

// devicesData is the devices list's.
type devicesData struct {
	Search   string
	Metadata string // key=value, one a line
	Group    string
	Shadow   string // fleet.ShadowInSync, fleet.ShadowOutOfSync or "" (any)
	Devices  []deviceRow
	Pager    pager
}

// readMetadataFilter reads "key=value" lines.
func readMetadataFilter(s string) (map[string]string, error) {
	var m map[string]string
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		k, val, ok := strings.Cut(line, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fleet.Errorf(fleet.EINVALID, "metadata filter %q must be key=value", line)
		}
		if m == nil {
			m = map[string]string{}
		}
		m[strings.TrimSpace(k)] = strings.TrimSpace(val)
	}
	return m, nil
}

func (c *Console) handleDevices(w http.ResponseWriter, r *http.Request, v *view) error {
	p, err := readPage(r)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	d := devicesData{Search: q.Get("search"), Metadata: q.Get("metadata"), Group: q.Get("group"), Shadow: q.Get("shadow")}
	meta, err := readMetadataFilter(d.Metadata)
	if err != nil {
		return err
	}
	if d.Shadow != "" && d.Shadow != fleet.ShadowInSync && d.Shadow != fleet.ShadowOutOfSync {
		return fleet.Errorf(fleet.EINVALID, "shadow must be in_sync or out_of_sync")
	}
	if d.Group != "" && !fleet.ValidGroupName(d.Group) {
		return fleet.Errorf(fleet.EINVALID, "group: a group name %s", fleet.GroupNameRule)
	}
	devs, n, err := c.Devices.FindDevices(r.Context(), v.Actor.Tenant, fleet.DeviceFilter{Search: d.Search, Metadata: meta, Group: d.Group, Shadow: d.Shadow, Page: p})
	if err != nil {
		return err
	}
	d.Devices, d.Pager = c.deviceRows(v.Actor.Tenant, devs), newPager(r, p, n)
	v.Title, v.Nav, v.Data = "Devices", "devices", d
	c.render(w, r, http.StatusOK, "devices", v)
	return nil
}

// deviceStreams is how many of a device's streams its page shows.
const deviceStreams = 20

// deviceData is a device page's.
type deviceData struct {
	Device   deviceRow
	Actions  []*fleet.DeviceAction
	Pager    pager
	Alerts   []*fleet.Alert
	Streams  []*fleet.DataPoint
	StreamsN int
	// Certificate is the device's current certificate, nil when it has
	// none; CanIssue says whether this fleetd issues them at all.
	Certificate *fleet.IssuedCertificate
	CanIssue    bool
	Charts      *chartsData
	Twin        twinData
	Token       string                   // a new token, shown once after rotation
	Credentials *fleet.DeviceCredentials // a new certificate and key, shown once
	// Status is the page's HTTP status: 200 unless a form was refused.
	Status int
}

func (c *Console) handleDevice(w http.ResponseWriter, r *http.Request, v *view) error {
	return c.renderDevice(w, r, v, deviceData{})
}

// renderDevice shows a device's page with d's one-time secrets.
func (c *Console) renderDevice(w http.ResponseWriter, r *http.Request, v *view, d deviceData) error {
	ctx, tenant, id := r.Context(), v.Actor.Tenant, r.PathValue("id")
	p, err := readPage(r)
	if err != nil {
		return err
	}
	dev, err := c.Devices.FindDevice(ctx, tenant, id)
	if err != nil {
		return err
	}
	d.Device = deviceRow{Device: dev}
	if c.Presence != nil {
		d.Device.Online, d.Device.OnlineKnown = c.Presence.Online(tenant, id), true
	}
	das, n, err := c.Actions.FindDeviceActions(ctx, tenant, fleet.DeviceActionFilter{DeviceID: id, SortBy: "action_id", Page: p})
	if err != nil {
		return err
	}
	d.Actions, d.Pager = das, newPager(r, p, n)
	if d.Alerts, _, err = c.Alerts.FindAlerts(ctx, tenant, fleet.AlertFilter{DeviceID: id, Page: fleet.Page{Page: 1, Limit: 20}}); err != nil {
		return err
	}
	if d.Streams, d.StreamsN, err = c.Streams.FindDeviceStreams(ctx, tenant, id, fleet.Page{Page: 1, Limit: deviceStreams}); err != nil {
		return err
	}
	if d.Charts, err = c.deviceChartsSection(r, tenant, id, d.Streams); err != nil {
		return err
	}
	if err := c.readTwin(r, tenant, id, &d); err != nil {
		return err
	}
	if c.Certificates != nil {
		d.CanIssue = true
		if d.Certificate, err = c.Certificates.FindDeviceCertificate(ctx, tenant, id); err != nil {
			return err
		}
	}
	if d.Status == 0 {
		d.Status = http.StatusOK
	}
	v.Title, v.Nav, v.Data = "Device "+id, "devices", d
	c.render(w, r, d.Status, "device", v)
	return nil
}

// handleRotateToken gives the device a new token and shows it this once:
// as a new API key's page, the answer is not cached and its script
// replaces the history entry with the device page's, so a reload or Back
// shows the device without the token instead of rotating it again.
func (c *Console) handleRotateToken(w http.ResponseWriter, r *http.Request, v *view) error {
	token, err := c.Devices.RotateDeviceToken(r.Context(), v.Actor.Tenant, r.PathValue("id"))
	if err != nil {
		return err
	}
	v.Flash = "The device has a new token; its old token and its certificate no longer work. Copy the token now: it is not shown again."
	r.URL.RawQuery = ""
	return c.renderDevice(w, r, v, deviceData{Token: token})
}

// handleIssueCertificate gives the device a new client certificate, which
// revokes its previous one, and shows the private key this once, as
// handleRotateToken shows a token.
func (c *Console) handleIssueCertificate(w http.ResponseWriter, r *http.Request, v *view) error {
	if c.Certificates == nil {
		return fleet.Errorf(fleet.ECONFLICT, "this fleetd has no MQTT TLS listener to present a certificate to; start it with --mqtts-addr, --tls-cert and --tls-key")
	}
	creds, err := c.Certificates.IssueDeviceCertificate(r.Context(), v.Actor.Tenant, r.PathValue("id"))
	if err != nil {
		return err
	}
	v.Flash = "The device has a new certificate; its previous one no longer works. Copy the private key now: it is not shown again."
	r.URL.RawQuery = ""
	return c.renderDevice(w, r, v, deviceData{Credentials: creds})
}

// actionsData is the actions list's.
type actionsData struct {
	Action     string
	Incomplete bool
	Actions    []actionRow
	Pager      pager
}

func (c *Console) handleActions(w http.ResponseWriter, r *http.Request, v *view) error {
	p, err := readPage(r)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	d := actionsData{Action: q.Get("action"), Incomplete: q.Get("incomplete") == "true"}
	f := fleet.ActionFilter{Action: d.Action, Incomplete: d.Incomplete, Page: p}
	if d.Action == "" {
		// A cancel_action is a part of the cancel or abort that sent it,
		// not an action of its own; asked for by name, they are listed.
		f.ExceptAction = fleet.ActionCancel
	}
	acts, n, err := c.Actions.FindActions(r.Context(), v.Actor.Tenant, f)
	if err != nil {
		return err
	}
	for _, a := range acts {
		d.Actions = append(d.Actions, actionRow{a, newProgress(a.Statuses)})
	}
	d.Pager = newPager(r, p, n)
	v.Title, v.Nav, v.Data = "Actions", "actions", d
	c.render(w, r, http.StatusOK, "actions", v)
	return nil
}

// phaseRow is a rollout phase with its progress.
type phaseRow struct {
	Index     int
	Phase     fleet.Phase
	Triggered bool
	Next      bool
	Progress  progress
}

// actionData is an action page's.
type actionData struct {
	Action   *fleet.Action
	Progress progress
	Phases   []phaseRow
	Failed   []*fleet.DeviceAction
	FailedN  int
	// Retriable: the Failed device actions no retry took yet, which the
	// retry button offers (a device action is retried once).
	Retriable int
	Devices   []actionDeviceRow
	Status    string // filter of the device list
	Pager     pager
	Statuses  []fleet.ActionStatus
}

// actionDeviceRow is a device action with its device's online state, as
// far as this replica's broker can tell.
type actionDeviceRow struct {
	*fleet.DeviceAction
	Online, OnlineKnown bool
}

func (c *Console) handleAction(w http.ResponseWriter, r *http.Request, v *view) error {
	ctx, tenant := r.Context(), v.Actor.Tenant
	id, err := actionID(r)
	if err != nil {
		return err
	}
	p, err := readPage(r)
	if err != nil {
		return err
	}
	a, err := c.Actions.FindAction(ctx, tenant, id)
	if err != nil {
		return err
	}
	d := actionData{Action: a, Progress: newProgress(a.Statuses), Statuses: fleet.ActionStatuses}
	d.Phases = phases(a)
	d.Failed, d.FailedN, err = c.Actions.FindDeviceActions(ctx, tenant, fleet.DeviceActionFilter{ActionID: id, ActionStatus: fleet.StatusFailed, Page: fleet.Page{Page: 1, Limit: 20}})
	if err != nil {
		return err
	}
	if d.Progress.Final == d.Progress.Total && d.Progress.Failed > 0 {
		if d.Retriable, err = c.Actions.CountRetriable(ctx, tenant, id, []fleet.ActionStatus{fleet.StatusFailed}); err != nil {
			return err
		}
	}
	d.Status = r.URL.Query().Get("status")
	if d.Status != "" && !fleet.ActionStatus(d.Status).Valid() {
		return fleet.Errorf(fleet.EINVALID, "status must be one of the action statuses")
	}
	das, n, err := c.Actions.FindDeviceActions(ctx, tenant, fleet.DeviceActionFilter{ActionID: id, ActionStatus: fleet.ActionStatus(d.Status), Page: p})
	if err != nil {
		return err
	}
	for _, da := range das {
		row := actionDeviceRow{DeviceAction: da}
		if c.Presence != nil {
			row.Online, row.OnlineKnown = c.Presence.Online(tenant, da.DeviceID), true
		}
		d.Devices = append(d.Devices, row)
	}
	d.Pager = newPager(r, p, n)
	v.Title, v.Nav, v.Data = "Action "+strconv.FormatInt(id, 10)+": "+a.Action, "actions", d
	c.render(w, r, http.StatusOK, "action", v)
	return nil
}

// phases returns a rollout's phases with their progress, nil for an
// action without a schedule.
func phases(a *fleet.Action) []phaseRow {
	if a.Schedule == nil {
		return nil
	}
	rows := make([]phaseRow, len(a.Schedule.Phases))
	for i, ph := range a.Schedule.Phases {
		rows[i] = phaseRow{Index: i, Phase: ph, Progress: newProgress(a.StatusesPhased[strconv.Itoa(i)])}
		if i < len(a.PhasesTriggered) {
			rows[i].Triggered = a.PhasesTriggered[i]
		}
		rows[i].Next = a.NextPhaseIndex != nil && *a.NextPhaseIndex == i
	}
	return rows
}

func actionID(r *http.Request) (int64, error) {
	id, ok := fleet.ParseActionID(r.PathValue("id"))
	if !ok {
		return 0, fleet.Errorf(fleet.ENOTFOUND, "there is no action %q", r.PathValue("id"))
	}
	return id, nil
}

// actionOps are the buttons of an action's page.
var actionOps = map[string]func(fleet.ActionService, context.Context, string, int64) error{
	"cancel":             fleet.ActionService.CancelAction,
	"pause":              fleet.ActionService.PauseRollout,
	"resume":             fleet.ActionService.ResumeRollout,
	"abort":              fleet.ActionService.AbortRollout,
	"trigger_next_phase": fleet.ActionService.TriggerNextPhase,
}

func (c *Console) handleActionOp(w http.ResponseWriter, r *http.Request, v *view) error {
	id, err := actionID(r)
	if err != nil {
		return err
	}
	op, ok := actionOps[r.PathValue("op")]
	if !ok {
		return fleet.Errorf(fleet.ENOTFOUND, "there is no action operation %q", r.PathValue("op"))
	}
	if err := op(c.Actions, r.Context(), v.Actor.Tenant, id); err != nil {
		return err
	}
	http.Redirect(w, r, "/console/actions/"+strconv.FormatInt(id, 10), http.StatusSeeOther)
	return nil
}

// handleRetry dispatches the action again to its Failed devices and shows
// the new action.
func (c *Console) handleRetry(w http.ResponseWriter, r *http.Request, v *view) error {
	id, err := actionID(r)
	if err != nil {
		return err
	}
	a, err := c.Actions.RetryAction(r.Context(), v.Actor.Tenant, id, []fleet.ActionStatus{fleet.StatusFailed})
	if err != nil {
		return err
	}
	http.Redirect(w, r, "/console/actions/"+strconv.FormatInt(a.ID, 10), http.StatusSeeOther)
	return nil
}

// sortedKeys returns m's keys in order, for stable rendering.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// when formats a time for a person: UTC, to the second.
func when(t any) string {
	switch t := t.(type) {
	case time.Time:
		if t.IsZero() {
			return "—"
		}
		return t.UTC().Format("2006-01-02 15:04:05 UTC")
	case *time.Time:
		if t == nil {
			return "never"
		}
		return when(*t)
	case int64: // epoch milliseconds, as a schedule's end_timestamp
		return when(time.UnixMilli(t))
	}
	return ""
}

// query returns a URL with one parameter changed, for filter links.
func withQuery(path string, kv ...string) string {
	q := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			q.Set(kv[i], kv[i+1])
		}
	}
	if len(q) == 0 {
		return path
	}
	return path + "?" + q.Encode()
}
