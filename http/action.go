package fleethttp

import (
	"net/http"
	"reflect"
	"strconv"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/codec"
)

// actionStatusNames are the six statuses, for enums and the filters.
var actionStatusNames = func() []string {
	names := make([]string, len(fleet.ActionStatuses))
	for i, s := range fleet.ActionStatuses {
		names[i] = string(s)
	}
	return names
}()

func init() {
	enums[reflect.TypeFor[fleet.ActionStatus]()] = actionStatusNames
	var rollout []string
	for _, s := range fleet.RolloutStatuses {
		rollout = append(rollout, string(s))
	}
	enums[reflect.TypeFor[fleet.RolloutStatus]()] = rollout
}

// dispatchBody is the body of S1 and of POST /api/v1/actions
// (docs/actions.md#dispatch).
type dispatchBody struct {
	Action      string         `json:"action" openapi:"required" doc:"the action's name, 1-128 characters; update_firmware and cancel_action are special"`
	Params      map[string]any `json:"params" openapi:"required" doc:"what the devices receive, as a JSON text, in the message's payload"`
	SearchType  string         `json:"search_type" openapi:"required" doc:"default (exactly device_ids), all, metadata (metadata[search_key] equals search_query) search (id or metadata value, under search_key when given, contains search_query, ignoring case) or group (the devices of the group named by group, at dispatch)"`
	DeviceIDs   []string       `json:"device_ids,omitempty" doc:"search_type default: the devices, every one of which must exist"`
	Metadata    map[string]any `json:"metadata,omitempty" doc:"anything worth keeping with the action; stored and shown"`
	SearchKey   string         `json:"search_key,omitempty"`
	SearchQuery string         `json:"search_query,omitempty"`
	Group       string         `json:"group,omitempty" doc:"search_type group: the group's name; the action shows it as its search_query"`
	Timeout     int64          `json:"timeout,omitempty" doc:"seconds, 1 to 31536000 (default 86400), counted from the device's receipt; a device action not final by then fails with status TimedOut"`
}

// rolloutDispatchBody is the body of POST /api/v1/actions: S1's, and a
// schedule.
type rolloutDispatchBody struct {
	dispatchBody
	Schedule *fleet.Schedule `json:"schedule,omitempty" doc:"makes the action a rollout: its targets are released phase by phase (docs/actions.md, Rollouts)"`
}

// dispatched answers POST /api/v1/actions.
type dispatched struct {
	ID        int64     `json:"id"`
	CreatedAt time.Time `json:"created_at"`
	Targeted  int       `json:"targeted"`
}

type actionList struct {
	Actions []*fleet.Action `json:"actions"`
	Count   int             `json:"count"`
}

type deviceActionList struct {
	DeviceActions []*fleet.DeviceAction `json:"device_actions"`
	Count         int                   `json:"count"`
}

// statusReportBody is S10's body.
type statusReportBody struct {
	DeviceID  string   `json:"device_id" openapi:"required"`
	ActionID  any      `json:"action_id,omitempty" doc:"the action's id, an integer or a string of its digits; id is accepted instead"`
	ID        any      `json:"id,omitempty" doc:"the same as action_id, as the uplink agent spells it"`
	State     string   `json:"state" openapi:"required" doc:"the device's word for where it is, 1-64 characters; Completed and Failed are final"`
	Progress  any      `json:"progress,omitempty" doc:"0 to 100: an integer or a string of digits"`
	Errors    []string `json:"errors,omitempty" doc:"messages, kept under this state"`
	Timestamp int64    `json:"timestamp,omitempty" doc:"epoch milliseconds; with sequence, orders the reports of one action: an older or repeated one is acknowledged and ignored"`
	Sequence  int64    `json:"sequence,omitempty"`
}

// actionIDParam is the {id} of action paths.
var actionIDParam = param{Name: "id", In: "path", Type: "integer", Desc: "the action's id"}

// actionStatusQuery filters device actions by status, and pages them.
var actionStatusQuery = append([]param{
	{Name: "action_status", Desc: "only device actions in this status", Enum: actionStatusNames},
}, pageParams...)

// pathActionID returns the {id} of the path, which must be an action id.
func pathActionID(r *http.Request) (int64, error) {
	id, ok := fleet.ParseActionID(r.PathValue("id"))
	if !ok {
		return 0, pathError("id", "action id", fleet.ActionIDRule)
	}
	return id, nil
}

// readDispatch decodes and validates a dispatch body. Its limit is the bulk
// one: device_ids may list many thousands of devices.
func (s *Server) readDispatch(w http.ResponseWriter, r *http.Request, withSchedule bool) (*fleet.Dispatch, error) {
	body, err := s.decode(w, r, s.Limits.Bulk, bulkElements)
	if err != nil {
		return nil, err
	}
	f := fleet.NewFields(body)
	d := fleet.ReadDispatch(f, withSchedule)
	if err := f.Err(); err != nil {
		return nil, err
	}
	return &d, nil
}

// handleMockDispatch is S1: 201, Location and an empty body.
func (s *Server) handleMockDispatch(w http.ResponseWriter, r *http.Request) error {
	d, err := s.readDispatch(w, r, false)
	if err != nil {
		return err
	}
	a, err := s.Actions.DispatchAction(r.Context(), tenantOf(r), d)
	if err != nil {
		return err
	}
	location(w, r, "/api/v1/actions/", strconv.FormatInt(a.ID, 10))
	return s.quiet(w, r, http.StatusCreated, func() (any, error) { return a, nil })
}

func (s *Server) handleDispatch(w http.ResponseWriter, r *http.Request) error {
	d, err := s.readDispatch(w, r, true)
	if err != nil {
		return err
	}
	a, err := s.Actions.DispatchAction(r.Context(), tenantOf(r), d)
	if err != nil {
		return err
	}
	location(w, r, "/api/v1/actions/", strconv.FormatInt(a.ID, 10))
	s.respond(w, r, http.StatusCreated, dispatched{ID: a.ID, CreatedAt: a.CreatedAt, Targeted: a.Targeted})
	return nil
}

// retryBody is what POST /api/v1/actions/{id}/retry takes; the body may
// be left out.
type retryBody struct {
	Statuses []fleet.ActionStatus `json:"statuses,omitempty" doc:"the final statuses (Completed, Failed, Cancelled) whose devices are retried; default [\"Failed\"]"`
}

func (s *Server) handleRetryAction(w http.ResponseWriter, r *http.Request) error {
	id, err := pathActionID(r)
	if err != nil {
		return err
	}
	var f *fleet.Fields
	if r.ContentLength != 0 || r.Header.Get("Content-Type") != "" { // a body, if only an empty one
		body, err := s.decode(w, r, s.Limits.Body, ordinaryElements)
		if err != nil {
			return err
		}
		f = fleet.NewFields(body)
	}
	statuses := fleet.ReadRetry(f)
	if f != nil {
		if err := f.Err(); err != nil {
			return err
		}
	}
	a, err := s.Actions.RetryAction(r.Context(), tenantOf(r), id, statuses)
	if err != nil {
		return err
	}
	location(w, r, "/api/v1/actions/", strconv.FormatInt(a.ID, 10))
	s.respond(w, r, http.StatusCreated, dispatched{ID: a.ID, CreatedAt: a.CreatedAt, Targeted: a.Targeted})
	return nil
}

func (s *Server) handleListActions(w http.ResponseWriter, r *http.Request) error {
	q := newQuery(r)
	f := fleet.ActionFilter{Action: q.String("action"), Incomplete: q.Enum("incomplete", "false", "true", "false") == "true", Page: q.Page()}
	if err := q.Err(); err != nil {
		return err
	}
	acts, n, err := s.Actions.FindActions(r.Context(), tenantOf(r), f)
	if err != nil {
		return err
	}
	s.respond(w, r, http.StatusOK, actionList{Actions: acts, Count: n})
	return nil
}

func (s *Server) handleGetAction(w http.ResponseWriter, r *http.Request) error {
	return getOne(s, w, r, pathActionID, s.Actions.FindAction)
}

// actionStatusParam reads the action_status filter.
func actionStatusParam(q *query) fleet.ActionStatus {
	return fleet.ActionStatus(q.Enum("action_status", "", actionStatusNames...))
}

func (s *Server) handleListActionDevices(w http.ResponseWriter, r *http.Request) error {
	id, err := pathActionID(r)
	if err != nil {
		return err
	}
	q := newQuery(r)
	f := fleet.DeviceActionFilter{ActionID: id, ActionStatus: actionStatusParam(q), Page: q.Page()}
	if err := q.Err(); err != nil {
		return err
	}
	das, n, err := s.Actions.FindDeviceActions(r.Context(), tenantOf(r), f)
	if err != nil {
		return err
	}
	s.respond(w, r, http.StatusOK, deviceActionList{DeviceActions: das, Count: n})
	return nil
}

func (s *Server) handleCancelAction(w http.ResponseWriter, r *http.Request) error {
	id, err := pathActionID(r)
	if err != nil {
		return err
	}
	if err := s.Actions.CancelAction(r.Context(), tenantOf(r), id); err != nil {
		return err
	}
	return s.quiet(w, r, http.StatusNoContent, func() (any, error) { return s.Actions.FindAction(r.Context(), tenantOf(r), id) })
}

// handleDeviceActions is S7.
func (s *Server) handleDeviceActions(w http.ResponseWriter, r *http.Request) error {
	device, err := pathValue(r, "device_id", "device id", fleet.ValidDeviceID, fleet.DeviceIDRule)
	if err != nil {
		return err
	}
	q := newQuery(r)
	f := fleet.DeviceActionFilter{
		DeviceID:     device,
		SortBy:       q.Enum("sort_by", fleet.DeviceActionSorts[0], fleet.DeviceActionSorts...),
		Ascending:    q.Enum("sort_order", "desc", "asc", "desc") == "asc",
		ActionStatus: actionStatusParam(q),
		Type:         q.String("type"),
		Page:         q.Page(),
	}
	if err := q.Err(); err != nil {
		return err
	}
	das, n, err := s.Actions.FindDeviceActions(r.Context(), tenantOf(r), f)
	if err != nil {
		return err
	}
	s.respond(w, r, http.StatusOK, deviceActionList{DeviceActions: das, Count: n})
	return nil
}

// handleActionStatus is S10, the hottest path: decode, one store call that
// returns once its (shared) transaction committed, 204.
func (s *Server) handleActionStatus(w http.ResponseWriter, r *http.Request) error {
	rep, err := s.readStatusReport(w, r)
	if err != nil {
		return err
	}
	errs, err := s.Actions.ReportStatus(r.Context(), tenantOf(r), []fleet.StatusReport{rep})
	if err != nil {
		return err
	}
	if errs[0] != nil {
		return errs[0]
	}
	return s.quiet(w, r, http.StatusNoContent, func() (any, error) {
		return s.Actions.FindDeviceAction(r.Context(), tenantOf(r), rep.ActionID, rep.DeviceID)
	})
}

// readStatusReport reads S10's body. A JSON report of the plain shape is
// read by fleet.QuickStatusReport, which makes no canonical values and so
// needs no room in the decoding budget; any other body, and any report it
// declines, is decoded the full way, which words every error.
func (s *Server) readStatusReport(w http.ResponseWriter, r *http.Request) (fleet.StatusReport, error) {
	var body any
	if f, ok := codec.FormatOf(r.Header.Get("Content-Type")); ok && f == codec.JSON {
		b, err := s.bodies.read(w, r, s.Limits.Body)
		if err != nil {
			return fleet.StatusReport{}, err
		}
		if rep, ok := fleet.QuickStatusReport(b, true); ok {
			return rep, nil
		}
		if body, err = s.decodeRead(w, r, f, b, ordinaryElements); err != nil {
			return fleet.StatusReport{}, err
		}
	} else {
		var err error
		if body, err = s.decode(w, r, s.Limits.Body, ordinaryElements); err != nil {
			return fleet.StatusReport{}, err
		}
	}
	f := fleet.NewFields(body)
	rep := fleet.ReadStatusReport(f, true)
	return rep, f.Err()
}
